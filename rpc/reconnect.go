package rpc

import (
	"math/rand/v2"
	"time"
)

// redial reconnects s with jittered exponential backoff until it succeeds or
// the client closes.
func (c *Client) redial(s *slot, done chan struct{}) {
	backoff := c.opts.MinBackoff
	for attempt := 0; ; attempt++ {
		cc, err := c.dialOnce(c.base, false)
		if err == nil {
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				cc.close(ErrClientClosed)
				break
			}
			s.cur.Store(cc)
			c.mu.Unlock()
			if attempt > 0 {
				c.log.Info("rpc: reconnected", "addr", c.addr, "attempts", attempt+1)
			}
			break
		}
		if c.base.Err() != nil {
			break
		}
		if attempt == 0 {
			c.log.Info("rpc: reconnecting", "addr", c.addr, "err", err)
			c.mu.Lock()
			s.failErr = err
			if s.failed != nil {
				close(s.failed) // stays closed: later calls fail fast too until a redial succeeds
			}
			c.mu.Unlock()
		}
		d := backoff/2 + time.Duration(rand.Int64N(int64(backoff/2)+1))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.base.Done():
			t.Stop()
		}
		if c.base.Err() != nil {
			break
		}
		backoff = min(2*backoff, c.opts.MaxBackoff)
	}
	c.mu.Lock()
	s.dialing = nil
	c.mu.Unlock()
	close(done)
}
