package rpc

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/shm"
)

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed)
	}
	return b
}

// TestShmEcho: sizes around the threshold and up to the max frame, each
// answer checked byte for byte; large ones went through the region (stats
// on both sides), small ones did not, and every slot came back.
func TestShmEcho(t *testing.T) {
	s := echoServer()
	s.HandleRawStream("items", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for i := 0; i < 4; i++ {
			if err := send(pattern(len(req), i)); err != nil {
				return err
			}
		}
		return nil
	})
	addr := startServer(t, s)
	c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	th := shm.DefaultThreshold
	large := 0
	for i, n := range []int{0, 1, 100, th - 1, th, th + 1, 64 << 10, 1 << 20, 3<<20 + 5, 16 << 20} {
		req := pattern(n, i)
		resp, err := c.CallRaw(ctx, "echo", req, nil)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(resp, req) {
			t.Fatalf("%d bytes: the answer differs", n)
		}
		if n >= th {
			large++
		}
	}
	cs, ss := c.ShmStats(), s.ShmStats()
	if cs.Conns != 1 || ss.Conns != 1 {
		t.Fatalf("shm conns: client %d, server %d, want 1 (%+v %+v)", cs.Conns, ss.Conns, cs, ss)
	}
	if cs.Sent != uint64(large) || ss.Received != uint64(large) || ss.Sent != uint64(large) || cs.Received != uint64(large) {
		t.Fatalf("through the region: client %+v server %+v, want %d each way", cs, ss, large)
	}
	// A server stream's large items come through the region too.
	st, err := c.Stream(ctx, "items", pattern(100<<10, 0))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		item, err := st.RecvRaw()
		if err != nil || !bytes.Equal(item, pattern(100<<10, i)) {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if _, err := st.RecvRaw(); err == nil {
		t.Fatal("stream did not end")
	}
	defer func() { t.Logf("client %+v server %+v", c.ShmStats(), s.ShmStats()) }()
	waitFor(t, "every slot released", func() bool {
		cs, ss := c.ShmStats(), s.ShmStats()
		return cs.InUse == 0 && ss.InUse == 0 && ss.Sent == uint64(large+4)
	})
}

// TestShmOff: either side's NoShm keeps the socket path, with the same answers.
func TestShmOff(t *testing.T) {
	for _, tc := range []struct{ client, server bool }{{true, false}, {false, true}} {
		t.Run(fmt.Sprintf("client-off=%v", tc.client), func(t *testing.T) {
			s := NewServer(ServerOptions{NoShm: tc.server})
			s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
			c := dialOpts(t, startServer(t, s), ClientOptions{NoShm: tc.client})
			req := pattern(1<<20, 3)
			resp, err := c.CallRaw(context.Background(), "echo", req, nil)
			if err != nil || !bytes.Equal(resp, req) {
				t.Fatal(err)
			}
			if c.ShmStats().Conns != 0 || s.ShmStats().Conns != 0 {
				t.Fatalf("shared memory in use: %+v %+v", c.ShmStats(), s.ShmStats())
			}
		})
	}
}

func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
