package rpc

import (
	"errors"
	"os"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// The server's read role for bidi and client-streaming handlers (the
// states, transitions and lock invariants are tabled in docs/internals.md,
// "Server"). One goroutine at a time reads a connection: the one holding
// the read role. Usually that is a frameLoop goroutine; with inline unary
// handlers the role can move to a new frameLoop goroutine (inline.go). A
// handler waiting in recv for its next request item can hold it too, so a
// ping-pong round trip needs no hand-off between the reader and the
// handler goroutine:
//
//   - The reader passes the role (passLead) right after it queued a request
//     item for a call whose recv is parked (reqInbox.waiting), nothing else
//     buffered, and whose handler is known to come back to recv within a
//     tick (leadable). The frameLoop then returns (as after an inline
//     hand-off); c.inline becomes run<<2|inlineRunning and the inbox's role
//     that same value.
//   - The handler takes its item with the role still held: to the watchdog
//     it is an inline run (inline.go), so if it does not come back to recv
//     within about two ticks, the watchdog takes the role from it and starts
//     a frameLoop, as for a slow inline handler.
//   - Its next recv swaps c.inline from that value to run<<2|inlineLeading
//     (failing when the watchdog took it) and reads frames itself (lead):
//     request items and ends of any call (queued in their inboxes, as the
//     reader does), stream_credit, cancel and shm_release frames. With its
//     own item in it returns it, the role held again as a new inline run.
//     Any other frame (a request, a ping, a frame larger than the read
//     buffer), a read error, its own request_end, its ctx ending (a read
//     deadline interrupts the wait: interruptLead), or the server's memory
//     budget over its limit, and it steps aside: c.inline back to idle and a
//     new frameLoop goroutine reads on from the same frame boundary (lead
//     only peeks at a frame before it is complete).
//   - A handler that returns, whose recv fails or ends, or whose send must
//     wait for stream credit gives a role it holds back (dropRole: a
//     frameLoop goroutine reads on).
//
// Only the holder changes c.inline, except for the watchdog's
// compare-and-swap from a running value; the run number in the value makes
// a stale holder's swap fail, so the role is never held twice.

// inlineLeading is the low bits of c.inline while a handler's recv reads
// the socket (lead): not a run the watchdog looks at.
const inlineLeading uint32 = 3

// leadable reports whether a bidi or client-streaming handler may hold the
// read role while it works on an item: its time between recvs (handler.cost,
// timed on every item while it is not leadable, else one in untimedRuns;
// raised by a watchdog hand-off, runsLong) is known and under a tick. A
// handler that works longer would hold the other calls of its connection up
// until the watchdog takes the role (about two ticks) on every item; it gets
// its items from the reader instead.
func (h *handler) leadable() bool {
	c := h.cost.Load()
	return c >= 0 && c < int64(inlineTick)
}

// passLead gives the read role to in's handler, parked in recv for the item
// the reader just queued, and reports whether it did (the reader then stops
// reading). Called by the reader with nothing buffered and no answer queued.
func (c *serverConn) passLead(in *reqInbox) bool {
	if c.s.noBidiLead || c.noDeadlines {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	// The item must still be queued: had recv taken it already and parked
	// again, it would hold the role parked, with nothing to wake it. Queued
	// and waiting, recv is parked or about to be woken by the item's signal,
	// and takes the item, and the role with it, under in.mu.
	if !in.waiting || in.head == len(in.q) || in.done || in.ended || in.role != 0 || !in.h.leadable() {
		return false
	}
	v := c.inlineSeq.Add(1)<<2 | inlineRunning
	if c.inlineH.Load() != in.h {
		c.inlineH.Store(in.h) // a watchdog hand-off marks it slow (runsLong)
	}
	c.inline.Store(v)
	in.role = v
	c.s.bidiPasses.Add(1)
	if c.s.watchAsleep.Load() {
		c.s.wakeWatchdog()
	}
	return true
}

// lead reads frames as the holder of the read role, for the call of in
// whose recv found no item queued, until that call's item is in (the role
// stays with the handler), or it steps aside (a frameLoop reads on).
func (c *serverConn) lead(in *reqInbox, hc *handlerCtx, role uint32) {
	lv := role&^3 | inlineLeading
	if !c.inline.CompareAndSwap(role, lv) {
		return // the watchdog took the role while the handler was busy
	}
	c.mu.Lock()
	c.leadIn = in
	// The only call: poll for its item before parking (ServerOptions.NoSpin).
	lone := c.armLoneLocked(1)
	c.mu.Unlock()
	in.leading.Store(true) // (after leadIn: a cancel that sees it can interrupt)
	keep := false
read:
	for hc.Err() == nil {
		if c.s.held.Load() > c.s.opts.MaxServerBytes {
			break // the reader waits for the budget (waitServerBudget)
		}
		if c.shmQueued.Load() {
			c.shmQueued.Store(false)
			c.w.Push()
		}
		c.markBoundary(c.r.Buffered())
		c.growReader()
		h, err := c.r.PeekFrame()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.mu.Lock()
				c.disarmLeadLocked()
				c.mu.Unlock()
				continue // interrupted: its ctx ended, or a stale interrupt
			}
			break // the reader meets it again and ends the connection
		}
		switch h.Type {
		case frame.TypeRequestData, frame.TypeRequestEnd, frame.TypeCancel, frame.TypeStreamCredit, frame.Type(shm.TypeRelease):
		default:
			break read
		}
		if _, err := c.r.ReadHeader(); err != nil {
			break // (it is buffered: not seen)
		}
		switch h.Type {
		case frame.TypeCancel:
			if !c.onCancel(&h) {
				break read
			}
		case frame.TypeStreamCredit:
			if !c.onStreamCredit(&h) {
				break read
			}
		case frame.Type(shm.TypeRelease): // the client took response items from the region
			if err := c.onShmRelease(&h); err != nil {
				c.shmFailed(err)
				break read
			}
		default:
			got, ok := c.onRequestItem(&h)
			if !ok {
				break read // the connection fails; the reader ends its loop
			}
			if got == in {
				keep = h.Type == frame.TypeRequestData && in.h.leadable()
				if keep {
					c.s.bidiLedItems.Add(1)
				}
				break read
			}
		}
	}
	if lone {
		c.spin.Disarm()
	}
	in.leading.Store(false)
	c.mu.Lock()
	c.leadIn = nil
	c.disarmLeadLocked()
	c.mu.Unlock()
	if keep {
		v := c.inlineSeq.Add(1)<<2 | inlineRunning
		if c.inlineH.Load() != in.h {
			c.inlineH.Store(in.h)
		}
		c.inline.Store(v)
		in.mu.Lock()
		in.role = v
		in.mu.Unlock()
		if c.s.watchAsleep.Load() {
			c.s.wakeWatchdog()
		}
		return
	}
	c.inline.Store(inlineIdle)
	c.startReader()
}

