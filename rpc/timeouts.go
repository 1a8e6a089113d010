package rpc

import (
	"errors"
	"io"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/internal/pollticker"
)

// Timeouts (ServerOptions.FrameTimeout, WriteTimeout, IdleTimeout) are
// enforced by one sweeper goroutine per Server, not by a deadline per read:
// arming a timer per frame would interrupt the runtime's netpoller on the
// hot path (see inlineTick). The sweeper runs while connections are open
// and ticks at a quarter of the shortest timeout (between 10 ms and 1 s), so
// a timeout fires between its value and that plus two ticks.
//
// What it reads of each connection, all without stopping its reader:
//
//   - rx, the bytes read from the socket so far (counted under the read
//     buffer), and boundary, the bytes consumed when the reader was last
//     between two frames (or NDJSON lines). rx > boundary means a frame has
//     started and not been consumed yet: it must be consumed within
//     FrameTimeout, unless the reader is stalled on the memory budget or an
//     NDJSON in-flight slot (then it is our own backpressure, not the
//     client's slowness).
//   - the writer's Progress: frames waiting to go out and no write completed
//     for WriteTimeout means the client stopped reading.
//   - no call in flight, no frame started, and boundary unchanged for
//     IdleTimeout: an idle connection, which is drained (goaway, then close).
//     Slot calls (shmcalls.go) send no frame: the poller counts its turns
//     that took a request (slotTurns), and a change counts as activity.
//
// The sweeper's fields in serverConn (sw*) are touched by the sweeper only.

var (
	errFrameTimeout = errors.New("frame not finished within the frame timeout")
	errWriteTimeout = errors.New("client read nothing within the write timeout")
)

// countingReader counts the bytes read through it into n.
type countingReader struct {
	r io.Reader
	n *atomic.Uint64
}

func (cr countingReader) Read(p []byte) (int, error) {
	k, err := cr.r.Read(p)
	cr.n.Add(uint64(k))
	return k, err
}

// markBoundary records that the reader is between two frames, having
// consumed everything before what is buffered.
func (c *serverConn) markBoundary(buffered int) {
	c.boundary.Store(c.rx.Load() - uint64(buffered))
}

func (s *Server) sweepTick() time.Duration {
	tick := time.Second
	for _, d := range []time.Duration{s.opts.FrameTimeout, s.opts.WriteTimeout, s.opts.IdleTimeout} {
		if d > 0 {
			tick = min(tick, d/4)
		}
	}
	return max(tick, 10*time.Millisecond)
}

func (s *Server) sweeps() bool {
	return s.opts.FrameTimeout > 0 || s.opts.WriteTimeout > 0 || s.opts.IdleTimeout > 0
}

// startSweeper starts the sweeper if timeouts are set and it is not running.
// Entered with s.mu held.
func (s *Server) startSweeperLocked() {
	if s.sweeping || !s.sweeps() {
		return
	}
	s.sweeping = true
	go s.sweeper()
}

func (s *Server) sweeper() {
	t := pollticker.NewTicker(s.sweepTick())
	defer t.Stop()
	var conns []*serverConn
	for now := range t.C {
		s.mu.Lock()
		if len(s.conns) == 0 {
			s.sweeping = false
			s.mu.Unlock()
			return
		}
		conns = conns[:0]
		for c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		for _, c := range conns {
			c.sweep(now)
		}
		clear(conns)
	}
}

// sweep applies the timeouts to c (see the comment at the top).
func (c *serverConn) sweep(now time.Time) {
	o := &c.s.opts
	rx, bd := c.rx.Load(), c.boundary.Load()
	started := rx > bd || c.waitingTotal.Load()
	if o.FrameTimeout > 0 && started && !c.stalled.Load() {
		if !c.swMid || c.swBd != bd {
			c.swMid, c.swBd, c.swSince = true, bd, now
		} else if now.Sub(c.swSince) > o.FrameTimeout {
			c.s.log.Debug("rpc: closing connection: frame not finished in time", "timeout", o.FrameTimeout, "cred", c.cred)
			c.close(errFrameTimeout)
			return
		}
	} else {
		c.swMid = false
	}
	if o.WriteTimeout > 0 {
		writes, waiting := c.w.Progress()
		switch {
		case !waiting || writes != c.swWrites:
			c.swWrites, c.swWriteSince = writes, time.Time{}
		case c.swWriteSince.IsZero():
			c.swWriteSince = now
		case now.Sub(c.swWriteSince) > o.WriteTimeout:
			c.s.log.Debug("rpc: closing connection: client reads nothing", "timeout", o.WriteTimeout, "cred", c.cred)
			c.close(errWriteTimeout)
			return
		}
	}
	if o.IdleTimeout > 0 {
		c.mu.Lock()
		busy := c.inFlightLocked() > 0 || c.draining
		c.mu.Unlock()
		turns := c.slotTurns.Load() // slot calls taken since the last look are activity too
		if busy || started || bd != c.swIdleBd || turns != c.swIdleTurns || c.swIdleSince.IsZero() {
			c.swIdleBd, c.swIdleTurns, c.swIdleSince = bd, turns, now
		} else if now.Sub(c.swIdleSince) > o.IdleTimeout {
			c.s.log.Debug("rpc: closing idle connection", "timeout", o.IdleTimeout, "cred", c.cred)
			c.drain()
		}
	}
}
