package rpc

import (
	"errors"
	"time"

	"github.com/udskit/udskit/internal/pollticker"
)

// Inline handlers. A unary request with nothing else buffered behind it runs
// on the goroutine that read it: no hand-off to a handler goroutine (which
// across processes often means waking another OS thread), so a lone caller's
// round trip costs close to what a plain socket echo does. So does one with
// requests buffered behind it when its handler has been quick lately
// (handler.quick, under quickHandler): a batch of requests read together is
// then served on the reading goroutine, and their answers, queued on the
// writer, go out with one write (frameLoop pushes them before it could wait). The server's
// watchdog (watchInline) checks every inlineTick; a handler it finds running
// inline on two ticks in a row gets the reading role taken from it: a new
// goroutine carries on reading, so a slow or blocking handler holds up other
// calls on its connection (and the cancel meant for itself) for at most about
// two ticks. The old reader finishes its call and exits. No timer is armed
// per call: resetting one would interrupt the runtime's netpoller each time.
// The watchdog parks after watchParkAfter quiet ticks and the next inline run
// wakes it, so idle connections cost no wake-ups.
//
// While calls flow and every look finds the handlers already done, the
// watchdog doubles its interval up to maxInlineTick; a look that finds one
// running brings the next look back to inlineTick. So a handler that blocks
// right after a long run of quick ones holds its connection up for at most
// about maxInlineTick+inlineTick, and one that blocks while the watchdog is
// just awake or already watching a running handler, about two inlineTicks.
// The back-off is what makes inline handlers pay: on a 2-core box, a 1 ms
// ticker in the server process (another in the client's) doubled the CPU cost
// and the p50 of a lone caller's 64 B round trip (docs/performance.md).
const (
	inlineTick    = time.Millisecond
	maxInlineTick = 16 * time.Millisecond
)

const (
	inlineIdle uint32 = iota
	inlineRunning
	inlineHandedOff
)

// handOffReading is called by the watchdog: if the inline run it saw (v) is
// still running, a new goroutine takes over the read loop. The state of a run
// carries its number, so the reader that started it cannot mistake a later
// inline run (by the new reader) for its own and go on reading too.
func (c *serverConn) handOffReading(v uint32) {
	if c.inline.CompareAndSwap(v, inlineHandedOff) {
		// Seen on two looks: it has run for a tick at least. Calls of its
		// method buffered behind it go to handler goroutines now.
		if h := c.inlineH.Load(); h != nil {
			h.runsLong(inlineTick)
		}
		c.newReader()
	}
}

// newReader starts a goroutine that carries on reading for an inline run
// that gave the reading role up (handOffReading, shmPutAnswer).
func (c *serverConn) newReader() {
	c.workers.Add(1)
	go func() {
		defer c.workers.Done()
		c.w.Push() // answers the old reader queued before the slow one
		c.frameLoop()
	}()
}

// errHandedOff: the poller's inline run was handed off (serverCalls.take).
var errHandedOff = errors.New("rpc: call-slot polling handed off")

// runInline runs a quick handler's slot call on the call-slot poller,
// watched like an inline run on the socket: a run the watchdog sees on two
// ticks in a row hands the polling to a new goroutine (handOffPolling), so
// a quick handler that blocks holds up the connection's other slot calls
// for about two ticks, not until it returns. It reports false when that
// happened: the caller, the old poller, owns no poller state any more and
// ends. The run's dst is taken out of x.dst before it starts, so a new
// poller never shares that buffer with it.
func (x *serverCalls) runInline(call *srvCall) bool {
	c := x.c
	running := x.inlineSeq.Add(1)<<2 | inlineRunning
	if x.inlineH.Load() != call.h {
		x.inlineH.Store(call.h)
	}
	dst := x.dst
	x.dst = nil
	x.inline.Store(running)
	if c.s.watchAsleep.Load() {
		c.s.wakeWatchdog()
	}
	dst = c.run(call, dst, true, true) // queue: releases are pushed by the poller
	if !x.inline.CompareAndSwap(running, inlineIdle) {
		return false
	}
	if cap(dst) > maxPooledBuf {
		dst = nil
	}
	x.dst = dst
	return true
}

// handOffPolling is handOffReading for the call-slot poller: if the inline
// run v is still running, a new goroutine polls the slots; the old one
// counts in c.workers until its run returns (finish waits for it there).
// Called by the watchdog with watchMu held, so never after finish's
// unwatchInline.
func (x *serverCalls) handOffPolling(v uint32) {
	if x.inline.CompareAndSwap(v, inlineHandedOff) {
		if h := x.inlineH.Load(); h != nil {
			h.runsLong(inlineTick)
		}
		x.c.workers.Add(1)
		go x.poll()
	}
}

// watchInline adds c to the inline-handler watchdog, starting the watchdog
// if it is not running.
func (s *Server) watchInline(c *serverConn) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.watchConns == nil {
		s.watchConns = map[*serverConn]struct{}{}
	}
	s.watchConns[c] = struct{}{}
	if !s.watching {
		s.watching = true
		go s.inlineWatchdog()
	}
}

