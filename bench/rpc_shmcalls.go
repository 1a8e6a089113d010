package bench

import (
	"context"

	"github.com/udskit/udskit/rpc"
)

// rpc-shm-calls is rpc-shm with the client's opt-in
// rpc.ClientOptions.ShmCalls (protocol/spec.md 10.8): unary calls go
// through call slots in the region, woken by futexes, not as frames on the
// socket.
func init() {
	Register(&Transport{
		Name:    "rpc-shm-calls",
		Network: "unix",
		Family:  "shm",
		PerRequest: "as rpc-shm (same server, same handler), the client with rpc.ClientOptions.ShmCalls (opt-in): " +
			"each call is published in a call slot of the region's control block (payloads of 16 KiB or more, or that do not fit the slot, " +
			"in payload slots as rpc-shm) and its answer comes back there; the caller and the server's poller wake each other with a futex only when the other sleeps",
		Serve: rpcEchoServer,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			return dialRPCOpts(ctx, network+":"+address, conc, rpc.ClientOptions{ShmCalls: true})
		},
	})
}

// rpc-shm-calls-inplace is rpc-shm-calls against the ShmInPlace server.
func init() {
	Register(&Transport{
		Name:    "rpc-shm-calls-inplace",
		Network: "unix",
		Family:  "shm",
		PerRequest: "as rpc-shm-calls, the server with rpc.ServerOptions.ShmInPlace (opt-in, as rpc-shm-inplace): " +
			"the handler reads the request in the client's slot and appends its answer into a slot of the server's half",
		Serve: rpcEchoServerInPlace,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			return dialRPCOpts(ctx, network+":"+address, conc, rpc.ClientOptions{ShmCalls: true})
		},
	})
}

// rpc-shm-calls-inplace-view adds the client's CallRawView to
// rpc-shm-calls-inplace: the answer is read in place, in its slot.
func init() {
	Register(&Transport{
		Name:    "rpc-shm-calls-inplace-view",
		Network: "unix",
		Family:  "shm",
		PerRequest: "as rpc-shm-calls-inplace, the callers using rpc.Client.CallRawView (opt-in, as rpc-shm-inplace-view): " +
			"an answer in the region is read in place and its slot released after the caller's next call",
		Serve: rpcEchoServerInPlace,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			cl, _, err := DialRPC(ctx, network+":"+address, conc, rpc.ClientOptions{ShmCalls: true}, true)
			return cl, err
		},
	})
}
