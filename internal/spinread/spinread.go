package spinread

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

// busyGap: a poll's round (a read and a yield) that took longer than this
// was descheduled: another thread had the CPU (the yield gave it away, or
// the scheduler or the hypervisor took it). On a busy machine the poll
// then stops and counts as a miss: it would only take turns with the
// threads that need the CPU, its peer among them.
const busyGap = 20 * time.Microsecond

// maxBackoff: after n polls in a row that missed, the next 2^min(n-1,
// maxBackoff) waits park without polling.
const maxBackoff = 10

// Reader is an io.Reader over a socket whose Read may poll before it
// blocks. Reads are one at a time (as a bufio.Reader's are); Arm and Disarm
// may come from any goroutine.
type Reader struct {
	c     net.Conn        // the blocking read
	rc    syscall.RawConn // nil: the socket cannot be polled (TLS, a pipe)
	bound atomic.Int64    // (ns) 0: never polls
	gap   atomic.Int64    // (ns) busyGap; 0: never stops for a late round

	armed atomic.Bool // the next Reads may poll
	lone  func() bool // nil, or false when the reader is no longer alone
	// (Read) misses counts the polls in a row that found nothing within
	// the bound; the next skip waits park without polling.
	misses, skip int

	// One non-blocking read's state, for fn (no allocation per read).
	p   []byte
	n   int
	err error
	fn  func(fd uintptr) bool

	// Counters, for tests and stats: polls started; ended by data within
	// the bound, by the end of the stream, an error, a deadline or a close
	// (the blocking read then reports it), given up at the bound, stopped
	// because the reader was no longer alone, stopped because a round was
	// descheduled (busyGap; also counted in Misses).
	Polls, Hits, Ended, Misses, Crowded, Busy atomic.Uint64
}

// New returns a Reader of c that polls for at most bound (0: never) when
// armed, while lone (nil: always) reports true. Only a c with a
// syscall.RawConn is polled (a *net.UnixConn or *net.TCPConn; not a
// *tls.Conn, whose bytes need decrypting).
func New(c net.Conn, bound time.Duration, lone func() bool) *Reader {
	r := &Reader{c: c, lone: lone}
	r.bound.Store(int64(bound))
	r.gap.Store(int64(busyGap))
	if sc, ok := c.(syscall.Conn); ok && bound > 0 {
		if rc, err := sc.SyscallConn(); err == nil {
			r.rc = rc
		}
	}
	r.fn = r.readOnce
	return r
}

// CanPoll reports whether Reads may ever poll.
func (r *Reader) CanPoll() bool { return r.rc != nil }

// SetBound changes the bound of the next polls (tests; at least 1ns).
func (r *Reader) SetBound(d time.Duration) { r.bound.Store(int64(max(d, 1))) }

// SetBusyGap changes the gap after which a late round stops a poll (tests;
// 0: never).
func (r *Reader) SetBusyGap(d time.Duration) { r.gap.Store(int64(d)) }

// Arm lets the next Reads poll, until Disarm.
func (r *Reader) Arm() { r.armed.Store(true) }

// Disarm makes Reads block at once again.
func (r *Reader) Disarm() { r.armed.Store(false) }

// readOnce is the RawConn callback: one non-blocking read, done either way.
func (r *Reader) readOnce(fd uintptr) bool {
	r.n, r.err = syscall.Read(int(fd), r.p)
	return true
}

// Read reads into p. Armed, with nothing to read yet, it first polls the
// socket for up to the bound (see the package doc), then blocks.
func (r *Reader) Read(p []byte) (int, error) {
	if r.rc == nil || len(p) == 0 || !r.armed.Load() {
		return r.c.Read(p)
	}
	if r.lone != nil && !r.lone() {
		// No longer alone (the armed holder reads on for other calls'
		// frames): never a poll, not even one read, with others in flight.
		return r.c.Read(p)
	}
	if r.skip > 0 {
		// Recent polls missed: park, and poll again after skip waits.
		r.skip--
		return r.c.Read(p)
	}
	r.Polls.Add(1)
	yield := runtime.GOMAXPROCS(0) == 1 // else the peer, if in this process, runs on another P
	bound, gap := time.Duration(r.bound.Load()), time.Duration(r.gap.Load())
	t0 := time.Now()
	last := t0
	r.p = p
	defer func() { r.p = nil }()
	for {
		if err := r.rc.Read(r.fn); err != nil {
			r.Ended.Add(1)
			break // a deadline passed or the socket closed: the blocking read says which
		}
		if r.n > 0 {
			r.misses = 0
			r.Hits.Add(1)
			return r.n, nil
		}
		if r.err != syscall.EAGAIN && r.err != syscall.EINTR {
			r.Ended.Add(1)
			break // the end of the stream or an error: the blocking read reports it
		}
		now := time.Now()
		busy := gap > 0 && now.Sub(last) > gap
		if busy || now.Sub(t0) >= bound {
			if busy {
				r.Busy.Add(1)
			}
			r.Misses.Add(1)
			r.skip = 1 << min(r.misses, maxBackoff)
			r.misses++
			break
		}
		last = now
		if r.lone != nil && !r.lone() {
			r.Crowded.Add(1)
			break
		}
		if yield {
			runtime.Gosched()
		}
		osYield()
	}
	return r.c.Read(p)
}

var _ io.Reader = (*Reader)(nil)
