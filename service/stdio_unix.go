//go:build unix

package service

import "golang.org/x/sys/unix"

// stdioBroken reports whether stdout or stderr lost its reader: the write
// end of a pipe whose reader exited polls POLLERR, a socket whose peer is
// gone POLLHUP or POLLERR. A terminal, a file or /dev/null never does.
func stdioBroken() bool { return fdsBroken(1, 2) }

func fdsBroken(fds ...int) bool {
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	}
	for {
		_, err := unix.Poll(pfds, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return true // cannot tell: stop, as every SIGPIPE did before
		}
		break
	}
	for _, p := range pfds {
		if p.Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
			return true
		}
	}
	return false
}
