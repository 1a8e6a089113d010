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
	"github.com/udskit/udskit/uds"
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
	// One call of up to MaxFrame bytes is always allowed. Default 16 MiB;
	// an NDJSON connection gets a quarter (its bytes are copied more).
	MaxConnBytes int64
	// MaxServerBytes bounds the same over all connections, counting a
	// request's payload from its header on (half-received frames count) and
	// 3 KiB per call in flight (what a call holds besides its bytes); a
	// connection that would go over it waits (a started frame's FrameTimeout
	// keeps running), except a small request on a connection with nothing
	// in flight, or when the server holds nothing. Default 64 MiB.
	MaxServerBytes int64
	// MaxConns caps the connections Serve keeps open (ServeConn is not
	// counted); WhenFull says what happens to more (see uds.Server and
	// docs/server.md). Default 0: no limit.
	MaxConns int
	WhenFull uds.FullPolicy
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
	// UnaryInterceptors and StreamInterceptors run around every unary and
	// server-streaming call, the first outermost (intercept.go). Default none.
	UnaryInterceptors  []UnaryServerInterceptor
	StreamInterceptors []StreamServerInterceptor
	// OnRefused is told of each call the server answers with an error
	// before any interceptor or handler runs (intercept.go: RefusedCall),
	// for metrics (rpc/rpcprom counts them). Called on the connection's
	// reader: it must not block. Default none.
	OnRefused func(RefusedCall)
	// NoShm turns the shared-memory data path off (protocol/spec.md,
	// section 10). By default, on Linux, the server accepts a client's
	// sealed memfd offer on a unix socket, checking its seals and size
	// before it maps it, and sends responses and stream items of
	// ShmThreshold bytes or more through it.
	NoShm bool
	// NoSpin turns off the lone waiter's poll: a bidi handler's recv
	// that is the only call on its connection and reads the socket itself
	// (it holds the read role, bidi_lead.go) polls for its next item, and
	// the reader of a connection that has just answered a unary call run
	// inline, with no other call in flight (the 32nd in a row that came
	// alone), polls for the next request (a sequential client sends it at
	// once), each for up to LoneSpin before
	// it parks, while recent polls found data within that time (as
	// ClientOptions.NoSpin).
	NoSpin bool
	// ShmThreshold is the payload size from which responses and stream
	// items go through the shared region. Default 16 KiB.
	ShmThreshold int
	// ShmInPlace lets handlers work in the shared region without copies
	// (default off: a request is copied out of the region before its
	// handler runs). With it, a request that came through the region is
	// read in place: the handler's req is the client's slot, released when
	// the handler returns (also when the call is canceled, times out or the
	// connection ends). A unary handler's dst is then a slot of the
	// server's half (capacity max(len(req), ShmThreshold)), when one is
	// free at once; an answer appended into it goes back with no copy.
	//
	// The cost, and why it is opt-in: the client can still write the
	// request's bytes while the handler runs, so a handler may see them
	// change between two reads (check, then use). Use it only for handlers
	// that read req once (an echo, a copy, a hash) or whose clients are
	// trusted; a client that rewrites its slot corrupts only its own call.
	// Handlers must not keep req or dst after they return.
	ShmInPlace bool
	// noCallsBell (tests) leaves shm_calls_bell out of the hello: the
	// connection's call slots then use the per-slot wakes (an older peer).
	noCallsBell bool
	// noShmStreams (tests) leaves shm_streams (spec 10.9) out of the hello.
	noShmStreams bool
	// withholdCBell (tests): a hostile server that sets shm_calls_bell but
	// never bumps or wakes cbell.
	withholdCBell bool
}

