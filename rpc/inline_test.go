package rpc

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestBlockingHandlerDoesNotStallConnection: unary handlers may run on the
// connection's reading goroutine; one that blocks must not hold up the other
// calls on the same connection, nor the cancel meant for itself.
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
		case <-time.After(20 * time.Second):
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
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	blockErr := make(chan error, 1)
	go func() {
		_, err := c.CallRaw(ctx, "block", nil, nil)
		blockErr <- err
	}()
	waitUntil(t, func() bool { return started.Load() == 1 })
	t0 := time.Now()
	for i := range 200 {
		p := []byte{byte(i)}
		method := "echo"
		if i%50 == 0 {
			method = "spin"
		}
		out, err := c.CallRaw(context.Background(), method, p, nil)
		if err != nil || !bytes.Equal(out, p) {
			t.Fatalf("call %d behind a blocked handler: %q %v", i, out, err)
		}
	}
	if d := time.Since(t0); d > 400*time.Millisecond {
		t.Errorf("200 calls behind a blocked handler took %v", d)
	}
	if err := <-blockErr; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked call: %v", err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("handler ctx ended with %v, want DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the blocked handler never saw its caller's deadline")
	}
	c.Close()
}
