package rpc

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
)

// slot is one connection of a Client's pool.
type slot struct {
	cur     atomic.Pointer[clientConn]
	dialing chan struct{} // (Client.mu) closed when the current dial or redial ends
	// failed is closed when the current redial's first attempt fails, after
	// failErr is set (both under Client.mu): fail-fast calls stop waiting then.
	failed  chan struct{}
	failErr error
}

// conn returns the usable connection with the fewest calls in flight for a
// call whose request is n bytes (0: a stream), opening another in the
// background when all are busy and the pool has room, and waiting for a
// reconnect within ctx when none is usable. See limit for the room.
func (c *Client) conn(ctx context.Context, n int) (*clientConn, error) {
	cc, _, err := c.connCall(ctx, n)
	return cc, err
}

// connCall is conn for a unary call: a call whose request goes in the
// region is also counted in its connection's region bytes in flight
// (connShm.flight) until the caller gives them back with
// cc.shmUnreserve(reserved).
func (c *Client) connCall(ctx context.Context, n int) (cc *clientConn, reserved int64, err error) {
	limit, need := c.limit(n)
	for {
		cc, _, more, full := c.pick(limit, need)
		if cc != nil {
			if full && limit < c.opts.LargeConns {
				// Every connection for region calls has a full share in
				// flight: spread over up to LargeConns, as without shared
				// memory.
				limit = c.opts.LargeConns
				continue
			}
			if more {
				c.grow(limit)
			}
			return cc, cc.shmReserve(need), nil
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, 0, &Error{Code: Canceled, Message: "client closed", cause: ErrClientClosed}
		}
		if cc, _, _, _ := c.pick(limit, need); cc != nil {
			c.mu.Unlock()
			return cc, cc.shmReserve(need), nil
		}
		if c.opts.NoReconnect {
			c.mu.Unlock()
			return nil, 0, &Error{Code: Unavailable, Message: "connection lost and reconnect is off"}
		}
		s := &c.slots[0]
		if s.dialing == nil {
			s.dialing = make(chan struct{})
			s.failed, s.failErr = make(chan struct{}), nil
			go c.redial(s, s.dialing)
		}
		ch, failed := s.dialing, s.failed
		if c.opts.WaitForReady {
			failed = nil // wait for the reconnect itself
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-failed:
			c.mu.Lock()
			err := s.failErr
			c.mu.Unlock()
			return nil, 0, failFast(c.addr, err)
		case <-ctx.Done():
			e := ctxError(ctx)
			e.Message = "waiting for reconnect to " + c.addr + ": " + e.Message
			return nil, 0, e
		}
	}
}

// connStream is conn for a stream call (server, client-streaming or bidi),
// with an in-flight slot of the connection already taken (cc.acquire's). A
// stream stays on its connection for its whole life, so when every usable
// connection has calls in flight and the pool has room, it waits for the
// connection being opened (grow) rather than joining a busy one, and takes
// its slot with a compare-and-swap from the count the pick saw: a burst of
// stream opens spreads over the pool as unary calls do, instead of all
// landing on the first connection while the second is being dialed. A
// lone stream (a connection with nothing in flight) takes the first idle
// connection at once; at most one dial runs at a time, as for unary calls;
// when growing is backing off after a failure, or the pool is full, the
// stream goes to the least busy connection.
func (c *Client) connStream(ctx context.Context) (*clientConn, error) {
	limit := c.opts.Conns
	for {
		cc, n, more, _ := c.pick(limit, 0)
		if cc == nil { // none usable: wait for the reconnect, as a call does
			cc, err := c.conn(ctx, 0)
			if err != nil {
				return nil, err
			}
			if e := cc.acquire(ctx); e != nil {
				return nil, e
			}
			return cc, nil
		}
		if more {
			if ch := c.growWait(limit); ch != nil {
				select {
				case <-ch:
					continue
				case <-ctx.Done():
					e := ctxError(ctx)
					e.Message = "waiting for a pooled connection to " + c.addr + ": " + e.Message
					return nil, e
				}
			}
		}
		if n >= cc.maxInFlight { // full: wait for a slot there
			if e := cc.acquire(ctx); e != nil {
				return nil, e
			}
			return cc, nil
		}
		if cc.inflight.CompareAndSwap(n, n+1) {
			return cc, nil
		}
		// Another call took a slot since the pick: pick again.
	}
}

// growWait starts opening another pooled connection (grow) and returns a
// channel closed when that dial, or the one already under way, ends; nil
// when none runs (the pool is full, closed, or backing off after a failed
// attempt). Only a pooled dial, one attempt bounded by HandshakeTimeout: a
// reconnect of a lost connection (redial) may retry for long, and a stream
// does not wait for it while another connection is usable.
func (c *Client) growWait(limit int) <-chan struct{} {
	c.grow(limit)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	return c.growDone
}

