package rpc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// unarySpinServer serves unary "echo", "slow" (echo after 20 ms) and "hold"
// (answers when its ctx ends, or when release is closed).
func unarySpinServer(t *testing.T, opts ServerOptions, release <-chan struct{}) (*Server, string) {
	t.Helper()
	s := NewServer(opts)
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req...), nil
	})
	s.HandleRaw("slow", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		time.Sleep(20 * time.Millisecond)
		return append(dst, req...), nil
	})
	s.HandleRaw("hold", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-release:
			return append(dst, req...), nil
		}
	})
	return s, startServer(t, s)
}

func callEcho(t *testing.T, c *Client, method, msg string) {
	t.Helper()
	got, err := c.CallRaw(context.Background(), method, []byte(msg), nil)
	if err != nil || string(got) != msg {
		t.Fatalf("%s = %q, %v; want %q", method, got, err, msg)
	}
}

// Sequential unary calls of one caller poll on both sides: the caller for
// its answer (it leads its read, the only call in flight), the server's
// reader for the next request after it answered the last one; answers and
// requests come within the polls. NoSpin on either side turns that side's
// poll off and leaves the other's.
func TestUnaryLoneSpinPolls(t *testing.T) {
	s, addr := unarySpinServer(t, ServerOptions{}, nil)
	c := dialOpts(t, addr, ClientOptions{Conns: 1})
	callEcho(t, c, "echo", "first")
	cc, sc := c.slots[0].cur.Load(), onlyConn(t, s)
	if cc.spin == nil || sc.spin == nil {
		t.Fatal("no poll on a unix socket by default")
	}
	// At most one poll per call and side (+2: the first call's, and the
	// server's poll for the next request may be under way).
	pollRounds(t, cc, sc, 2, func() { callEcho(t, c, "echo", "x") })

	for _, side := range []string{"server", "client"} {
		t.Run("NoSpin "+side, func(t *testing.T) {
			s2, addr2 := unarySpinServer(t, ServerOptions{NoSpin: side == "server"}, nil)
			c2 := dialOpts(t, addr2, ClientOptions{Conns: 1, NoSpin: side == "client"})
			callEcho(t, c2, "echo", "first")
			cc2, sc2 := c2.slots[0].cur.Load(), onlyConn(t, s2)
			off, on := sc2.spin, cc2.spin
			if side == "client" {
				off, on = cc2.spin, sc2.spin
			}
			if off != nil {
				t.Fatalf("NoSpin on the %s: its poll is set up", side)
			}
			if on == nil {
				t.Fatalf("NoSpin on the %s turned the other side's poll off", side)
			}
			for range 50 {
				callEcho(t, c2, "echo", "y")
			}
			if on.Polls.Load() == 0 {
				t.Fatalf("NoSpin on the %s: the other side never polled in 50 calls", side)
			}
		})
	}
}

