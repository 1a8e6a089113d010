// Command grpcecho serves only the grpc-go echo service (internal/grpcecho,
// raw codec forced) on a unix socket, for benchmarks of other languages'
// gRPC clients (clients/node's bench runs grpc-js against it). It prints
// "READY <addr>" once listening and exits on SIGTERM/SIGINT or when stdin
// closes, so a parent that dies takes it along.
//
//	go run ./tools/grpcecho --addr /tmp/grpc.sock
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/udskit/udskit/internal/grpcecho"
	"github.com/udskit/udskit/uds"
)

func main() {
	addr := flag.String("addr", "", "unix socket path (or any udskit address) to serve on")
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "grpcecho: --addr is required")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	ln, err := uds.Listen(ctx, *addr, uds.ListenOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcecho:", err)
		os.Exit(1)
	}
	s := grpcecho.NewServer(grpcecho.ForceRawCodec())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	go func() {
		<-ctx.Done()
		s.Stop()
	}()
	fmt.Printf("READY %s\n", *addr)
	if err := s.Serve(ln); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "grpcecho:", err)
		os.Exit(1)
	}
}
