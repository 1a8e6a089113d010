package rpc

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"
)

// TestShmPoolSpreadsBigRegionCalls: large calls through the region keep to
// ShmConns connections only while each carries at most shmFlightMax bytes
// of them; past that they spread over up to LargeConns, as without shared
// memory. 12 CallRawView callers of 6 MiB on 2 connections made a server's
// reader wait for its budget (16 MiB per connection) with the releases of
// the callers' views queued behind, and every call wait for the others
// until its deadline (also with LargeConns 16). With the default client
// and plain CallRaw too; and on one connection (Conns 1), where only the
// server's side of the fix (shmPutAnswer) keeps the calls going.
func TestShmPoolSpreadsBigRegionCalls(t *testing.T) {
	const size, callers, rounds = 6 << 20, 12, 4
	cases := []struct {
		view, one bool
	}{{false, false}, {true, false}, {true, true}}
	for _, tc := range cases {
		view := tc.view
		s := NewServer(ServerOptions{ShmInPlace: view, MaxFrame: 16 << 20})
		s.HandleRaw("echo", func(_ context.Context, req, dst []byte) ([]byte, error) { return req, nil })
		opts := ClientOptions{MaxFrame: 16 << 20}
		if tc.one {
			opts.Conns, opts.LargeConns = 1, 1
		}
		c := dialOpts(t, startServer(t, s), opts)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				p := pattern(size, i)
				var v RawView
				defer v.Release()
				for range rounds {
					v.Release()
					var out []byte
					var err error
					if view {
						v, err = c.CallRawView(ctx, "echo", p, nil)
						out = v.Bytes()
					} else {
						out, err = c.CallRaw(ctx, "echo", p, nil)
					}
					if err != nil || !bytes.Equal(out, p) {
						t.Errorf("view %v, Conns 1 %v: %d bytes back, %v (client %+v, server %+v)", view, tc.one, len(out), err, c.ShmStats(), s.ShmStats())
						return
					}
				}
			})
		}
		wg.Wait()
		cancel()
		st := c.ShmStats()
		if tc.one && st.Conns != 1 || !tc.one && st.Conns <= DefaultShmConns || st.Sent != callers*rounds {
			t.Errorf("view %v, Conns 1 %v: %d connections, %d payloads through the region; want 1 or more than %d (spread), %d", view, tc.one, st.Conns, st.Sent, DefaultShmConns, callers*rounds)
		}
		for cc := range c.live {
			if f := cc.shm.flight.Load(); f != 0 {
				t.Errorf("view %v: %d region bytes still counted in flight after the calls", view, f)
			}
		}
		c.Close()
	}
}
