package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// statsEventually polls s.Stats until ok holds (20 s at most).
func statsEventually(t *testing.T, s *Server, what string, ok func(ServerStats) bool) ServerStats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := s.Stats()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: stats %+v", what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStatsMethod: udskit.stats reports the open connections and the
// shared-memory path: payloads each way, the regions, and counters that
// keep counting the connections that closed.
func TestStatsMethod(t *testing.T) {
	s := echoServer()
	addr := startServer(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1})
	for i := 0; i < 3; i++ {
		req := pattern(64<<10, i)
		if resp, err := c.CallRaw(ctx, "echo", req, nil); err != nil || !bytes.Equal(resp, req) {
			t.Fatalf("echo: %v", err)
		}
	}
	st, err := FetchStats(ctx, c) // itself a small call on the socket
	if err != nil {
		t.Fatal(err)
	}
	sh := st.Shm
	if st.Conns != 1 || !sh.Enabled || sh.Threshold != shm.DefaultThreshold || sh.Conns != 1 ||
		sh.Sent != 3 || sh.Received != 3 || sh.Waits != 0 || sh.OverHalf != 0 || sh.Capacity == 0 {
		t.Fatalf("stats %+v: want 1 connection, 1 region, 3 payloads each way", st)
	}
	if cs := c.ShmStats(); sh.Capacity != cs.Capacity {
		t.Fatalf("server half %d bytes, client half %d: the halves of one region are equal", sh.Capacity, cs.Capacity)
	}

	// The wire form is the documented one (protocol/spec.md 9.3).
	raw, err := c.CallRaw(ctx, StatsMethod, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wire map[string]any
	if err := json.Unmarshal(raw, &wire); err != nil {
		t.Fatal(err)
	}
	shmWire, _ := wire["shm"].(map[string]any)
	for _, k := range []string{"enabled", "threshold", "conns", "in_use", "capacity", "sent", "received", "waits", "over_half"} {
		if _, ok := shmWire[k]; !ok {
			t.Fatalf("%s answer %s lacks shm.%s", StatsMethod, raw, k)
		}
	}
	if wire["conns"] != float64(1) {
		t.Fatalf("%s answer %s: conns want 1", StatsMethod, raw)
	}

	// The standard method is not listed with the application's methods.
	ms, err := ListMethods(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Name == StatsMethod {
			t.Fatalf("%s listed among the methods", StatsMethod)
		}
	}

	// A second client, then both gone: the region count drops to 0, the
	// counters keep what went through.
	c2 := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1})
	req := pattern(20<<10, 7)
	if resp, err := c2.CallRaw(ctx, "echo", req, nil); err != nil || !bytes.Equal(resp, req) {
		t.Fatalf("echo: %v", err)
	}
	statsEventually(t, s, "2 regions", func(st ServerStats) bool { return st.Shm.Conns == 2 && st.Shm.Sent == 4 })
	c.Close()
	c2.Close()
	st = statsEventually(t, s, "the connections to close", func(st ServerStats) bool { return st.Conns == 0 })
	if sh := st.Shm; sh.Conns != 0 || sh.Capacity != 0 || sh.InUse != 0 || sh.Sent != 4 || sh.Received != 4 {
		t.Fatalf("after close: %+v, want no region and the counters kept (4 each way)", st)
	}
}

// TestStatsNoShm: a server with NoShm says so, and counts nothing.
func TestStatsNoShm(t *testing.T) {
	s := NewServer(ServerOptions{NoShm: true, ShmThreshold: 32 << 10})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, LargeConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.CallRaw(ctx, "echo", pattern(64<<10, 1), nil); err != nil {
		t.Fatal(err)
	}
	st, err := FetchStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if st.Conns != 1 || st.Shm.Enabled || st.Shm.Threshold != 32<<10 || st.Shm.Conns != 0 || st.Shm.Sent != 0 || st.Shm.Received != 0 {
		t.Fatalf("NoShm server stats %+v: want shared memory off, nothing through it", st)
	}
}

// TestStatsWaits: a client that never releases the server's slots fills
// the server's half; the next response waits for space, and the stats
// show it: the fill level near 100 % and the wait counted. Closing that
// client frees the region; the wait stays counted.
func TestStatsWaits(t *testing.T) {
	s := echoServer()
	addr := startServer(t, s)
	c := rawDial(t, addr)
	c.accepted() // 1 MiB: the server's half is 512 KiB
	req := pattern(200<<10, 3)
	for id := uint32(1); id <= 3; id++ {
		c.write(frame.TypeRequest, 0, id, frame.AppendRequestHead(nil, "echo"), req)
	}
	// Two answers fit in the half; the third waits for a release that never comes.
	for i := 0; i < 2; i++ {
		h, _, _, err := c.readFrame()
		if err != nil || h.Type != frame.TypeResponse || h.Flags&shm.FlagShm == 0 {
			t.Fatalf("answer %d: %+v %v, want a response through the region", i, h, err)
		}
	}
	st := statsEventually(t, s, "the third answer to wait", func(st ServerStats) bool { return st.Shm.Waits == 1 })
	if sh := st.Shm; sh.Conns != 1 || sh.Sent != 2 || sh.InUse < 400<<10 || sh.Fill() < 0.75 || sh.Fill() > 1 {
		t.Fatalf("stats %+v (fill %.2f): want 2 answers held in the half, over 75 %% full", st, st.Shm.Fill())
	}
	c.uc.Close()
	st = statsEventually(t, s, "the connection to close", func(st ServerStats) bool { return st.Conns == 0 })
	if sh := st.Shm; sh.Conns != 0 || sh.InUse != 0 || sh.Waits != 1 || sh.Sent != 2 {
		t.Fatalf("after close: %+v, want the region gone, 1 wait and 2 answers counted", st)
	}
}
