package rpc

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// TestLingerServesUntilClientsLeave: while lingering the server reports
// Draining, keeps answering on open connections (an NDJSON connection,
// which a goaway drain would close once answered, stays open and
// answered), keeps accepting new clients, and Linger returns only once
// every connection has gone; Shutdown afterwards is immediate.
func TestLingerServesUntilClientsLeave(t *testing.T) {
	s := echoServer()
	addr := startServer(t, s)
	c1 := dial(t, addr)
	if _, err := c1.CallRaw(context.Background(), "echo", []byte("a"), nil); err != nil {
		t.Fatal(err)
	}
	nd, err := net.Dial("unix", strings.TrimPrefix(addr, "unix:"))
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	ndr := bufio.NewReader(nd)
	ndCall := func(id string) error {
		if _, err := nd.Write([]byte(`{"id":` + id + `,"func":"echo","data":"x"}` + "\n")); err != nil {
			return err
		}
		nd.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := ndr.ReadString('\n')
		if err == nil && !strings.Contains(line, `"id":`+id) {
			err = errors.New("answer " + line)
		}
		return err
	}
	if err := ndCall("1"); err != nil {
		t.Fatal(err)
	}
	if s.Draining() {
		t.Fatal("Draining before any drain")
	}
	lingered := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		lingered <- s.Linger(ctx, 0)
	}()
	for !s.Draining() {
		if time.Since(start) > 5*time.Second {
			t.Fatal("Draining still false after Linger started")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	c3 := dial(t, addr) // a new client is accepted and served
	for i, call := range []func() error{
		func() error { _, err := c1.CallRaw(context.Background(), "echo", []byte("b"), nil); return err },
		func() error { return ndCall("2") },
		func() error { _, err := c3.CallRaw(context.Background(), "echo", []byte("c"), nil); return err },
	} {
		if err := call(); err != nil {
			t.Errorf("call %d while lingering: %v", i, err)
		}
	}
	c1.Close()
	nd.Close()
	select {
	case err := <-lingered:
		t.Fatalf("Linger returned (%v) with a client connected", err)
	case <-time.After(500 * time.Millisecond):
	}
	c3.Close()
	closed := time.Now()
	select {
	case err := <-lingered:
		if err != nil {
			t.Fatalf("Linger: %v", err)
		}
		// linger.Quiet (250 ms) after the server saw the last close; the
		// rest is slack for a loaded CI machine (1.43 s once at -cpu 1),
		// still far from the 20 s ctx that would end a Linger that missed it.
		if el := time.Since(closed); el > 5*time.Second {
			t.Errorf("Linger returned %v after the last client left; want within 5s", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Linger did not return after every client left (%d open)", s.ActiveConns())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el > 500*time.Millisecond {
		t.Errorf("Shutdown after Linger took %v", el)
	}
}

// TestLingerDeadline: a client that stays keeps Linger until its ctx ends;
// minGrace holds it even with no client.
func TestLingerDeadline(t *testing.T) {
	s := echoServer()
	addr := startServer(t, s)
	c := dial(t, addr)
	if _, err := c.CallRaw(context.Background(), "echo", []byte("a"), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := s.Linger(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Linger with a client that stays: %v, want deadline exceeded", err)
	}
	if el := time.Since(t0); el < 250*time.Millisecond {
		t.Errorf("Linger returned after %v, before its deadline", el)
	}

	s2 := echoServer()
	startServer(t, s2)
	t0 = time.Now()
	if err := s2.Linger(context.Background(), 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el < 400*time.Millisecond || el > 2*time.Second {
		t.Errorf("Linger with no client and a 400ms grace took %v", el)
	}
}
