package uds

import (
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// PeerCred asks the kernel (SO_PEERCRED) who is at the other end of c.
func PeerCred(c net.Conn) (Cred, error) {
	if uc, ok := c.(*Conn); ok {
		c = uc.Conn
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return Cred{}, ErrNoCred
	}
	if _, isUnix := c.(*net.UnixConn); !isUnix {
		return Cred{}, ErrNoCred
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var ucred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		ucred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("peer credentials: SO_PEERCRED: %w", serr)
	}
	return Cred{PID: ucred.Pid, UID: ucred.Uid, GID: ucred.Gid}, nil
}
