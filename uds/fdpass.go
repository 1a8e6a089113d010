package uds

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// MaxFDsPerMessage caps the descriptors SendFDs sends and RecvFDs accepts in
// one message. Linux itself refuses more than 253 (SCM_MAX_FD).
const MaxFDsPerMessage = 64

// ErrFDTruncated is returned by RecvFDs when the kernel had to drop
// descriptors (MSG_CTRUNC: the control buffer was too small) or more arrived
// than the caller allowed. Every descriptor that did arrive has been closed.
var ErrFDTruncated = errors.New("uds: descriptors truncated (more were sent than the receiver allows)")

// ErrTooManyFDs is returned by SendFDs for more than MaxFDsPerMessage fds.
var ErrTooManyFDs = fmt.Errorf("uds: more than %d descriptors in one message", MaxFDsPerMessage)

// SendFDs writes payload to c with fds attached as one SCM_RIGHTS control
// message. The payload must not be empty: a stream socket carries
// descriptors only alongside at least one byte, and the receiver gets them
// with the first bytes of payload it reads. The caller keeps its fds open and
// owns them; the receiver gets new descriptors for the same open files.
func SendFDs(c *net.UnixConn, payload []byte, fds []int) error {
	if len(payload) == 0 {
		return errors.New("uds: SendFDs needs a non-empty payload to carry the descriptors")
	}
	if len(fds) > MaxFDsPerMessage {
		return ErrTooManyFDs
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("uds: send fds: %w", err)
	}
	sent := 0
	var serr error
	werr := raw.Write(func(fd uintptr) bool {
		n, err := unix.SendmsgN(int(fd), payload, oob, nil, 0) // Go ignores SIGPIPE on sockets
		if err == unix.EAGAIN || err == unix.EINTR {
			return false
		}
		sent, serr = n, err
		return true
	})
	if werr == nil {
		werr = serr
	}
	if werr != nil {
		return fmt.Errorf("uds: send fds: %w", os.NewSyscallError("sendmsg", werr))
	}
	// The descriptors went with the first chunk; the rest is plain bytes.
	if sent < len(payload) {
		if _, err := c.Write(payload[sent:]); err != nil {
			return fmt.Errorf("uds: send fds: %w", err)
		}
	}
	return nil
}

// RecvFDs reads up to len(buf) bytes from c together with at most maxFDs
// descriptors sent with them (SCM_RIGHTS). Received descriptors are
// close-on-exec from the start on Linux (MSG_CMSG_CLOEXEC) and right after
// the receive elsewhere, under syscall.ForkLock so that no exec in this
// process can inherit them. The caller owns the returned fds.
//
// maxFDs is capped by MaxFDsPerMessage. When the sender attached more than
// fit (MSG_CTRUNC) or more than maxFDs, RecvFDs closes every descriptor that
// arrived and returns ErrFDTruncated along with n, the bytes read, which the
// caller may still consume. Any other control message is ignored. n == 0
// with a nil error never happens: EOF is io.EOF.
func RecvFDs(c *net.UnixConn, buf []byte, maxFDs int) (n int, fds []int, err error) {
	if len(buf) == 0 {
		return 0, nil, errors.New("uds: RecvFDs needs a buffer for at least one byte")
	}
	maxFDs = min(max(maxFDs, 0), MaxFDsPerMessage)
	var oob []byte
	if maxFDs > 0 {
		oob = make([]byte, unix.CmsgSpace(4*maxFDs))
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, nil, fmt.Errorf("uds: receive fds: %w", err)
	}
	var oobn, flags int
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		n, oobn, flags, rerr = recvmsgCloexec(int(fd), buf, oob)
		return rerr != unix.EAGAIN && rerr != unix.EINTR
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, nil, fmt.Errorf("uds: receive fds: %w", os.NewSyscallError("recvmsg", err))
	}
	fds, perr := parseRights(oob[:oobn])
	switch {
	case perr != nil:
		closeAll(fds)
		return n, nil, fmt.Errorf("uds: receive fds: %w", perr)
	case flags&unix.MSG_CTRUNC != 0 || len(fds) > maxFDs:
		closeAll(fds)
		return n, nil, ErrFDTruncated
	}
	if n == 0 {
		closeAll(fds)
		return 0, nil, io.EOF
	}
	return n, fds, nil
}

// parseRights returns every descriptor in the SCM_RIGHTS messages of oob.
// On a parse error it still returns the descriptors it found, to be closed.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	var firstErr error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		fds = append(fds, got...)
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return fds, firstErr
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
