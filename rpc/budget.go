package rpc

import "time"

// Memory budget (protocol/spec.md leaves it to the server): the bytes a
// connection holds are its calls' request payloads, read and not yet
// answered, plus unary responses and NDJSON reply lines made and not yet
// written.
//
//   - Per connection (MaxConnBytes): before reading a request's payload, a
//     reader whose connection already holds something waits until the
//     payload fits. A client that sends faster than it reads its answers
//     fills its budget; its reader then stops reading until calls finish, so
//     the socket's buffers and then the client wait: the connection itself
//     waits, nobody else. A connection holding nothing may always start one
//     call (up to MaxFrame), so every connection makes progress.
//   - In total (MaxServerBytes): bytes count once they have arrived (a
//     payload announced and not sent costs only what was sent, and
//     FrameTimeout bounds how long). While the total is over the limit, a
//     reader whose connection holds something waits before its next frame;
//     one holding nothing never waits, so a well-behaved client with nothing
//     in flight is never held up by what others hold.
//
// Invariants: c.held (under c.mu) grows in acquire and hold (run does hold's
// work for a unary response made apart from its request, in the critical
// section that takes the call out of c.calls) and shrinks in
// release/releaseConn; s.held (atomic) grows in arrived and hold and shrinks
// in release. Every byte is given back exactly once: by run when the answer
// is written (release's work, in run's last critical section), by sendItem
// for a stream's request before it first waits for credit (a stream waiting
// on its client must not keep the reader from reading that very credit), or
// by releaseConn when the payload could not be read.

// budgetPoll is how often a reader waiting for the server's total budget
// looks again (another connection's release does not wake it).
const budgetPoll = 10 * time.Millisecond

// acquire waits until n more bytes fit the connection's budget (or the
// connection holds nothing, or closes), then adds them to it. The reader
// calls it before reading a request's payload; while it waits the sweeper
// does not count the unread frame against FrameTimeout. The server's total
// learns of the bytes when they have arrived (arrived).
func (c *serverConn) acquire(n int64) {
	c.mu.Lock()
	limit := c.s.opts.MaxConnBytes
	if c.ndSem != nil {
		// An NDJSON byte costs about three (the line, its data, the reply
		// line) and a parse: a quarter of the budget holds as much.
		limit /= 4
	}
	if !c.closed && c.held > 0 && c.held+n > limit {
		c.stalled.Store(true)
		c.mu.Unlock()
		c.w.Push() // queued answers (frameLoop) must not wait with the reader
		c.mu.Lock()
		for !c.closed && c.held > 0 && c.held+n > limit {
			c.mu.Unlock()
			<-c.budgetWake // release and close signal it
			c.mu.Lock()
		}
		c.stalled.Store(false) // (no atomic store per call when it fits)
	}
	c.held += n
	c.mu.Unlock()
}

// arrived adds n acquired bytes, now read, to the server's total.
func (c *serverConn) arrived(n int64) { c.s.held.Add(n) }

// waitServerBudget holds the reader, before its next frame, while the
// server's total is over MaxServerBytes and this connection holds
// something. One atomic load when the total is under the limit.
func (c *serverConn) waitServerBudget() {
	o := &c.s.opts
	if c.s.held.Load() <= o.MaxServerBytes {
		return
	}
	c.w.Push() // queued answers (frameLoop) must not wait with the reader
	c.mu.Lock()
	for !c.closed && c.held > 0 && c.s.held.Load() > o.MaxServerBytes {
		c.stalled.Store(true)
		c.mu.Unlock()
		t := time.NewTimer(budgetPoll)
		select {
		case <-c.budgetWake:
		case <-t.C:
		}
		t.Stop()
		c.mu.Lock()
	}
	c.stalled.Store(false)
	c.mu.Unlock()
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

// releaseConn gives back n bytes acquired but never arrived.
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
}