// limit is how many of the pool's connections a call whose request is n
// bytes may use, and open: a large call (frame.DefaultLargePayload or more)
// up to LargeConns, or ShmConns when its request will travel in the shared
// region of the pool's first connection (its frames then carry only a
// descriptor; need is then n, the bytes it will hold in flight); the others
// keep to the first Conns.
func (c *Client) limit(n int) (limit int, need int64) {
	if first := c.slots[0].cur.Load(); first != nil && first.slotCalls.keeps(n) && first.usable() {
		return 1, 0 // call slots: one connection while it has a free slot (shmcalls.go, keeps)
	}
	if n < frame.DefaultLargePayload {
		return c.opts.Conns, 0
	}
	if first := c.slots[0].cur.Load(); first != nil && first.shm.takes(n) {
		return c.opts.ShmConns, int64(n)
	}
	return c.opts.LargeConns, 0
}

// shmFlightMax is how many bytes of region requests the pool puts in flight
// on one connection before it spreads them over more (up to LargeConns): half
// of a default server's ServerOptions.MaxConnBytes (16 MiB). A server whose
// connection holds more stops reading it until calls finish (budget.go), and
// so also stops reading the shm_release frames queued behind: calls waiting
// for space in a half full of answers the client has let go of would then
// wait for each other (16 CallRawView callers of 8 MiB on 2 connections
// did). A connection with nothing in flight takes any one call.
const shmFlightMax = 8 << 20

// pick returns the usable connection among the first limit slots with the
// fewest calls in flight (the first of those with none), or nil, and that
// number of calls (n); for a
// region call (need > 0), among those with room for need more region bytes
// in flight (shmFlightMax), and when none has room the least busy of all,
// with full set. more reports that every one of them has calls in flight (or
// no room) and there is room for another.
func (c *Client) pick(limit int, need int64) (best *clientConn, bestN int32, more, full bool) {
	var any *clientConn
	var anyN int32
	open := 0
	for i := range c.slots[:limit] {
		cc := c.slots[i].cur.Load()
		if cc == nil || !cc.usable() {
			continue
		}
		n := cc.inflight.Load()
		room := cc.shm.room(need)
		if n == 0 && room {
			return cc, 0, false, false
		}
		open++
		if room && (best == nil || n < bestN) {
			best, bestN = cc, n
		}
		if any == nil || n < anyN {
			any, anyN = cc, n
		}
	}
	if best == nil && any != nil {
		return any, anyN, open < limit, true
	}
	return best, bestN, best != nil && open < limit, false
}

// grow opens one more pooled connection in the background, into the first
// slot with no usable connection, unless one is already being opened or the
// back-off after a failed attempt (see ClientOptions.Conns) has not passed.
// With NoReconnect, a slot whose connection was lost is not reopened.
func (c *Client) grow(limit int) {
	if c.growing.Load() || time.Now().UnixNano() < c.growAfter.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.growing.Load() {
		return
	}
	for i := range c.slots[:limit] {
		s := &c.slots[i]
		cc := s.cur.Load()
		if s.dialing != nil || cc != nil && (cc.usable() || c.opts.NoReconnect) {
			continue
		}
		c.growing.Store(true)
		s.dialing = make(chan struct{})
		c.growDone = s.dialing
		go c.growInto(s, s.dialing)
		return
	}
}

// growInto makes one attempt to open a connection into s.
func (c *Client) growInto(s *slot, done chan struct{}) {
	ctx, cancel := context.WithTimeout(c.base, c.opts.HandshakeTimeout)
	cc, err := c.dialOnce(ctx, false)
	cancel()
	c.mu.Lock()
	closed := c.closed
	switch {
	case err != nil:
		wait := c.opts.MaxBackoff << min(c.growFails, 6)
		c.growFails++
		c.growAfter.Store(time.Now().Add(wait).UnixNano())
		if !closed {
			c.log.Debug("rpc: opening a pooled connection failed", "addr", c.addr, "err", err, "retry_in", wait)
		}
	case !closed:
		c.growFails = 0
		s.cur.Store(cc)
	}
	s.dialing = nil
	c.growDone = nil
	c.growing.Store(false)
	c.mu.Unlock()
	if err == nil && closed {
		cc.close(ErrClientClosed)
	}
	close(done)
}

// failFast is the error of a call that found no connection after a reconnect
// attempt failed (spec 4.2): the server's refusal as it is (permanent), else
// Unavailable with the dial error as the cause.
func failFast(addr string, err error) *Error {
	var re *RefusedError
	if errors.As(err, &re) {
		return &Error{Code: re.Err.Code, Message: re.Error(), cause: err}
	}
	msg := "no connection to " + addr + ": reconnecting failed"
	if err != nil {
		msg += ": " + err.Error()
	}
	return &Error{Code: Unavailable, Message: msg + " (calls fail fast; set ClientOptions.WaitForReady to wait for the server)", cause: err}
}
