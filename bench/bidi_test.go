package bench

import (
	"context"
	"testing"
)

// TestBidiRows: rpc-bidi, rpc-bidi-shm (stream slots, spec 10.9) and
// grpc-bidi run through Run (servers in another process) and pair their
// "vs grpc" ratio with each other (Over "bidi"), not with the unary rows.
func TestBidiRows(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transports = []string{"rpc-unix", "rpc-bidi", "rpc-bidi-shm", "grpc-bidi"}
	cfg.Sizes = []int{1 << 10, 64 << 10}
	cfg.Conc = []int{1, 3}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != 4*2*2 {
		t.Fatalf("%d cells, want 16", len(rep.Cells))
	}
	for _, c := range rep.Cells {
		if c.RPS <= 0 || c.Requests < int64(c.Conc) {
			t.Errorf("cell %s %d c=%d: %v req/s, %d requests", c.Transport, c.Size, c.Conc, c.RPS, c.Requests)
		}
		switch c.Transport {
		case "rpc-bidi", "rpc-bidi-shm", "grpc-bidi":
			if c.Network != "bidi" || c.VsGRPC <= 0 {
				t.Errorf("cell %s: network %q, vs grpc %v: want paired with grpc-bidi", c.Transport, c.Network, c.VsGRPC)
			}
		case "rpc-unix":
			if c.VsGRPC != 0 {
				t.Errorf("rpc-unix paired with %v: no grpc-unix was measured", c.VsGRPC)
			}
		}
	}
}
