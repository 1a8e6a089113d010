package proxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
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

// smallBufSize is the read size of the small-message path and the threshold
// between the two paths: a read that fills it switches to splice, a splice
// that moves less than it switches back.
const smallBufSize = 32 << 10

var smallPool = sync.Pool{New: func() any { b := make([]byte, smallBufSize); return &b }}

// spliceCopy moves bytes from src to dst until src's EOF (nil error) or an
// error. Bulk data goes src -> pipe -> dst with splice(2); small messages
// (a read that does not fill smallBufSize) go through read/write on a small
// buffer, which costs the same two syscalls without the pipe bookkeeping.
// With allowSplice false, bulk (a read that fills the small buffer) is read
// through a 256 KiB buffer instead, until a read comes back small.
// Readiness waits go through the netpoller via RawConn callbacks, so deadlines
// and Close on either conn interrupt it.
func spliceCopy(dst, src net.Conn, pipeSize int, allowSplice bool, act *activity) (int64, error) {
	srcRaw, err := src.(syscall.Conn).SyscallConn()
	if err != nil {
		return 0, err
	}
	dstRaw, err := dst.(syscall.Conn).SyscallConn()
	if err != nil {
		return 0, err
	}
	small := smallPool.Get().(*[]byte)
	defer smallPool.Put(small)
	c := &copier{buf: *small}
	var big *[]byte // a bufPool buffer while a copy-only direction moves bulk
	defer func() {
		if big != nil {
			bufPool.Put(big)
		}
		if c.p != nil {
			putPipe(c.p, c.inPipe == 0)
		}
	}()
	// The callbacks are made once: a func literal per syscall would escape
	// (RawConn takes an interface) and allocate on every message.
	read, write, spliceIn, spliceOut := c.read, c.write, c.spliceIn, c.spliceOut

	var n int64
	bulk := false
	for {
		if !bulk || c.p == nil {
			// read(2) into buf.
			if err := srcRaw.Read(read); err != nil {
				return n, fmt.Errorf("read: %w", err)
			}
			if c.err != nil {
				return n, fmt.Errorf("read: %w", c.err)
			}
			nr := int(c.n)
			if nr <= 0 {
				return n, nil // EOF
			}
			act.touch()
			for c.off, c.end = 0, nr; c.off < c.end; {
				werr := dstRaw.Write(write)
				if werr == nil {
					werr = c.err
				}
				if werr == nil && c.n <= 0 {
					werr = errors.New("write returned 0 bytes")
				}
				if werr != nil {
					return n, fmt.Errorf("write: %w", werr)
				}
				c.off += int(c.n)
				n += c.n
			}
			act.touch()
			switch {
			case nr == len(c.buf) && allowSplice:
				// More is probably queued: move it with splice.
				bulk = true
				if c.p == nil {
					if c.p, err = getPipe(pipeSize); err != nil {
						c.p, bulk = nil, false
					}
				}
			case nr == len(c.buf) && big == nil:
				// Copying only: read bulk in big chunks. The big buffer is
				// held only while bulk flows, so idle conns cost 32 KiB.
				big = bufPool.Get().(*[]byte)
				c.buf = *big
			case nr < smallBufSize && big != nil:
				bufPool.Put(big)
				big, c.buf = nil, *small
			}
			continue
		}

		// socket -> pipe (the pipe is empty here, so EAGAIN means "no data yet").
		if err := srcRaw.Read(spliceIn); err != nil {
			return n, fmt.Errorf("read: %w", err)
		}
		if c.err != nil {
			return n, fmt.Errorf("read: %w", c.err)
		}
		if c.n == 0 {
			return n, nil // EOF
		}
		if c.n < smallBufSize {
			bulk = false
		}
		c.inPipe = int(c.n)
		act.touch()
		// pipe -> socket, until the pipe is empty (EAGAIN means the socket is full).
		for c.inPipe > 0 {
			werr := dstRaw.Write(spliceOut)
			if werr == nil {
				werr = c.err
			}
			if werr == nil && c.n == 0 {
				werr = errors.New("splice wrote 0 bytes")
			}
			if werr != nil {
				return n, fmt.Errorf("write: %w", werr)
			}
			c.inPipe -= int(c.n)
			n += c.n
			act.touch()
		}
	}
}

// copier is one direction's state, shared with its RawConn callbacks. Each
// callback leaves its syscall's result in n and err and returns false (wait
// for readiness, then call again) only on EAGAIN.
type copier struct {
	buf      []byte
	off, end int // buf[off:end] is still to be written
	p        *pipe
	inPipe   int // bytes in p
	n        int64
	err      error
}

func (c *copier) done() bool { return c.err != unix.EAGAIN }

func (c *copier) read(fd uintptr) bool {
	for {
		var k int
		k, c.err = readNB(int(fd), c.buf)
		c.n = int64(k)
		if c.err != unix.EINTR {
			return c.done()
		}
	}
}

func (c *copier) write(fd uintptr) bool {
	for {
		var k int
		k, c.err = writeNB(int(fd), c.buf[c.off:c.end])
		c.n = int64(k)
		if c.err != unix.EINTR {
			return c.done()
		}
	}
}

func (c *copier) spliceIn(fd uintptr) bool {
	for {
		c.n, c.err = spliceNB(int(fd), c.p.w, c.p.size)
		if c.err != unix.EINTR {
			return c.done()
		}
	}
}

func (c *copier) spliceOut(fd uintptr) bool {
	for {
		c.n, c.err = spliceNB(c.p.r, int(fd), c.inPipe)
		if c.err != unix.EINTR {
			return c.done()
		}
	}
}

// Bulk splices are issued with RawSyscall: every fd here is non-blocking
// (sockets from the net package, pipes made O_NONBLOCK, SPLICE_F_NONBLOCK),
// so none of them can block, and skipping the runtime's entersyscall/
// exitsyscall bookkeeping (which also wakes sysmon) cut the proxy's CPU per
// GB by about a quarter side by side (tools/benchproxy -alt-bin). The small-message
// read/write path keeps the ordinary syscall wrappers: raw ones there made the
// 64 B round-trip tail worse (mean 85 µs vs 65 µs, same median, same run).

// spliceNB is splice(2) between two non-blocking fds, no offsets.
func spliceNB(in, out, n int) (int64, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), spliceFlags)
	if e != 0 {
		return 0, e
	}
	return int64(r), nil
}

// readNB is read(2) on a non-blocking fd.
func readNB(fd int, b []byte) (int, error) { return unix.Read(fd, b) }

// writeNB is write(2) on a non-blocking fd.
func writeNB(fd int, b []byte) (int, error) { return unix.Write(fd, b) }
