package rpc

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// TestServerMaxConns: a plain rpc.Server has a connection limit; the
// connection over it is closed at once (the default) and counted.
func TestServerMaxConns(t *testing.T) {
	s := NewServer(ServerOptions{MaxConns: 2})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return req, nil })
	addr := startServer(t, s)
	a, b := dial(t, addr), dial(t, addr)
	for _, c := range []*Client{a, b} {
		if _, err := c.CallRaw(context.Background(), "echo", []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, `s.ActiveConns() == 2`, func() bool { return s.ActiveConns() == 2 })
	c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 16)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("third connection: %d %v, want EOF", n, err)
	}
	if s.Rejected() != 1 {
		t.Fatalf("Rejected() = %d", s.Rejected())
	}
}

// failingListener fails every Accept with EMFILE, as a process out of fds.
type failingListener struct {
	closed chan struct{}
	once   sync.Once // Close is called by Server.Close and by Serve's return, maybe at once
}

func (l *failingListener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: syscall.EMFILE}
	}
}
func (l *failingListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}
func (l *failingListener) Addr() net.Addr { return &net.UnixAddr{Name: "fail", Net: "unix"} }

// TestServeBackoffInterruptible: Serve backing off after accept errors
// (EMFILE) returns as soon as the server is closed, not after its sleep.
func TestServeBackoffInterruptible(t *testing.T) {
	s := NewServer(ServerOptions{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(&failingListener{closed: make(chan struct{})}) }()
	time.Sleep(1500 * time.Millisecond) // the backoff is at its 1 s cap by now
	start := time.Now()
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrServerClosed) {
			t.Fatalf("Serve: %v", err)
		}
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Fatalf("Serve returned %v after Close", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
}
