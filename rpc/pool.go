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
	limit := c.limit(n)
	for {
		if cc, more := c.pick(limit); cc != nil {
			if more {
				c.grow(limit)
			}
			return cc, nil
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, &Error{Code: Canceled, Message: "client closed", cause: ErrClientClosed}
		}
		if cc, _ := c.pick(limit); cc != nil {
			c.mu.Unlock()
			return cc, nil
		}
		if c.opts.NoReconnect {
			c.mu.Unlock()
			return nil, &Error{Code: Unavailable, Message: "connection lost and reconnect is off"}
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
			return nil, failFast(c.addr, err)
		case <-ctx.Done():
			e := ctxError(ctx)
			e.Message = "waiting for reconnect to " + c.addr + ": " + e.Message
			return nil, e
		}
	}
}

// limit is how many of the pool's connections a call whose request is n
// bytes may use, and open: a large call (frame.DefaultLargePayload or more)
// up to LargeConns, or ShmConns when its request will travel in the shared
// region of the pool's first connection (its frames then carry only a
// descriptor); the others keep to the first Conns.
func (c *Client) limit(n int) int {
	if n < frame.DefaultLargePayload {
		return c.opts.Conns
	}
	if first := c.slots[0].cur.Load(); first != nil && first.shm.takes(n) {
		return c.opts.ShmConns
	}
	return c.opts.LargeConns
}

// pick returns the usable connection among the first limit slots with the
// fewest calls in flight (the first of those with none), or nil. more
// reports that every one of them has calls in flight and there is room for
// another.
func (c *Client) pick(limit int) (best *clientConn, more bool) {
	bestN, open := 0, 0
	for i := range c.slots[:limit] {
		cc := c.slots[i].cur.Load()
		if cc == nil || !cc.usable() {
			continue
		}
		n := int(cc.inflight.Load())
		if n == 0 {
			return cc, false
		}
		open++
		if best == nil || n < bestN {
			best, bestN = cc, n
		}
	}
	return best, best != nil && open < limit
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