// No poll while another call is in flight on the connection: sequential
// calls next to two held calls never poll on either side, and a lone
// caller's poll stops when a second call starts. (Two held calls: next to
// one, the held call's caller, leading the read, is alone between two
// sequential calls, and a loaded machine let it poll there: "client polled
// 1 times", 1 run in 300 under load. With two, no call is ever alone.)
func TestUnaryNoSpinWithOthers(t *testing.T) {
	release := make(chan struct{})
	s, addr := unarySpinServer(t, ServerOptions{}, release)
	c := dialOpts(t, addr, ClientOptions{Conns: 1})
	for range 5 {
		callEcho(t, c, "echo", "x")
	}
	cc, sc := c.slots[0].cur.Load(), onlyConn(t, s)
	held := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.CallRaw(context.Background(), "hold", []byte("h"), nil)
			held <- err
		}()
	}
	spinWaitFor(t, "the held calls on both sides", func() bool {
		sc.mu.Lock()
		n := len(sc.calls)
		sc.mu.Unlock()
		return n == 2 && cc.inflight.Load() == 2 && !polling(cc.spin) && !polling(sc.spin)
	})
	cp, sp := cc.spin.Polls.Load(), sc.spin.Polls.Load()
	for range 200 {
		callEcho(t, c, "echo", "x")
	}
	if cc.spin.Polls.Load() != cp || sc.spin.Polls.Load() != sp {
		t.Fatalf("200 calls next to two held ones: client polled %d times, server %d",
			cc.spin.Polls.Load()-cp, sc.spin.Polls.Load()-sp)
	}
	close(release)
	for range 2 {
		if err := <-held; err != nil {
			t.Fatal(err)
		}
	}
	spinWaitFor(t, "no call in flight", func() bool { return cc.inflight.Load() == 0 })

	// A lone held call's caller polls (without bound) until a second call
	// (held too: no answer for the poll to find) starts, then parks; both
	// get their answers.
	release2 := make(chan struct{})
	_, addr2 := unarySpinServer(t, ServerOptions{}, release2)
	c2 := dialOpts(t, addr2, ClientOptions{Conns: 1})
	callEcho(t, c2, "echo", "x")
	cc2 := c2.slots[0].cur.Load()
	cc2.spin.SetBound(time.Hour)
	cc2.spin.SetBusyGap(0)
	var wg sync.WaitGroup
	defer wg.Wait()
	var first chan error
	for attempt := 1; ; attempt++ {
		callEcho(t, c2, "echo", "x") // (the read role free again)
		first = make(chan error, 1)
		hctx, hcancel := context.WithCancel(context.Background())
		defer hcancel()
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := c2.CallRaw(hctx, "hold", []byte("1"), nil)
			if err == nil && string(got) != "1" {
				err = errors.New("wrong answer " + string(got))
			}
			first <- err
		}()
		if waitPolling(cc2, 2*time.Second) {
			break
		}
		if attempt == 5 {
			t.Fatalf("attempt %d: the lone held call never polled", attempt)
		}
		hcancel()
		<-first
	}
	crowded := cc2.spin.Crowded.Load()
	second := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		got, err := c2.CallRaw(context.Background(), "hold", []byte("2"), nil)
		if err == nil && string(got) != "2" {
			err = errors.New("wrong answer " + string(got))
		}
		second <- err
	}()
	spinWaitFor(t, "the poll's stop", func() bool { return cc2.spin.Crowded.Load() == crowded+1 && !polling(cc2.spin) })
	close(release2)
	for _, ch := range []chan error{first, second} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no answer 10 s after the release")
		}
	}
}

// waitPolling reports whether a poll of cc.spin is under way within d.
func waitPolling(cc *clientConn, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if polling(cc.spin) {
			return true
		}
	}
	return false
}

// A slow handler (answers after 20 ms) makes a lone caller's polls back off,
// and a client that pauses 20 ms between calls makes the server's reader's
// polls back off: each miss doubles the waits that park without polling.
func TestUnaryLoneSpinBacksOff(t *testing.T) {
	s, addr := unarySpinServer(t, ServerOptions{}, nil)
	c := dialOpts(t, addr, ClientOptions{Conns: 1})
	callEcho(t, c, "echo", "first")
	cc, sc := c.slots[0].cur.Load(), onlyConn(t, s)
	p0, m0, h0 := cc.spin.Polls.Load(), cc.spin.Misses.Load(), cc.spin.Hits.Load()
	for range 12 {
		callEcho(t, c, "slow", "s")
	}
	// Polls at waits 1, 3, 6 and 11 at most, each a miss.
	if p, m, h := cc.spin.Polls.Load()-p0, cc.spin.Misses.Load()-m0, cc.spin.Hits.Load()-h0; p > 4 || m != p || h != 0 {
		t.Fatalf("client, 12 answers after 20 ms: polls %d misses %d hits %d, want at most 4, all misses", p, m, h)
	}

	s2, addr2 := unarySpinServer(t, ServerOptions{}, nil)
	c2 := dialOpts(t, addr2, ClientOptions{Conns: 1, NoSpin: true})
	for range 2 * loneRuns {
		callEcho(t, c2, "echo", "quick") // (lone calls in a row: the reader polls)
	}
	sc2 := onlyConn(t, s2)
	if sc2.spin.Polls.Load() == 0 {
		t.Fatalf("%d sequential calls: the server's reader never polled", 2*loneRuns)
	}
	p0, m0, h0 = sc2.spin.Polls.Load(), sc2.spin.Misses.Load(), sc2.spin.Hits.Load()
	for range 12 {
		time.Sleep(20 * time.Millisecond)
		callEcho(t, c2, "echo", "e")
	}
	// Waits 1, 3, 6 and 11 after a miss poll at most (and the 12th may be
	// under way), none finding a request (a poll under way at p0 ends as a
	// miss too).
	if p, m, h := sc2.spin.Polls.Load()-p0, sc2.spin.Misses.Load()-m0, sc2.spin.Hits.Load()-h0; p > 5 || m+1 < p || h != 0 {
		t.Fatalf("server, 12 requests 20 ms apart: polls %d misses %d hits %d, want at most 5, misses", p, m, h)
	}
	_ = sc
}

