package rpc

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// bellServer is a server with echo and "nap" (echo after 300 µs, so that
// callers park) and opts.
func bellServer(t *testing.T, opts ServerOptions) (*Server, string) {
	s := NewServer(opts)
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req...), nil
	})
	s.HandleRaw("nap", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		time.Sleep(300 * time.Microsecond)
		return append(dst, req...), nil
	})
	s.HandleRaw("slow", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	return s, startServer(t, s)
}

// serverSlotCalls waits for s's one connection to have its call slots
// (set under its mu once the offer is accepted, maybe after the client's
// handshake returned) and returns them.
func serverSlotCalls(t *testing.T, s *Server) *serverCalls {
	t.Helper()
	var sc *serverCalls
	waitFor(t, "the server's connection to set up its call slots", func() bool {
		c := onlyConn(t, s)
		c.mu.Lock()
		sc = c.slotCalls
		c.mu.Unlock()
		return sc != nil
	})
	return sc
}

// TestShmCallsBellInterop: the client's bell (shm_calls_bell, spec 10.8)
// is in use only when both hellos set it. A client without it against a
// server with it, and a client with it against a server without it, keep
// the per-slot wakes (no poller); every echo of 16 callers is right either
// way, and with the bell the poller hands answers to parked callers.
func TestShmCallsBellInterop(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		clientOld, serverOld bool
	}{
		{"both set it", false, false},
		{"a client without it", true, false},
		{"a server without it", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, addr := bellServer(t, ServerOptions{noCallsBell: tc.serverOld})
			c, x := slotClientOpts(t, addr, ClientOptions{noCallsBell: tc.clientOld})
			want := !tc.clientOld && !tc.serverOld
			if x.bell != want {
				t.Fatalf("the client's bell in use: %v, want %v", x.bell, want)
			}
			if sc := serverSlotCalls(t, s); sc.bell != want {
				t.Fatalf("the server's bell in use: %v, want %v", sc.bell, want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, method := range []string{"echo", "nap"} {
				if err := callRounds(ctx, c, method, 16, 6, 1000, 64, 64<<10, 1<<20); err != nil {
					t.Fatal(err)
				}
			}
			if got := c.slotCallCount(); got != 2*16*6*3 {
				t.Fatalf("%d calls through call slots, want %d", got, 2*16*6*3)
			}
			handed, state := x.handed.Load(), x.pstate.Load()
			t.Logf("the poller handed %d answers (state %d)", handed, state)
			if want && handed == 0 {
				t.Fatal("with the bell, the poller handed no answer (every caller found its own: the test proves nothing)")
			}
			if !want && (handed != 0 || state != pollNone) {
				t.Fatalf("without the bell, the poller ran (state %d, %d answers handed)", state, handed)
			}
		})
	}
}

