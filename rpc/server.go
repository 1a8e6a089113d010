package rpc

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
)

// ServerOptions configures a Server. The zero value is a sane default.
type ServerOptions struct {
	// SocketBuffer is SO_SNDBUF for unix-socket connections, in bytes. Default
	// (0) uds.DefaultSocketBuffer, 4 MiB, capped by the kernel at net.core.wmem_max;
	// negative keeps the kernel's default. TCP connections are left to autotune.
	SocketBuffer int
	// MaxFrame is the largest payload accepted (and sent). Default
	// frame.DefaultMaxFrame (16 MiB); clients may negotiate it down.
	MaxFrame uint32
	// MaxInFlight is the most concurrent calls per connection. A udskit peer
	// that exceeds it gets a connection error and is closed; an NDJSON peer is
	// simply not read until a call finishes. Default frame.DefaultMaxInFlight.
	MaxInFlight uint32
	// HandshakeTimeout bounds the wait for a new connection's first bytes.
	// Default 10s.
	HandshakeTimeout time.Duration
	// FrameTimeout bounds how long a frame (or NDJSON line) may take to
	// arrive once its first byte has: a client that starts one and stalls is
	// closed after it. Default 30s; negative: no limit.
	FrameTimeout time.Duration
	// WriteTimeout bounds how long the server waits for a client that
	// does not read what it is sent (no write completes while frames are
	// waiting to go out); the connection is closed after it. Default 30s;
	// negative: no limit.
	WriteTimeout time.Duration
	// IdleTimeout, when positive, drains a connection with no call in
	// flight and no frame arriving for that long (goaway, then close; the
	// client reconnects when it needs to). Default 0: idle connections stay.
	IdleTimeout time.Duration
	// MaxConnBytes bounds the bytes one connection may hold: request
	// payloads read and not yet answered plus responses not yet written.
	// When it is reached the server stops reading that connection until
	// calls finish (a client that sends and never reads waits on itself).
	// One call of up to MaxFrame bytes is always allowed. Default 4 MiB.
	MaxConnBytes int64
	// MaxServerBytes bounds the same over all connections; a connection
	// that would go over it waits, except when the server holds nothing.
	// Default 64 MiB.
	MaxServerBytes int64
	// DisableNDJSON refuses newline-JSON clients.
	DisableNDJSON bool
	// BaseContext is the parent of every handler context (for values only;
	// handlers are not canceled when it is). Default context.Background().
	BaseContext context.Context
	// Logger receives connection-level problems. Default slog.Default().
	Logger *slog.Logger
	// WrapConn, when set, wraps every connection before it is served, e.g.
	// capture.ServerWrap to record this server's own traffic as pcapng.
	WrapConn func(net.Conn) net.Conn
}

// Server serves udskit RPC and NDJSON clients. Create it with NewServer.
type Server struct {
	opts     ServerOptions
	log      *slog.Logger
	handlers atomic.Pointer[map[string]*handler]
	regMu    sync.Mutex

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
	draining  bool
	closed    bool
	connsWG   sync.WaitGroup
	idle      chan struct{} // signaled when a conn goes away while draining
	sweeping  bool          // the timeout sweeper runs (under mu)

	held atomic.Int64 // bytes held by all connections (see budget.go)

	watchMu     sync.Mutex
	watchConns  map[*serverConn]struct{} // conns in frame mode, for the inline watchdog
	watching    bool                     // the watchdog goroutine runs
	watchAsleep atomic.Bool              // the watchdog is parked; the next inline run wakes it
	watchWake   chan struct{}            // (buffered 1) wakes a parked watchdog
	watchLooks  atomic.Uint64            // the watchdog's ticks, for tests
}

