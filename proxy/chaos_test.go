package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// pattern is connection k's byte stream: position-dependent, so that a
// byte lost, repeated, reordered or taken from another connection (a reused
// splice pipe with bytes left in it) shows.
func pattern(k, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31+k*7) ^ byte(i>>8)
	}
	return b
}

// TestChaosConnectionsAbortedMidStream: through tcp -> unix (splice) and
// unix -> tcp (copy) routes, many connections echo streams of up to 2 MiB;
// a third of them are aborted mid-stream (a TCP reset or a unix close). Every
// connection that is not aborted gets back exactly its own bytes, aborted
// ones cost only themselves, and nothing is left running afterwards.
func TestChaosConnectionsAbortedMidStream(t *testing.T) {
	dir := sockDir(t)
	upUnix := serve(t, "unix:"+dir+"/up.sock", echo)
	upTCP := serve(t, "tcp:127.0.0.1:0", echo)
	p, _ := startProxy(t, []Route{
		{Listen: "tcp:127.0.0.1:0", To: upUnix.String()},
		{Listen: "unix:" + dir + "/px.sock", To: upTCP.String()},
	}, Options{})
	fronts := p.Addrs()

	var intact, aborted atomic.Int64
	testutil.Workers(6, 800*time.Millisecond, 10_000, func(g, i int) bool {
		k := g*10_000 + i
		n := 1 + (k*7919)%(256<<10)
		if k%5 == 0 {
			n = 2 << 20
		}
		abort := k%3 == 0
		front := fronts[k%2]
		c, err := net.Dial(front.Network(), front.SockaddrName())
		if err != nil {
			t.Errorf("dial %s: %v", front, err)
			return false
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if err := echoOnce(c, k, n, abort); err != nil {
			t.Errorf("connection %d (%d bytes via %s): %v", k, n, front, err)
			return false
		}
		if abort {
			aborted.Add(1)
		} else {
			intact.Add(1)
		}
		return true
	})
	t.Logf("%d connections echoed intact, %d aborted mid-stream", intact.Load(), aborted.Load())
	if intact.Load() == 0 || aborted.Load() == 0 {
		t.Fatal("the mix did not happen")
	}
	testutil.WaitFor(t, `p.Stats().Active == 0`, func() bool { return p.Stats().Active == 0 })
	p.Close()
	testutil.NoGoroutinesIn(t, "udskit/proxy.")
}

// echoOnce sends connection k's n bytes and checks the echo. With abort it
// stops after about half, reading a little, and closes at once (a reset on
// TCP).
func echoOnce(c net.Conn, k, n int, abort bool) error {
	defer c.Close()
	out := pattern(k, n)
	if abort {
		half := max(n/2, 1)
		go c.Write(out[:half])
		io.ReadAtLeast(c, make([]byte, 64<<10), 1)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // close with a reset
		}
		return nil
	}
	back, err := writeCloseRead(c, out)
	if err != nil {
		return err
	}
	if !bytes.Equal(back, out) {
		i := 0
		for i < len(back) && i < len(out) && back[i] == out[i] {
			i++
		}
		return fmt.Errorf("echo differs from byte %d (got %d bytes, sent %d)", i, len(back), len(out))
	}
	return nil
}
