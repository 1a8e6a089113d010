package rpc_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

type Query struct {
	Service string `json:"service"`
}

type Location struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

func Example() {
	dir, _ := os.MkdirTemp("", "rpc-example")
	defer os.RemoveAll(dir)
	addr := "unix:" + filepath.Join(dir, "app.sock")
	ctx := context.Background()

	// Server: a JSON method and a raw-bytes method.
	s := rpc.NewServer(rpc.ServerOptions{})
	rpc.HandleJSON(s, "getService", func(ctx context.Context, q Query) (Location, error) {
		if q.Service == "" {
			return Location{}, rpc.Errorf(rpc.InvalidArgument, "service is required")
		}
		return Location{Host: "10.0.0.7", Port: 8765}, nil
	})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req...), nil
	})
	l, err := uds.Listen(ctx, addr, uds.ListenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	go s.Serve(l)
	defer s.Shutdown(ctx)

	// Client.
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	var loc Location
	if err := c.Call(ctx, "getService", Query{Service: "barista"}, &loc); err != nil {
		log.Fatal(err)
	}
	fmt.Println(loc.Host, loc.Port)

	buf := make([]byte, 0, 64)
	out, _ := c.CallRaw(ctx, "echo", []byte("ping"), buf)
	fmt.Println(string(out))

	err = c.Call(ctx, "getService", Query{}, &loc)
	fmt.Println(rpc.CodeOf(err), err)
	err = c.Call(ctx, "nope", nil, nil)
	fmt.Println(rpc.CodeOf(err))
	// Output:
	// 10.0.0.7 8765
	// ping
	// invalid_argument rpc error: invalid_argument: service is required
	// unimplemented
}