// defaultTimeout maps an option's zero value to def and a negative one to 0
// (no limit).
func defaultTimeout(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// NewServer returns a Server with no handlers.
func NewServer(opts ServerOptions) *Server {
	if opts.MaxFrame == 0 {
		opts.MaxFrame = frame.DefaultMaxFrame
	}
	opts.MaxFrame = max(opts.MaxFrame, frame.MinMaxFrame)
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = frame.DefaultMaxInFlight
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	opts.FrameTimeout = defaultTimeout(opts.FrameTimeout, 30*time.Second)
	opts.WriteTimeout = defaultTimeout(opts.WriteTimeout, 30*time.Second)
	opts.IdleTimeout = max(opts.IdleTimeout, 0)
	if opts.MaxConnBytes <= 0 {
		opts.MaxConnBytes = 4 << 20
	}
	if opts.MaxServerBytes <= 0 {
		opts.MaxServerBytes = 64 << 20
	}
	if opts.BaseContext == nil {
		opts.BaseContext = context.Background()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{
		opts:      opts,
		log:       opts.Logger,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*serverConn]struct{}{},
		idle:      make(chan struct{}, 1),
		watchWake: make(chan struct{}, 1),
	}
	m := map[string]*handler{}
	s.handlers.Store(&m)
	return s
}

func (s *Server) register(h *handler) {
	if h.name == "" {
		panic("rpc: empty method name")
	}
	if len(h.name) > frame.MaxHead-2 {
		panic("rpc: method name too long")
	}
	s.regMu.Lock()
	defer s.regMu.Unlock()
	old := *s.handlers.Load()
	m := make(map[string]*handler, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[h.name] = h
	s.handlers.Store(&m)
}

// Methods lists the registered method names.
func (s *Server) Methods() []string {
	m := *s.handlers.Load()
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (s *Server) lookup(method []byte) *handler {
	return (*s.handlers.Load())[string(method)]
}

// Serve accepts connections on l and serves each until l fails or the server
// shuts down; it then returns ErrServerClosed (after Shutdown/Close) or the
// accept error. Serve may be called for several listeners.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.draining || s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.draining || s.closed
			s.mu.Unlock()
			if stopping {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTooManyFiles) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("rpc: accept failed; retrying", "err", err, "delay", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		// Registered before the goroutine starts, so a Shutdown right after
		// this accept waits for the connection instead of missing it.
		if sc := s.track(c); sc != nil {
			go s.run(sc)
		}
	}
}

// ServeConn serves one connection until it closes. It returns at once (closing
// c) if the server is closed. A connection that arrives while the server
// drains (accepted just before Shutdown) is served through the drain: a
// udskit client gets its hello and then goaway, so its calls are refused
// as not processed and retried elsewhere, instead of a reset connection.
func (s *Server) ServeConn(c net.Conn) {
	if sc := s.track(c); sc != nil {
		s.run(sc)
	}
}

// track registers c with the server (nil if the server is closed, c then
// closed); run serves it and unregisters it.
func (s *Server) track(c net.Conn) *serverConn {
	setSocketBuffer(c, s.opts.SocketBuffer)
	if s.opts.WrapConn != nil {
		c = s.opts.WrapConn(c)
	}
	sc := newServerConn(s, c)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.Close()
		return nil
	}
	draining := s.draining
	s.conns[sc] = struct{}{}
	s.connsWG.Add(1)
	s.startSweeperLocked()
	s.mu.Unlock()
	if draining {
		sc.drain()
	}
	return sc
}

func (s *Server) run(sc *serverConn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
		s.connsWG.Done()
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}()
	sc.serve()
}

// ActiveConns returns the number of connections being served.
func (s *Server) ActiveConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Shutdown drains the server: it stops accepting, sends goaway on every
// connection, lets in-flight calls finish and their responses go out, and
// returns once every connection is closed. Requests that arrive after the
// goaway are refused with a retryable Unavailable error that tells the
// client the call was not processed, so no call is dropped. When ctx ends
// first, Shutdown closes what is left and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	for _, c := range s.stopAccepting(&s.draining) {
		c.drain()
	}
	for {
		if s.ActiveConns() == 0 {
			s.connsWG.Wait()
			return nil
		}
		select {
		case <-s.idle:
		case <-ctx.Done():
			s.Close()
			return ctx.Err()
		}
	}
}

// stopAccepting sets *flag (s.draining or s.closed) under s.mu, closes the
// listeners, and returns the connections open at that moment.
func (s *Server) stopAccepting(flag *bool) []*serverConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	*flag = true
	for l := range s.listeners {
		l.Close()
	}
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// Close stops the server at once: listeners and connections are closed and
// in-flight handlers see their contexts canceled. It waits for the connection
// goroutines to end (handlers that ignore their ctx may still be running).
func (s *Server) Close() error {
	for _, c := range s.stopAccepting(&s.closed) {
		c.close(errors.New("server closed"))
	}
	s.connsWG.Wait()
	return nil
}

