package uds

import (
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// PeerCred asks the kernel who is at the other end of c: LOCAL_PEERCRED for
// the uid and primary gid, LOCAL_PEEREPID for the pid.
func PeerCred(c net.Conn) (Cred, error) {
	if uc, ok := c.(*Conn); ok {
		c = uc.Conn
	}
	if _, isUnix := c.(*net.UnixConn); !isUnix {
		return Cred{}, ErrNoCred
	}
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var xu *unix.Xucred
	var pid int
	var serr, perr error
	if err := raw.Control(func(fd uintptr) {
		xu, serr = unix.GetsockoptXucred(int(fd), unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
		pid, perr = unix.GetsockoptInt(int(fd), unix.SOL_LOCAL, unix.LOCAL_PEEREPID)
	}); err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("peer credentials: LOCAL_PEERCRED: %w", serr)
	}
	if perr != nil {
		return Cred{}, fmt.Errorf("peer credentials: LOCAL_PEEREPID: %w", perr)
	}
	cr := Cred{PID: int32(pid), UID: xu.Uid}
	if xu.Ngroups > 0 {
		cr.GID = xu.Groups[0]
	}
	return cr, nil
}
