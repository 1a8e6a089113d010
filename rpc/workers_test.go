package rpc

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testutil"
)

// countGoroutines counts goroutines whose stack contains fn.
func countGoroutines(fn string) int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// TestIdleWorkersRetire: a burst of 200 concurrent calls on one connection
// needs 200 handler goroutines; once they are done, at most maxIdleWorkers
// stay parked for the next burst, not all 200 until the connection closes.
func TestIdleWorkersRetire(t *testing.T) {
	s := echoServer()
	release := make(chan struct{})
	s.HandleRaw("wait", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return req, nil
	})
	addr := startServer(t, s)
	c, r := rawPeer(t, addr)
	w := frame.NewWriter(c)
	const n = 200
	for i := 1; i <= n; i++ {
		h := frame.Header{Type: frame.TypeRequest, ID: uint32(i)}
		if err := w.WriteFrame(&h, frame.AppendRequestHead(nil, "wait"), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, `countGoroutines("rpc.(*serverConn).run") >= n-1`, func() bool { return countGoroutines("rpc.(*serverConn).run") >= n-1 })
	close(release)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for i := 0; i < n; i++ {
		if f, err := r.ReadFrame(nil); err != nil || f.Type != frame.TypeResponse {
			t.Fatalf("response %d: %v %v", i, f.Type, err)
		}
	}
	var idle int
	deadline := time.Now().Add(5 * time.Second)
	for {
		idle = countGoroutines("rpc.(*serverConn).worker")
		if idle <= maxIdleWorkers || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if idle > maxIdleWorkers {
		t.Fatalf("%d handler goroutines parked after the burst, want at most %d", idle, maxIdleWorkers)
	}
}