// TestShmCallsBellWithheld: a server that sets shm_calls_bell but never
// bumps or wakes cbell costs each parked call at most the poller's nap
// (shmCallNap): every call completes, the poller's naps find the answers
// in; and a call whose deadline passes while it is parked fails with
// deadline_exceeded at its deadline, not a nap later.
func TestShmCallsBellWithheld(t *testing.T) {
	_, addr := bellServer(t, ServerOptions{withholdCBell: true})
	c, x := slotClientOpts(t, addr, ClientOptions{})
	if !x.bell {
		t.Fatal("the connection did not negotiate shm_calls_bell")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := callRounds(ctx, c, "nap", 8, 5, 1000, 64, 64<<10); err != nil {
		t.Fatal(err)
	}
	naps, missed := x.naps.Load(), x.missed.Load()
	t.Logf("the poller slept %d whole naps, %d of which found an answer in", naps, missed)
	if missed == 0 {
		t.Fatal("no nap of the poller found an answer in: the calls were not waiting for the withheld bell")
	}
	const d = 50 * time.Millisecond
	dctx, dcancel := context.WithTimeout(context.Background(), d)
	defer dcancel()
	t0 := time.Now()
	_, err := c.CallRaw(dctx, "slow", pattern(64<<10, 1), nil)
	took := time.Since(t0)
	var e *Error
	if !errors.As(err, &e) || e.Code != DeadlineExceeded {
		t.Fatalf("the slow call failed with %v, want deadline_exceeded", err)
	}
	if took > d+5*time.Second { // (a parked caller sees its ctx end at once; the bound is for a loaded machine)
		t.Fatalf("the slow call returned %v after its deadline", took-d)
	}
	echoes(t, c, 3, 64<<10)
}

// pollers counts the client call-slot pollers running in this process.
func pollers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "(*clientCalls).pollAnswers")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestShmCallsPollerEndsOnClose: the client's poller starts with the first
// parked caller and ends when the connection closes, whether it is running
// (callers parked on a slow call) or idle (no caller waiting); no poller
// goroutine is left.
func TestShmCallsPollerEndsOnClose(t *testing.T) {
	_, addr := bellServer(t, ServerOptions{})
	// (Pollers of earlier tests' clients, closed, end within a few ms.)
	waitFor(t, "no poller left from earlier tests", func() bool { return pollers() == 0 })
	const before = 0
	for _, idle := range []bool{true, false} {
		c, x := slotClientOpts(t, addr, ClientOptions{})
		if x.pstate.Load() != pollNone || pollers() != before {
			t.Fatal("a poller runs before any call parked")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := callRounds(ctx, c, "nap", 4, 3, 1000, 64<<10); err != nil {
			t.Fatal(err)
		}
		cancel()
		if pollers() != before+1 {
			t.Fatalf("%d pollers running, want %d", pollers(), before+1)
		}
		errc := make(chan error, 2)
		if idle {
			waitFor(t, "the poller to go idle", func() bool { return x.pstate.Load() == pollIdle })
		} else {
			for range 2 { // (two: the connection's only slot call sleeps on its own word)
				go func() {
					_, err := c.CallRaw(context.Background(), "slow", nil, nil)
					errc <- err
				}()
			}
			waitFor(t, "a slow caller to park", func() bool { return x.anyWaiting() })
		}
		c.Close()
		if !idle {
			for range 2 {
				if err := <-errc; CodeOf(err) != Unavailable && CodeOf(err) != Canceled {
					t.Fatalf("a slow call ended with %v, want unavailable or canceled", err)
				}
			}
		}
		waitFor(t, "the poller to end", func() bool { return pollers() == before })
	}
}

// TestShmCallsClientKilled: kill -9 of a client (another process) while
// its slot call's handler runs and its caller is parked for its poller:
// the handler is canceled at once, the server drops the connection and
// unmaps the region, and it keeps serving others.
func TestShmCallsClientKilled(t *testing.T) {
	_, _, devBefore := shmTraces(t)
	// Two calls: the connection's only slot call would sleep on its own word.
	s, addr, kill := killedClient(t, "slotclient", 2)
	sc := serverSlotCalls(t, s)
	if !sc.bell {
		t.Fatal("the helper's connection did not negotiate call slots with shm_calls_bell")
	}
	// The helper's caller is parked, its poller asleep on cbell (csleeping
	// is in the client's half, which the server maps too).
	waitFor(t, "the helper's poller to sleep on cbell", func() bool { return sc.calls.CSleeping().Load() != 0 })
	if st := s.ShmStats(); st.SlotCalls != 0 || st.Received != 2 {
		t.Fatalf("server shm %+v, want the two 1 MiB requests through call slots (not yet answered)", st)
	}
	kill()
	waitFor(t, "the server to drop the connection", func() bool { return s.ShmStats().Conns == 0 })
	waitNoTraces(t, devBefore)
	c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1, ShmConns: 1, ShmCalls: true})
	echoes(t, c, 3, 64<<10)
	if c.slotCallCount() != 3 {
		t.Fatalf("%d of the next client's calls through call slots, want 3", c.slotCallCount())
	}
}

// TestShmCallsBellLoneSleeps: with the bell, a lone caller whose answer
// takes longer than its spin sleeps on its own ans_seq and the server
// wakes it there: no poller starts, and its waits end by the server's wake,
// not by the 10 ms nap.
func TestShmCallsBellLoneSleeps(t *testing.T) {
	_, addr := bellServer(t, ServerOptions{})
	c, x := slotClientOpts(t, addr, ClientOptions{})
	if !x.bell {
		t.Fatal("the connection did not negotiate shm_calls_bell")
	}
	const n = 20
	for i := range n {
		req := pattern(64<<10, i)
		resp, err := c.CallRaw(context.Background(), "nap", req, nil) // (300 µs: past the lone spin)
		if err != nil || !bytes.Equal(resp, req) {
			t.Fatalf("call %d: %v (equal %v)", i, err, bytes.Equal(resp, req))
		}
	}
	naps := x.naps.Load()
	t.Logf("%d lone calls: %d waits slept their whole nap; poller state %d", n, naps, x.pstate.Load())
	if x.pstate.Load() != pollNone || x.handed.Load() != 0 {
		t.Fatal("a lone caller parked for the poller")
	}
	if naps > n/4 { // (without the server's wake every call would nap its 10 ms)
		t.Fatalf("%d of %d lone calls' waits slept their whole nap: the server did not wake them", naps, n)
	}
}
