package uds

import "golang.org/x/sys/unix"

// recvmsgCloexec receives with MSG_CMSG_CLOEXEC: the descriptors are
// close-on-exec the moment they exist in this process.
func recvmsgCloexec(fd int, p, oob []byte) (n, oobn, flags int, err error) {
	n, oobn, flags, _, err = unix.Recvmsg(fd, p, oob, unix.MSG_CMSG_CLOEXEC)
	return n, oobn, flags, err
}
