package rpc

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/pollticker"
)

// Reading (the states and transitions, with the invariants each lock
// protects, are tabled in docs/internals.md, "Client"). A caller waiting for its response reads the socket itself when
// nobody else does: it is the leader, reads whatever frames come, hands
// other calls their results, and returns as soon as its own response is in,
// passing the role to another waiting call, or to the connection's
// background reader when only streams are left, or to nobody when nothing is
// in flight. So a lone caller's response wakes that caller directly, with no
// hand-off between goroutines. When nobody has held the role for a tick the
// background reader takes it, so goaway, pings and a lost connection are
// seen on an idle connection too; while it holds it (parked in the socket
// read, no timer), calls wait for it to deliver their results, and it lets
// the role go again after a response when nothing is left in flight.
//
// A leader only ever waits in frame.Reader.PeekFrame, which consumes nothing,
// so a leader whose ctx ends is interrupted with a read deadline (armed and
// cleared under mu, only while that leader holds the role) and steps aside
// without losing the frame boundary. A frame larger than the read buffer is
// read in place without interruption (a cancel takes effect once it is in);
// a unary leader leaves stream items to the background reader (Recv may be
// slow). A bidi call's Recv waiting for its next item leads too (awaitItem in
// bidi_client.go): it reads until its own item or end is in and passes the
// role on, and the background reader hands it the role after delivering it
// an item, so a ping-pong round trip has no hand-off between goroutines.
const (
	roleBackground uint8 = iota
	roleNone
	roleCaller
)

// idleTick is how often, at first, the background reader looks for a
// connection nobody reads; it takes the role after a full tick with no caller
// taking it. It ticks only while it does not hold the role, and every tick
// that finds callers reading doubles the interval, up to maxIdleTick, so an
// idle connection is taken over within 2*maxIdleTick of its last call. Why
// not a steady 1 ms tick: docs/internals.md, "Client".
const (
	idleTick    = time.Millisecond
	maxIdleTick = 64 * time.Millisecond
)

// aLongTimeAgo is a read deadline that has passed: it interrupts a read.
var aLongTimeAgo = time.Unix(1, 0)

// Outcomes of lead.
const (
	leadDone     = iota // cl's result is in
	leadCanceled        // cl's ctx ended; cl is forgotten and the server told
	leadPassed          // the role went to the background reader; wait for it
)

// await waits for cl's result, reading the socket itself whenever it holds
// the read role. It returns nil when cl's result is in, or the ctx error
// (the call forgotten, the server told to cancel it).
func (cc *clientConn) await(ctx context.Context, cl *call) *Error {
	cc.mu.Lock()
	// Not if cl's result is already in: a reader may have delivered it
	// between send and here, and then let the role go.
	lead := cc.role == roleNone && !cc.closed && cl.inCalls
	var watched bool
	if lead {
		cc.role, cc.leader = roleCaller, cl
		cc.leadSeq++
		watched = cc.watchLocked(ctx, cl)
	}
	cc.setWaitingLocked(cl)
	cc.mu.Unlock()
	for {
		if lead {
			switch cc.lead(ctx, cl, watched) {
			case leadDone:
				return nil
			case leadCanceled:
				return ctxError(ctx)
			}
			lead = false
		}
		select {
		case <-cl.done:
			return nil
		case <-cl.lead:
			cc.mu.Lock()
			if lead = cc.role == roleCaller && cc.leader == cl; lead {
				watched = cc.watchLocked(ctx, cl)
			}
			cc.mu.Unlock()
		case <-ctx.Done():
			cc.mu.Lock()
			removed := cc.abandonLocked(cl)
			cc.mu.Unlock()
			if removed {
				e := ctxError(ctx)
				cc.cancelRemote(cl.id, e.Code)
				return e
			}
			<-cl.done // a reader has it: the result is moments away
			return nil
		}
	}
}

