package rpc

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// TestBlockingHandlerDoesNotStallConnection: unary handlers may run on the
// connection's reading goroutine; one that blocks must not hold up the other
// calls on the same connection, nor the cancel meant for itself. The calls
// behind it are checked to finish while it still blocks (its caller cancels
// it only after them), not against a time: a loaded CI machine at -cpu 1
// took 531 ms for the 200 calls that once had to fit in 400 ms. A deadline
// (not a cancel) must reach a blocked handler too.
func TestBlockingHandlerDoesNotStallConnection(t *testing.T) {
	s := echoServer()
	var started atomic.Int32
	ended := make(chan error, 1)
	s.HandleRaw("block", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		started.Add(1)
		select {
		case <-ctx.Done():
			ended <- ctx.Err()
			return nil, ctx.Err()
		case <-time.After(60 * time.Second):
			ended <- nil
			return dst, nil
		}
	})
	s.HandleRaw("spin", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		t0 := time.Now()
		for time.Since(t0) < 5*time.Millisecond { // busy, never parks
		}
		return append(dst, req...), nil
	})
	c := dial(t, startServer(t, s))
	for _, end := range []string{"cancel", "deadline"} {
		started.Store(0)
		var ctx context.Context
		var cancel context.CancelFunc
		want := context.Canceled
		if end == "cancel" {
			ctx, cancel = context.WithCancel(context.Background())
		} else {
			ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
			want = context.DeadlineExceeded
		}
		blockErr := make(chan error, 1)
		go func() {
			_, err := c.CallRaw(ctx, "block", nil, nil)
			blockErr <- err
		}()
		testutil.WaitFor(t, `started.Load() == 1`, func() bool { return started.Load() == 1 })
		if end == "cancel" {
			// Stalled behind the handler, they would wait for its 60 s.
			cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
			t0 := time.Now()
			for i := range 200 {
				p := []byte{byte(i)}
				method := "echo"
				if i%50 == 0 {
					method = "spin"
				}
				out, err := c.CallRaw(cctx, method, p, nil)
				if err != nil || !bytes.Equal(out, p) {
					ccancel()
					t.Fatalf("call %d behind a blocked handler: %q %v", i, out, err)
				}
			}
			ccancel()
			t.Logf("200 calls behind a blocked handler took %v", time.Since(t0))
			select {
			case err := <-ended:
				t.Fatalf("the blocked handler ended (%v) before its caller canceled", err)
			default:
			}
		}
		if end == "cancel" {
			cancel()
		}
		err := <-blockErr
		cancel()
		if !errors.Is(err, want) {
			t.Fatalf("%s: blocked call: %v, want %v", end, err, want)
		}
		select {
		case err := <-ended:
			if !errors.Is(err, want) {
				t.Fatalf("%s: handler ctx ended with %v, want %v", end, err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the blocked handler never saw its caller's %s", end)
		}
	}
	c.Close()
}

// TestFlowingCallsBackOffTicks: while one caller's calls keep flowing, the
// server's inline watchdog and the client's background reader back off
// instead of waking every millisecond (1 ms tickers in both processes
// doubled a lone caller's round trip), and the watchdog still takes the
// connection off a handler that blocks after a long run of quick calls
// within about maxInlineTick+inlineTick.
func TestFlowingCallsBackOffTicks(t *testing.T) {
	s := echoServer()
	var started atomic.Int32
	release := make(chan struct{})
	s.HandleRaw("block", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return dst, nil
	})
	c := dial(t, startServer(t, s))
	if _, err := c.CallRaw(context.Background(), "echo", []byte("warm"), nil); err != nil {
		t.Fatal(err)
	}
	cc := c.slots[0].cur.Load()
	looks0, watch0 := cc.looks.Load(), s.watchLooks.Load()
	const window = 400 * time.Millisecond
	t0 := time.Now()
	calls := 0
	for time.Since(t0) < window && calls < 1_000_000 {
		if _, err := c.CallRaw(context.Background(), "echo", []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
		calls++
	}
	elapsed := time.Since(t0)
	looks, watch := cc.looks.Load()-looks0, s.watchLooks.Load()-watch0
	t.Logf("%d calls in %v: client background reader looked %d times, server watchdog %d", calls, elapsed, looks, watch)
	// At 1 ms each would look ~400 times. Backed off, the client looks about
	// a dozen times; the watchdog a few dozen (every look that finds a
	// handler running adds a second look 1 ms later).
	if looks > 60 {
		t.Errorf("client background reader looked %d times in %v of flowing calls; want it backed off", looks, elapsed)
	}
	if watch > 150 {
		t.Errorf("server watchdog looked %d times in %v of flowing calls; want it backed off", watch, elapsed)
	}

	// The watchdog is backed off now; a handler that blocks must still
	// lose the connection's reading role soon.
	blockErr := make(chan error, 1)
	go func() {
		_, err := c.CallRaw(context.Background(), "block", nil, nil)
		blockErr <- err
	}()
	testutil.WaitFor(t, `started.Load() == 1`, func() bool { return started.Load() == 1 })
	t1 := time.Now()
	if out, err := c.CallRaw(context.Background(), "echo", []byte("behind"), nil); err != nil || string(out) != "behind" {
		t.Fatalf("call behind a blocked handler: %q %v", out, err)
	}
	// maxInlineTick+inlineTick is 17 ms; the rest is slack for a busy CI box.
	if d := time.Since(t1); d > 300*time.Millisecond {
		t.Errorf("a call behind a handler that blocked after flowing calls took %v", d)
	}
	close(release)
	if err := <-blockErr; err != nil {
		t.Fatal(err)
	}
}