// armLoneLocked arms the lone waiter's poll (ServerOptions.NoSpin,
// internal/spinread) for the holder of the read role about to wait for the
// client's next frame, when the connection has exactly calls calls in flight
// (a bidi handler's lead: its own one; the reader after an inline call was
// answered: none) and no call slots (their calls do not come on the socket),
// and reports whether it did: the holder disarms it (c.spin.Disarm) when its
// read returns. No call can open while the holder reads (only it reads
// calls), so the poll needs no lone check of its own. Called with mu held.
func (c *serverConn) armLoneLocked(calls int) bool {
	if c.spin != nil && len(c.calls) == calls && c.slotCalls == nil {
		c.spin.Arm()
		return true
	}
	return false
}

// dropRole gives back the read role in's handler holds, if it does (and the
// watchdog did not take it meanwhile).
func (in *reqInbox) dropRole() {
	in.mu.Lock()
	v := in.role
	in.role = 0
	in.mu.Unlock()
	in.c.releaseRole(v)
}

// releaseRole ends the inline run v of a handler holding the read role: a
// frameLoop goroutine reads on. Nothing when v is 0 or the role moved on.
func (c *serverConn) releaseRole(v uint32) {
	if v != 0 && c.inline.CompareAndSwap(v, inlineIdle) {
		c.startReader()
	}
}

// startReader starts a frameLoop goroutine for the read role a handler let
// go.
func (c *serverConn) startReader() {
	c.workers.Add(1)
	go func() {
		defer c.workers.Done()
		c.frameLoop()
	}()
}

// interruptLead ends the socket wait of in's recv, which reads as the
// holder of the read role, when its call's ctx ends: a read deadline in the
// past, armed only while in leads (leadIn, under mu) and cleared under mu
// before the role leaves it, so it never reaches another reader.
func (c *serverConn) interruptLead(in *reqInbox) {
	c.mu.Lock()
	if c.leadIn == in && !c.leadArmed && !c.closed {
		c.leadArmed = true
		c.raw.SetReadDeadline(aLongTimeAgo)
	}
	c.mu.Unlock()
}

func (c *serverConn) disarmLeadLocked() {
	if c.leadArmed {
		c.leadArmed = false
		c.raw.SetReadDeadline(time.Time{})
	}
}
