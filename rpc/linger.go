package rpc

import (
	"context"
	"time"

	"github.com/udskit/udskit/internal/linger"
)

// Linger is the first half of a drain for a sidecar whose clients are
// shutting down at the same time (service.DrainLinger): the server keeps
// serving as before — it keeps accepting, sends no goaway, answers every
// call — and Draining reports true from now on. Linger returns nil once no
// connection has been open for 250 ms (an app may close a connection and
// open another; internal/linger.Quiet) and minGrace has passed since the
// call, or ctx's error when ctx ends first. It does not stop the server: call Shutdown
// after it (quick when no connection is left; with a ctx that has ended, it
// closes what is still open).
func (s *Server) Linger(ctx context.Context, minGrace time.Duration) error {
	s.lingering.Store(true)
	return linger.Wait(ctx, minGrace, s.ActiveConns)
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
