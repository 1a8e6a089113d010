package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/udskit/udskit/bench"
)

// TestMain lets the bench engine start this test binary as its server
// process ("bench-server ...").
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "bench-server" {
		os.Exit(bench.ServeMain(context.Background(), os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
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