// watchLocked decides how a cancel of ctx reaches cl, which is about to lead:
// it reports true when the background reader's wait already watches ctx (it
// interrupts the leader itself when ctx ends, at no cost per call). Otherwise
// lead registers a context.AfterFunc (two allocations), and the background
// reader is asked to watch ctx from its next wait on, so that the next calls
// with the same ctx (one long-lived ctx for many calls is common) need none.
func (cc *clientConn) watchLocked(ctx context.Context, cl *call) bool {
	done := ctx.Done()
	if done != nil && cc.watching == done {
		cl.watched = done
		return true
	}
	cl.watched = nil
	cc.watchWant = done
	return false
}

// armLone arms the lone waiter's poll (ClientOptions.NoSpin,
// internal/spinread) for the caller about to read as the holder of the read
// role, a unary caller (lead) or a bidi Recv (leadRecv), when its call is the
// only one in flight on the connection, and reports whether it did: the
// caller then disarms it (cc.spin.Disarm) before the role passes. A second
// call stops a poll under way (the Reader's lone check).
func (cc *clientConn) armLone() bool {
	if cc.spin != nil && cc.inflight.Load() == 1 {
		cc.spin.Arm()
		return true
	}
	return false
}

// lead reads frames as the holder of the read role until cl's own result is
// in, cl's ctx ends, or a frame needs the background reader. watched: the
// background reader watches ctx for it (watchLocked).
func (cc *clientConn) lead(ctx context.Context, cl *call, watched bool) int {
	if ctx.Done() != nil {
		if ctx.Err() != nil {
			return cc.leaderCanceled(ctx, cl)
		}
		if !watched {
			cl.leading.Store(cc)
			stop := context.AfterFunc(ctx, cl.onCancel)
			defer func() {
				stop()
				cl.leading.Store(nil)
			}()
		}
	}
	if cc.armLone() {
		// The only call: poll for its result before parking. Disarmed
		// before the role passes (here or in leaderCanceled), else when
		// lead returns.
		defer cc.spin.Disarm()
	}
	for {
		h, err := cc.r.PeekFrame()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				cc.mu.Lock()
				cc.disarmLocked()
				cc.mu.Unlock()
				if ctx.Err() != nil {
					return cc.leaderCanceled(ctx, cl)
				}
				continue // a stale interrupt meant for an earlier leader
			}
			if err != frame.ErrNotBuffered {
				cc.fail(err) // cl is registered: this delivers its result
				<-cl.done
				return leadDone
			}
		}
		large := err == frame.ErrNotBuffered
		// A frame larger than the buffer arrives at the peer's pace (a
		// dribbling server: a 16 MiB header, then a byte at a time) and
		// cannot be interrupted without losing the frame boundary. A
		// caller whose ctx can end passes it to the background reader and
		// waits for its result or its ctx in await, like a stream item.
		if h.Type == frame.TypeStreamData || large && ctx.Done() != nil {
			cc.unspin()
			cc.mu.Lock()
			cc.disarmLocked()
			cc.leader = nil
			cc.giveBackgroundLocked()
			cc.mu.Unlock()
			return leadPassed
		}
		if large {
			// (No ctx to end: the frame is read in place, at the peer's
			// pace. A stale interrupt is cleared first.)
			cc.mu.Lock()
			if cc.armed {
				cc.disarmLocked()
				cc.mu.Unlock()
				if ctx.Err() != nil {
					return cc.leaderCanceled(ctx, cl)
				}
				continue
			}
			cc.inFrame = true
			cc.mu.Unlock()
		}
		if _, err := cc.r.ReadHeader(); err != nil {
			cc.fail(err)
			<-cl.done
			return leadDone
		}
		mine, err := cc.handleFrame(h, cl)
		if large {
			cc.mu.Lock()
			cc.inFrame = false
			cc.mu.Unlock()
		}
		if err != nil {
			cc.fail(err)
			if !mine {
				<-cl.done
			}
			return leadDone
		}
		if large && !mine && ctx.Err() != nil {
			return cc.leaderCanceled(ctx, cl)
		}
		if mine {
			cc.unspin()
			cc.mu.Lock()
			cc.passRoleLocked()
			cc.mu.Unlock()
			return leadDone
		}
	}
}

