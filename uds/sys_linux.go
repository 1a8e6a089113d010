package uds

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/proc"
)

// sunPathMax is the size of sockaddr_un.sun_path, terminating NUL included.
const sunPathMax = 108

// newUnixSocket returns a close-on-exec unix stream socket.
func newUnixSocket() (int, error) {
	return unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
}

// presetSocketMode sets the mode the socket file will be created with. Linux
// creates the file at bind(2) with the socket inode's mode minus the umask, so
// an fchmod before bind means the file never exists with looser bits.
func presetSocketMode(fd int, mode uint32) error { return unix.Fchmod(fd, mode) }

// ownerPID returns the pid of a process holding the listening socket bound at
// path. hint is the pid the kernel reported for the listener (SO_PEERCRED of a
// probe connection, i.e. the process that called listen(2)); it is used when
// that process is still alive, otherwise the socket's inode from
// /proc/net/unix is looked up among every process's open fds. 0 means unknown.
func ownerPID(path string, hint int32) int {
	if hint > 0 {
		if proc.Alive(int(hint)) {
			return int(hint)
		}
	}
	f, err := os.Open(proc.NetUnixPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	names := []string{path}
	if abs, err := filepath.Abs(path); err == nil && abs != path {
		names = append(names, abs)
	}
	ino, ok := listeningInode(f, names...)
	if !ok {
		return 0
	}
	return pidWithSocket(ino)
}

// pidWithSocket returns the first pid that has socket inode ino open, or 0.
func pidWithSocket(ino uint64) int { return proc.PIDWithSocket("", ino) }

func fileIDOf(fi os.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim.Nano()}
}

// setSocketFileAttrs gives the socket file just bound at path its mode and,
// when uid or gid is not -1, its owner, without ever following a symlink:
// the file is opened with O_PATH|O_NOFOLLOW, checked to be a socket owned by
// us (what bind created), and changed through that fd only. It returns the
// file's info after the change (for its identity).
func setSocketFileAttrs(path string, mode uint32, uid, gid int) (os.FileInfo, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := checkOwnSocketInfo(fi, path); err != nil {
		return nil, err
	}
	// From here on the file is ours: on failure, fi lets the caller remove it.
	if uid != -1 || gid != -1 {
		if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
			return fi, &os.PathError{Op: "chown", Path: path, Err: err}
		}
	}
	// fchmodat2(AT_EMPTY_PATH) on Linux 6.6+; else chmod through the fd's
	// /proc entry, which names the inode itself (never a symlink).
	if err := unix.Fchmodat(fd, "", mode, unix.AT_EMPTY_PATH); err != nil {
		if err != unix.ENOSYS && err != unix.EOPNOTSUPP && err != unix.EINVAL {
			return fi, &os.PathError{Op: "chmod", Path: path, Err: err}
		}
		if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode); err != nil {
			return fi, &os.PathError{Op: "chmod", Path: path, Err: err}
		}
	}
	return f.Stat()
}
