package bench

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCheckSizesGRPCLimit(t *testing.T) {
	ts, err := ResolveTransports([]string{"raw-unix", "grpc-unix"})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSizes(ts, []int{1 << 10, 4 << 20}); err != nil {
		t.Fatalf("4MiB over grpc: %v", err)
	}
	err = CheckSizes(ts, []int{1 << 10, 4<<20 + 1})
	var se *SizeError
	if !errors.As(err, &se) || se.Transport != "grpc-unix" || se.Max != 4<<20 || se.Size != 4<<20+1 {
		t.Fatalf("4MiB+1 over grpc: %v", err)
	}
	raw, _ := ResolveTransports([]string{"raw-unix"})
	if err := CheckSizes(raw, []int{MaxFrame}); err != nil {
		t.Fatalf("raw at MaxFrame: %v", err)
	}
}

// Run refuses a size a transport cannot carry before it starts any server,
// instead of failing mid-run with grpc's ResourceExhausted.
func TestRunRejectsOversizeForGRPC(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transports = []string{"grpc-unix"}
	cfg.Sizes = []int{5 << 20}
	cfg.ServerCmd = []string{"/nonexistent/never-started"}
	var se *SizeError
	if _, err := Run(context.Background(), cfg); !errors.As(err, &se) {
		t.Fatalf("Run with 5MiB over grpc: %v, want *SizeError", err)
	}
}

// The limit is the real one: grpc echoes exactly grpcMaxPayload bytes.
func TestGRPCEchoesAtItsLimit(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transports = []string{"grpc-unix"}
	cfg.Sizes = []int{grpcMaxPayload}
	cfg.Conc = []int{1}
	cfg.Requests = 3
	cfg.Warmup = -1
	cfg.Duration = 50 * time.Millisecond
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("grpc at %d bytes: %v", grpcMaxPayload, err)
	}
	if len(rep.Cells) != 1 || rep.Cells[0].Requests != 3 {
		t.Fatalf("cells %+v", rep.Cells)
	}
}
