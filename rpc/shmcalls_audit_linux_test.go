package rpc

import (
	"bytes"
	"context"
	"fmt"
	"sync"
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

// TestShmCallsSlowInlineHandedOff: a handler quick so far runs inline on
// the call-slot poller; when one of its runs blocks, the inline watchdog
// hands the polling off as it hands reading off a slow inline run on the
// socket, so the connection's other slot calls go on (20 echoes while it
// blocks), and the blocked run's method is no longer quick (runsLong).
// Without the hand-off every slot call of the connection waited for it.
func TestShmCallsSlowInlineHandedOff(t *testing.T) {
	s := NewServer(ServerOptions{})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	s.HandleRaw("gate", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		if len(req) == 1 && req[0] == 0xFF {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return append(dst, req...), nil
	})
	addr := startServer(t, s)
	c, _ := slotClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := s.lookup([]byte("gate"))
	for i := 0; !h.quick(); i++ { // (the poller runs a quick handler inline)
		if i == 20000 || ctx.Err() != nil {
			t.Fatalf("gate not quick after %d calls (cost %v)", i, time.Duration(h.cost.Load()))
		}
		if _, err := c.CallRaw(ctx, "gate", []byte{1, 2, 3}, nil); err != nil {
			t.Fatal(err)
		}
	}
	slotsBefore := c.slotCallCount()
	blocked := make(chan error, 1)
	go func() {
		_, err := c.CallRaw(ctx, "gate", []byte{0xFF}, nil)
		blocked <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking call did not arrive")
	}
	others, othersCtxCancel := context.WithTimeout(ctx, 5*time.Second)
	defer othersCtxCancel()
	for i := range 20 {
		req := pattern(64, i)
		resp, err := c.CallRaw(others, "gate", req, nil)
		if err != nil || !bytes.Equal(resp, req) {
			close(release)
			t.Fatalf("echo %d while a slot call's handler blocked inline: %v (answer equal: %v)", i, err, bytes.Equal(resp, req))
		}
		if i == 0 && h.quick() {
			t.Errorf("the blocked method is still quick after the hand-off (cost %v)", time.Duration(h.cost.Load()))
		}
	}
	select {
	case err := <-blocked:
		t.Fatalf("the blocking call returned before it was released: %v", err)
	default:
	}
	close(release)
	if err := <-blocked; err != nil {
		t.Fatalf("the released call: %v", err)
	}
	for i := range 50 { // the new poller serves on
		req := pattern(64, i)
		if resp, err := c.CallRaw(ctx, "gate", req, nil); err != nil || !bytes.Equal(resp, req) {
			t.Fatalf("echo %d after the release: %v", i, err)
		}
	}
	if got := c.slotCallCount() - slotsBefore; got != 71 {
		t.Fatalf("%d of 71 calls went through call slots", got)
	}
}

// TestShmCallsPollerBudgetWaitIsNotTheReaders: the call-slot poller waits
// for its connection's memory budget (MaxConnBytes) before it takes a slot
// call's payload, as the reader does before a socket request's; it says so
// in a flag of its own. readerHeld (which sends answers waiting for room in
// the region out on the socket instead, and stops FrameTimeout) still
// speaks of the reader alone, and a release wakes both waiters.
func TestShmCallsPollerBudgetWaitIsNotTheReaders(t *testing.T) {
	s := NewServer(ServerOptions{MaxConnBytes: 1 << 20})
	entered, release := make(chan struct{}, 4), make(chan struct{})
	s.HandleRaw("hold", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append(dst, req[:8]...), nil
	})
	addr := startServer(t, s)
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free) // (before the server's close, on a failure)
	c, _ := slotClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	call := func(seed int) {
		req := pattern(600<<10, seed) // a payload slot of the region: held until answered
		resp, err := c.CallRaw(ctx, "hold", req, nil)
		if err == nil && !bytes.Equal(resp, req[:8]) {
			err = fmt.Errorf("call %d: the answer differs", seed)
		}
		errs <- err
	}
	go call(1)
	<-entered // 600 KiB held: the next 600 KiB do not fit 1 MiB
	go call(2)
	var sc *serverConn
	waitFor(t, "the poller waiting for the connection's budget", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for x := range s.conns {
			sc = x
		}
		return sc != nil && (sc.slotStalled.Load() || sc.stalled.Load())
	})
	if sc.readerHeld() || !sc.slotStalled.Load() {
		t.Fatalf("readerHeld %v, slotStalled %v while only the call-slot poller waits for budget", sc.readerHeld(), sc.slotStalled.Load())
	}
	free()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := c.slotCallCount(); got != 2 {
		t.Fatalf("%d of 2 calls went through call slots", got)
	}
}

// TestShmCallsShutdownDrains: Server.Shutdown with slot calls in flight
// waits for them (they count in the server connection's calls in flight
// like socket calls), their answers arrive, and only then does it return.
// The client, seeing goaway, once closed its connection at once because no
// call was in its table of socket calls, so the server canceled the slot
// calls as the peer was gone and Shutdown returned with them unanswered;
// now a draining client connection waits for its slot calls too
// (clientCalls.flight, clientConn.slotsIdle).
func TestShmCallsShutdownDrains(t *testing.T) {
	s := NewServer(ServerOptions{})
	entered, release := make(chan struct{}, 4), make(chan struct{})
	s.HandleRaw("hold", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append(dst, req...), nil
	})
	addr := startServer(t, s)
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free)
	c, x := slotClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const calls = 3
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			req := pattern(100, i)
			resp, err := c.CallRaw(ctx, "hold", req, nil)
			if err == nil && !bytes.Equal(resp, req) {
				err = fmt.Errorf("call %d: the answer differs", i)
			}
			errs <- err
		}()
	}
	for range calls {
		<-entered
	}
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	waitFor(t, "the connection draining", func() bool {
		n, draining := serverDraining(s)
		select {
		case err := <-shut:
			t.Fatalf("Shutdown returned %v with %d conns", err, n)
		default:
		}
		return draining
	})
	time.Sleep(50 * time.Millisecond) // a Shutdown that does not wait would return meanwhile
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned with slot calls in flight: %v", err)
	case err := <-errs:
		t.Fatalf("a slot call returned before its handler did: %v", err)
	default:
	}
	free()
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := x.n.Load(); got != calls { // (the closed connection left c.live)
		t.Fatalf("%d of %d calls went through call slots", got, calls)
	}
	if n := s.ActiveConns(); n != 0 {
		t.Fatalf("%d connections left after Shutdown", n)
	}
}
