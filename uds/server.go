package uds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Handler serves one connection. ctx is canceled when the server stops hard
// (Close, or Shutdown reaching its deadline); the conn is closed then too, and
// after the handler returns. A handler must return once its conn is closed or
// ctx is done. To learn that a graceful drain has begun, watch
// Server.Draining(): finish the current request and return.
type Handler func(ctx context.Context, c net.Conn)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("uds: server closed")

// FullPolicy is what a Server does with connections that arrive while
// MaxConns are open.
type FullPolicy int

const (
	// RejectWhenFull accepts each further connection and closes it at once:
	// the peer reads EOF and learns immediately that the server is full,
	// rather than hanging until its own timeout, and a flood holds at most
	// MaxConns fds plus one short-lived fd. The default.
	RejectWhenFull FullPolicy = iota
	// BacklogWhenFull stops accepting until a connection ends: new peers
	// wait in the listen backlog (their connect succeeds, nothing is read
	// from them) and are served in turn; once the backlog is full, connects
	// fail (EAGAIN on unix sockets). For clients that would rather wait.
	BacklogWhenFull
)

// Server runs an accept loop with a per-connection handler goroutine.
// Set the fields before calling Serve; the zero value of each optional field is
// the documented default.
//
// Connection limit: at most MaxConns connections are open at once; what
// happens to more is WhenFull (default RejectWhenFull). Either way a line is
// logged at most once a second with the count, and Rejected counts the
// connections closed. docs/server.md compares the two.
type Server struct {
	// Handler serves each connection. Required.
	Handler Handler
	// MaxConns caps concurrently open connections. 0 means no limit.
	MaxConns int
	// WhenFull says what happens to connections beyond MaxConns.
	WhenFull FullPolicy
	// ConnContext, when set, derives each connection's handler ctx from
	// the server's, knowing the listener that accepted it (say, to find
	// the route a proxy listener serves).
	ConnContext func(ctx context.Context, l net.Listener, c net.Conn) context.Context
	// Logger receives rejections and handler panics. Default slog.Default().
	Logger *slog.Logger

	initOnce  sync.Once
	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	stopping  bool
	draining  chan struct{}
	ctx       context.Context
	cancel    context.CancelFunc
	handlers  sync.WaitGroup
	loops     sync.WaitGroup
	rejected  atomic.Uint64
	rejectLog rateLog
	// freed, made by an accept loop waiting for room (BacklogWhenFull), is
	// closed (and cleared) when a connection ends; nil while nobody waits,
	// so that ending a connection costs no channel otherwise.
	freed chan struct{}
}

func (s *Server) init() {
	s.initOnce.Do(func() {
		s.listeners = make(map[net.Listener]struct{})
		s.conns = make(map[net.Conn]struct{})
		s.draining = make(chan struct{})
		s.ctx, s.cancel = context.WithCancel(context.Background())
	})
}

func (s *Server) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}

// ListenAndServe listens on address with opts (see Listen) and serves it.
func (s *Server) ListenAndServe(ctx context.Context, address string, opts ListenOptions) error {
	l, err := Listen(ctx, address, opts)
	if err != nil {
		return err
	}
	return s.Serve(l)
}

// Serve accepts connections on l and runs Handler for each in its own
// goroutine, until Shutdown or Close (then it returns ErrServerClosed) or a
// non-temporary accept error. Serve closes l when it returns. It may be
// called for several listeners at once.
func (s *Server) Serve(l net.Listener) error {
	if s.Handler == nil {
		return errors.New("uds: Server.Handler is nil")
	}
	s.init()
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.loops.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
		s.loops.Done()
	}()

	var delay time.Duration
	for {
		if s.WhenFull == BacklogWhenFull && !s.waitForRoom(l) {
			return ErrServerClosed
		}
		c, err := l.Accept()
		if err != nil {
			if s.isStopping() {
				return ErrServerClosed
			}
			if isTemporary(err) {
				// EMFILE and friends: back off instead of spinning.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.logger().Warn("uds: accept failed, retrying", "err", err.Error(), "in", delay)
				select {
				case <-time.After(delay):
				case <-s.draining:
				}
				continue
			}
			return fmt.Errorf("uds: accept: %w", err)
		}
		delay = 0
		s.mu.Lock()
		// A connection accepted as the server began to stop (Accept
		// returned it just before the listener closed) is served all the
		// same: its handler sees Draining (or a canceled ctx after Close)
		// and can end it properly, where closing it here would reset a
		// client that has already sent its first request.
		stopping := s.stopping
		if !stopping && s.MaxConns > 0 && len(s.conns) >= s.MaxConns {
			s.noteRejectLocked(l)
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.handlers.Add(1)
		s.mu.Unlock()
		ctx := s.ctx
		if s.ConnContext != nil {
			ctx = s.ConnContext(ctx, l, c)
		}
		go s.handle(ctx, c)
		if stopping {
			return ErrServerClosed
		}
	}
}

