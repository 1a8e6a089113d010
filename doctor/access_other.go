//go:build !linux

package doctor

import "golang.org/x/sys/unix"

const (
	xOK = unix.X_OK
	wOK = unix.W_OK
)

// accessOK uses access(2) (real ids) where faccessat with AT_EACCESS is not available.
func accessOK(p string, mode uint32) error { return unix.Access(p, mode) }

func major(dev uint64) uint32 { return uint32(unix.Major(dev)) }
func minor(dev uint64) uint32 { return uint32(unix.Minor(dev)) }

func foreignFS(string) string { return "" }
