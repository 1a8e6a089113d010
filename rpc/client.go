package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/uds"
)

// ClientOptions configures a Client. The zero value is a sane default.
type ClientOptions struct {
	// SocketBuffer is SO_SNDBUF for unix-socket connections, in bytes. Default
	// (0) uds.DefaultSocketBuffer, 4 MiB, capped by the kernel at net.core.wmem_max;
	// negative keeps the kernel's default. TCP connections are left to autotune.
	SocketBuffer int
	// Codec encodes Call and Stream values. Default: chosen per value
	// ([]byte raw, proto.Message protobuf, anything else JSON).
	Codec Codec
	// MaxFrame is the largest payload this client accepts; the connection uses
	// the smaller of this and the server's. Default frame.DefaultMaxFrame.
	MaxFrame uint32
	// Wait makes Dial wait for the server to appear (within ctx) instead of
	// failing at once when the socket is missing or refuses.
	Wait bool
	// NoReconnect turns off reconnecting after the connection is lost.
	NoReconnect bool
	// WaitForReady makes a call that finds no connection wait, within its
	// ctx, for the background reconnect to succeed. By default a call fails
	// fast (spec 4.2): once a reconnect attempt has failed, calls waiting for
	// it fail with Unavailable (or the server's refusal, e.g. PermissionDenied)
	// instead of blocking until ctx ends, which with context.Background() is never.
	WaitForReady bool
	// Conns is the most connections the client opens to the server. Dial
	// opens one; each call goes to the open connection with the fewest calls
	// in flight (the first on a tie, so a lone caller always uses the same
	// one), and when every open connection has calls in flight another is
	// opened in the background, up to Conns (a stream, which stays on its
	// connection for its whole life, waits for that one instead of joining
	// a busy one). Default DefaultConns (why two:
	// docs/internals.md); 1 multiplexes every call on one connection. A
	// pooled connection that fails to open (a server at its connection
	// limit) is tried again after MaxBackoff, then twice that, up to 64
	// times MaxBackoff while it keeps failing.
	Conns int
	// LargeConns is the most connections the client opens for large calls
	// (a unary request of frame.DefaultLargePayload, 32 KiB, or more). A
	// large call goes to a connection with nothing in flight when there is
	// one; when there is none, another is opened in the background, up to
	// LargeConns, and the call goes to the least busy connection meanwhile.
	// Small calls keep to the first Conns connections, so their answers
	// still batch. Multiplexing 100 KiB calls costs more than it saves (a
	// connection's writes, and its reads, take turns: docs/performance.md,
	// "Aligned payloads and a connection per large call"). 0 means DefaultLargeConns when Conns is left at its
	// default, and Conns when Conns is set; values under Conns mean Conns.
	LargeConns int
	// ShmConns is LargeConns for large calls on a connection that uses
	// shared memory (NoShm, ShmThreshold): their frames carry only a
	// descriptor, so spreading them buys nothing, and a few connections let
	// the descriptor frames of concurrent calls share writes and reads
	// (docs/performance.md, "Shared memory"). 0 means DefaultShmConns when
	// Conns and LargeConns are left at their defaults, else LargeConns.
	ShmConns int
	// MinBackoff and MaxBackoff bound the jittered reconnect delay. Defaults
	// 10ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// HandshakeTimeout bounds the hello exchange. Default 10s.
	HandshakeTimeout time.Duration
	// Logger receives reconnect notes. Default slog.Default().
	Logger *slog.Logger
	// WrapConn, when set, wraps every connection the client opens (and the
	// one given to NewClient), e.g. capture.ClientWrap to record the
	// client's own traffic as pcapng.
	WrapConn func(net.Conn) net.Conn
	// UnaryInterceptors and StreamInterceptors run around every unary call
	// (Call, CallRaw) and stream start (Stream), the first outermost
	// (intercept.go). Default none.
	UnaryInterceptors  []UnaryClientInterceptor
	StreamInterceptors []StreamClientInterceptor
	// TLS is the client configuration for a tls: address (required there;
	// see uds.DialOptions.TLS and package tlsfiles).
	TLS *tls.Config
	// SSH configures ssh:// addresses (see uds.SSHOptions).
	SSH uds.SSHOptions
	// NoShm turns the shared-memory data path off (protocol/spec.md,
	// section 10; docs/internals.md, "Shared memory"). By default, on Linux,
	// a connection to a local unix: or @abstract address (no WrapConn)
	// offers the server a sealed memfd region, and payloads of ShmThreshold
	// bytes or more travel in it when the server accepts; TCP, TLS, ssh://
	// and older or non-Go servers keep the socket path.
	NoShm bool
	// ShmThreshold is the payload size from which requests go through the
	// shared region. Default 16 KiB.
	ShmThreshold int
	// ShmCalls publishes unary calls in call slots of the shared region
	// (protocol/spec.md 10.8) instead of as frames on the socket, when the
	// server agrees: the caller and the server's poller wake each other
	// with futexes only when the other sleeps. Off by default because it
	// trades CPU for latency: a caller spins (yields) briefly, about 2 µs,
	// before it waits, and the server keeps a thread polling while calls
	// come. A waiting caller parks as a goroutine, and one poller per
	// connection sleeps in FUTEX_WAIT for all of them (the client's bell,
	// spec 10.8 shm_calls_bell); against a server without the bell each
	// waiting caller holds an OS thread in FUTEX_WAIT instead (at most 32
	// per connection; calls beyond that and server streams use the socket
	// as before; CallRawView works through slots too). Bidirectional and
	// client-streaming calls live in the slots too when the server sets
	// shm_streams (spec 10.9, a newer Go server): their items are published
	// in one-frame mailboxes of the slot, no frame on the socket. Only with shared memory (not NoShm). Unary calls
	// whose payload fits a slot's payload area (64 KiB) stay on the pool's
	// first connection while it has a free slot, whatever Conns and
	// ShmConns say: one server poller then serves them all.
	ShmCalls bool
	// noCallsBell (tests) leaves shm_calls_bell out of the hello: the
	// connection's call slots then use the per-slot wakes (an older peer).
	noCallsBell bool
	// noShmStreams (tests) leaves shm_streams (spec 10.9) out of the
	// hello: bidi and client-streaming calls stay on the socket.
	noShmStreams bool
	// NoSpin turns off the lone waiter's poll: a unary caller waiting for
	// its answer, or a bidi call's Recv waiting for its next item, that is
	// the only call on its connection and reads the socket itself (the
	// sequential calls of a CLI or a health check, a one-call ping-pong)
	// polls the socket with non-blocking reads for up to
	// LoneSpin (50 µs) before it parks, while recent answers came within
	// that time and its thread keeps its CPU (internal/spinread). It
	// costs CPU for the time it polls (about the round trip's wait) and
	// saves the wake of a parked thread, which on a VM whose idle vCPU
	// halts is the slow round trips' cause (docs/performance.md,
	// "Bidirectional calls").
	NoSpin bool
}