// unspin disarms the lone waiter's poll (armLone) before the role holder
// passes the role (nothing when it is not armed).
func (cc *clientConn) unspin() {
	if cc.spin != nil {
		cc.spin.Disarm()
	}
}

// leaderCanceled ends the lead of a call whose ctx ended.
func (cc *clientConn) leaderCanceled(ctx context.Context, cl *call) int {
	cc.unspin()
	cc.mu.Lock()
	removed := cc.abandonLocked(cl)
	cc.mu.Unlock()
	if !removed { // the connection failed and delivered a result
		<-cl.done
		return leadDone
	}
	cc.cancelRemote(cl.id, ctxError(ctx).Code)
	return leadCanceled
}

// abandonLocked forgets cl, whose ctx ended, and makes sure it no longer
// holds the read role: forgetLocked passes the role on when it removes cl,
// and a cl already gone (the connection closed) gives it up here. One pass:
// a second would signal another waiting call for nothing.
func (cc *clientConn) abandonLocked(cl *call) (removed bool) {
	removed = cc.forgetLocked(cl)
	if cc.role == roleCaller && cc.leader == cl {
		cc.passRoleLocked()
	}
	return removed
}

// interrupt ends the wait of leader cl (its ctx ended) with a read deadline.
func (cc *clientConn) interrupt(cl *call) {
	cc.mu.Lock()
	cc.interruptLocked(cl)
	cc.mu.Unlock()
}

func (cc *clientConn) interruptLocked(cl *call) {
	if cc.role == roleCaller && cc.leader == cl && !cc.armed && !cc.inFrame && !cc.closed {
		cc.armed = true
		cc.nc.SetReadDeadline(aLongTimeAgo)
	}
}

// watchFired handles the end of the ctx the background reader watched:
// it interrupts the leader that relies on it, and stops watching.
func (cc *clientConn) watchFired(w <-chan struct{}) {
	cc.mu.Lock()
	if !cc.closed && cc.role == roleCaller && cc.leader != nil && cc.leader.watched == w { // after close, leader may be stale
		cc.interruptLocked(cc.leader)
	}
	if cc.watchWant == w {
		cc.watchWant = nil
	}
	cc.watching = nil
	cc.mu.Unlock()
}

func (cc *clientConn) disarmLocked() {
	if cc.armed {
		cc.armed = false
		cc.nc.SetReadDeadline(time.Time{})
	}
}

// passRoleLocked gives the read role away when the leading caller is done
// with it: to another waiting call, else to the background reader if streams
// are in flight, else to nobody (the background reader takes it when the
// connection stays unread for a tick).
func (cc *clientConn) passRoleLocked() {
	cc.disarmLocked()
	cc.leader = nil
	if cc.closed {
		cc.role = roleNone
		return
	}
	// Prefer a call already waiting in await: one still writing its
	// request would not read until its write is done.
	// Then a bidi call whose Recv waits for its item; the background
	// reader only when a call needs it (a server stream, whose Recv does
	// not read): bidi calls alone are read by their Recv (awaitItem), or
	// after an idle tick by the background reader.
	// (O(1): the sets of rolesets.go, not a scan of the calls.)
	next := cc.sets[setWaiting].pick()
	if next == nil {
		next = cc.sets[setUnary].pick()
	}
	if next == nil {
		next = cc.sets[setRecv].pick()
	}
	if next != nil {
		cc.role, cc.leader = roleCaller, next
		select {
		case next.lead <- struct{}{}:
		default:
		}
		return
	}
	if cc.serverStreams > 0 {
		cc.giveBackgroundLocked()
		return
	}
	cc.role = roleNone
}

