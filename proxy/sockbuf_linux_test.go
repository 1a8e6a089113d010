package proxy

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

func sndbuf(t *testing.T, c net.Conn) int {
	t.Helper()
	return testutil.SendBuffer(t, c.(*net.UnixConn))
}

// TestJoinRaisesUnixSendBuffer: Join gives unix sockets a larger SO_SNDBUF
// (the kernel reports twice the value set, capped by wmem_max), unless told
// to keep the kernel's default; TCP sockets are left alone.
func TestJoinRaisesUnixSendBuffer(t *testing.T) {
	_, wmemMax := testutil.WmemLimits(t)
	for _, tc := range []struct {
		name string
		set  int
		want func(before int) int
	}{
		{"default", 0, func(int) int { return 2 * min(uds.DefaultSocketBuffer, wmemMax) }},
		{"explicit", 64 << 10, func(int) int { return 2 * min(64<<10, wmemMax) }},
		{"kernel default", -1, func(before int) int { return before }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a1, a2 := unixPair(t)
			b1, b2 := tcpPair(t)
			before := sndbuf(t, a2)
			done := make(chan JoinResult, 1)
			go func() { done <- Join(context.Background(), a2, b1, JoinOptions{SocketBuffer: tc.set}) }()
			// A byte through both ways: Join is running and set the buffers.
			io.WriteString(a1, "x")
			io.WriteString(b2, "y")
			buf := make([]byte, 1)
			if _, err := io.ReadFull(b2, buf); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(a1, buf); err != nil {
				t.Fatal(err)
			}
			if got, want := sndbuf(t, a2), tc.want(before); got != want {
				t.Errorf("SO_SNDBUF of the unix side = %d, want %d (before Join %d, wmem_max %d)", got, want, before, wmemMax)
			}
			a1.Close()
			b2.Close()
			<-done
		})
	}
}
