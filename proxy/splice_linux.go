package proxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"unsafe"

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
// With allowSplice false every read goes through a 256 KiB buffer instead.
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
	var p *pipe
	inPipe := 0
	defer func() {
		if p != nil {
			putPipe(p, inPipe == 0)
		}
	}()
	pool := &smallPool
	if !allowSplice {
		pool = &bufPool // copying only: read big chunks
	}
	bp := pool.Get().(*[]byte)
	defer pool.Put(bp)
	buf := *bp

	var n int64
	bulk := false
	for {
		if !bulk || p == nil {
			// read(2) into buf.
			var nr int
			var serr error
			rerr := srcRaw.Read(func(fd uintptr) bool {
				nr, serr = ignoringEINTR(func() (int, error) { return readNB(int(fd), buf) })
				return serr != unix.EAGAIN
			})
			if rerr == nil {
				rerr = serr
			}
			if rerr != nil {
				return n, fmt.Errorf("read: %w", rerr)
			}
			if nr <= 0 {
				return n, nil // EOF
			}
			act.touch()
			for off := 0; off < nr; {
				var nw int
				werr := dstRaw.Write(func(fd uintptr) bool {
					nw, serr = ignoringEINTR(func() (int, error) { return writeNB(int(fd), buf[off:nr]) })
					return serr != unix.EAGAIN
				})
				if werr == nil {
					werr = serr
				}
				if werr == nil && nw <= 0 {
					werr = errors.New("write returned 0 bytes")
				}
				if werr != nil {
					return n, fmt.Errorf("write: %w", werr)
				}
				off += nw
				n += int64(nw)
			}
			act.touch()
			if nr == len(buf) && allowSplice {
				// More is probably queued: move it with splice.
				bulk = true
				if p == nil {
					if p, err = getPipe(pipeSize); err != nil {
						p, bulk = nil, false
					}
				}
			}
			continue
		}

		// socket -> pipe (the pipe is empty here, so EAGAIN means "no data yet").
		var nr int64
		var serr error
		rerr := srcRaw.Read(func(fd uintptr) bool {
			for {
				nr, serr = spliceNB(int(fd), p.w, p.size)
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
		if nr < smallBufSize {
			bulk = false
		}
		inPipe = int(nr)
		act.touch()
		// pipe -> socket, until the pipe is empty (EAGAIN means the socket is full).
		for inPipe > 0 {
			var nw int64
			werr := dstRaw.Write(func(fd uintptr) bool {
				for {
					nw, serr = spliceNB(p.r, int(fd), inPipe)
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

func ignoringEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != unix.EINTR {
			return n, err
		}
	}
}

// The data path's syscalls are issued with RawSyscall: every fd here is
// non-blocking (sockets from the net package, pipes made O_NONBLOCK, and
// SPLICE_F_NONBLOCK), so none of them can block, and skipping the runtime's
// entersyscall/exitsyscall bookkeeping (which also wakes sysmon) cut the
// proxy's CPU per GB by about a quarter in side-by-side runs of bench/proxy.

// spliceNB is splice(2) between two non-blocking fds, no offsets.
func spliceNB(in, out, n int) (int64, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), spliceFlags)
	if e != 0 {
		return 0, e
	}
	return int64(r), nil
}

// readNB is read(2) on a non-blocking fd.
func readNB(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// writeNB is write(2) on a non-blocking fd.
func writeNB(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
