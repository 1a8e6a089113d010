package rpc

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// peerHungUp waits up to d for c's peer to be gone entirely (closed, or reset)
// and reports whether it is. A peer that only shut down its sending side is
// not gone. It asks poll(2) for no events, so only POLLHUP/POLLERR return it.
func peerHungUp(c net.Conn, d time.Duration) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		time.Sleep(d)
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	err = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd)}}
		n, err := unix.Poll(fds, int(d/time.Millisecond))
		gone = err == nil && n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
	})
	return gone || err != nil
}
