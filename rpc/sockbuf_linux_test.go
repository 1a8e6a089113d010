package rpc

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

func sendBufOf(t *testing.T, c net.Conn) int {
	t.Helper()
	return testutil.SendBuffer(t, c.(syscall.Conn))
}

// TestSocketBufferDefault: client and server both raise SO_SNDBUF of a unix
// connection to uds.DefaultSocketBuffer (reported doubled, capped by wmem_max), and a
// negative SocketBuffer keeps the kernel's default.
func TestSocketBufferDefault(t *testing.T) {
	kernelDefault, wmemMax := testutil.WmemLimits(t)
	want := 2 * min(uds.DefaultSocketBuffer, wmemMax)
	if want <= kernelDefault {
		t.Skipf("wmem_max %d leaves no room above the default %d", wmemMax, kernelDefault)
	}
	for _, tc := range []struct {
		name string
		size int
		want int
	}{
		{"default", 0, want},
		{"kernel default", -1, kernelDefault}, // an untouched buffer is reported as is
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(ServerOptions{SocketBuffer: tc.size})
			s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
			addr := startServer(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Dial(ctx, addr, ClientOptions{SocketBuffer: tc.size})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.CallRaw(ctx, "echo", []byte("x"), nil); err != nil {
				t.Fatal(err)
			}
			if got := sendBufOf(t, c.slots[0].cur.Load().nc); got != tc.want {
				t.Errorf("client SO_SNDBUF = %d, want %d", got, tc.want)
			}
			if got := sendBufOf(t, onlyConn(t, s).raw); got != tc.want {
				t.Errorf("server SO_SNDBUF = %d, want %d", got, tc.want)
			}
		})
	}
}
