package rpc

import (
	"sync/atomic"
	"time"
)

// Memory budget (protocol/spec.md leaves it to the server): the bytes a
// connection holds are its calls' request payloads, read or being read and
// not yet answered, plus unary responses and NDJSON reply lines made and not
// yet written. Each call in flight also counts callCost against the server's
// total, for what it holds besides its bytes (a goroutine's stack, its
// context): 100,000 sleeping calls over 25 connections, with a few bytes of
// payload each, grew the server to 967 MiB before they counted.
//
//   - Per connection (MaxConnBytes): before reading a request's payload, a
//     reader whose connection already holds something waits until the
//     payload fits. A client that sends faster than it reads its answers
//     fills its budget; its reader then stops reading until calls finish, so
//     the socket's buffers and then the client wait: the connection itself
//     waits, nobody else. A connection holding nothing may always start one
//     call (up to MaxFrame), so every connection makes progress.
//   - In total (MaxServerBytes): a payload is reserved, whole, before it is
//     read (reserve), so what sits in half-received frames counts: 20
//     connections sending 15 of 16 MiB and then dribbling grew the server to
//     425 MiB when only payloads fully arrived counted. A reader whose
//     payload does not fit waits for room, and the frame's FrameTimeout keeps
//     running while it waits (a peer that announces a large frame has started
//     it), so announced-and-stalled frames cost a goroutine and a header each,
//     and end at FrameTimeout. Small payloads (smallPayload) of a connection
//     with nothing in flight never wait: a well-behaved client with nothing
//     in flight is never held up by what others hold. And while the total is
//     over the limit, a reader whose connection holds something or has calls
//     in flight waits before its next frame (waitServerBudget), so 400
//     never-reading clients cannot each hold a 1 MiB request and its reply
//     (725 MiB): they wait, their write timeout ends them.
//
// Invariants: c.held (under c.mu) grows in acquire and hold (run does hold's
// work for a unary response made apart from its request, in the critical
// section that takes the call out of c.calls) and shrinks in release; s.held
// (atomic) grows in reserve (acquire), hold and onRequest/serveNDJSON
// (callCost) and shrinks in release and at the end of run. Every byte is
// given back exactly once: by run when the answer is written (release's
// work, in run's last critical section), by sendItem for a stream's request
// before it first waits for credit or for space in the shared-memory half (a
// stream waiting on its client must not keep the reader from reading that
// very credit, or the shm_release frames that make room), or by release when
// the payload could not be read.

// callCost is what each call in flight counts against the server's total
// besides its bytes (budget.go's doc): a nominal share of a goroutine and its
// context (a sleeping call of the soak holds about 10 KiB in all). 64 MiB /
// 3 KiB: 21,845 calls in flight over the whole server before readers of busy
// connections wait, more than 4 connections' worth of MaxInFlight (4,096),
// so that a few connections going over their in-flight limit still reach it
// and are closed at once rather than held at the total.
const callCost = 3 << 10

// smallPayload: a payload up to this size, on a connection with nothing in
// flight, is read at once even when the server's total is over its limit.
const smallPayload = 16 << 10

// budgetPoll is how often a reader waiting for the server's total budget
// looks again (another connection's release does not wake it).
const budgetPoll = 10 * time.Millisecond

// acquire waits until n more bytes fit the connection's budget (or the
// connection holds nothing, or closes), then adds them to it, then reserves
// them in the server's total (reserve). The reader calls it before reading a
// request's payload; while it waits for its own connection's budget the
// sweeper does not count the unread frame against FrameTimeout (the wait is
// the connection's own doing); while it waits for the server's total, it
// does.
func (c *serverConn) acquire(n int64) {
	c.acquireAs(n, &c.stalled, &c.waitingTotal, c.budgetWake)
}

// acquireSlot is acquire for the call-slot poller (shmcalls.go, take): it
// waits as the reader does, but announces itself in flags of its own and
// is woken on a channel of its own, so that stalled and waitingTotal still
// say the reader waits (readerHeld, the sweeper's FrameTimeout) and a
// release wakes both waiters (run, wakeBudget).
func (c *serverConn) acquireSlot(n int64) {
	c.acquireAs(n, &c.slotStalled, &c.slotWaitingTotal, c.slotBudgetWake)
}

// acquireAs is acquire announcing the wait in stalled (the connection's
// budget) and waitingTotal (the server's total), woken on wake.
func (c *serverConn) acquireAs(n int64, stalled, waitingTotal *atomic.Bool, wake chan struct{}) {
	c.mu.Lock()
	limit := c.s.opts.MaxConnBytes
	if c.ndSem != nil {
		// An NDJSON byte costs about three (the line, its data, the reply
		// line) and a parse: a quarter of the budget holds as much.
		limit /= 4
	}
	if !c.closed && c.held > 0 && c.held+n > limit {
		stalled.Store(true)
		c.mu.Unlock()
		c.wakeStalledAnswers()
		c.w.Push() // queued answers (frameLoop) must not wait with the reader
		c.mu.Lock()
		for !c.closed && c.held > 0 && c.held+n > limit {
			c.mu.Unlock()
			c.budgetPauseOn(wake, 10*budgetPoll) // release and close signal it
			c.mu.Lock()
		}
		stalled.Store(false) // (no atomic store per call when it fits)
	}
	busy := c.held > 0 || c.inFlightLocked() > 0
	c.held += n
	c.mu.Unlock()
	c.reserveAs(n, busy, waitingTotal, wake)
}