// watchInline adds c to the inline-handler watchdog, starting the watchdog
// if it is not running.
func (s *Server) watchInline(c *serverConn) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.watchConns == nil {
		s.watchConns = map[*serverConn]struct{}{}
	}
	s.watchConns[c] = struct{}{}
	if !s.watching {
		s.watching = true
		go s.inlineWatchdog()
	}
}

func (s *Server) unwatchInline(c *serverConn) {
	s.watchMu.Lock()
	delete(s.watchConns, c)
	last := len(s.watchConns) == 0
	s.watchMu.Unlock()
	if last {
		s.wakeWatchdog() // so that it sees there is nothing left and ends
	}
}

// wakeWatchdog wakes the watchdog if it is parked. An inline run calls it
// after marking itself running; the cost on the hot path is one atomic load
// while the watchdog is awake.
func (s *Server) wakeWatchdog() {
	if s.watchAsleep.CompareAndSwap(true, false) {
		select {
		case s.watchWake <- struct{}{}:
		default:
		}
	}
}

// watchParkAfter is how many ticks in a row without any inline run the
// watchdog waits before it parks. While calls keep coming it stays awake,
// so a steady caller never pays for waking it.
const watchParkAfter = 10

// inlineWatchdog moves the read loop off handlers that run inline for more
// than a tick (see inlineTick). It ticks only while inline handlers run or
// ran within the last watchParkAfter ticks; otherwise it parks until the next
// inline run wakes it, so a server with idle connections does not wake up.
// It ends when no connection is left to watch.
func (s *Server) inlineWatchdog() {
	// tick is the current interval; level, the backed-off one it returns to
	// after the quick second look at a running handler.
	tick, level := inlineTick, inlineTick
	t := time.NewTicker(tick)
	defer t.Stop()
	quiet := 0
	for {
		<-t.C // never a wake-up here: two looks in a row would hand off a handler that just started
		s.watchLooks.Add(1)
		s.watchMu.Lock()
		if len(s.watchConns) == 0 {
			s.watching = false
			s.watchMu.Unlock()
			return
		}
		active, running := s.watchTick()
		// Look again a tick after seeing a handler running; back off while
		// handlers come and go between looks (see maxInlineTick).
		next := inlineTick
		if !running {
			level = min(2*level, maxInlineTick)
			next = level
		}
		if next != tick {
			tick = next
			t.Reset(tick)
		}
		if active {
			quiet = 0
			s.watchMu.Unlock()
			continue
		}
		if quiet++; quiet < watchParkAfter {
			s.watchMu.Unlock()
			continue
		}
		// Park. Announce it first, then look again: an inline run marks
		// itself running before it checks watchAsleep, so either it sees
		// the announcement and wakes us, or we see it here.
		s.watchAsleep.Store(true)
		if s.watchBusy() {
			s.watchAsleep.Store(false)
			s.watchMu.Unlock()
			continue
		}
		s.watchMu.Unlock()
		t.Stop()
		<-s.watchWake // may be a stale wake-up: then it parks again after a few ticks
		tick, level = inlineTick, inlineTick
		t.Reset(tick)
		quiet = 0
	}
}

// watchTick checks every connection once, hands reading off a handler seen
// running inline on two ticks in a row, and reports whether any inline
// handler ran since the last tick (active) and whether one is running now
// and was not handed off (running). Entered with watchMu held.
func (s *Server) watchTick() (active, running bool) {
	for c := range s.watchConns {
		seq := c.inlineSeq.Load()
		if seq != c.watchLast {
			c.watchLast, active = seq, true
		}
		v := c.inline.Load()
		if v&3 != inlineRunning {
			c.watchRun = false
			continue
		}
		active = true
		if c.watchRun && seq == c.watchSeen {
			c.handOffReading(v)
			c.watchRun = false
			continue
		}
		c.watchSeen, c.watchRun, running = seq, true, true
	}
	return active, running
}

// watchBusy reports whether an inline handler runs or has started since the
// last tick. Entered with watchMu held.
func (s *Server) watchBusy() bool {
	for c := range s.watchConns {
		if c.inline.Load()&3 == inlineRunning || c.inlineSeq.Load() != c.watchLast {
			return true
		}
	}
	return false
}
