//go:build !linux

package shm

import (
	"errors"
	"syscall"
)

// Supported reports whether this system has the shared-memory path.
const Supported = false

var errUnsupported = errors.New("udskit shm: shared memory needs Linux (memfd); the socket path is used")

// Create fails: no memfd here.
func Create(size uint64) (*Region, int, error) { return nil, -1, errUnsupported }

// OpenOffer fails: no memfd here.
func OpenOffer(fd int, size uint64) (*Region, error) {
	return nil, errf(NameBadOffer, "%v", errUnsupported)
}

// CloseFD closes a descriptor.
func CloseFD(fd int) { _ = syscall.Close(fd) }
