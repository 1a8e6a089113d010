package rpc

import (
	"context"
	"errors"
	"net"
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

// Listening is a Server with its listeners: what package service runs
// (service.Run): Serve serves every listener until Shutdown or Close;
// Shutdown, Linger and the rest are the Server's.
type Listening struct {
	*Server
	ls []net.Listener
}

// On returns s serving ls, for service.Run.
func (s *Server) On(ls ...net.Listener) *Listening { return &Listening{Server: s, ls: ls} }

// Serve serves every listener and returns once all have stopped: nil after
// Shutdown or Close, else the first accept error (which stops the server).
func (v *Listening) Serve() error {
	errc := make(chan error, len(v.ls))
	for _, l := range v.ls {
		go func() { errc <- v.Server.Serve(l) }()
	}
	var first error
	for range v.ls {
		if err := <-errc; err != nil && !errors.Is(err, ErrServerClosed) && first == nil {
			first = err
			v.Server.Close()
		}
	}
	return first
}