// A lone caller that polls (here without bound) still ends at once on its
// ctx's cancel, its deadline and the client's Close; the server's reader
// polling for the next request ends on the server's Close.
func TestUnaryLoneSpinEnds(t *testing.T) {
	_, addr := unarySpinServer(t, ServerOptions{}, nil)
	for _, name := range []string{"cancel", "deadline", "client close"} {
		t.Run(name, func(t *testing.T) {
			c := dialOpts(t, addr, ClientOptions{Conns: 1})
			callEcho(t, c, "echo", "x")
			cc := c.slots[0].cur.Load()
			cc.spin.SetBound(time.Hour)
			cc.spin.SetBusyGap(0) // it polls until its wait ends
			var cancel context.CancelFunc
			var done chan error
			for attempt := 1; ; attempt++ {
				callEcho(t, c, "echo", "x") // (the read role free again)
				ctx, stop := context.WithCancel(context.Background())
				limit := 5 * time.Second
				if name == "deadline" {
					// Polling well before the deadline, else a new call.
					ctx, stop = context.WithTimeout(context.Background(), 3*time.Second)
					limit = 1500 * time.Millisecond
				}
				cancel = stop
				defer stop()
				done = make(chan error, 1)
				go func() {
					_, err := c.CallRaw(ctx, "hold", []byte("h"), nil)
					done <- err
				}()
				if waitPolling(cc, limit) {
					break
				}
				if attempt == 5 {
					t.Fatalf("attempt %d: the lone caller never polled", attempt)
				}
				stop()
				<-done
			}
			misses0, ends0 := cc.spin.Misses.Load(), cc.spin.Ended.Load()+cc.spin.Hits.Load()+cc.spin.Crowded.Load()
			time.Sleep(20 * time.Millisecond) // well into the poll
			switch name {
			case "cancel":
				cancel()
			case "client close":
				c.Close()
			}
			select {
			case err := <-done:
				var want bool
				switch name {
				case "cancel":
					want = errors.Is(err, context.Canceled)
				case "deadline":
					want = errors.Is(err, context.DeadlineExceeded)
				default:
					want = err != nil
				}
				if !want {
					t.Fatalf("call = %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the call still polling 10 s after its end")
			}
			// Its bound is an hour: it ended by the interrupt or close
			// (Ended), or the call's slot given back (Crowded: no longer
			// the only call), not the bound.
			if polling(cc.spin) || cc.spin.Misses.Load() != misses0 || cc.spin.Ended.Load()+cc.spin.Hits.Load()+cc.spin.Crowded.Load() == ends0 {
				t.Fatalf("the poll did not end by the call's end: polls %d ended %d hits %d crowded %d misses %d (before %d)",
					cc.spin.Polls.Load(), cc.spin.Ended.Load(), cc.spin.Hits.Load(), cc.spin.Crowded.Load(), cc.spin.Misses.Load(), misses0)
			}
		})
	}

	t.Run("server close", func(t *testing.T) {
		s, addr := unarySpinServer(t, ServerOptions{}, nil)
		c := dialOpts(t, addr, ClientOptions{Conns: 1, NoSpin: true})
		callEcho(t, c, "echo", "x")
		sc := onlyConn(t, s)
		sc.spin.SetBound(time.Hour)
		sc.spin.SetBusyGap(0)
		for deadline := time.Now().Add(10 * time.Second); ; {
			callEcho(t, c, "echo", "x")
			if waitPollingSpin(sc, 200*time.Millisecond) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the server's reader never polled for the next request")
			}
		}
		misses0 := sc.spin.Misses.Load()
		time.Sleep(20 * time.Millisecond)
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Server.Close still waiting 10 s later")
		}
		spinWaitFor(t, "the reader's poll's end", func() bool { return !polling(sc.spin) })
		if sc.spin.Misses.Load() != misses0 || sc.spin.Ended.Load() == 0 {
			t.Fatalf("the server's poll did not end by the close: ended %d misses %d (before %d)", sc.spin.Ended.Load(), sc.spin.Misses.Load(), misses0)
		}
	})
}

// waitPollingSpin reports whether a poll of the server connection's reader
// is under way within d.
func waitPollingSpin(sc *serverConn, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if polling(sc.spin) {
			return true
		}
	}
	return false
}