func (cc *clientConn) giveBackgroundLocked() {
	cc.role = roleBackground
	select {
	case cc.bgWake <- struct{}{}:
	default:
	}
}

// ensureReader makes sure somebody reads for a call that will not read
// itself (a stream).
func (cc *clientConn) ensureReader() {
	cc.mu.Lock()
	if cc.role == roleNone && !cc.closed {
		cc.giveBackgroundLocked()
	}
	cc.mu.Unlock()
}

// readLoop is the connection's background reader: it reads whenever it holds
// the read role, and otherwise waits for the role to be given to it or for
// the connection to stay unread for a tick.
func (cc *clientConn) readLoop() {
	defer cc.onExit(cc)
	t := pollticker.NewTicker(idleTick)
	t.Stop()
	for cc.awaitRole(t) {
		if err := cc.readFrames(); err != nil {
			cc.fail(err)
			return
		}
	}
}

// awaitRole returns true once the background reader holds the read role, or
// false when the connection has closed.
func (cc *clientConn) awaitRole(t *pollticker.Ticker) bool {
	var seen uint32
	var quiet, ticking bool
	tick := idleTick
	defer func() {
		if ticking {
			t.Stop()
		}
	}()
	for {
		cc.mu.Lock()
		if cc.closed {
			cc.watching = nil
			cc.mu.Unlock()
			return false
		}
		switch {
		case cc.role == roleBackground:
		case cc.role == roleNone && quiet && cc.leadSeq == seen:
			cc.role = roleBackground
		default:
			next := tick
			if ticking && (cc.role == roleCaller || cc.leadSeq != seen) {
				next = min(2*tick, maxIdleTick) // callers read: back off
			}
			seen, quiet = cc.leadSeq, cc.role == roleNone
			w := cc.watchWant
			cc.watching = w
			cc.mu.Unlock()
			if !ticking || next != tick {
				tick, ticking = next, true
				t.Reset(tick)
			}
			select {
			case <-t.C:
				cc.looks.Add(1)
			case <-cc.bgWake:
			case <-cc.done:
			case <-w:
				cc.watchFired(w)
			}
			continue
		}
		cc.watching = nil // it reads now: no leader can rely on its watch
		cc.mu.Unlock()
		return true
	}
}

// readFrames reads frames while the background reader holds the read role.
// It returns nil when it lets the role go: after a result, with nothing left
// in flight.
func (cc *clientConn) readFrames() error {
	for {
		h, err := cc.r.ReadHeader()
		if err != nil {
			return err
		}
		if _, err := cc.handleFrame(h, nil); err != nil {
			return err
		}
		if h.Type == frame.TypeStreamData && cc.bidiDelivered(h.ID) {
			return nil
		}
		switch h.Type {
		case frame.TypeResponse, frame.TypeError, frame.TypeStreamEnd:
			cc.mu.Lock()
			idle := len(cc.calls) == 0 && cc.r.Buffered() == 0
			if idle {
				cc.role = roleNone
			}
			cc.mu.Unlock()
			if idle {
				return nil
			}
		}
	}
}

// bidiDelivered follows the background reader's delivery of a stream item
// to call id. When id is a bidi call whose Recv waits for that item and
// nothing more is buffered, it gives Recv the read role and reports true:
// Recv takes the item and then reads its next one itself (awaitItem).
func (cc *clientConn) bidiDelivered(id uint32) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cl := cc.calls[id]
	if cl == nil || cl.stream == nil || cl.stream.tx == nil {
		return false
	}
	cc.bidiItems.Add(1)
	if !cl.recvWaiting || cc.closed || cc.role != roleBackground || cc.r.Buffered() != 0 {
		return false
	}
	cc.role, cc.leader = roleCaller, cl
	select {
	case cl.lead <- struct{}{}:
	default:
	}
	return true
}
