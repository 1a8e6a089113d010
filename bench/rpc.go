package bench

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/udskit/udskit/rpc"
)

// rpcEchoServer is the udskit rpc server of the rpc and ndjson transports:
// one raw "echo" method that sends back the request buffer it was given, as the
// raw server writes back the buffer it read and grpc's echo returns the decoded
// bytes: no transport's handler copies the payload.
func rpcEchoServer(ctx context.Context, ln net.Listener) error {
	return serveRPCEcho(ctx, ln, rpc.ServerOptions{MaxFrame: MaxFrame + 1<<10})
}

// rpcEchoServerInPlace is rpcEchoServer with ServerOptions.ShmInPlace (the
// rpc-shm-inplace row): the same handler, reading its request in the
// client's slot.
func rpcEchoServerInPlace(ctx context.Context, ln net.Listener) error {
	return serveRPCEcho(ctx, ln, rpc.ServerOptions{MaxFrame: MaxFrame + 1<<10, ShmInPlace: true})
}

func serveRPCEcho(ctx context.Context, ln net.Listener, opts rpc.ServerOptions) error {
	s := rpc.NewServer(opts)
	s.HandleRaw("echo", func(_ context.Context, req, _ []byte) ([]byte, error) {
		return req, nil
	})
	s.HandleRawBidiView(bidiEchoMethod, rpcBidiEcho) // the rpc-bidi row (bidi.go); it sends each item before its next recv
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	err := s.Serve(ln)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func init() {
	for _, network := range []string{"unix", "tcp"} {
		Register(&Transport{
			Name:    "rpc-" + network,
			Network: network,
			Family:  "rpc",
			PerRequest: "one udskit rpc unary call of the raw-bytes method \"echo\" (CallRaw into a reused buffer); " +
				"the C callers share one rpc.Client with the default pool: C calls multiplexed over at most rpc.DefaultConns (2) connections, the second opened only when calls overlap (calls of 32 KiB or more: up to rpc.DefaultLargeConns (16), one each when they can); on a unix socket a call alone on its connection polls the socket for up to rpc.LoneSpin before it parks, and so does the server's reader after 32 lone calls in a row (the default; ClientOptions.NoSpin, ServerOptions.NoSpin)",
			Serve: rpcEchoServer,
			Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
				return dialRPCOpts(ctx, network+":"+address, conc, rpc.ClientOptions{NoShm: true})
			},
		})
	}
	// rpc-shm is rpc-unix with the shared-memory path (protocol/spec.md,
	// section 10) on, as it is by default: the same server, the client's
	// NoShm is what rpc-unix sets.
	Register(&Transport{
		Name:    "rpc-shm",
		Network: "unix",
		Family:  "shm",
		PerRequest: "as rpc-unix (same client pool and server), with the shared-memory data path on (the default on Linux): " +
			"payloads of 16 KiB or more are written into the connection's sealed memfd region and the frame carries a descriptor; " +
			"each side copies out once and releases the slot; calls of 32 KiB or more use up to rpc.DefaultShmConns (2) connections (ClientOptions.ShmConns), not 16",
		Serve: rpcEchoServer,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			return dialRPCOpts(ctx, network+":"+address, conc, rpc.ClientOptions{})
		},
	})
	// rpc-shm-inplace is rpc-shm against a server with
	// ServerOptions.ShmInPlace (opt-in: the handler reads the client's slot).
	Register(&Transport{
		Name:    "rpc-shm-inplace",
		Network: "unix",
		Family:  "shm",
		PerRequest: "as rpc-shm (same client, same handler), the server with rpc.ServerOptions.ShmInPlace (opt-in): " +
			"the handler reads the request in the client's slot, so the server makes one copy (into its response slot) instead of two",
		Serve: rpcEchoServerInPlace,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			return dialRPCOpts(ctx, network+":"+address, conc, rpc.ClientOptions{})
		},
	})
	// rpc-shm-inplace-view adds the client's opt-in CallRawView.
	Register(&Transport{
		Name:    "rpc-shm-inplace-view",
		Network: "unix",
		Family:  "shm",
		PerRequest: "as rpc-shm-inplace, the callers using rpc.Client.CallRawView (opt-in): a response in the region is read in place " +
			"(no copy-out) and its slot released when the caller sends its next request",
		Serve: rpcEchoServerInPlace,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			cl, _, err := DialRPC(ctx, network+":"+address, conc, rpc.ClientOptions{}, true)
			return cl, err
		},
	})
}

// dialRPC dials addr (with tlsConf for a tls: address) and makes conc
// callers sharing the client's connections.
func dialRPC(ctx context.Context, addr string, conc int, tlsConf *tls.Config) (*Client, error) {
	return dialRPCOpts(ctx, addr, conc, rpc.ClientOptions{TLS: tlsConf})
}

// dialRPCOpts is dialRPC with client options (MaxFrame and NoReconnect are set here).
func dialRPCOpts(ctx context.Context, addr string, conc int, opts rpc.ClientOptions) (*Client, error) {
	cl, _, err := DialRPC(ctx, addr, conc, opts, false)
	return cl, err
}

// DialRPC dials the bench's rpc client (opts with MaxFrame and NoReconnect
// set as the rpc rows set them) and makes conc callers of "echo" sharing its
// connections: CallRaw callers, or with view CallRawView callers, each view
// valid until its caller's next call (the engine checks it before) and all
// released when the Client closes. It also returns the rpc client. Tools
// that add rows of their own (tools/benchshm) dial with it.
func DialRPC(ctx context.Context, addr string, conc int, opts rpc.ClientOptions, view bool) (*Client, *rpc.Client, error) {
	opts.MaxFrame, opts.NoReconnect = MaxFrame+1<<10, true
	c, err := rpc.Dial(ctx, addr, opts)
	if err != nil {
		return nil, nil, err
	}
	cl := &Client{Close: c.Close}
	var views []*rpcViewCaller
	for range conc {
		if view {
			v := &rpcViewCaller{c: c}
			views = append(views, v)
			cl.Callers = append(cl.Callers, v)
		} else {
			cl.Callers = append(cl.Callers, &rpcCaller{c: c})
		}
	}
	if view {
		cl.Close = func() error { // the callers have stopped: let their last views go
			for _, v := range views {
				v.view.Release()
			}
			return c.Close()
		}
	}
	return cl, c, nil
}

type rpcCaller struct {
	c   *rpc.Client
	buf []byte
}

func (r *rpcCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	out, err := r.c.CallRaw(ctx, "echo", payload, r.buf[:0])
	r.buf = out
	return out, err
}

// rpcViewCaller calls with CallRawView; the answer it returns stays valid
// until its next Call (the engine checks it before), which releases it.
type rpcViewCaller struct {
	c    *rpc.Client
	view rpc.RawView
	buf  []byte
}

func (r *rpcViewCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	r.view.Release()
	v, err := r.c.CallRawView(ctx, "echo", payload, r.buf[:0])
	r.view = v
	if !v.InPlace() {
		r.buf = v.Bytes()
	}
	return v.Bytes(), err
}
