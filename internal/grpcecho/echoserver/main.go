// Command echoserver serves the grpcecho service on a unix socket for the
// benchmarks of non-Go clients (clients/python's grpcio baseline). It forces
// the raw codec (see grpcecho.ForceRawCodec), prints "READY PATH" once it
// listens, and exits when its stdin closes (the parent is gone) or on SIGTERM.
//
//	go build -o /tmp/echoserver ./internal/grpcecho/echoserver
//	/tmp/echoserver -unix /tmp/g.sock
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/udskit/udskit/internal/grpcecho"
)

func main() {
	path := flag.String("unix", "", "unix socket path to listen on (required)")
	flag.Parse()
	if *path == "" {
		fmt.Fprintln(os.Stderr, "echoserver: -unix PATH is required")
		os.Exit(2)
	}
	l, err := net.Listen("unix", *path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echoserver:", err)
		os.Exit(1)
	}
	s := grpcecho.NewServer(grpcecho.ForceRawCodec())
	stop := func() { s.Stop() }
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sig
		stop()
	}()
	fmt.Printf("READY %s\n", *path)
	if err := s.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, "echoserver:", err)
		os.Exit(1)
	}
}
