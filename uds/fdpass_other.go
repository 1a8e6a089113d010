//go:build !linux

package uds

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// recvmsgCloexec receives and then marks every descriptor close-on-exec.
// There is no MSG_CMSG_CLOEXEC here, so the receive and the fcntl run under
// syscall.ForkLock (read side): os/exec takes it for writing around fork, so
// no child of this process can inherit a descriptor in between.
func recvmsgCloexec(fd int, p, oob []byte) (n, oobn, flags int, err error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	n, oobn, flags, _, err = unix.Recvmsg(fd, p, oob, 0)
	if oobn > 0 {
		if fds, _ := parseRights(oob[:oobn]); len(fds) > 0 {
			for _, f := range fds {
				unix.CloseOnExec(f)
			}
		}
	}
	return n, oobn, flags, err
}