// waitForRoom returns once fewer than MaxConns connections are open (true)
// or the server stops (false). Several accept loops may pass it together
// and overshoot by one each; the check after Accept closes the extra ones.
func (s *Server) waitForRoom(l net.Listener) bool {
	for {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return false
		}
		if s.MaxConns <= 0 || len(s.conns) < s.MaxConns {
			s.mu.Unlock()
			return true
		}
		if s.freed == nil {
			s.freed = make(chan struct{})
		}
		freed := s.freed
		s.mu.Unlock()
		if ok, _ := s.rejectLog.allow(); ok {
			s.logger().Warn("uds: connection limit reached, not accepting until a connection ends",
				"addr", l.Addr().String(), "max_conns", s.MaxConns)
		}
		select {
		case <-freed:
		case <-s.draining:
			return false
		}
	}
}

// noteRejectLocked counts a connection over MaxConns and logs at most once a second.
func (s *Server) noteRejectLocked(l net.Listener) {
	s.rejected.Add(1)
	if ok, n := s.rejectLog.allow(); ok {
		s.logger().Warn("uds: connection limit reached, closing new connections",
			"addr", l.Addr().String(), "max_conns", s.MaxConns, "closed", n+1)
	}
}

func (s *Server) handle(ctx context.Context, c net.Conn) {
	defer func() {
		if r := recover(); r != nil {
			s.logger().Error("uds: handler panicked; closing its connection", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		if s.freed != nil {
			close(s.freed)
			s.freed = nil
		}
		s.mu.Unlock()
		s.handlers.Done()
	}()
	s.Handler(ctx, c)
}

func (s *Server) isStopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// StopAccepting is the start of Shutdown without the wait: the server
// stops accepting (its listeners are closed and the accept loops end) and
// Draining is closed; open connections go on. For servers built on this one
// that drain their connections themselves (rpc.Server); Shutdown or Close
// still ends the connections' handlers.
func (s *Server) StopAccepting() { s.stopAccepting() }

// stopAccepting marks the server stopping, signals Draining and closes every
// listener. The accept loops exit.
func (s *Server) stopAccepting() {
	s.init()
	s.mu.Lock()
	if !s.stopping {
		s.stopping = true
		close(s.draining)
	}
	ls := make([]net.Listener, 0, len(s.listeners))
	for l := range s.listeners {
		ls = append(ls, l)
	}
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
}

// forceClose cancels handler contexts and closes every open connection.
func (s *Server) forceClose() {
	s.cancel()
	s.mu.Lock()
	cs := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

func (s *Server) wait() {
	s.loops.Wait()
	s.handlers.Wait()
}

// Shutdown stops accepting (closing the listeners, which for a *Listener also
// removes its socket file), closes Draining, and waits for open connections'
// handlers to return. If ctx ends first, it force-closes the remaining
// connections, cancels the handlers' ctx, waits for the handlers to return and
// returns ctx.Err(). It returns nil after a complete graceful drain.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopAccepting()
	done := make(chan struct{})
	go func() { s.wait(); close(done) }()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
		s.forceClose()
		<-done
		return ctx.Err()
	}
}

// Close stops accepting and closes every connection at once, then waits for
// the handlers to return. No goroutine started by the server survives it.
func (s *Server) Close() error {
	s.stopAccepting()
	s.forceClose()
	s.wait()
	return nil
}

// Draining is closed when Shutdown or Close begins: handlers of long-lived
// connections should finish their current work and return.
func (s *Server) Draining() <-chan struct{} {
	s.init()
	return s.draining
}

// ActiveConns returns the number of connections whose handler is running.
func (s *Server) ActiveConns() int {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Rejected returns how many connections were closed because MaxConns were open.
func (s *Server) Rejected() uint64 { return s.rejected.Load() }

func isTemporary(err error) bool {
	var ne interface{ Temporary() bool }
	if errors.As(err, &ne) && ne.Temporary() {
		return true
	}
	var to interface{ Timeout() bool }
	return errors.As(err, &to) && to.Timeout()
}
