package uds

import (
	"context"
	"net"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

func sndbuf(t *testing.T, c net.Conn) int {
	t.Helper()
	if uc, ok := c.(*Conn); ok {
		c = uc.NetConn()
	}
	return testutil.SendBuffer(t, c.(syscall.Conn))
}

// TestSetSendBuffer: both ends of a unix connection (the accepted *Conn and the
// dialed conn) get the larger SO_SNDBUF, capped by wmem_max and reported doubled;
// a TCP conn is left alone.
func TestSetSendBuffer(t *testing.T) {
	_, wmemMax := testutil.WmemLimits(t)
	const size = 4 << 20
	want := 2 * min(size, wmemMax)

	ctx := context.Background()
	l, err := Listen(ctx, filepath.Join(t.TempDir(), "b.sock"), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d, err := Dial(ctx, l.UAddr().String(), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	before := sndbuf(t, a)
	for _, c := range []net.Conn{a, d} {
		if err := SetSendBuffer(c, size); err != nil {
			t.Fatal(err)
		}
		if got := sndbuf(t, c); got != want {
			t.Errorf("SO_SNDBUF = %d, want %d (default was %d, wmem_max %d)", got, want, before, wmemMax)
		}
	}

	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	tc, err := net.Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	tbefore := sndbuf(t, tc)
	if err := SetSendBuffer(tc, size); err != nil {
		t.Fatal(err)
	}
	if got := sndbuf(t, tc); got != tbefore {
		t.Errorf("TCP SO_SNDBUF changed from %d to %d: TCP must be left to autotune", tbefore, got)
	}
}
