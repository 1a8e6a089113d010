//go:build !linux

package uds

const abstractSupported = false
