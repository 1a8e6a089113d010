//go:build !unix

package service

// stdioBroken cannot poll here: every SIGPIPE stops the service.
func stdioBroken() bool { return true }
