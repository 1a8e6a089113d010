package bench

import (
	"context"
	"net"

	"google.golang.org/grpc"

	"github.com/udskit/udskit/internal/grpcecho"
)

func init() {
	for _, network := range []string{"unix", "tcp"} {
		Register(&Transport{
			Name:    "grpc-" + network,
			Network: network,
			Family:  "grpc",
			PerRequest: "one unary grpc-go call (HTTP/2, raw-bytes codec, no protobuf) per request; the C callers share " +
				"one ClientConn, i.e. C concurrent HTTP/2 streams on one connection",
			Serve: func(ctx context.Context, ln net.Listener) error { return serveGRPC(ctx, ln) },
			Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
				c, err := grpcecho.Dial(ctx, network, address)
				if err != nil {
					return nil, err
				}
				return grpcClient(c, conc), nil
			},
		})
	}
}

// serveGRPC serves the grpc-go echo service on ln until ctx ends (then nil).
func serveGRPC(ctx context.Context, ln net.Listener, opts ...grpc.ServerOption) error {
	s := grpcecho.NewServer(opts...)
	stop := context.AfterFunc(ctx, s.Stop)
	defer stop()
	err := s.Serve(ln)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// grpcClient makes conc callers sharing c (concurrent HTTP/2 streams).
func grpcClient(c *grpcecho.Client, conc int) *Client {
	cl := &Client{Close: c.Close}
	for i := 0; i < conc; i++ {
		cl.Callers = append(cl.Callers, grpcCaller{c})
	}
	return cl
}

type grpcCaller struct{ c *grpcecho.Client }

func (g grpcCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	return g.c.Echo(ctx, payload)
}
