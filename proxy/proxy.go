package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/internal/linger"
	"github.com/udskit/udskit/uds"
)

// Route is one listen address and the upstream it forwards to.
type Route struct {
	Listen string // where clients connect (any uds address form)
	To     string // where the proxy dials for each client
}

// RouteError reports --listen/--to lists that do not pair up.
type RouteError struct {
	Listens, Tos int
}

func (e *RouteError) Error() string {
	return fmt.Sprintf("%d listen address(es) but %d upstream address(es): give one --to per --listen, paired in order", e.Listens, e.Tos)
}

// PairRoutes pairs listen and to addresses by position and checks that every
// address parses. Unequal lengths are a *RouteError.
func PairRoutes(listen, to []string) ([]Route, error) {
	if len(listen) != len(to) {
		return nil, &RouteError{Listens: len(listen), Tos: len(to)}
	}
	if len(listen) == 0 {
		return nil, errors.New("no routes: give at least one --listen ADDR --to ADDR pair")
	}
	routes := make([]Route, len(listen))
	for i := range listen {
		if _, err := uds.ParseAddr(listen[i]); err != nil {
			return nil, fmt.Errorf("listen address #%d: %w", i+1, err)
		}
		if _, err := uds.ParseAddr(to[i]); err != nil {
			return nil, fmt.Errorf("upstream address #%d: %w", i+1, err)
		}
		routes[i] = Route{Listen: listen[i], To: to[i]}
	}
	return routes, nil
}

// Options configures a Proxy. The zero value is a sane default: owner-only
// sockets, no peer policy, dial once with a 10s timeout, no connection limit,
// no idle timeout, 1 MiB splice pipes, logs to slog.Default().
type Options struct {
	// Listen is passed to uds.Listen for every route (Mode, UID/GID, DirMode,
	// Policy, ...). Its Logger defaults to Logger.
	Listen uds.ListenOptions
	// Wait makes each upstream dial retry until the upstream accepts or
	// DialTimeout passes (an upstream that starts after the proxy).
	Wait bool
	// DialTimeout bounds each upstream connect, including waiting. Default 10s.
	DialTimeout time.Duration
	// DialTLS is the client configuration for tls: upstreams (see
	// uds.DialOptions.TLS), DialSSH the options of ssh:// upstreams.
	DialTLS *tls.Config
	DialSSH uds.SSHOptions
	// MaxConns caps concurrent client connections across all routes;
	// WhenFull says what happens to more: by default they are closed at
	// once, as by every udskit server (uds.Server, docs/server.md);
	// uds.BacklogWhenFull stops accepting until a connection ends. Zero
	// means no cap.
	MaxConns int
	WhenFull uds.FullPolicy
	// IdleTimeout closes a connection after this long without a byte moving
	// either way. Zero means none.
	IdleTimeout time.Duration
	// PipeSize is the splice pipe size per direction. Default DefaultPipeSize.
	PipeSize int
	// NoSplice forces the portable copy path.
	NoSplice bool
	// SpliceUnixToTCP is JoinOptions.SpliceUnixToTCP for every connection.
	SpliceUnixToTCP bool
	// SocketBuffer is JoinOptions.SocketBuffer (SO_SNDBUF of unix sockets)
	// for every connection. Default uds.DefaultSocketBuffer; negative keeps the
	// kernel's default.
	SocketBuffer int
	// Logger gets one line per connection and lifecycle notes. Default slog.Default().
	Logger *slog.Logger
	// Tap, when set, sees the bytes of every connection (udskit proxy
	// --capture). Its conns hide the sockets, so tapped connections use the
	// copy path, never splice.
	Tap Tap
}

// Tap records what a Proxy relays. Tap is called once per connection after
// the upstream dial; Join runs on the conns it returns, and done is called
// with Join's result.
type Tap interface {
	Tap(client, upstream net.Conn, r Route) (c, u net.Conn, done func(JoinResult))
}

// Stats are a Proxy's counters.
type Stats struct {
	Active   int64 // connections being proxied now
	Total    int64 // connections accepted since start
	Failed   int64 // connections whose upstream dial failed
	BytesIn  int64 // client -> upstream, finished connections
	BytesOut int64 // upstream -> client, finished connections
	Rejected int64 // connections closed at once because MaxConns were open
	Draining bool  // Shutdown, Linger or Close has been called
}

