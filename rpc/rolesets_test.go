package rpc

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"
)

// checkRoleSets compares cc's sets (rolesets.go) with a scan of cc.calls,
// the way passRoleLocked used to choose.
func checkRoleSets(cc *clientConn) error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	want := [numSets]map[*call]bool{{}, {}, {}}
	streams := 0
	for _, cl := range cc.calls {
		switch {
		case cl.stream == nil:
			want[setUnary][cl] = true
			if cl.waiting {
				want[setWaiting][cl] = true
			}
		case cl.stream.tx == nil:
			streams++
		case cl.recvWaiting:
			want[setRecv][cl] = true
		}
	}
	if streams != cc.serverStreams {
		return fmt.Errorf("%d server streams in flight, counted %d", streams, cc.serverStreams)
	}
	for k := range numSets {
		if len(cc.sets[k]) != len(want[k]) {
			return fmt.Errorf("set %d holds %d calls, want %d", k, len(cc.sets[k]), len(want[k]))
		}
		for i, cl := range cc.sets[k] {
			if !want[k][cl] || int(cl.setPos[k]) != i+1 {
				return fmt.Errorf("set %d: call %d at %d (pos %d) should not be there", k, cl.id, i, cl.setPos[k])
			}
		}
	}
	return nil
}

// TestRoleSetsFollowCalls: unary calls (some canceled), server streams and
// bidi ping-pongs (some closed early) on one connection; the sets
// passRoleLocked picks from always match the calls in flight, and are empty
// at the end. Every call completes (a wrong set would pass the role to a
// call that does not read, and hang the others).
func TestRoleSetsFollowCalls(t *testing.T) {
	s := sumServer()
	s.HandleRawStream("count", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for i := range 50 {
			if err := send([]byte{byte(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	s.HandleRaw("slow", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
		return append(dst, req...), nil
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cc *clientConn
	{
		st, err := c.Stream(ctx, "count", []byte(nil))
		if err != nil {
			t.Fatal(err)
		}
		cc = st.cc
		st.Close()
	}
	stop := make(chan struct{})
	checked := make(chan error, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				checked <- nil
				return
			default:
			}
			if err := checkRoleSets(cc); err != nil {
				checked <- fmt.Errorf("after %d checks: %w", n, err)
				return
			}
			n++
			time.Sleep(100 * time.Microsecond)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				switch (w + i) % 4 {
				case 0: // unary, every third one canceled
					cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
					if i%3 == 0 {
						cctx, ccancel = context.WithTimeout(ctx, 200*time.Microsecond)
					}
					out, err := c.CallRaw(cctx, "slow", []byte("x"), nil)
					ccancel()
					if err == nil && string(out) != "x" || err != nil && i%3 != 0 {
						errs <- fmt.Errorf("unary: %q %v", out, err)
						return
					}
				case 1: // a server stream, read to its end or closed early
					st, err := c.Stream(ctx, "count", []byte(nil))
					if err != nil {
						errs <- err
						return
					}
					for j := range 50 {
						if i%2 == 0 && j == 10 {
							break
						}
						if _, err := st.RecvRaw(); err != nil {
							errs <- fmt.Errorf("stream: %v", err)
							return
						}
					}
					st.Close()
				default: // a bidi ping-pong, ended or closed early
					st, err := OpenJSONBidi[int, int](ctx, c, "sum")
					if err != nil {
						errs <- err
						return
					}
					want := 0
					for j := 1; j <= 20; j++ {
						st.Send(j)
						want += j
						if got, err := st.Recv(); err != nil || got != want {
							errs <- fmt.Errorf("bidi: %d %v, want %d", got, err, want)
							return
						}
					}
					if i%2 == 0 {
						st.Close()
						continue
					}
					st.CloseSend()
					if _, err := st.Recv(); err != io.EOF {
						errs <- fmt.Errorf("bidi end: %v", err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	if err := <-checked; err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Closed streams leave when their end arrives.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := checkRoleSets(cc)
		cc.mu.Lock()
		n, sets := len(cc.calls), len(cc.sets[setUnary])+len(cc.sets[setWaiting])+len(cc.sets[setRecv])+cc.serverStreams
		cc.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 && sets == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls and %d set entries left", n, sets)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