func (s *Server) unwatchInline(c *serverConn) {
	s.watchMu.Lock()
	delete(s.watchConns, c)
	last := len(s.watchConns) == 0
	s.watchMu.Unlock()
	if last {
		s.wakeWatchdog() // so that it sees there is nothing left and ends
	}
}

// wakeWatchdog wakes the watchdog if it is parked. An inline run calls it
// after marking itself running; the cost on the hot path is one atomic load
// while the watchdog is awake.
func (s *Server) wakeWatchdog() {
	if s.watchAsleep.CompareAndSwap(true, false) {
		select {
		case s.watchWake <- struct{}{}:
		default:
		}
	}
}

// watchParkAfter is how many ticks in a row without any inline run the
// watchdog waits before it parks. While calls keep coming it stays awake,
// so a steady caller never pays for waking it.
const watchParkAfter = 10

// inlineWatchdog moves the read loop off handlers that run inline for more
// than a tick (see inlineTick). It ticks only while inline handlers run or
// ran within the last watchParkAfter ticks; otherwise it parks until the next
// inline run wakes it, so a server with idle connections does not wake up.
// It ends when no connection is left to watch.
func (s *Server) inlineWatchdog() {
	// tick is the current interval; level, the backed-off one it returns to
	// after the quick second look at a running handler.
	tick, level := inlineTick, inlineTick
	t := pollticker.NewTicker(tick)
	defer t.Stop()
	quiet := 0
	for {
		<-t.C // never a wake-up here: two looks in a row would hand off a handler that just started
		s.watchLooks.Add(1)
		s.watchMu.Lock()
		if len(s.watchConns) == 0 {
			s.watching = false
			s.watchMu.Unlock()
			return
		}
		active, running := s.watchTick()
		// Look again a tick after seeing a handler running; back off while
		// handlers come and go between looks (see maxInlineTick).
		next := inlineTick
		if !running {
			level = min(2*level, maxInlineTick)
			next = level
		}
		if next != tick {
			tick = next
			t.Reset(tick)
		}
		if active {
			quiet = 0
			s.watchMu.Unlock()
			continue
		}
		if quiet++; quiet < watchParkAfter {
			s.watchMu.Unlock()
			continue
		}
		// Park. Announce it first, then look again: an inline run marks
		// itself running before it checks watchAsleep, so either it sees
		// the announcement and wakes us, or we see it here.
		s.watchAsleep.Store(true)
		if s.watchBusy() {
			s.watchAsleep.Store(false)
			s.watchMu.Unlock()
			continue
		}
		s.watchMu.Unlock()
		t.Stop()
		<-s.watchWake // may be a stale wake-up: then it parks again after a few ticks
		tick, level = inlineTick, inlineTick
		t.Reset(tick)
		quiet = 0
	}
}

// watchTick checks every connection once, hands reading off a handler seen
// running inline on two ticks in a row, and reports whether any inline
// handler ran since the last tick (active) and whether one is running now
// and was not handed off (running). Entered with watchMu held.
func (s *Server) watchTick() (active, running bool) {
	for c := range s.watchConns {
		if x := c.slotCalls; x != nil { // (set before watchInline, never unset)
			a, r := x.watchTick()
			active, running = active || a, running || r
		}
		seq := c.inlineSeq.Load()
		if seq != c.watchLast {
			c.watchLast, active = seq, true
		}
		v := c.inline.Load()
		if v&3 != inlineRunning {
			c.watchRun = false
			continue
		}
		active = true
		if h := c.inlineH.Load(); s.noWatchLead && h != nil && h.clientStreams() { // tests: a handler holding the bidi read role (bidi_lead.go)
			c.watchRun = false
			continue
		}
		if c.watchRun && seq == c.watchSeen {
			c.handOffReading(v)
			c.watchRun = false
			continue
		}
		c.watchSeen, c.watchRun, running = seq, true, true
	}
	return active, running
}

// watchBusy reports whether an inline handler runs or has started since the
// last tick. Entered with watchMu held.
func (s *Server) watchBusy() bool {
	for c := range s.watchConns {
		if c.inline.Load()&3 == inlineRunning || c.inlineSeq.Load() != c.watchLast {
			return true
		}
		if x := c.slotCalls; x != nil && (x.inline.Load()&3 == inlineRunning || x.inlineSeq.Load() != x.watchLast) {
			return true
		}
	}
	return false
}

// watchTick is Server.watchTick for the call-slot poller's inline runs.
// Entered with watchMu held.
func (x *serverCalls) watchTick() (active, running bool) {
	seq := x.inlineSeq.Load()
	if seq != x.watchLast {
		x.watchLast, active = seq, true
	}
	v := x.inline.Load()
	if v&3 != inlineRunning {
		x.watchRun = false
		return active, false
	}
	if x.watchRun && seq == x.watchSeen {
		x.handOffPolling(v)
		x.watchRun = false
		return true, false
	}
	x.watchSeen, x.watchRun = seq, true
	return true, true
}