// LoneSpin bounds the poll of a lone waiter (ClientOptions.NoSpin,
// ServerOptions.NoSpin).
const LoneSpin = 50 * time.Microsecond

// DefaultConns is ClientOptions.Conns when it is 0.
const DefaultConns = 2

// DefaultLargeConns is ClientOptions.LargeConns when both it and Conns are 0.
const DefaultLargeConns = 16

// DefaultShmConns is ClientOptions.ShmConns when it, Conns and LargeConns
// are 0.
const DefaultShmConns = 2

// Client is a client of an rpc Server, safe for concurrent use: calls are
// multiplexed over a small pool of connections (see ClientOptions.Conns).
type Client struct {
	addr string
	opts ClientOptions
	log  *slog.Logger

	slots []slot // the pool; slots[0] is opened by Dial

	mu        sync.Mutex
	closed    bool
	growing   atomic.Bool              // a pooled connection is being opened
	growAfter atomic.Int64             // (unix ns) no pooled connection opens before this, after one failed
	growFails int                      // (mu) pooled dials failed in a row
	growDone  chan struct{}            // (mu) closed when the pooled dial under way (growing) ends
	live      map[*clientConn]struct{} // (mu) every connection not yet closed, pooled or not (a draining one replaced in its slot)
	conns     sync.WaitGroup
	base      context.Context
	stop      context.CancelFunc

	unaryIC  UnaryClientInterceptor  // the chain of opts.UnaryInterceptors, nil if none
	streamIC StreamClientInterceptor // the chain of opts.StreamInterceptors, nil if none
	invoke   UnaryInvoker            // callRaw, made once for unaryIC
	open     StreamOpener            // openStream, made once for streamIC
}

// Dial connects to the server at address (see uds.ParseAddr) and does the
// hello exchange. With opts.Wait it waits for the server within ctx.
func Dial(ctx context.Context, address string, opts ClientOptions) (*Client, error) {
	c := newClient(address, opts)
	cc, err := c.dialOnce(ctx, opts.Wait)
	if err != nil {
		c.stop()
		return nil, err
	}
	c.slots[0].cur.Store(cc)
	return c, nil
}

