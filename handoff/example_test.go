package handoff_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/uds"
)

// serve answers each connection with tag (the application's server).
func serve(l net.Listener, tag string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		fmt.Fprintln(c, tag)
		c.Close()
	}
}

// Two processes, shown in one: the running one offers its listener, a new
// one takes it over, serves, and commits; then the old one stops.
func Example() {
	dir, _ := os.MkdirTemp("", "handoff-example")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "app.sock")
	ctl := handoff.ControlPath(sock) // app.sock.handoff, owner-only
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The running process.
	l, err := handoff.Listen(ctx, "api", sock, uds.ListenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	go serve(l, "old")
	off, err := handoff.Offer(ctx, []*handoff.Listener{l}, handoff.OfferOptions{
		Control: ctl,
		State:   func() ([]byte, error) { return []byte(`{"generation":1}`), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer off.Close()

	// The new process (any program): acquire, serve, commit.
	a, err := handoff.Acquire(ctx, ctl, handoff.AcquireOptions{})
	if err != nil {
		log.Fatal(err) // nothing changed: the old process serves on
	}
	nl, err := a.Listener("api", uds.ListenOptions{})
	if err != nil {
		a.Abort(err.Error())
		log.Fatal(err)
	}
	go serve(nl, "new")
	if _, err := a.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("state: %s\n", a.State())

	// The old process: told to stop accepting; it drains and exits.
	<-off.Committed()
	l.Close() // leaves the socket file: the new process serves it

	c, err := net.Dial("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	var who string
	fmt.Fscanln(c, &who)
	fmt.Println("answered by:", who)
	nl.Close() // the new owner's Close removes the file
	// Output:
	// state: {"generation":1}
	// answered by: new
}
