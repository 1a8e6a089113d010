package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/udskit/udskit/bench"
)

// TestMain lets the bench engine start this test binary as its server
// process ("bench-server ...").
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "bench-server" {
		os.Exit(serverMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestRowsRun: every row of this tool serves and answers, through the
// bench engine (which checks each caller's first answer byte for byte and
// every answer's length), at a size under shmipc's largest slice and one
// over it, with two callers.
func TestRowsRun(t *testing.T) {
	rows := []string{"rpc-shm", "rpc-shm-inplace", "rpc-shm-inplace-view", "rpc-unix", "raw-unix", "shmipc-copy", "shmipc-zerocopy"}
	rep, err := bench.Run(context.Background(), bench.Config{
		Transports: rows,
		Sizes:      []int{64, 200 << 10},
		Conc:       []int{2},
		Duration:   150 * time.Millisecond,
		Warmup:     50 * time.Millisecond,
		Repeat:     1,
		ServerCmd:  []string{os.Args[0], "bench-server"},
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, c := range rep.Cells {
		if c.RPS <= 0 {
			t.Errorf("%s %d B: no requests/s", c.Transport, c.Size)
		}
		seen[c.Transport]++
	}
	for _, r := range rows {
		if seen[r] != 2 {
			t.Errorf("%s: %d cells, want 2", r, seen[r])
		}
	}
	if rep.System.MemcpyGBps <= 0 {
		t.Error("no memcpy bandwidth in the report")
	}
}

// TestShmConnsRows: -shm-conns adds a row per N after each shared-memory
// row, the rows run through the bench engine (server in another process,
// which registers the row from its name), and a row's client keeps its
// large calls to N connections.
func TestShmConnsRows(t *testing.T) {
	got, err := expandShmConns([]string{"rpc-shm", "raw-unix", "rpc-shm-inplace-view"}, "1,4")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"rpc-shm", "rpc-shm/sc1", "rpc-shm/sc4", "raw-unix", "rpc-shm-inplace-view", "rpc-shm-inplace-view/sc1", "rpc-shm-inplace-view/sc4"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("expanded rows %q, want %q", got, want)
	}
	for _, bad := range []string{"0", "x", "65"} {
		if _, err := expandShmConns([]string{"rpc-shm"}, bad); err == nil {
			t.Errorf("-shm-conns %q accepted", bad)
		}
	}
	if got, err := expandShmConns([]string{"rpc-shm-calls-inplace-view"}, "1"); err != nil || strings.Join(got, " ") != "rpc-shm-calls-inplace-view rpc-shm-calls-inplace-view/sc1" {
		t.Errorf("call-slot row expanded to %q, %v", got, err)
	}
	for _, bad := range []string{"raw-unix/sc2", "rpc-shm/sc0", "rpc-shm/scx", "rpc-shm-calls-view/sc1"} {
		if err := ensureShmConnsRow(bad); err == nil {
			t.Errorf("row %q accepted", bad)
		}
	}

	rows := []string{"rpc-shm/sc1", "rpc-shm-inplace-view/sc2", "rpc-shm-calls-inplace-view/sc1"}
	for _, r := range rows {
		if err := ensureShmConnsRow(r); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := bench.Run(context.Background(), bench.Config{
		Transports: rows,
		Sizes:      []int{200 << 10},
		Conc:       []int{4},
		Duration:   150 * time.Millisecond,
		Warmup:     50 * time.Millisecond,
		Repeat:     1,
		ServerCmd:  []string{os.Args[0], "bench-server"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != len(rows) {
		t.Fatalf("%d cells, want %d", len(rep.Cells), len(rows))
	}
	for _, c := range rep.Cells {
		if c.RPS <= 0 {
			t.Errorf("%s: no requests/s", c.Transport)
		}
	}

	// In this process: 8 callers of 64 KiB on a ShmConns 1 client use one
	// connection (the default would open a second), and all of it went
	// through the region.
	rpcShm, _ := bench.Lookup("rpc-shm")
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- rpcShm.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	for _, view := range []bool{false, true} {
		cl, c, err := dialShmConns(ctx, "unix:"+path, 8, 1, false, view)
		if err != nil {
			t.Fatal(err)
		}
		p := bytes.Repeat([]byte("shm3"), 16<<10)
		var wg sync.WaitGroup
		for _, caller := range cl.Callers {
			wg.Go(func() {
				for range 50 {
					out, err := caller.Call(ctx, p)
					if err != nil || !bytes.Equal(out, p) {
						t.Errorf("echo: %d bytes, %v", len(out), err)
						return
					}
				}
			})
		}
		wg.Wait()
		st := c.ShmStats()
		if st.Conns != 1 || st.Sent != 8*50 {
			t.Errorf("view %v: ShmConns 1 with 8 callers: %d shared-memory connections, %d payloads sent in the region; want 1 and 400", view, st.Conns, st.Sent)
		}
		if err := cl.Close(); err != nil {
			t.Error(err)
		}
	}

}

func TestParseEnv(t *testing.T) {
	got, err := parseEnv(" GOMAXPROCS=1, GOGC=off ,")
	if err != nil || len(got) != 2 || got[0] != "GOMAXPROCS=1" || got[1] != "GOGC=off" {
		t.Errorf("parseEnv: %q, %v", got, err)
	}
	for _, bad := range []string{"GOMAXPROCS", "=1", "A B=1"} {
		if _, err := parseEnv(bad); err == nil {
			t.Errorf("parseEnv(%q) accepted", bad)
		}
	}
}
