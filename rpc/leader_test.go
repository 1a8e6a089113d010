package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestCallersTakeTurnsReading: many clients called in turn, so that each
// connection alternates between its callers reading and its background
// reader taking over after a quiet tick. Every call must complete (each has
// a deadline, so a lost wake-up fails instead of hanging).
func TestCallersTakeTurnsReading(t *testing.T) {
	addr := startServer(t, echoServer())
	var clients []*Client
	for range 20 {
		clients = append(clients, dial(t, addr))
	}
	for round := range 60 {
		for i, c := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			p := []byte(fmt.Sprint(round, i))
			out, err := c.CallRaw(ctx, "echo", p, nil)
			cancel()
			if err != nil || !bytes.Equal(out, p) {
				t.Fatalf("round %d client %d: %q %v", round, i, out, err)
			}
		}
		if round%20 == 0 {
			time.Sleep(3 * maxIdleTick) // let the background readers take over
		}
	}
}

// TestLeaderCanceledWhileReading: a call whose ctx ends while it is the one
// reading the socket returns at once with its ctx error, and the calls still
// waiting get their results (another caller or the background reader reads
// for them).
func TestLeaderCanceledWhileReading(t *testing.T) {
	s := echoServer()
	release := make(chan struct{})
	s.HandleRaw("wait", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append(dst, req...), nil
	})
	c := dial(t, startServer(t, s))
	for i := range 20 {
		// One caller alone: it leads, blocked in the read, until its
		// deadline ends the wait.
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%3)*time.Millisecond)
		t0 := time.Now()
		_, err := c.CallRaw(ctx, "wait", []byte("x"), nil)
		cancel()
		if CodeOf(err) != DeadlineExceeded {
			t.Fatalf("call %d: want DeadlineExceeded, got %v", i, err)
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Fatalf("call %d: the deadline took %v to end the call", i, d)
		}
		// The connection still works, read by whoever comes next.
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		out, err := c.CallRaw(ctx, "echo", []byte("y"), nil)
		cancel()
		if err != nil || string(out) != "y" {
			t.Fatalf("call %d after a canceled leader: %q %v", i, out, err)
		}
	}
	// Several waiting callers; cancel some while others wait: the rest all
	// get their results once released. The release comes after the
	// canceled ones have returned (not after a fixed 50 ms: a loaded
	// machine started three of them only after it, and they got answers).
	var wg, short sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		if i%2 == 0 {
			short.Add(1)
		}
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if i%2 == 0 {
				defer short.Done()
				cancel()
				ctx, cancel = context.WithTimeout(context.Background(), time.Duration(i+1)*time.Millisecond)
			}
			defer cancel()
			p := []byte{byte(i)}
			out, err := c.CallRaw(ctx, "wait", p, nil)
			switch {
			case i%2 == 0 && CodeOf(err) != DeadlineExceeded:
				errs <- fmt.Errorf("caller %d: want DeadlineExceeded, got %q %v", i, out, err)
			case i%2 == 1 && (err != nil || !bytes.Equal(out, p)):
				errs <- fmt.Errorf("caller %d: %q %v", i, out, err)
			}
		}()
	}
	shortDone := make(chan struct{})
	go func() { short.Wait(); close(shortDone) }()
	select {
	case <-shortDone:
	case <-time.After(10 * time.Second):
		t.Error("callers with deadlines of 1 to 15 ms still waiting 10 s later")
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, err := c.CallRaw(context.Background(), "echo", nil, nil); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestRolePassesToAWaitingCall: when a leader is done, the read role goes to
// a call already waiting for its result rather than one still writing its
// request (which would not read until its write is done).
func TestRolePassesToAWaitingCall(t *testing.T) {
	for range 50 { // map order varies: every time, the waiting call wins
		cc := &clientConn{calls: map[uint32]*call{}, bgWake: make(chan struct{}, 1)}
		for id := uint32(1); id <= 6; id++ {
			cl := &call{id: id, lead: make(chan struct{}, 1), waiting: id == 4, inCalls: true}
			cc.calls[id] = cl
			cc.addedLocked(cl) // as register does (rolesets.go)
		}
		cc.role = roleCaller
		cc.passRoleLocked()
		if cc.role != roleCaller || cc.leader == nil || cc.leader.id != 4 {
			t.Fatalf("role %d went to %+v, want the waiting call 4", cc.role, cc.leader)
		}
		select {
		case <-cc.leader.lead:
		default:
			t.Fatal("the new leader was not told")
		}
	}
}

// TestWatchedLeaderCanceled: calls that share one cancelable ctx lead without
// a context.AfterFunc once the connection's background reader watches that
// ctx; canceling it still ends a leader blocked in the socket read, at once.
func TestWatchedLeaderCanceled(t *testing.T) {
	s := echoServer()
	s.HandleRaw("block", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	c := dial(t, startServer(t, s))
	cc := c.slots[0].cur.Load()
	for round := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		// Calls until the background reader has adopted ctx (at its next look).
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, err := c.CallRaw(ctx, "echo", []byte("x"), nil); err != nil {
				t.Fatal(err)
			}
			cc.mu.Lock()
			w := cc.watching
			cc.mu.Unlock()
			if w == ctx.Done() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the background reader never watched the calls' ctx", round)
			}
			time.Sleep(time.Millisecond)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := c.CallRaw(ctx, "block", []byte("y"), nil)
			errc <- err
		}()
		time.Sleep(20 * time.Millisecond) // let it lead, blocked in the read
		cc.mu.Lock()
		leader := cc.leader
		relies := leader != nil && leader.watched == ctx.Done()
		cc.mu.Unlock()
		if !relies {
			t.Errorf("round %d: the blocked caller does not rely on the background reader's watch", round)
		}
		t0 := time.Now()
		cancel()
		select {
		case err := <-errc:
			if CodeOf(err) != Canceled {
				t.Fatalf("round %d: want Canceled, got %v", round, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: canceling the watched ctx did not end the leader", round)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("round %d: the cancel took %v", round, d)
		}
		// The connection still works, with a fresh ctx.
		if out, err := c.CallRaw(context.Background(), "echo", []byte("z"), nil); err != nil || string(out) != "z" {
			t.Fatalf("round %d: after the cancel: %q %v", round, out, err)
		}
	}
}

// TestOneAllocPerCallCancelable: a unary raw call with a cancelable ctx costs
// at most one heap allocation, client and server together (the server's
// handler ctx), once the connection's reader watches that ctx; a payload
// large enough to be padded too (the :pad metadata entry is not copied for
// the handler: it has no metadata an application sees).
func TestOneAllocPerCallCancelable(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race sync.Pool drops items at random: allocation counts mean nothing (make test runs this package without -race too)")
	}
	for _, size := range []int{64, 100 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			c := dial(t, startServer(t, echoServer()))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p, dst := make([]byte, size), make([]byte, 0, size)
			call := func() {
				if _, err := c.CallRaw(ctx, "echo", p, dst[:0]); err != nil {
					t.Fatal(err)
				}
			}
			for range 100 {
				call()
			}
			time.Sleep(150 * time.Millisecond) // at least one look of the background reader
			for range 100 {
				call()
			}
			if n := testing.AllocsPerRun(1000, call); n > 1.05 {
				t.Errorf("%.2f allocations per call of %d bytes with a cancelable ctx, client + server; want at most 1", n, size)
			}
		})
	}
}

// TestLargeCallAllocs: 1 MiB echo calls reuse their buffers on both sides
// once warm (the server's pooled request buffer must not end up over the
// 1 MiB pooling limit, or every call allocates it again step by step).
func TestLargeCallAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race sync.Pool drops items at random: allocation counts mean nothing (make allocs runs this without -race)")
	}
	s := NewServer(ServerOptions{})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return req, nil })
	c := dial(t, startServer(t, s))
	p := bytes.Repeat([]byte("m"), 1<<20)
	dst := make([]byte, 0, 1<<20)
	call := func() {
		out, err := c.CallRaw(context.Background(), "echo", p, dst[:0])
		if err != nil || len(out) != len(p) {
			t.Fatalf("%d bytes, %v", len(out), err)
		}
	}
	for range 10 {
		call()
	}
	if n := testing.AllocsPerRun(50, call); n > 3 {
		t.Errorf("%.1f allocations per 1 MiB call, client + server; want a handful at most (buffers reused)", n)
	}
}
