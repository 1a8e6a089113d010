package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/uds"
)

// JoinOptions tunes Join. The zero value is ready to use.
type JoinOptions struct {
	// IdleTimeout closes both conns when no byte has moved in either direction
	// for this long. Zero means no idle timeout.
	IdleTimeout time.Duration
	// PipeSize is the splice pipe capacity per direction (Linux). Default
	// 1 MiB, capped by what the kernel allows (/proc/sys/fs/pipe-max-size
	// for non-root).
	PipeSize int
	// Linger is how long the healthy direction may keep delivering bytes that
	// are already in flight after the other direction failed. Default 1s.
	Linger time.Duration
	// NoSplice forces the portable copy path (for comparison and tests).
	NoSplice bool
	// SpliceUnixToTCP splices the unix -> TCP direction too. By default that
	// one direction copies through a user-space buffer: splicing into a TCP
	// socket pages that came from a unix socket measured slower than copying
	// them (tools/benchproxy -dir unix-tcp; see docs/performance.md), while every
	// other combination is faster, and lighter on CPU, with splice.
	SpliceUnixToTCP bool
	// SocketBuffer is SO_SNDBUF for the unix-domain sockets among the two,
	// in bytes. Unix stream sockets do not autotune: the sender's SO_SNDBUF
	// (net.core.wmem_default, 208 KiB on most systems) bounds the bytes in
	// flight, so a bulk transfer wakes the proxy and the peer every ~200 KB.
	// Default uds.DefaultSocketBuffer; the kernel caps it at net.core.wmem_max
	// (raise that sysctl to benefit). Negative keeps the kernel default. TCP
	// sockets are left to the kernel's autotuning.
	SocketBuffer int
}

// DefaultPipeSize is the splice pipe capacity used when JoinOptions.PipeSize is 0.
const DefaultPipeSize = 1 << 20

// JoinResult reports what Join moved and why it ended.
type JoinResult struct {
	// AtoB and BtoA are the bytes delivered in each direction.
	AtoB, BtoA int64
	// SplicedAtoB and SplicedBtoA report which directions used splice(2).
	SplicedAtoB, SplicedBtoA bool
	// Err is the first error (nil when both sides ended with EOF). It is
	// ErrIdleTimeout after an idle timeout and context.Canceled (or ctx's
	// cause) when ctx ended.
	Err error
}

// ErrIdleTimeout is JoinResult.Err when the idle timeout closed the connection.
var ErrIdleTimeout = errors.New("idle timeout: no bytes moved in either direction")

// activity is the last time any byte moved, in unix nanoseconds.
type activity struct{ last atomic.Int64 }

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// dirResult is the end of one direction.
type dirResult struct {
	aToB bool
	n    int64
	err  error // nil on a clean EOF
}

// Join copies a->b and b->a until both directions have ended, forwarding
// half-closes, then closes both conns. ctx ending closes both at once.
// Both conns are always closed when Join returns.
func Join(ctx context.Context, a, b net.Conn, opts JoinOptions) JoinResult {
	if opts.PipeSize <= 0 {
		opts.PipeSize = DefaultPipeSize
	}
	if opts.SocketBuffer == 0 {
		opts.SocketBuffer = uds.DefaultSocketBuffer
	}
	if opts.Linger <= 0 {
		opts.Linger = time.Second
	}
	var closeOnce sync.Once
	var why atomic.Value // error that forced the close
	closeBoth := func(reason error) {
		closeOnce.Do(func() {
			if reason != nil {
				why.Store(reason)
			}
			a.Close()
			b.Close()
		})
	}
	stop := context.AfterFunc(ctx, func() { closeBoth(context.Cause(ctx)) })
	defer stop()

	act := &activity{}
	act.touch()
	if opts.IdleTimeout > 0 {
		var timer *time.Timer
		var mu sync.Mutex
		var check func()
		check = func() {
			idle := time.Since(time.Unix(0, act.last.Load()))
			if idle >= opts.IdleTimeout {
				closeBoth(ErrIdleTimeout)
				return
			}
			mu.Lock()
			timer.Reset(opts.IdleTimeout - idle)
			mu.Unlock()
		}
		mu.Lock()
		timer = time.AfterFunc(opts.IdleTimeout, check)
		mu.Unlock()
		defer timer.Stop()
	}

	ra, rb := rawConn(a), rawConn(b)
	if opts.SocketBuffer > 0 {
		setBuffers(ra, opts.SocketBuffer)
		setBuffers(rb, opts.SocketBuffer)
	}
	spliced := !opts.NoSplice && canSplice(ra) && canSplice(rb)
	useSplice := func(dst, src net.Conn) bool {
		if !spliced {
			return false
		}
		_, fromUnix := src.(*net.UnixConn)
		_, toTCP := dst.(*net.TCPConn)
		return opts.SpliceUnixToTCP || !(fromUnix && toTCP)
	}
	var out JoinResult
	out.SplicedAtoB, out.SplicedBtoA = useSplice(rb, ra), useSplice(ra, rb)
	res := make(chan dirResult, 2)
	run := func(dst, src net.Conn, aToB bool) {
		var n int64
		var err error
		if spliced {
			// Sockets on Linux: raw non-blocking syscalls, splice(2) for bulk
			// unless this direction copies.
			n, err = spliceCopy(dst, src, opts.PipeSize, aToB && out.SplicedAtoB || !aToB && out.SplicedBtoA, act)
		} else {
			n, err = bufferCopy(dst, src, act)
		}
		if err == nil {
			// Clean EOF: everything read has been written; pass the EOF on.
			closeWrite(dst)
		}
		res <- dirResult{aToB: aToB, n: n, err: err}
	}
	go run(rb, ra, true)
	go run(ra, rb, false)

	first := <-res
	record(&out, first)
	if first.err != nil {
		// Let the other direction deliver what is already in flight, briefly.
		deadline := time.Now().Add(opts.Linger)
		if first.aToB {
			rb.SetReadDeadline(deadline)
		} else {
			ra.SetReadDeadline(deadline)
		}
	}
	second := <-res
	record(&out, second)
	closeBoth(nil)
	if w, ok := why.Load().(error); ok && w != nil {
		out.Err = w
	} else if out.Err == nil && second.err != nil && !errors.Is(second.err, os.ErrDeadlineExceeded) {
		out.Err = second.err
	}
	return out
}

func record(out *JoinResult, d dirResult) {
	if d.aToB {
		out.AtoB = d.n
	} else {
		out.BtoA = d.n
	}
	if out.Err == nil && d.err != nil {
		out.Err = d.err
	}
}

// rawConn unwraps conns that expose the socket underneath (*uds.Conn and
// similar wrappers with a NetConn method).
func rawConn(c net.Conn) net.Conn {
	for range 8 {
		if _, ok := c.(*tls.Conn); ok {
			// Its NetConn is the ciphertext: bytes must go through it.
			break
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		inner := w.NetConn()
		if inner == nil || inner == c {
			break
		}
		c = inner
	}
	return c
}

// setBuffers sets SO_SNDBUF on a unix socket, best effort (the kernel caps
// it at net.core.wmem_max). Other conns keep their defaults: TCP autotunes.
func setBuffers(c net.Conn, size int) { _ = uds.SetSendBuffer(c, size) }

// closeWrite shuts down the write side (shutdown(SHUT_WR)) where possible.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// bufPool holds copy buffers for the portable path.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// bufferCopy is the portable path: read into a pooled buffer, write it all.
// It returns nil at a clean EOF.
func bufferCopy(dst, src net.Conn, act *activity) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var n int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			act.touch()
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return n, werr
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
