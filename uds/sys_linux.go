package uds

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/procnet"
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
		if _, err := os.Stat("/proc/" + strconv.Itoa(int(hint))); err == nil {
			return int(hint)
		}
	}
	f, err := os.Open(procnet.Path)
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
func pidWithSocket(ino uint64) int {
	want := "socket:[" + strconv.FormatUint(ino, 10) + "]"
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := "/proc/" + p.Name() + "/fd"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if target, err := os.Readlink(dir + "/" + fd.Name()); err == nil && target == want {
				return pid
			}
		}
	}
	return 0
}

func fileIDOf(fi os.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim.Nano()}
}
