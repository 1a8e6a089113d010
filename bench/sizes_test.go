package bench

import (
	"context"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/grpcecho"
)

// Every size ParseSize and Config accept (up to MaxFrame) must fit every
// transport: grpc-go's default 4 MiB message limit once failed 5 MiB runs
// mid-way with ResourceExhausted.
func TestEveryTransportCarriesMaxFrame(t *testing.T) {
	if MaxFrame > grpcecho.MaxMessageSize {
		t.Fatalf("bench accepts sizes up to %d but grpcecho carries only %d", MaxFrame, grpcecho.MaxMessageSize)
	}
	if _, err := ParseSize("64MiB"); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseSize("65m"); err == nil {
		t.Fatal("65m accepted over the 64MiB cap")
	}
}

// grpc echoes a payload over grpc-go's default 4 MiB limit through Run.
func TestGRPCOverDefaultMessageLimit(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transports = []string{"grpc-unix"}
	cfg.Sizes = []int{5 << 20}
	cfg.Conc = []int{1}
	cfg.Requests = 2
	cfg.Warmup = -1
	cfg.Duration = 50 * time.Millisecond
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("grpc with 5MiB payloads: %v", err)
	}
	if len(rep.Cells) != 1 || rep.Cells[0].Requests != 2 || rep.Cells[0].RPS <= 0 {
		t.Fatalf("cells %+v", rep.Cells)
	}
}
