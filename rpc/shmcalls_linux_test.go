package rpc

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestShmCallsEcho: with ShmCalls, echoes of 0 B, 64 B, 64 KiB and 1 MiB
// by 1 and 16 callers come back byte for byte, every one through a call
// slot, and every payload slot comes back.
func TestShmCallsEcho(t *testing.T) {
	s := echoServer()
	addr := startServer(t, s)
	for _, callers := range []int{1, 16} {
		c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1, ShmConns: 1, ShmCalls: true})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		rounds := 20 / callers * 2 // 40 calls for a lone caller, 2 each for 16
		for g := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					for _, n := range []int{0, 64, 64 << 10, 1 << 20} {
						req := pattern(n, g*31+i)
						resp, err := c.CallRaw(ctx, "echo", req, nil)
						if err != nil {
							errs <- fmt.Errorf("caller %d, %d bytes: %w", g, n, err)
							return
						}
						if !bytes.Equal(resp, req) {
							errs <- fmt.Errorf("caller %d, %d bytes: the answer differs", g, n)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		cancel()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		want := uint64(callers * rounds * 4)
		if got := c.slotCallCount(); got != want {
			t.Fatalf("%d callers: %d calls through call slots, want %d", callers, got, want)
		}
		waitFor(t, "every payload slot released", func() bool {
			return c.ShmStats().InUse == 0 && s.ShmStats().InUse == 0
		})
		c.Close()
	}
}
