package rpc

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// TestResetCancelsInlineCall: a client that sends its hello and a request
// and closes without reading anything (so the server's hello is unread and
// the kernel reports a reset) gets the handler — running inline, waiting
// only on its ctx — canceled at once, together with every other call of the
// connection, and the connection released.
func TestResetCancelsInlineCall(t *testing.T) {
	s := echoServer()
	var started, canceled atomic.Int32
	s.HandleRaw("block", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		started.Add(1)
		<-ctx.Done()
		canceled.Add(1)
		return nil, ctx.Err()
	})
	addr := startServer(t, s)
	for _, calls := range []int{1, 3} {
		started.Store(0)
		canceled.Store(0)
		c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b := clientHello(0)
		for i := 1; i <= calls; i++ {
			b = appendRequest(b, uint32(i), "block", 0)
		}
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, `started.Load() == int32(calls)`, func() bool { return started.Load() == int32(calls) })
		time.Sleep(20 * time.Millisecond) // the server's hello is in our receive queue by now
		c.Close()
		start := time.Now()
		testutil.WaitFor(t, `canceled.Load() == int32(calls)`, func() bool { return canceled.Load() == int32(calls) })
		testutil.WaitFor(t, `s.ActiveConns() == 0`, func() bool { return s.ActiveConns() == 0 })
		if d := time.Since(start); d > time.Second {
			t.Errorf("%d calls: canceled %v after the reset", calls, d)
		}
	}
}
