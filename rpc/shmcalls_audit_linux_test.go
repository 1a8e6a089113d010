package rpc

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// Tests of what the call-slot poller shares with the socket reader of its
// connection (docs/internals.md, "Call slots": who else runs calls).

// serverDraining reports whether s has a connection and whether any of its
// connections is draining (nil: none left).
func serverDraining(s *Server) (conns int, draining bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sc := range s.conns {
		sc.mu.Lock()
		draining = draining || sc.draining || sc.closed
		sc.mu.Unlock()
	}
	return len(s.conns), draining
}

// TestShmCallsIdleTimeoutSeesSlotCalls: a connection whose only traffic is
// slot calls (they send no frame on the socket) is not idle: with
// IdleTimeout 200 ms, a caller making one call every 10 ms for 1.2 s keeps
// its connection, and every call goes through a slot. Once it stops, the
// connection is drained after IdleTimeout as before. (The sweeper once
// looked at socket frames only, and drained such a connection under its
// caller.)
func TestShmCallsIdleTimeoutSeesSlotCalls(t *testing.T) {
	s := NewServer(ServerOptions{IdleTimeout: 200 * time.Millisecond})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req...), nil
	})
	addr := startServer(t, s)
	c, _ := slotClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := 0
	for t0 := time.Now(); time.Since(t0) < 1200*time.Millisecond; n++ {
		req := pattern(64, n)
		resp, err := c.CallRaw(ctx, "echo", req, nil)
		if err != nil || !bytes.Equal(resp, req) {
			t.Fatalf("call %d: %v (answer equal: %v)", n, err, bytes.Equal(resp, req))
		}
		if conns, draining := serverDraining(s); conns != 1 || draining {
			t.Fatalf("after call %d: %d server connections, draining %v: a connection busy with slot calls was taken for idle", n, conns, draining)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := c.slotCallCount(); got != uint64(n) {
		t.Fatalf("%d of %d calls went through call slots", got, n)
	}
	waitFor(t, "the quiet connection drained after IdleTimeout", func() bool {
		conns, draining := serverDraining(s)
		return conns == 0 || draining
	})
}
