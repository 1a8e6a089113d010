package rpc

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pingPongs runs n concurrent bidi ping-pongs of rounds round trips (1 KiB
// each way) on c's method and returns the first failure.
func pingPongs(c *Client, method string, n, rounds int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			st, err := c.Bidi(ctx, method)
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			msg := make([]byte, 1024)
			for r := range rounds {
				msg[0], msg[1] = byte(i), byte(r)
				if err := st.SendRaw(msg); err != nil {
					errs <- err
					return
				}
				it, err := st.RecvRawView()
				if err != nil {
					errs <- err
					return
				}
				if len(it) != len(msg) || it[0] != byte(i) || it[1] != byte(r) {
					errs <- errors.New("echo of another item")
					return
				}
			}
			st.CloseSend()
			if _, err := st.RecvRaw(); err != io.EOF {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// TestBidiGatherWrites: 8 bidi ping-pongs on one connection: an item sent
// while other calls were handed items and are about to send theirs
// (clientConn.owed, serverConn.owed) waits for them to run once
// (frame.Writer.GatherFrame), so several calls' items go out in one write,
// both ways. Without it each item took a write of its own (about 1.0 per
// item each way); with it about 0.25 here, measured on the writers' own
// counts (frame.Writer.Progress). Afterwards no call is left marked.
func TestBidiGatherWrites(t *testing.T) {
	s := NewServer(ServerOptions{})
	rawEchoBidi(s)
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	if err := pingPongs(c, "echo-view", 1, 1); err != nil { // the connection is up
		t.Fatal(err)
	}
	cc, sc := c.slots[0].cur.Load(), onlyConn(t, s)
	cw0, _ := cc.w.Progress()
	sw0, _ := sc.w.Progress()
	const n, rounds = 8, 300
	if err := pingPongs(c, "echo-view", n, rounds); err != nil {
		t.Fatal(err)
	}
	cw1, _ := cc.w.Progress()
	sw1, _ := sc.w.Progress()
	items := float64(n * rounds)
	cli, srv := float64(cw1-cw0)/items, float64(sw1-sw0)/items
	t.Logf("writes per item: client %.2f, server %.2f", cli, srv)
	// Each side also writes opens, ends and credit: a few per call.
	if cli > 0.7 || srv > 0.7 {
		t.Fatalf("writes per item: client %.2f, server %.2f; want both at most 0.7 (items gathered)", cli, srv)
	}
	waitOwedZero(t, cc, sc)
}

// waitOwedZero waits until no bidi call of cc (client) or sc (server) is
// marked owed: every mark is settled when its call sends, waits or ends.
func waitOwedZero(t *testing.T, cc *clientConn, sc *serverConn) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for cc.owed.n() != 0 || sc.owed.n() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("owed marks left after every call ended: client %d, server %d", cc.owed.n(), sc.owed.n())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBidiOwedMarksSettle: calls that end every way while marked (handed
// an item they have not answered) leave no mark behind on either side: the
// client closes, cancels its ctx, or half-closes; the server's handler
// returns without reading on, or with an error. A mark left over would
// make every later send on the connection gather for nothing.
func TestBidiOwedMarksSettle(t *testing.T) {
	s := NewServer(ServerOptions{})
	rawEchoBidi(s)
	// "once": echoes one item, then returns (nil or an error) without
	// reading the next, which the client sends at once.
	s.HandleRawBidi("once", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		it, err := recv()
		if err != nil {
			return err
		}
		if err := send(it); err != nil {
			return err
		}
		if len(it) > 0 && it[0] == 'e' {
			return Errorf(Aborted, "done")
		}
		return nil
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		method := "echo-view"
		if i%4 == 3 {
			method = "once"
		}
		st, err := c.Bidi(ctx, method)
		if err != nil {
			t.Fatal(err)
		}
		first := []byte("x")
		if i%8 == 7 {
			first = []byte("e")
		}
		if err := st.SendRaw(first); err != nil {
			t.Fatal(err)
		}
		if _, err := st.RecvRawView(); err != nil {
			t.Fatal(err)
		}
		st.SendRaw([]byte("y")) // the server may never read it
		time.Sleep(time.Duration(i%3) * 50 * time.Microsecond)
		switch i % 4 {
		case 0:
			st.Close() // marked: its echo of "y" may be in
		case 1:
			cancel()
		case 2:
			st.CloseSend()
			for {
				if _, err := st.RecvRaw(); err != nil {
					break
				}
			}
		case 3:
			for {
				if _, err := st.RecvRaw(); err != nil {
					break
				}
			}
		}
		cancel()
	}
	waitOwedZero(t, c.slots[0].cur.Load(), onlyConn(t, s))
}

// TestBidiLoneCallNeverGathers: one ping-pong next to an idle bidi call
// (its caller parked in Recv, its handler in recv) on the same connection:
// at every send of the active call no other call is marked, on either
// side, so its items never wait for anybody (GatherFrame is not used).
func TestBidiLoneCallNeverGathers(t *testing.T) {
	s := NewServer(ServerOptions{})
	var sc atomic.Pointer[serverConn]
	var srvOthers atomic.Int32 // the most other marks a send of the active handler saw
	s.HandleRawBidiView("active", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for {
			it, err := recv()
			if err != nil {
				return nil
			}
			if c := sc.Load(); c != nil {
				if o := c.owed.n() - 1; o > srvOthers.Load() { // - its own mark
					srvOthers.Store(o)
				}
			}
			if err := send(it); err != nil {
				return err
			}
		}
	})
	rawEchoBidi(s)
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	idle, err := c.Bidi(ctx, "echo-view")
	if err != nil {
		t.Fatal(err)
	}
	idle.SendRaw([]byte("i"))
	if _, err := idle.RecvRawView(); err != nil {
		t.Fatal(err)
	}
	parked := make(chan error, 1)
	go func() { _, err := idle.RecvRaw(); parked <- err }() // waits for an item that never comes
	sc.Store(onlyConn(t, s))
	cc := c.slots[0].cur.Load()
	st, err := c.Bidi(ctx, "active")
	if err != nil {
		t.Fatal(err)
	}
	waitOwedZero(t, cc, sc.Load()) // the idle caller is parked in Recv, its handler in recv
	for i := range 500 {
		if err := st.SendRaw([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.RecvRawView(); err != nil {
			t.Fatal(err)
		}
		if n := cc.owed.n(); n != 1 { // its own mark, settled by its next send
			t.Fatalf("round %d: %d calls marked on the client, want 1 (the active call itself)", i, n)
		}
	}
	if o := srvOthers.Load(); o != 0 {
		t.Fatalf("a send of the lone active handler saw %d other calls marked, want 0", o)
	}
	st.CloseSend()
	idle.Close()
	if err := <-parked; err == nil {
		t.Fatal("idle Recv returned an item")
	}
}

// TestBidiStaleOwedMarkExpires: a call that was handed an item and then
// neither answers nor waits again (a client caller that keeps its item, a
// handler that holds its request) stays marked, but its mark stops counting
// after one send of another call yielded for it without any mark being
// settled (owed.go): the other calls' sends then write at once instead of
// yielding every time. Without the epoch every round saw the stale mark.
// One side at a time: a send on one side ends the epoch the other side's
// holder would need to stay counted in.
func TestBidiStaleOwedMarkExpires(t *testing.T) {
	for _, side := range []string{"client", "server"} {
		t.Run(side, func(t *testing.T) { staleOwedMark(t, side == "server") })
	}
}

func staleOwedMark(t *testing.T, server bool) {
	s := NewServer(ServerOptions{})
	var sc atomic.Pointer[serverConn]
	release := make(chan struct{})
	s.HandleRawBidiView("hold", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		if _, err := recv(); err != nil { // handed an item: marked, and never answers
			return err
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	const rounds = 300
	srvOthers := make([]int32, 0, rounds) // per send of the active handler: the other calls marked
	s.HandleRawBidiView("active", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for {
			it, err := recv()
			if err != nil {
				return nil
			}
			srvOthers = append(srvOthers, sc.Load().owed.n()-1) // - its own mark
			if err := send(it); err != nil {
				return err
			}
		}
	})
	rawEchoBidi(s)
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	method := "echo-view" // the client's caller keeps its echo
	if server {
		method = "hold" // the server's handler holds its request
	}
	holder, err := c.Bidi(ctx, method)
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.SendRaw([]byte("h")); err != nil {
		t.Fatal(err)
	}
	sc.Store(onlyConn(t, s))
	cc := c.slots[0].cur.Load()
	if !server {
		if _, err := holder.RecvRawView(); err != nil { // marked until it sends or waits again
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		cn, sn := cc.owed.n(), sc.Load().owed.n()
		if server && cn == 0 && sn == 1 || !server && cn == 1 && sn == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls marked: client %d, server %d; want only the holder's", cn, sn)
		}
	}
	st, err := c.Bidi(ctx, "active")
	if err != nil {
		t.Fatal(err)
	}
	cliStale := 0 // rounds in which the client still counted the kept item
	for i := range rounds {
		if err := st.SendRaw([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.RecvRawView(); err != nil {
			t.Fatal(err)
		}
		if cc.owed.n() > 1 { // more than its own mark
			cliStale++
		}
	}
	st.CloseSend()
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatal(err)
	}
	srvStale := 0
	for _, o := range srvOthers {
		if o > 0 {
			srvStale++
		}
	}
	// The first send yields once and ends the epoch; one more for a send
	// that raced with it.
	if cliStale > 2 || srvStale > 2 {
		t.Fatalf("the stale mark counted in %d client rounds and %d server sends of %d, want at most 2", cliStale, srvStale, rounds)
	}
	close(release)
	holder.Close()
	waitOwedZero(t, cc, sc.Load())
}