// Proxy serves one or more routes.
type Proxy struct {
	opts      Options
	log       *slog.Logger
	routes    []Route
	listeners []Listener
	acc       *uds.Server // the accept loop, shared by every route

	served   atomic.Bool
	active   atomic.Int64
	total    atomic.Int64
	failed   atomic.Int64
	bytesIn  atomic.Int64
	bytesOut atomic.Int64
	draining atomic.Bool // Shutdown, Linger or Close was called (Stats.Draining)
}

// Listener is what a route is served on: a *uds.Listener, or one that wraps
// it (a handoff.Listener).
type Listener interface {
	net.Listener
	UAddr() uds.Addr
}

// Listen binds every route's listen address. On any failure the listeners
// already bound are closed and the error names the route.
func Listen(ctx context.Context, routes []Route, opts Options) (*Proxy, error) {
	if len(routes) == 0 {
		return nil, errors.New("proxy: no routes")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Listen.Logger == nil {
		opts.Listen.Logger = opts.Logger
	}
	var ls []Listener
	closeAll := func() {
		for _, l := range ls {
			l.Close()
		}
	}
	for _, r := range routes {
		if _, err := uds.ParseAddr(r.To); err != nil {
			closeAll()
			return nil, fmt.Errorf("route %s -> %s: %w", r.Listen, r.To, err)
		}
		lo := opts.Listen
		// uds.Listen names the address in its errors, and refuses a peer
		// policy on TCP (uds.ErrPolicyOnTCP: no kernel credentials).
		l, err := uds.Listen(ctx, r.Listen, lo)
		if err != nil {
			closeAll()
			return nil, err
		}
		ls = append(ls, l)
	}
	return New(routes, ls, opts)
}

// New returns a Proxy serving routes on listeners that already listen
// (inherited, or taken over from another process), paired by position.
// opts.Listen is not used. On error the listeners are closed.
func New(routes []Route, ls []Listener, opts Options) (*Proxy, error) {
	if len(routes) == 0 || len(routes) != len(ls) {
		for _, l := range ls {
			l.Close()
		}
		return nil, fmt.Errorf("proxy: %d routes but %d listeners", len(routes), len(ls))
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &Proxy{opts: opts, log: opts.Logger, routes: routes, listeners: ls}
	routeOf := map[net.Listener]Route{}
	for i, l := range ls {
		routeOf[l] = routes[i]
	}
	p.acc = &uds.Server{MaxConns: opts.MaxConns, WhenFull: opts.WhenFull, Logger: opts.Logger,
		ConnContext: func(ctx context.Context, l net.Listener, _ net.Conn) context.Context {
			return context.WithValue(ctx, routeKey{}, routeOf[l])
		},
		Handler: func(ctx context.Context, c net.Conn) {
			p.total.Add(1)
			p.active.Add(1)
			defer p.active.Add(-1)
			p.handle(ctx, c, ctx.Value(routeKey{}).(Route))
		}}
	return p, nil
}

// Addrs returns the bound listen addresses, in route order; a TCP port 0 is
// resolved to the real port.
func (p *Proxy) Addrs() []uds.Addr {
	out := make([]uds.Addr, len(p.listeners))
	for i, l := range p.listeners {
		a := l.UAddr()
		if ta, ok := l.Addr().(*net.TCPAddr); ok && a.Kind != uds.TLS {
			a = uds.Addr{Kind: uds.TCP, Name: ta.String()}
		}
		out[i] = a
	}
	return out
}

// Stats returns the current counters.
func (p *Proxy) Stats() Stats {
	return Stats{Active: p.active.Load(), Total: p.total.Load(), Failed: p.failed.Load(),
		BytesIn: p.bytesIn.Load(), BytesOut: p.bytesOut.Load(), Rejected: int64(p.acc.Rejected()),
		Draining: p.draining.Load()}
}

// routeKey keys the Route of a connection in its handler's ctx.
type routeKey struct{}

// Serve runs the accept loops (one uds.Server for every route, so MaxConns
// counts them all) until Shutdown or Close, then waits for the connections
// to end (Shutdown bounds that wait). It returns nil after a Shutdown/Close
// and the accept error otherwise.
func (p *Proxy) Serve() error {
	if !p.served.CompareAndSwap(false, true) {
		return errors.New("proxy: Serve called twice")
	}
	errc := make(chan error, len(p.listeners))
	for i, l := range p.listeners {
		go func() {
			err := p.acc.Serve(l)
			if err != nil && !errors.Is(err, uds.ErrServerClosed) {
				err = fmt.Errorf("accept on %s: %w", p.routes[i].Listen, err)
				p.acc.StopAccepting() // one route failing stops them all
			} else {
				err = nil
			}
			errc <- err
		}()
	}
	var first error
	for range p.listeners {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	// Wait for the connections: after a failed route, until they end; after
	// Shutdown or Close, with them (their deadline, or Close, ends them).
	p.acc.Shutdown(context.Background())
	return first
}

// handle dials the upstream for one client and joins the two.
func (p *Proxy) handle(ctx context.Context, client net.Conn, r Route) {
	start := time.Now()
	attrs := []any{"listen", r.Listen, "to", r.To, "client", remoteName(client)}
	if cr, ok := uds.CredOf(client); ok {
		// The pid is what the kernel recorded at connect time; the command is
		// read from /proc now, so both are observations, not identities.
		attrs = append(attrs, "peer_pid", cr.PID, "peer_uid", cr.UID, "peer_gid", cr.GID,
			"peer_comm", peerCommand(cr.PID))
	} else if id := uds.PeerOf(client).Remote; id != nil {
		// A tls: client: its verified certificate identity.
		attrs = append(attrs, "peer", uds.Peer{Remote: id}.String())
	}
	dctx, cancel := context.WithTimeout(ctx, p.opts.DialTimeout)
	up, err := uds.Dial(dctx, r.To, uds.DialOptions{Wait: p.opts.Wait, TLS: p.opts.DialTLS, SSH: p.opts.DialSSH})
	cancel()
	if err != nil {
		client.Close()
		p.failed.Add(1)
		p.log.Error("proxy upstream dial failed", append(attrs, "err", err, "duration", time.Since(start))...)
		return
	}
	var tapped func(JoinResult)
	if p.opts.Tap != nil {
		client, up, tapped = p.opts.Tap.Tap(client, up, r)
	}
	res := Join(ctx, client, up, JoinOptions{IdleTimeout: p.opts.IdleTimeout, PipeSize: p.opts.PipeSize, NoSplice: p.opts.NoSplice, SpliceUnixToTCP: p.opts.SpliceUnixToTCP, SocketBuffer: p.opts.SocketBuffer})
	if tapped != nil {
		tapped(res)
	}
	p.bytesIn.Add(res.AtoB)
	p.bytesOut.Add(res.BtoA)
	attrs = append(attrs, "bytes_in", res.AtoB, "bytes_out", res.BtoA,
		"duration", time.Since(start), "splice_in", res.SplicedAtoB, "splice_out", res.SplicedBtoA)
	switch {
	case res.Err == nil:
		p.log.Info("proxy conn", attrs...)
	case errors.Is(res.Err, ErrIdleTimeout):
		p.log.Info("proxy conn", append(attrs, "end", "idle timeout")...)
	case errors.Is(res.Err, context.Canceled):
		p.log.Warn("proxy conn", append(attrs, "end", "closed by proxy shutdown")...)
	default:
		p.log.Info("proxy conn", append(attrs, "end", "error", "err", res.Err)...)
	}
}

func remoteName(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil && a.String() != "" && a.String() != "@" {
		return a.Network() + ":" + a.String()
	}
	if a := c.LocalAddr(); a != nil {
		return "unix client of " + a.String()
	}
	return "?"
}

func (p *Proxy) closeListeners() {
	for _, l := range p.listeners {
		l.Close()
	}
}

// Shutdown stops accepting (the listen sockets are closed at once), then waits
// for the open connections to finish. When ctx ends first, the remaining
// connections are closed and ctx's error is returned.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.draining.Store(true)
	p.acc.StopAccepting()
	p.closeListeners() // also those Serve never ran on
	return p.acc.Shutdown(ctx)
}

// Linger keeps relaying and accepting as before until no client connection
// has been open for 250 ms (internal/linger.Quiet) and minGrace has passed
// since the call, or ctx ends (then it returns ctx's error). It does not
// stop the proxy: call Shutdown after it (service.DrainLinger does).
func (p *Proxy) Linger(ctx context.Context, minGrace time.Duration) error {
	p.draining.Store(true)
	return linger.Wait(ctx, minGrace, p.acc.ActiveConns)
}

// Close stops accepting and closes every connection now.
func (p *Proxy) Close() error {
	p.draining.Store(true)
	p.acc.StopAccepting()
	p.closeListeners()
	return p.acc.Close()
}
