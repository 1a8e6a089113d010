// Command handoffecho is a second, unrelated program built on package
// handoff, for the tests that hand a socket back and forth between it and
// `udskit serve`: an rpc server with one method, echo, that takes over from
// (or hands over to) any process speaking the handoff protocol.
//
//	handoffecho -listen /tmp/s.sock -control /tmp/s.sock.handoff
//	handoffecho -takeover -control /tmp/s.sock.handoff
//	handoffecho -takeover -control ... -die-before-commit   (serves, then dies uncommitted)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/rpc"
)

func main() {
	listen := flag.String("listen", "", "socket address to listen on (fresh start)")
	control := flag.String("control", "", "handoff control socket")
	takeover := flag.Bool("takeover", false, "take the socket over from the instance offering on -control")
	drain := flag.Duration("drain-timeout", 5*time.Second, "drain deadline after a successor took over")
	die := flag.Bool("die-before-commit", false, "take over, serve, then die without committing (test)")
	flag.Parse()
	if err := run(*listen, *control, *takeover, *drain, *die); err != nil {
		fmt.Fprintln(os.Stderr, "handoffecho:", err)
		os.Exit(1)
	}
}

func run(listen, control string, takeover bool, drain time.Duration, die bool) error {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	hp, err := handoff.Start(ctx, []handoff.Spec{{Name: "rpc", Address: listen}},
		handoff.ProcessOptions{Control: control, Takeover: takeover, Logger: log})
	if err != nil {
		return err
	}
	defer hp.Close()
	srv := rpc.NewServer(rpc.ServerOptions{Logger: log})
	srv.HandleRaw("echo", func(_ context.Context, req, _ []byte) ([]byte, error) { return req, nil })
	served := make(chan error, 1)
	go func() { served <- srv.Serve(hp.Listener("rpc")) }()
	if die {
		<-hp.Listener("rpc").Accepting()
		time.Sleep(50 * time.Millisecond) // take a few connections, then vanish uncommitted
		fmt.Println("dying before commit")
		os.Exit(3)
	}
	res, err := hp.Ready(ctx)
	if err != nil {
		return err
	}
	if res != nil {
		fmt.Println(res.String())
	} else {
		fmt.Println("listening on", hp.Listener("rpc").UAddr())
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	select {
	case err := <-served:
		return err
	case <-sigs:
	case <-hp.Committed():
	}
	dctx, cancel := context.WithTimeout(ctx, drain)
	defer cancel()
	if err := srv.Shutdown(dctx); errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintln(os.Stderr, "handoffecho: drain timeout: closed the remaining connections")
	} else if err != nil {
		return err
	}
	<-served
	return nil
}
