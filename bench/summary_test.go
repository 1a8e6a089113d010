package bench

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestCompactReport: what make demo prints leads with the three-line summary
// (rpc vs grpc-go, vs the raw echo, unix vs tcp, from the cells' own ratios),
// explains rpc above the floor, and fits CompactWidth columns everywhere.
func TestCompactReport(t *testing.T) {
	r := &Report{Settings: Settings{Repeat: 2, NoisySpread: 0.1, DurationSec: 0.7}}
	r.System.CPU = strings.Repeat("a very long CPU model name ", 5)
	for _, size := range []int{1 << 10, 100 << 10, 1 << 20} {
		for _, c := range []Cell{
			{Transport: "rpc-unix", Family: "rpc", Network: "unix", RPS: 300_000, VsGRPC: 3.1, VsRaw: 1.56},
			{Transport: "rpc-tcp", Family: "rpc", Network: "tcp", RPS: 150_000, VsGRPC: 2.5, VsRaw: 1.14},
			{Transport: "grpc-unix", Family: "grpc", Network: "unix", RPS: 100_000, VsGRPC: 1, VsRaw: 0.5},
			{Transport: "rawframed-unix", Family: "rawframed", Network: "unix", RPS: 1_234_567, VsGRPC: 12.3, VsRaw: 1, Noisy: true, Truncated: true},
		} {
			c.Size, c.Conc, c.Repeats, c.Spread = size, 16, 2, 0.25
			if size == 1<<20 && c.Family == "rpc" {
				c.VsGRPC, c.VsRaw = 2.0, 0.9
			}
			r.Cells = append(r.Cells, c)
		}
	}
	var b bytes.Buffer
	if err := r.WriteCompact(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	want := []string{
		"udskit rpc over unix vs grpc-go: 2.00x-3.10x the requests/s (sizes 1KiB, 100KiB, 1MiB)",
		"udskit rpc vs the raw echo (the floor): 0.90x-1.56x the requests/s (above 1x: see below)",
		"udskit rpc over unix vs over tcp: 2.00x the requests/s; 3 of 12 cells noisy: rerun when idle",
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("summary line %d:\n got %q\nwant %q", i+1, lines[i], w)
		}
	}
	for i, l := range lines {
		if n := utf8.RuneCountInString(l); n > CompactWidth {
			t.Errorf("line %d is %d columns (over %d): %q", i+1, n, CompactWidth, l)
		}
	}
	if !strings.Contains(b.String(), "Why rpc can beat raw") || !strings.Contains(b.String(), "noisy,cut") {
		t.Errorf("no explanation or note:\n%s", b.String())
	}
}