// Server serves udskit RPC and NDJSON clients. Create it with NewServer.
type Server struct {
	opts     ServerOptions
	log      *slog.Logger
	handlers atomic.Pointer[map[string]*handler]
	regMu    sync.Mutex

	acc *uds.Server // the accept loop of Serve

	mu       sync.Mutex
	conns    map[*serverConn]struct{}
	draining bool
	closed   bool
	connsWG  sync.WaitGroup
	idle     chan struct{} // signaled when a conn goes away while draining
	sweeping bool          // the timeout sweeper runs (under mu)
	shmDone  shmClosed     // shared-memory counters of closed connections (under mu; shm_stats.go)

	held atomic.Int64 // bytes held by all connections (see budget.go)

	lingering atomic.Bool // Linger was called (linger.go)

	health healthState // statuses for the health method (health.go)

	unaryIC  UnaryServerInterceptor  // the chain of opts.UnaryInterceptors, nil if none
	streamIC StreamServerInterceptor // the chain of opts.StreamInterceptors, nil if none

	watchMu     sync.Mutex
	watchConns  map[*serverConn]struct{} // conns in frame mode, for the inline watchdog
	watching    bool                     // the watchdog goroutine runs
	watchAsleep atomic.Bool              // the watchdog is parked; the next inline run wakes it
	watchWake   chan struct{}            // (buffered 1) wakes a parked watchdog
	watchLooks  atomic.Uint64            // the watchdog's ticks, for tests

	// The bidi read role (bidi_lead.go), for tests: noBidiLead (set before
	// Serve) keeps the role with the reader; bidiPasses counts the reader's
	// passes to a handler, bidiLedItems the items a handler's recv read
	// itself.
	noBidiLead   bool
	noWatchLead  bool // the watchdog never takes the role from a handler holding it
	bidiPasses   atomic.Uint64
	bidiLedItems atomic.Uint64
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
		opts.MaxConnBytes = 16 << 20
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
		conns:     map[*serverConn]struct{}{},
		idle:      make(chan struct{}, 1),
		watchWake: make(chan struct{}, 1),
		unaryIC:   chainUnaryServer(opts.UnaryInterceptors),
		streamIC:  chainStreamServer(opts.StreamInterceptors),
	}
	m := map[string]*handler{}
	s.handlers.Store(&m)
	s.registerStd()
	// The connection is tracked in the accept loop itself (ConnContext runs
	// there), before the loop accepts again: a Shutdown right after an
	// accept drains it, and a handoff.Listener, which waits for the loop to
	// be back in Accept, knows it has been handed to the server.
	s.acc = &uds.Server{MaxConns: opts.MaxConns, WhenFull: opts.WhenFull, Logger: opts.Logger,
		ConnContext: func(ctx context.Context, _ net.Listener, c net.Conn) context.Context {
			return context.WithValue(ctx, trackedKey{}, s.track(c))
		},
		Handler: func(ctx context.Context, _ net.Conn) {
			if sc, _ := ctx.Value(trackedKey{}).(*serverConn); sc != nil {
				s.run(sc)
			}
		}}
	return s
}

// trackedKey keys, in an accepted connection's ctx, its tracked serverConn.
type trackedKey struct{}

func (s *Server) register(h *handler) {
	if h.name == "" {
		panic("rpc: empty method name")
	}
	if len(h.name) > frame.MaxHead-2 {
		panic("rpc: method name too long")
	}
	h.cost.Store(costUnknown)
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

// Methods lists the registered method names (not the standard methods,
// StdPrefix, which every server has).
func (s *Server) Methods() []string {
	m := *s.handlers.Load()
	out := make([]string, 0, len(m))
	for k, h := range m {
		if h.std {
			continue
		}
		out = append(out, k)
	}
	return out
}

func (s *Server) lookup(method []byte) *handler {
	return (*s.handlers.Load())[string(method)]
}

// Serve accepts connections on l and serves each until l fails or the server
// shuts down; it then returns ErrServerClosed (after Shutdown/Close) or the
// accept error. Serve may be called for several listeners. The accept loop
// is a uds.Server's: MaxConns and WhenFull apply, temporary accept errors
// (EMFILE) back off up to a second, and Serve closes l when it returns.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	stopping := s.draining || s.closed
	s.mu.Unlock()
	if stopping {
		l.Close()
		return ErrServerClosed
	}
	if ul, ok := l.(interface {
		SetRefusalNotice(func(uds.Cred, error) []byte)
	}); ok { // a *uds.Listener, or one that embeds it
		ul.SetRefusalNotice(RefusalNotice) // spec 5.4: a refused client learns it is permanent
	}
	err := s.acc.Serve(l)
	if errors.Is(err, uds.ErrServerClosed) {
		return ErrServerClosed
	}
	return err
}

// Rejected counts the connections Serve closed because MaxConns were open.
func (s *Server) Rejected() uint64 { return s.acc.Rejected() }

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
		cs := sc.shmSession()
		s.mu.Lock()
		delete(s.conns, sc)
		s.addClosedLocked(cs)
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
			// A connection accepted just before the drain may still be on
			// its way to ServeConn (which serves it through the drain):
			// wait for the accept loop's handlers too.
			if err := s.acc.Shutdown(ctx); err != nil {
				s.Close()
				return err
			}
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

// stopAccepting sets *flag (s.draining or s.closed) under s.mu, makes the
// accept loop stop (closing the listeners), and returns the connections
// open at that moment. A connection accepted meanwhile sees the flag in
// ServeConn: it is drained (or closed, after Close).
func (s *Server) stopAccepting(flag *bool) []*serverConn {
	s.mu.Lock()
	*flag = true
	s.mu.Unlock()
	s.acc.StopAccepting() // its connections are ours: the caller drains or closes them
	s.mu.Lock()
	defer s.mu.Unlock()
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
	s.acc.Close()
	s.connsWG.Wait()
	return nil
}
