package rpc

import "time"

// Memory budget (protocol/spec.md leaves it to the server): the bytes a
// connection holds are its calls' request payloads, read and not yet
// answered, plus unary responses made and not yet written. A connection
// whose client sends faster than it reads its answers fills its budget; its
// reader then stops reading until calls finish, so the socket's buffers and
// then the client wait: the connection itself waits, nobody else. The same
// holds for the server's total, except that a connection holding nothing
// may always start one call (up to MaxFrame), so every connection makes
// progress.
//
// Invariants: c.held (under c.mu) and s.held (atomic) grow only in acquire
// and hold and shrink only in release; every byte acquired for a call is
// released exactly once, by run when the call has been answered (or by
// sendItem, for a stream's request, before it first waits for credit: a
// stream that waits for the client must not keep the reader from reading
// that very credit).

// budgetPoll is how often a reader waiting for the server's total budget
// looks again (another connection's release does not wake it).
const budgetPoll = 5 * time.Millisecond

// acquire waits until n more bytes fit the connection's and the server's
// budgets (or the connection holds nothing and the server nothing either,
// or the connection closes), then adds them. The reader calls it before
// reading a request's payload; while it waits the sweeper does not count
// the unread frame against FrameTimeout.
func (c *serverConn) acquire(n int64) {
	o := &c.s.opts
	c.mu.Lock()
	for !c.closed {
		total := c.s.held.Load()
		connFull := c.held > 0 && c.held+n > o.MaxConnBytes
		serverFull := total > 0 && total+n > o.MaxServerBytes
		if !connFull && !serverFull {
			break
		}
		c.stalled.Store(true)
		c.mu.Unlock()
		if connFull {
			<-c.budgetWake // release and close signal it
		} else {
			t := time.NewTimer(budgetPoll)
			select {
			case <-c.budgetWake:
			case <-t.C:
			}
			t.Stop()
		}
		c.mu.Lock()
	}
	c.stalled.Store(false)
	c.held += n
	c.mu.Unlock()
	c.s.held.Add(n)
}

// hold adds n bytes already in memory (a response) without waiting.
func (c *serverConn) hold(n int64) {
	c.mu.Lock()
	c.held += n
	c.mu.Unlock()
	c.s.held.Add(n)
}

// release gives n bytes back and wakes a reader waiting for room.
func (c *serverConn) release(n int64) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	c.held -= n
	c.mu.Unlock()
	c.s.held.Add(-n)
	c.wakeBudget()
}

func (c *serverConn) wakeBudget() {
	select {
	case c.budgetWake <- struct{}{}:
	default:
	}
}
