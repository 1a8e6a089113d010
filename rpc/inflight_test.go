package rpc

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// TestInFlightSlots: a client never has more calls in flight on a
// connection than the server's MaxInFlight (from its hello); callers beyond
// it wait for a slot, each release wakes a waiter (no caller is left waiting
// while a slot is free), and a waiting caller whose ctx ends returns at once
// with the ctx's error.
func TestInFlightSlots(t *testing.T) {
	const limit, callers = 3, 40
	s := NewServer(ServerOptions{MaxInFlight: limit})
	var running, peak, done atomic.Int32
	gate := make(chan struct{})
	s.HandleRaw("slot", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		defer running.Add(-1)
		select {
		case <-gate:
		case <-ctx.Done(): // the server closes at cleanup, even after a failure
			return nil, ctx.Err()
		}
		return append(dst, req...), nil
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, LargeConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.CallRaw(ctx, "slot", []byte("x"), nil)
			if err == nil {
				done.Add(1)
			}
			errs <- err
		}()
	}
	testutil.WaitFor(t, "the first calls to fill the slots", func() bool { return running.Load() == limit })

	// A caller waiting for a slot gives up when its ctx ends.
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	start := time.Now()
	if _, err := c.CallRaw(short, "slot", []byte("y"), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting caller with an ended ctx: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("waiting caller returned %v after its ctx ended", d)
	}

	// Release the handlers one at a time: every release lets exactly one
	// more call in, until all are done.
	for i := range callers {
		select {
		case gate <- struct{}{}:
		case <-time.After(testutil.WaitTimeout):
			t.Fatalf("release %d: no handler running to release (%d done)", i+1, done.Load())
		}
		want := min(limit, callers-i-1)
		testutil.WaitFor(t, "a waiting call to take the freed slot", func() bool {
			return running.Load() == int32(want) && done.Load() == int32(i+1)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if p := peak.Load(); p != limit {
		t.Fatalf("peak calls in flight %d, want the server's limit %d", p, limit)
	}
}
