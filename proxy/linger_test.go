package proxy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLingerKeepsAccepting: while lingering the proxy keeps its socket file,
// accepts new clients and relays; Linger returns once every client has
// gone (within a second), and Shutdown after it is immediate.
func TestLingerKeepsAccepting(t *testing.T) {
	up := serve(t, "tcp:127.0.0.1:0", echo)
	p, _ := startProxy(t, []Route{{Listen: filepath.Join(sockDir(t), "px.sock"), To: up.String()}}, Options{})
	addr := p.Addrs()[0]
	c := dial(t, addr)
	if _, err := roundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- p.Linger(ctx, 0)
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(addr.Name); err != nil {
		t.Fatalf("the socket file went away while lingering: %v", err)
	}
	c2 := dial(t, addr) // a new client, accepted and relayed
	if got, err := roundTrip(c2, "new"); err != nil || got != "new" {
		t.Fatalf("a new client while lingering: %q %v", got, err)
	}
	if got, err := roundTrip(c, "old"); err != nil || got != "old" {
		t.Fatalf("the open client while lingering: %q %v", got, err)
	}
	c.Close()
	select {
	case err := <-done:
		t.Fatalf("Linger returned %v with a client open", err)
	case <-time.After(500 * time.Millisecond):
	}
	c2.Close()
	closed := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		if el := time.Since(closed); el > time.Second {
			t.Errorf("Linger returned %v after the last client left", el)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Linger did not return after the last client left")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
