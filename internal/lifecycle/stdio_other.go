//go:build !unix

package lifecycle

// stdioBroken cannot poll here: every SIGPIPE stops the service.
func stdioBroken() bool { return true }