// NewClient runs a client over an established connection (a socketpair, a
// conn from elsewhere). It never reconnects.
func NewClient(ctx context.Context, conn net.Conn, opts ClientOptions) (*Client, error) {
	opts.NoReconnect = true
	opts.Conns, opts.LargeConns, opts.ShmConns = 1, 1, 1
	c := newClient("", opts)
	if opts.WrapConn != nil {
		conn = opts.WrapConn(conn)
	}
	cc, err := c.handshake(ctx, conn)
	if err != nil {
		c.stop()
		conn.Close()
		return nil, err
	}
	c.slots[0].cur.Store(cc)
	return c, nil
}

func newClient(address string, opts ClientOptions) *Client {
	if opts.MaxFrame == 0 {
		opts.MaxFrame = frame.DefaultMaxFrame
	}
	opts.MaxFrame = max(opts.MaxFrame, frame.MinMaxFrame)
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 10 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = time.Second
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Conns <= 0 {
		opts.Conns = DefaultConns
		if opts.LargeConns == 0 {
			opts.LargeConns = DefaultLargeConns
			if opts.ShmConns <= 0 {
				opts.ShmConns = DefaultShmConns
			}
		}
	}
	opts.LargeConns = max(opts.LargeConns, opts.Conns)
	if opts.ShmConns <= 0 {
		opts.ShmConns = opts.LargeConns
	}
	c := &Client{addr: address, opts: opts, log: opts.Logger, slots: make([]slot, max(opts.LargeConns, opts.ShmConns)),
		live: map[*clientConn]struct{}{}}
	c.base, c.stop = context.WithCancel(context.Background())
	if c.unaryIC = chainUnaryClient(opts.UnaryInterceptors); c.unaryIC != nil {
		c.invoke = c.callRaw
	}
	if c.streamIC = chainStreamClient(opts.StreamInterceptors); c.streamIC != nil {
		c.open = c.openStream
	}
	return c
}

// Close closes the connections; calls in flight fail with Canceled. It
// waits for the client's goroutines to end.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var dialing []chan struct{}
	for i := range c.slots {
		if ch := c.slots[i].dialing; ch != nil {
			dialing = append(dialing, ch)
		}
	}
	c.mu.Unlock()
	c.stop()
	for _, ch := range dialing {
		<-ch
	}
	// Every connection, including a draining one whose slot a reconnect
	// has since filled: its calls end too, and its reader.
	c.mu.Lock()
	live := make([]*clientConn, 0, len(c.live))
	for cc := range c.live {
		live = append(live, cc)
	}
	c.mu.Unlock()
	for _, cc := range live {
		cc.close(ErrClientClosed)
	}
	c.conns.Wait()
	return nil
}

// Call invokes method with req and decodes the response into resp (which may
// be nil to discard it). The codec is ClientOptions.Codec or chosen from req's
// type. Errors are *Error.
func (c *Client) Call(ctx context.Context, method string, req, resp any) error {
	codec := c.opts.Codec
	if codec == nil {
		codec = codecFor(req)
	}
	bp := getBuf()
	defer putBuf(bp)
	in, err := codec.Marshal((*bp)[:0], req)
	if err != nil {
		return encodeError(method+" request", err)
	}
	*bp = in
	op := getBuf()
	defer putBuf(op)
	out, err := c.CallRaw(ctx, method, in, (*op)[:0])
	*op = out
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	if err := codec.Unmarshal(out, resp); err != nil {
		return decodeError(method+" response", err)
	}
	return nil
}

// CallRaw invokes method with the payload req, appends the response payload
// to dst and returns it. With a dst of enough capacity it allocates nothing.
// req is not retained after CallRaw returns.
func (c *Client) CallRaw(ctx context.Context, method string, req, dst []byte) ([]byte, error) {
	if ic := c.unaryIC; ic != nil {
		return ic(ctx, method, req, dst, c.invoke)
	}
	return c.callRaw(ctx, method, req, dst)
}

// callRaw is CallRaw without the interceptors.
func (c *Client) callRaw(ctx context.Context, method string, req, dst []byte) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		cc, reserved, err := c.connCall(ctx, len(req))
		if err != nil {
			return dst, err
		}
		out, err := cc.unary(ctx, method, req, dst)
		cc.shmUnreserve(reserved)
		if err == nil {
			return out, nil
		}
		// A refused call was not processed: send it again on a new
		// connection, within the caller's deadline.
		if e, ok := err.(*Error); ok && e.Refused && attempt < 10 && ctx.Err() == nil {
			cc.markDraining()
			continue
		}
		return out, err
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) <= maxPooledBuf {
		*b = (*b)[:0]
		bufPool.Put(b)
	}
}

// errConnLost is the cause of calls failed by a dropped connection.
var errConnLost = errors.New("connection lost")
