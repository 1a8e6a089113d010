//go:build !linux

package uds

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// This file serves macOS and the BSDs (the module builds only on unix systems:
// see unixonly.go).

// sunPathMax is the size of sockaddr_un.sun_path, terminating NUL included
// (104 on macOS and the BSDs).
const sunPathMax = 104

// newUnixSocket returns a close-on-exec unix stream socket.
func newUnixSocket() (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// presetSocketMode is a no-op here: BSD-derived kernels do not take the file
// mode from the socket inode. The socket is not listening until Listen has
// chmod'ed it, so it is never reachable with looser bits.
func presetSocketMode(fd int, mode uint32) error { return nil }

// ownerPID returns the pid the kernel reported for the listener (LOCAL_PEEREPID
// of a probe connection). There is no cheap way to search further.
func ownerPID(path string, hint int32) int { return int(hint) }

func fileIDOf(fi os.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino), ctime: st.Ctimespec.Nano()}
}

// setSocketFileAttrs gives the socket file just bound at path its mode and,
// when uid or gid is not -1, its owner, without following a symlink
// (AT_SYMLINK_NOFOLLOW), after checking it is a socket owned by us. It
// returns the file's info after the change (for its identity).
func setSocketFileAttrs(path string, mode uint32, uid, gid int) (os.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if err := checkOwnSocketInfo(fi, path); err != nil {
		return nil, err
	}
	if uid != -1 || gid != -1 {
		if err := os.Lchown(path, uid, gid); err != nil {
			return fi, err
		}
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, path, mode, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fi, &os.PathError{Op: "chmod", Path: path, Err: err}
	}
	return os.Lstat(path)
}
