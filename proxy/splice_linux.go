package proxy

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// canSplice reports whether c is a socket splice(2) can move bytes from and to.
func canSplice(c net.Conn) bool {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}

// pipe is a kernel pipe used as the splice buffer for one direction.
type pipe struct {
	r, w int
	size int // capacity in bytes
}

// pipePool keeps idle, empty pipes for reuse; at most cap(pipePool) are kept.
var pipePool = make(chan *pipe, 64)

func getPipe(size int) (*pipe, error) {
	var p *pipe
	select {
	case p = <-pipePool:
	default:
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			return nil, fmt.Errorf("splice pipe: %w", err)
		}
		p = &pipe{r: fds[0], w: fds[1]}
	}
	if p.size != size {
		if got, err := unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, size); err == nil {
			p.size = got
		} else if got, err := unix.FcntlInt(uintptr(p.w), unix.F_GETPIPE_SZ, 0); err == nil {
			// Over the unprivileged limit: keep what the kernel gave us.
			p.size = got
		} else {
			p.size = 64 << 10
		}
		if p.size <= 0 {
			p.size = 64 << 10
		}
	}
	return p, nil
}

// putPipe returns an empty pipe to the pool; a pipe with bytes left in it
// (after a failed write) is closed instead.
func putPipe(p *pipe, empty bool) {
	if empty {
		select {
		case pipePool <- p:
			return
		default:
		}
	}
	unix.Close(p.r)
	unix.Close(p.w)
}

const spliceFlags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK

// spliceCopy moves bytes src -> pipe -> dst until src's EOF (nil error) or an
// error. Readiness waits go through the netpoller via RawConn callbacks, so
// deadlines and Close on either conn interrupt it.
func spliceCopy(dst, src net.Conn, pipeSize int, act *activity) (int64, error) {
	srcRaw, err := src.(syscall.Conn).SyscallConn()
	if err != nil {
		return 0, err
	}
	dstRaw, err := dst.(syscall.Conn).SyscallConn()
	if err != nil {
		return 0, err
	}
	p, err := getPipe(pipeSize)
	if err != nil {
		return bufferCopy(dst, src, act)
	}
	inPipe := 0
	defer func() { putPipe(p, inPipe == 0) }()

	var n int64
	for {
		// socket -> pipe (the pipe is empty here, so EAGAIN means "no data yet").
		var nr int64
		var serr error
		rerr := srcRaw.Read(func(fd uintptr) bool {
			for {
				nr, serr = unix.Splice(int(fd), nil, p.w, nil, p.size, spliceFlags)
				if serr != unix.EINTR {
					break
				}
			}
			return serr != unix.EAGAIN
		})
		if rerr == nil {
			rerr = serr
		}
		if rerr != nil {
			return n, fmt.Errorf("read: %w", rerr)
		}
		if nr == 0 {
			return n, nil // EOF
		}
		inPipe = int(nr)
		act.touch()
		// pipe -> socket, until the pipe is empty (EAGAIN means the socket is full).
		for inPipe > 0 {
			var nw int64
			werr := dstRaw.Write(func(fd uintptr) bool {
				for {
					nw, serr = unix.Splice(p.r, nil, int(fd), nil, inPipe, spliceFlags)
					if serr != unix.EINTR {
						break
					}
				}
				return serr != unix.EAGAIN
			})
			if werr == nil {
				werr = serr
			}
			if werr == nil && nw == 0 {
				werr = errors.New("splice wrote 0 bytes")
			}
			if werr != nil {
				return n, fmt.Errorf("write: %w", werr)
			}
			inPipe -= int(nw)
			n += nw
			act.touch()
		}
	}
}
