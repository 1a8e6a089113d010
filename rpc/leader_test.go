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
	// get their results once released.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if i%2 == 0 {
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
	time.Sleep(50 * time.Millisecond)
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
			cc.calls[id] = &call{id: id, lead: make(chan struct{}, 1), waiting: id == 4}
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
