package rpcprom_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/rpc/rpcprom"
	"github.com/udskit/udskit/uds"
)

// TestShmScraped: WatchServer exports the shared-memory path: a Go client's
// 64 KiB echoes go through its region, and curl reads the region, the
// payloads each way and no waits; once the client leaves, the region is
// gone and the counters stay.
func TestShmScraped(t *testing.T) {
	m := rpcprom.New(rpcprom.Options{})
	l, err := uds.Listen(context.Background(), "unix:"+filepath.Join(t.TempDir(), "app.sock"), uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := rpc.NewServer(m.ServerOptions(rpc.ServerOptions{}))
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	m.WatchServer(s)
	go s.Serve(l)
	defer s.Close()
	url := serveMetrics(t, m)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, l.Addr().String(), rpc.ClientOptions{Conns: 1, LargeConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	req := bytes.Repeat([]byte("x"), 64<<10)
	for range 3 {
		if _, err := c.CallRaw(ctx, "echo", req, nil); err != nil {
			t.Fatal(err)
		}
	}
	half := float64(c.ShmStats().Capacity)
	body := scrape(t, url)
	for series, want := range map[string]float64{
		rpcprom.ServerShmConns:                               1,
		rpcprom.ServerShmCapacity:                            half,
		rpcprom.ServerShmPayloads + `{direction="sent"}`:     3,
		rpcprom.ServerShmPayloads + `{direction="received"}`: 3,
		rpcprom.ServerShmWaits:                               0,
		rpcprom.ServerShmOverHalf:                            0,
		rpcprom.ServerShmStalled:                             0,
	} {
		if got := value(t, body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if half < 64<<10 {
		t.Fatalf("client half %v bytes", half)
	}
	if v := value(t, body, rpcprom.ServerShmInUse); v < 0 || v > half {
		t.Errorf("in use %v of %v", v, half)
	}
	c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for s.ActiveConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the server kept the connection")
		}
		time.Sleep(5 * time.Millisecond)
	}
	body = scrape(t, url)
	for series, want := range map[string]float64{
		rpcprom.ServerShmConns:                           0,
		rpcprom.ServerShmCapacity:                        0,
		rpcprom.ServerShmInUse:                           0,
		rpcprom.ServerShmPayloads + `{direction="sent"}`: 3,
	} {
		if got := value(t, body, series); got != want {
			t.Errorf("after the client left: %s = %v, want %v", series, got, want)
		}
	}
}

// TestShmSlotCallsScraped: a Go client with ShmCalls makes 64 B and 64 KiB
// echoes through call slots; curl reads the slot calls, the payload-area
// bytes each way (those payloads also in the payloads counter) and the
// spurious wake-ups (about none).
func TestShmSlotCallsScraped(t *testing.T) {
	m := rpcprom.New(rpcprom.Options{})
	l, err := uds.Listen(context.Background(), "unix:"+filepath.Join(t.TempDir(), "app.sock"), uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := rpc.NewServer(m.ServerOptions(rpc.ServerOptions{}))
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	m.WatchServer(s)
	go s.Serve(l)
	defer s.Close()
	url := serveMetrics(t, m)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, l.Addr().String(), rpc.ClientOptions{Conns: 1, LargeConns: 1, ShmConns: 1, ShmCalls: true, NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, n := range []int{64, 64 << 10, 64, 64 << 10, 64 << 10} {
		if _, err := c.CallRaw(ctx, "echo", bytes.Repeat([]byte("x"), n), nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.ShmStats().SlotCalls; n != 5 {
		t.Fatalf("%d calls through call slots, want the 5 echoes", n)
	}
	body := scrape(t, url)
	for series, want := range map[string]float64{
		rpcprom.ServerShmSlotCalls:                            5,
		rpcprom.ServerShmAreaBytes + `{direction="sent"}`:     3 * 64 << 10,
		rpcprom.ServerShmAreaBytes + `{direction="received"}`: 3 * 64 << 10,
		rpcprom.ServerShmPayloads + `{direction="sent"}`:      3,
		rpcprom.ServerShmPayloads + `{direction="received"}`:  3,
	} {
		if got := value(t, body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if got := value(t, body, rpcprom.ServerShmSpuriousWakes); got < 0 || got > 5 { // (a rare race may cause one)
		t.Errorf("%s = %v, want about 0", rpcprom.ServerShmSpuriousWakes, got)
	}
}
