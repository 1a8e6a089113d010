package rpc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// TestServerChaosClientsVanish: clients that vanish at any moment (mid-call,
// mid-stream, with a stream blocked on credit) cost the server nothing
// lasting: a well-behaved client is answered within its deadline throughout,
// every handler ends, and every connection is released.
func TestServerChaosClientsVanish(t *testing.T) {
	defer checkNoLeaks(t)
	var running atomic.Int64
	s := echoServer()
	s.HandleRaw("slow", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		running.Add(1)
		defer running.Add(-1)
		select {
		case <-time.After(time.Duration(req[0]) * 50 * time.Microsecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append(dst, req...), nil
	})
	s.HandleRawStream("flood", func(ctx context.Context, req []byte, send func([]byte) error) error {
		running.Add(1)
		defer running.Add(-1)
		item := make([]byte, 16<<10)
		for range 1000 { // 16 MiB: far past the credit, so it blocks unless read
			if err := send(item); err != nil {
				return err
			}
		}
		return nil
	})
	addr := startServer(t, s)

	stop := make(chan struct{})
	var good sync.WaitGroup
	good.Go(func() { // the well-behaved client
		c := dial(t, addr)
		defer c.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			p := []byte(fmt.Sprint(i))
			out, err := c.CallRaw(ctx, "echo", p, nil)
			cancel()
			if err != nil || string(out) != string(p) {
				t.Errorf("well-behaved call %d: %q %v", i, out, err)
				return
			}
		}
	})

	testutil.Workers(6, 600*time.Millisecond, 10_000, func(g, i int) bool {
		c, err := Dial(context.Background(), addr, ClientOptions{Conns: 1, NoReconnect: true})
		if err != nil {
			t.Errorf("dial: %v", err)
			return false
		}
		var calls sync.WaitGroup
		for k := range 1 + (g+i)%4 {
			calls.Go(func() {
				if (g+i+k)%3 == 0 {
					if st, err := c.Stream(context.Background(), "flood", nil); err == nil {
						st.RecvRaw() // then leave it blocked on credit
					}
					return
				}
				c.CallRaw(context.Background(), "slow", []byte{byte(k * 20), 0}, nil)
			})
		}
		time.Sleep(time.Duration((g*13+i*7)%1000) * time.Microsecond)
		c.Close() // vanish, whatever is in flight
		calls.Wait()
		return true
	})
	close(stop)
	good.Wait()
	testutil.WaitFor(t, "handlers to end", func() bool { return running.Load() == 0 })
	testutil.WaitFor(t, "connections to be released", func() bool { return s.ActiveConns() == 0 })
	s.Close() // before the leak check: the accept loop is the last goroutine
}
