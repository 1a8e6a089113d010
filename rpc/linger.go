package rpc

import (
	"context"
	"time"
)

// Linger is the first half of a drain for a sidecar whose clients are
// shutting down at the same time (service.DrainLinger): the server keeps
// serving as before — it keeps accepting, sends no goaway, answers every
// call — and Draining reports true from now on. Linger returns nil once no
// connection is open and minGrace has passed since the call, or ctx's
// error when ctx ends first. It does not stop the server: call Shutdown
// after it (quick when no connection is left; with a ctx that has ended, it
// closes what is still open).
func (s *Server) Linger(ctx context.Context, minGrace time.Duration) error {
	s.lingering.Store(true)
	if minGrace > 0 {
		t := time.NewTimer(minGrace)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	// idle is signaled when a connection goes; the tick covers a signal
	// taken by someone else (a concurrent Shutdown).
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for s.ActiveConns() > 0 {
		select {
		case <-s.idle:
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Draining reports whether a drain has started: Linger, Shutdown or Close
// was called. The health method answers "draining" then.
func (s *Server) Draining() bool {
	if s.lingering.Load() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining || s.closed
}