// reserve adds n bytes to the server's total once they fit under
// MaxServerBytes (or the total is zero: a frame larger than the limit still
// goes through, alone), or at once for a small payload of a connection with
// nothing in flight (busy false), or when the connection closes.
func (c *serverConn) reserve(n int64, busy bool) {
	c.reserveAs(n, busy, &c.waitingTotal, c.budgetWake)
}

// reserveAs is reserve announcing the wait in waitingTotal, woken on wake.
func (c *serverConn) reserveAs(n int64, busy bool, waitingTotal *atomic.Bool, wake chan struct{}) {
	limit := c.s.opts.MaxServerBytes
	if n <= smallPayload && !busy {
		c.s.held.Add(n)
		return
	}
	pushed := false
	for {
		cur := c.s.held.Load()
		if cur == 0 || cur+n <= limit {
			if c.s.held.CompareAndSwap(cur, cur+n) {
				if pushed {
					waitingTotal.Store(false)
				}
				return
			}
			continue
		}
		if !pushed {
			c.w.Push() // queued answers (frameLoop) must not wait with the reader
			pushed = true
			// The frame has started even when all its bytes so far were
			// buffered before the reader's boundary (timeouts.go): the
			// sweeper counts FrameTimeout while this waits.
			waitingTotal.Store(true)
			c.wakeStalledAnswers()
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			waitingTotal.Store(false)
			c.s.held.Add(n) // given back with the rest by the failed read
			return
		}
		c.budgetPauseOn(wake, budgetPoll)
	}
}

// waitServerBudget holds the reader, before its next frame, while the
// server's total is over MaxServerBytes and this connection holds something
// or has calls in flight. One atomic load when the total is under the limit.
func (c *serverConn) waitServerBudget() {
	o := &c.s.opts
	if c.s.held.Load() <= o.MaxServerBytes {
		return
	}
	c.w.Push() // queued answers (frameLoop) must not wait with the reader
	c.mu.Lock()
	for woke := false; !c.closed && (c.held > 0 || c.inFlightLocked() > 0) && c.s.held.Load() > o.MaxServerBytes; {
		c.stalled.Store(true)
		c.mu.Unlock()
		if !woke {
			c.wakeStalledAnswers()
			woke = true
		}
		c.budgetPause(budgetPoll)
		c.mu.Lock()
	}
	c.stalled.Store(false)
	c.mu.Unlock()
}

// readerHeld reports whether the reader waits for budget: its connection's
// (acquire) or the server's total (waitServerBudget, reserve). It then reads
// no frame, no shm_release either.
func (c *serverConn) readerHeld() bool {
	return c.stalled.Load() || c.waitingTotal.Load()
}

// wakeStalledAnswers runs once the reader is held (readerHeld), before it
// waits for budget: answers waiting for space in the server's half
// (shmPutAnswer) look at readerHeld at once and go on the socket, rather
// than wait for releases the held reader will not read.
func (c *serverConn) wakeStalledAnswers() {
	if c.shm != nil {
		c.shm.alloc.Wake()
	}
}

// budgetPause is one wait of a reader held by a budget: until a release or
// close wakes it, or d passes. Then, since the reader is not reading, it
// looks whether the client hung up meanwhile and if so closes the connection
// (canceling its calls at once, as a reading server does on EOF): 25 clients
// that closed with 4,000 calls in flight each otherwise left their calls
// running to the end.
func (c *serverConn) budgetPause(d time.Duration) { c.budgetPauseOn(c.budgetWake, d) }

// budgetPauseOn is budgetPause woken on wake (the poller's: acquireSlot).
func (c *serverConn) budgetPauseOn(wake chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	select {
	case <-wake:
	case <-t.C:
	}
	t.Stop()
	if peerHungUp(c.raw, 0) {
		c.close(errPeerGone)
	}
}

// hold adds n bytes already in memory (a response) without waiting.
func (c *serverConn) hold(n int64) {
	c.mu.Lock()
	c.held += n
	c.mu.Unlock()
	c.s.held.Add(n)
}

// release gives back n bytes that counted for the connection and the server
// and wakes a reader waiting for room.
func (c *serverConn) release(n int64) {
	if n == 0 {
		return
	}
	c.s.held.Add(-n)
	c.releaseConn(n)
}

// releaseConn gives back n bytes of the connection's budget only.
func (c *serverConn) releaseConn(n int64) {
	c.mu.Lock()
	c.held -= n
	c.mu.Unlock()
	c.wakeBudget()
}

func (c *serverConn) wakeBudget() {
	select {
	case c.budgetWake <- struct{}{}:
	default:
	}
	select { // the call-slot poller's (acquireSlot)
	case c.slotBudgetWake <- struct{}{}:
	default:
	}
}
