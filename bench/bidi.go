package bench

import (
	"context"
	"io"
	"net"
	"sync"

	"github.com/udskit/udskit/internal/grpcecho"
	"github.com/udskit/udskit/rpc"
)

// The bidi rows: a ping-pong on one bidirectional call per caller (one item
// each way per request), udskit's (spec 4.3) next to grpc-go's bidi stream.
// Both pair ratios on Over "bidi", so rpc-bidi's "vs grpc" is against
// grpc-bidi; compare its req/s with rpc-unix's for bidi against unary.

// bidiEchoMethod is the rpc bench server's bidirectional echo.
const bidiEchoMethod = "echo-bidi"

// rpcBidiEcho sends each request item back as it comes.
func rpcBidiEcho(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
	for {
		it, err := recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := send(it); err != nil {
			return err
		}
	}
}

func init() {
	Register(&Transport{
		Name: "rpc-bidi", Network: "unix", Over: "bidi", Family: "rpc",
		PerRequest: "one round trip on a udskit bidirectional call (SendRaw of the payload, RecvRawView of its echo; the server's handler takes items as views, HandleRawBidiView); " +
			"each of the C callers keeps its own call open for the whole run; a call alone on its connection (1 caller) polls the socket for up to rpc.LoneSpin before it parks, on both sides (the default; ClientOptions.NoSpin, ServerOptions.NoSpin); the calls are spread over rpc.DefaultConns (2) connections " +
			"(one rpc.Client with Conns 1 each, callers alternating), as rpc-unix's pool spreads its unary calls; one default client now spreads a burst of bidi opens the same way (8 and 8), " +
			"but measured about 8% fewer req/s (median of 7 interleaved runs on a loaded machine, 2026-11-27), so the row keeps two",
		Serve: rpcEchoServer,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			clients := make([]*rpc.Client, min(max(conc, 1), rpc.DefaultConns))
			closeAll := func() error {
				var first error
				for _, c := range clients {
					if c != nil {
						if err := c.Close(); err != nil && first == nil {
							first = err
						}
					}
				}
				return first
			}
			for i := range clients {
				c, err := rpc.Dial(ctx, network+":"+address, rpc.ClientOptions{Conns: 1, MaxFrame: MaxFrame + 1<<10, NoReconnect: true})
				if err != nil {
					closeAll()
					return nil, err
				}
				clients[i] = c
			}
			life, stop := context.WithCancel(context.Background())
			cl := &Client{Close: func() error { stop(); return closeAll() }}
			for i := range conc {
				cl.Callers = append(cl.Callers, &rpcBidiCaller{c: clients[i%len(clients)], life: life})
			}
			return cl, nil
		},
	})
	Register(&Transport{
		Name: "rpc-bidi-shm", Network: "unix", Over: "bidi", Family: "rpc",
		PerRequest: "as rpc-bidi (same server, same handler), the client with rpc.ClientOptions.ShmCalls: each call lives in a stream slot of the shared region " +
			"(protocol/spec.md 10.9), its items published in one-frame mailboxes with no frame on the socket; one rpc.Client with Conns 1 holds all C calls (32 slots per connection)",
		Serve: rpcEchoServer,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			c, err := rpc.Dial(ctx, network+":"+address, rpc.ClientOptions{Conns: 1, ShmConns: 1, LargeConns: 1, ShmCalls: true, MaxFrame: MaxFrame + 1<<10, NoReconnect: true})
			if err != nil {
				return nil, err
			}
			life, stop := context.WithCancel(context.Background())
			cl := &Client{Close: func() error { stop(); return c.Close() }}
			for range conc {
				cl.Callers = append(cl.Callers, &rpcBidiCaller{c: c, life: life})
			}
			return cl, nil
		},
	})
	Register(&Transport{
		Name: "grpc-bidi", Network: "unix", Over: "bidi", Family: "grpc",
		PerRequest: "one round trip on a grpc-go bidirectional stream (SendMsg, RecvMsg; raw-bytes codec); " +
			"each of the C callers keeps its own stream open for the whole run, C HTTP/2 streams on one connection over unix",
		Serve: func(ctx context.Context, ln net.Listener) error { return serveGRPC(ctx, ln) },
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			c, err := grpcecho.Dial(ctx, network, address)
			if err != nil {
				return nil, err
			}
			life, stop := context.WithCancel(context.Background())
			cl := &Client{Close: func() error { stop(); return c.Close() }}
			for range conc {
				cl.Callers = append(cl.Callers, &grpcBidiCaller{c: c, life: life})
			}
			return cl, nil
		},
	})
}

type rpcBidiCaller struct {
	c    *rpc.Client
	life context.Context
	once sync.Once
	st   *rpc.BidiStream
	err  error
}

func (r *rpcBidiCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	r.once.Do(func() { r.st, r.err = r.c.Bidi(r.life, bidiEchoMethod) })
	if r.err != nil {
		return nil, r.err
	}
	if err := r.st.SendRaw(payload); err != nil {
		return nil, err
	}
	return r.st.RecvRawView() // valid until the next Call, like rpc-unix's reused dst
}

type grpcBidiCaller struct {
	c    *grpcecho.Client
	life context.Context
	once sync.Once
	st   *grpcecho.EchoStream
	err  error
}

func (g *grpcBidiCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	g.once.Do(func() { g.st, g.err = g.c.OpenEchoStream(g.life) })
	if g.err != nil {
		return nil, g.err
	}
	return g.st.Echo(payload)
}
