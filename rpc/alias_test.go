package rpc

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// A handler may answer with req itself. Before the fix the server then kept
// that (pooled) request buffer as the next call's dst as well, so a later
// call's request and response shared memory: a handler writing its response
// while reading its request corrupted it, and two goroutines could use one
// buffer at once (the race detector flags it).
func TestHandlerMayReturnReq(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRaw("echo", func(_ context.Context, req, _ []byte) ([]byte, error) { return req, nil })
	s.HandleRaw("head", func(_ context.Context, req, _ []byte) ([]byte, error) { return req[:len(req)/2], nil })
	s.HandleRaw("rev", func(_ context.Context, req, dst []byte) ([]byte, error) {
		for i := len(req) - 1; i >= 0; i-- {
			dst = append(dst, req[i])
		}
		return dst, nil
	})
	c := dial(t, startServer(t, s))
	sizes := []int{7, 4 << 10, 100 << 10}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			var out []byte
			for i := range 60 {
				n := sizes[(g+i)%len(sizes)]
				req := bytes.Repeat([]byte{byte(g)}, n)
				for j := range req {
					req[j] += byte(j * 7) // not a palindrome
				}
				method := []string{"echo", "head", "rev"}[(g+i)%3]
				want := append([]byte(nil), req...)
				switch method {
				case "head":
					want = want[:n/2]
				case "rev":
					for a, b := 0, len(want)-1; a < b; a, b = a+1, b-1 {
						want[a], want[b] = want[b], want[a]
					}
				}
				var err error
				out, err = c.CallRaw(context.Background(), method, req, out[:0])
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(out, want) {
					errs <- fmt.Errorf("goroutine %d call %d (%s, %d B): wrong response", g, i, method, n)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestOverlaps(t *testing.T) {
	buf := make([]byte, 100)
	other := make([]byte, 100)
	for _, tc := range []struct {
		a, b []byte
		want bool
	}{
		{buf, buf, true},
		{buf[:10], buf[50:60], true}, // capacities reach into each other
		{buf[10:20:20], buf[50:60:60], false},
		{buf[:0], buf, true},
		{buf, other, false},
		{nil, buf, false},
		{buf[100:], buf, false},
	} {
		if got := overlaps(tc.a, tc.b); got != tc.want {
			t.Errorf("overlaps(len %d cap %d, len %d cap %d) = %v, want %v", len(tc.a), cap(tc.a), len(tc.b), cap(tc.b), got, tc.want)
		}
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
