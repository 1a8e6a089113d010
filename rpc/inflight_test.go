package rpc

import (
	"context"
	"errors"
	"fmt"
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
	addr := startServer(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, ClientOptions{Conns: 1, LargeConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

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

// TestHandlerCtxKeptAfterReturn: a handler may keep its ctx after it returns
// (a goroutine it started, a log record). Handler contexts are allocated in
// batches (newHandlerCtx): each kept ctx must stay its own call's for good,
// ended, with its own metadata and method, across many more calls than one
// batch holds.
func TestHandlerCtxKeptAfterReturn(t *testing.T) {
	s := NewServer(ServerOptions{})
	var mu sync.Mutex
	var kept []context.Context
	s.HandleRaw("keep", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		mu.Lock()
		kept = append(kept, ctx)
		mu.Unlock()
		return append(dst, req...), nil
	})
	c := dial(t, startServer(t, s))
	const n = 3*hcBatch + 5
	for i := range n {
		ctx := WithMetadata(context.Background(), Metadata{"n": fmt.Sprint(i)})
		if _, err := c.CallRaw(ctx, "keep", []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kept) != n {
		t.Fatalf("%d handler runs, want %d", len(kept), n)
	}
	for i, ctx := range kept {
		select { // the server ends a call's ctx just after writing its answer
		case <-ctx.Done():
		case <-time.After(testutil.WaitTimeout):
			t.Fatalf("call %d: its ctx is still live %v after the handler returned", i, testutil.WaitTimeout)
		}
		if got := MetadataFromContext(ctx)["n"]; got != fmt.Sprint(i) {
			t.Errorf("call %d: its kept ctx carries metadata n=%q (another call's?)", i, got)
		}
		if m := MethodFromContext(ctx); m != "keep" {
			t.Errorf("call %d: method %q", i, m)
		}
	}
}
