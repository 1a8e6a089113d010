package rpc

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// heapInUse returns the heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// TestHalfReceivedFramesCountInTotal: connections that send most of a large
// frame and then stall hold what they sent in the server's memory; the
// server's total (MaxServerBytes) counts a payload from its header on, so
// only the total's worth of them is read at a time (the rest wait, and end at
// FrameTimeout like the others). Without the reservation the server buffered
// every connection's bytes (the Go soak: 20 × 15 MiB, 425 MiB).
func TestHalfReceivedFramesCountInTotal(t *testing.T) {
	for _, mode := range []string{"frames", "ndjson"} {
		t.Run(mode, func(t *testing.T) { testHalfReceived(t, mode) })
	}
}

func testHalfReceived(t *testing.T, mode string) {
	const conns, size, sent = 24, 8 << 20, 7 << 20
	s := NewServer(ServerOptions{MaxServerBytes: 16 << 20, FrameTimeout: 2 * time.Second})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return req, nil })
	addr := startServer(t, s)
	base := heapInUse()
	payload := bytes.Repeat([]byte("x"), sent)
	first := appendRequest(clientHello(0), 1, "echo", size)
	if mode == "ndjson" {
		first = []byte(`{"id":1,"func":"echo","data":"`)
	}
	var hostile []net.Conn
	for range conns {
		c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hostile = append(hostile, c)
		go func() {
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			c.Write(first)
			c.Write(payload)
		}()
	}
	good := dial(t, addr)
	var peak int64
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := good.CallRaw(ctx, "echo", []byte("hi"), nil)
		cancel()
		if err != nil {
			t.Fatalf("good client while %d connections stall 8 MiB %s: %v", conns, mode, err)
		}
		peak = max(peak, heapInUse()-base)
		time.Sleep(100 * time.Millisecond)
	}
	// 16 MiB of frames reserved (read buffers may double them), not 24 × 7 MiB.
	if peak > 64<<20 {
		t.Fatalf("server heap grew %d MiB with a 16 MiB total budget (%d connections × %d MiB of %s sent)", peak>>20, conns, sent>>20, mode)
	}
	t.Logf("heap growth %d MiB", peak>>20)
	for _, c := range hostile {
		expectClosed(t, c, 8*time.Second)
	}
	testutil.WaitFor(t, "the budget given back", func() bool { return s.held.Load() == 0 })
}

// TestInFlightCallsCountInTotal: every call in flight counts callCost
// against MaxServerBytes, so connections that keep thousands of blocked
// calls in flight stop being read once the total is reached (the Go soak:
// 25 × 4,000 calls, 967 MiB), while a client with nothing in flight is served;
// everything is given back when the calls end.
func TestInFlightCallsCountInTotal(t *testing.T) {
	const conns, perConn = 6, 2000
	release := make(chan struct{})
	var started atomic.Int32
	s := holdServer(release, &started)
	s.opts.MaxServerBytes = 1024 * callCost // 1,024 calls' worth
	addr := startServer(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, conns*perConn)
	for range conns {
		c := dialOpts(t, addr, ClientOptions{Conns: 1})
		for range perConn {
			go func() {
				_, err := c.CallRaw(ctx, "hold", []byte("x"), nil)
				errs <- err
			}()
		}
	}
	testutil.WaitFor(t, "calls started", func() bool { return started.Load() >= 1000 })
	time.Sleep(300 * time.Millisecond)
	// Each busy reader may take one more frame after the total is reached.
	if n := started.Load(); n > 1024+2*conns {
		close(release)
		t.Fatalf("%d calls in flight with a budget of 1,024 calls' worth", n)
	}
	good := dial(t, addr)
	cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
	_, err := good.CallRaw(cctx, "echo", []byte("hi"), nil)
	ccancel()
	if err != nil {
		close(release)
		t.Fatalf("good client while the total is full of held calls: %v", err)
	}
	close(release)
	for range conns * perConn {
		if err := <-errs; err != nil {
			t.Fatalf("a held call: %v", err)
		}
	}
	testutil.WaitFor(t, "the budget given back", func() bool { return s.held.Load() == 0 })
}

// TestStalledReaderSeesHangUp: a client that closes while its reader is held
// by the server's total budget has its calls canceled at once, as a reading
// server does on EOF, and everything is given back (without the look for a
// hang-up its calls ran on until they ended by themselves).
func TestStalledReaderSeesHangUp(t *testing.T) {
	var started, canceled atomic.Int32
	s := NewServer(ServerOptions{MaxServerBytes: 64 * callCost})
	s.HandleRaw("hold", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		started.Add(1)
		<-ctx.Done()
		canceled.Add(1)
		return nil, ctx.Err()
	})
	addr := startServer(t, s)
	c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := clientHello(frame.FeatureStreamCredit)
	for id := uint32(1); id <= 1000; id++ {
		b = appendRequest(b, id, "hold", 0)
	}
	go c.Write(b)
	testutil.WaitFor(t, "calls started", func() bool { return started.Load() >= 60 })
	time.Sleep(100 * time.Millisecond) // the reader waits for the total now
	if n := started.Load(); n > 80 {
		t.Fatalf("%d calls started with a budget of 64 calls' worth", n)
	}
	c.Close()
	deadline := time.Now().Add(2 * time.Second)
	for canceled.Load() < started.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c, s := canceled.Load(), started.Load(); c < s {
		t.Fatalf("2 s after the client closed: %d of %d held calls canceled", c, s)
	}
	testutil.WaitFor(t, "the budget given back", func() bool { return s.held.Load() == 0 })
}
