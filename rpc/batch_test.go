package rpc

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testutil"
)

// sendRequests writes requests (id, method, payload) in one write.
func sendRequests(t *testing.T, c net.Conn, firstID uint32, methods ...string) {
	t.Helper()
	var b []byte
	for i, m := range methods {
		b = appendRequest(b, firstID+uint32(i), m, 4)
		b = append(b, "ping"...)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// readAnswers reads len(ids) frames (10 s at most: a liveness guard, not a
// timing assertion) and checks they answer ids, in any order, with "ping".
func readAnswers(t *testing.T, c net.Conn, r *frame.Reader, ids ...uint32) {
	t.Helper()
	want := map[uint32]bool{}
	for _, id := range ids {
		want[id] = true
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for range ids {
		f, err := r.ReadFrame(nil)
		if err != nil {
			t.Fatalf("waiting for the answers to %v: %v", ids, err)
		}
		if f.Type != frame.TypeResponse || !want[f.ID] || string(f.Payload) != "ping" {
			t.Fatalf("got %s %d %q, want a response to one of %v", f.Type, f.ID, f.Payload, ids)
		}
		delete(want, f.ID)
	}
}

// settledWrites returns the number of writes sc's writer has made once it
// has nothing in progress. The peer can read a write's bytes before the
// writer counts it (the count is taken after write(2) returns), so counting
// right after reading would sometimes miss the last write.
func settledWrites(t *testing.T, sc *serverConn) uint64 {
	t.Helper()
	var n uint64
	testutil.WaitFor(t, "the server's writer to finish writing", func() bool {
		var waiting bool
		n, waiting = sc.w.Progress()
		return !waiting
	})
	return n
}

// TestQuickBatchAnsweredWithOneWrite: requests that arrive together for a
// handler known to be quick run on the reading goroutine, and their answers
// go out with one write (before the change, each went to a handler
// goroutine and wrote its own).
func TestQuickBatchAnsweredWithOneWrite(t *testing.T) {
	s := echoServer()
	c, r := rawPeer(t, startServer(t, s))
	sendRequests(t, c, 1, "echo")
	readAnswers(t, c, r, 1)
	s.lookup([]byte("echo")).cost.Store(int64(time.Microsecond)) // known quick (a slow CI box may not measure it so)
	sc := onlyConn(t, s)
	before := settledWrites(t, sc)
	sendRequests(t, c, 2, "echo", "echo", "echo", "echo", "echo", "echo", "echo", "echo")
	readAnswers(t, c, r, 2, 3, 4, 5, 6, 7, 8, 9)
	if after := settledWrites(t, sc); after-before != 1 {
		t.Errorf("8 answers to requests read together took %d writes, want 1", after-before)
	}
}

// TestQueuedAnswersNotHeldByABlockingHandler: a handler thought quick that
// blocks does not hold up the answers queued before it nor the calls behind
// it: the watchdog hands reading off, the new reader writes what was
// queued and serves the rest, and the handler is no longer taken for quick.
func TestQueuedAnswersNotHeldByABlockingHandler(t *testing.T) {
	for _, tc := range []struct {
		name    string
		methods []string
		early   []uint32 // answered while gate blocks
	}{
		{"nothing behind it", []string{"echo", "gate"}, []uint32{2}},
		{"a call behind it", []string{"echo", "gate", "echo"}, []uint32{2, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := echoServer()
			gate := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(gate) }) }
			s.HandleRaw("gate", func(ctx context.Context, req, dst []byte) ([]byte, error) {
				<-gate
				return append(dst, req...), nil
			})
			c, r := rawPeer(t, startServer(t, s))
			t.Cleanup(open) // runs before the server's cleanup, which waits for handlers
			sendRequests(t, c, 1, "echo")
			readAnswers(t, c, r, 1)
			for _, m := range []string{"echo", "gate"} {
				s.lookup([]byte(m)).cost.Store(int64(time.Microsecond))
			}
			sendRequests(t, c, 2, tc.methods...)
			readAnswers(t, c, r, tc.early...)
			if s.lookup([]byte("gate")).quick() {
				t.Error("a handler the watchdog found blocking is still taken for quick")
			}
			open()
			readAnswers(t, c, r, 3)
		})
	}
}

// TestHandlerCost: the first run sets the estimate, later runs move it an
// eighth of the way, and a run found long raises it.
func TestHandlerCost(t *testing.T) {
	h := &handler{}
	h.cost.Store(costUnknown)
	if h.quick() {
		t.Fatal("a handler never run counts as quick")
	}
	h.noteCost(80 * time.Microsecond)
	if h.quick() || h.cost.Load() != int64(80*time.Microsecond) {
		t.Fatalf("after one 80µs run: cost %v", time.Duration(h.cost.Load()))
	}
	for range 12 { // 80µs·(7/8)^12 ≈ 16µs
		h.noteCost(0)
	}
	if !h.quick() {
		t.Fatalf("after quick runs: cost %v, want under %v", time.Duration(h.cost.Load()), quickHandler)
	}
	h.runsLong(inlineTick)
	if h.quick() {
		t.Fatal("a run found long leaves the handler quick")
	}
}
