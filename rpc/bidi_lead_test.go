package rpc

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// recvLeading reports whether st's Recv is reading the socket itself.
func recvLeading(st *ClientStream) bool {
	cc := st.cc
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.role == roleCaller && cc.leader == st.cl && st.cl.recvLeading
}

// waitRecvLeading waits up to d until st's Recv reads the socket itself.
func waitRecvLeading(st *ClientStream, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !recvLeading(st) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// TestBidiRecvReadsItself: in a ping-pong, a bidi call's Recv reads its own
// items (it holds the read role, as a unary caller does) instead of being
// handed each by the background reader; the sums stay right.
func TestBidiRecvReadsItself(t *testing.T) {
	c := dial(t, startServer(t, sumServer()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := OpenJSONBidi[int, int](ctx, c, "sum")
	if err != nil {
		t.Fatal(err)
	}
	cc := st.Stream().cc
	before := cc.bidiItems.Load()
	const rounds = 300
	want := 0
	for i := 1; i <= rounds; i++ {
		if err := st.Send(i); err != nil {
			t.Fatal(err)
		}
		want += i
		got, err := st.Recv()
		if err != nil || got != want {
			t.Fatalf("round %d: %d %v, want %d", i, got, err, want)
		}
	}
	bg := cc.bidiItems.Load() - before
	t.Logf("%d rounds: the background reader delivered %d items", rounds, bg)
	// Before Recv read itself, the background reader delivered every item
	// (300). Now only after an idle tick (the machine stalled a round
	// trip for a tick) does it take the role, and it hands it back with
	// the next item.
	if bg > rounds/3 {
		t.Fatalf("the background reader delivered %d of %d items: Recv does not read its own", bg, rounds)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: %v, want io.EOF", err)
	}
}

// TestBidiRecvLeaderStepsAside: a Recv reading the socket while its item
// does not come steps aside when its ctx ends or the stream is closed from
// another goroutine, and the connection is read again by the next caller
// (a unary call and a second bidi call on it complete). The Recv leads
// unless the background reader took the role after an idle tick first (then
// it waits for it, which must end the same way): tried until it led once.
func TestBidiRecvLeaderStepsAside(t *testing.T) {
	for _, how := range []string{"ctx", "close"} {
		t.Run(how, func(t *testing.T) {
			s := sumServer()
			ended := make(chan error, 100)
			blockingBidi(s, ended)
			c := dial(t, startServer(t, s))
			led := false
			for try := 0; try < 50 && !led; try++ {
				led = stepAside(t, c, how)
			}
			if !led {
				t.Fatal("in 50 tries the bidi Recv never took the read role")
			}
		})
	}
}

// stepAside is one try of TestBidiRecvLeaderStepsAside; it reports whether
// the Recv was leading when it was canceled.
func stepAside(t *testing.T, c *Client, how string) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.Bidi(ctx, "hold")
	if err != nil {
		t.Fatal(err)
	}
	st.SendRaw([]byte("x"))
	if _, err := st.RecvRaw(); err != nil { // hold answers the first item
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := st.RecvRaw()
		got <- err
	}()
	led := waitRecvLeading(st.ClientStream, 200*time.Millisecond)
	if how == "ctx" {
		cancel()
	} else {
		st.Close()
	}
	select {
	case err := <-got:
		if CodeOf(err) != Canceled {
			t.Fatalf("Recv: %v, want Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the Recv (leading: %v) did not end when canceled", led)
	}
	checkConnServes(t, c)
	return led
}

// TestBidiRecvLeaderMixed: bidi ping-pongs whose Recv read the socket share
// a connection with unary calls and a server stream; every call gets its
// own results (a leading Recv delivers the others' frames).
func TestBidiRecvLeaderMixed(t *testing.T) {
	s := sumServer()
	s.HandleRawStream("count", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for i := 0; i < 200; i++ {
			if err := send([]byte{byte(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 8)
	for g := 0; g < 3; g++ {
		go func() {
			st, err := OpenJSONBidi[int, int](ctx, c, "sum")
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			want := 0
			for i := 1; i <= 200; i++ {
				want += i
				if err := st.Send(i); err != nil {
					errs <- err
					return
				}
				if got, err := st.Recv(); err != nil || got != want {
					errs <- Errorf(Internal, "bidi round %d: %d %v, want %d", i, got, err, want)
					return
				}
			}
			errs <- nil
		}()
	}
	go func() {
		for i := 0; i < 200; i++ {
			if out, err := c.CallRaw(ctx, "echo", []byte{byte(i)}, nil); err != nil || len(out) != 1 || out[0] != byte(i) {
				errs <- Errorf(Internal, "unary %d: %v %v", i, out, err)
				return
			}
		}
		errs <- nil
	}()
	go func() {
		st, err := c.Stream(ctx, "count", []byte{})
		if err != nil {
			errs <- err
			return
		}
		for i := 0; ; i++ {
			it, err := st.RecvRaw()
			if err == io.EOF {
				if i != 200 {
					errs <- Errorf(Internal, "stream ended after %d items", i)
					return
				}
				break
			}
			if err != nil || len(it) != 1 || it[0] != byte(i) {
				errs <- Errorf(Internal, "stream item %d: %v %v", i, it, err)
				return
			}
		}
		errs <- nil
	}()
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// rawEchoBidi registers "echo" as a raw bidi handler that answers each item
// with itself, and "echo-view", the same taking its items as views
// (HandleRawBidiView).
func rawEchoBidi(s *Server) {
	s.HandleRawBidi("echo", rawEchoBidiHandler)
	s.HandleRawBidiView("echo-view", rawEchoBidiHandler)
}

func rawEchoBidiHandler(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
	for {
		it, err := recv()
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if err := send(it); err != nil {
			return err
		}
	}
}

// TestBidiPingPongAllocs: a bidi round trip (1 KiB each way, the client
// taking its items with RecvRawView) allocates at most once, client and
// server together: the client reads each item into the previous one's
// buffer; the server's raw handler owns its items (one each), and with
// HandleRawBidiView it borrows them too: no allocation at all.
func TestBidiPingPongAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector (sync.Pool drops items)")
	}
	t.Run("owned", func(t *testing.T) { bidiPingPongAllocs(t, "echo", 1.05) })
	t.Run("view", func(t *testing.T) { bidiPingPongAllocs(t, "echo-view", 0.05) })
}

func bidiPingPongAllocs(t *testing.T, method string, most float64) {
	s := NewServer(ServerOptions{})
	rawEchoBidi(s)
	c := dial(t, startServer(t, s))
	st, err := c.Bidi(context.Background(), method)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	msg := bytes.Repeat([]byte("b"), 1024)
	round := func() {
		if err := st.SendRaw(msg); err != nil {
			t.Fatal(err)
		}
		if it, err := st.RecvRawView(); err != nil || !bytes.Equal(it, msg) {
			t.Fatalf("%d bytes, %v", len(it), err)
		}
	}
	for range 200 {
		round()
	}
	if n := testing.AllocsPerRun(1000, round); n > most {
		t.Fatalf("%.2f allocs per bidi round trip, want at most %.0f", n, most)
	}
}

// TestBidiItemBuffersReused: items of changing sizes both ways, taken with
// RecvRawView (client) and by a typed handler (server), whose buffers are
// reused for the next item, arrive intact; an item taken with RecvRaw stays
// the caller's (a later item does not overwrite it).
func TestBidiItemBuffersReused(t *testing.T) {
	s := NewServer(ServerOptions{})
	rawEchoBidi(s)
	HandleJSONBidi(s, "strs", func(ctx context.Context, recv func() (string, error), send func(string) error) error {
		for {
			v, err := recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := send(v); err != nil {
				return err
			}
		}
	})
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sizes := []int{1000, 10, 3000, 0, 2999, 1, 70 << 10, 5}
	for _, method := range []string{"echo", "echo-view"} {
		bidiItemsIntact(t, ctx, c, method, sizes)
	}
	ts, err := OpenJSONBidi[string, string](ctx, c, "strs")
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	for i, n := range sizes {
		v := strings.Repeat(string(rune('a'+i)), n)
		if err := ts.Send(v); err != nil {
			t.Fatal(err)
		}
		if got, err := ts.Recv(); err != nil || got != v {
			t.Fatalf("typed item %d: %d bytes (want %d), %v", i, len(got), n, err)
		}
	}
}

// bidiItemsIntact sends items of sizes to method (a raw echo) and checks
// what comes back, taken alternately with RecvRawView and RecvRaw.
func bidiItemsIntact(t *testing.T, ctx context.Context, c *Client, method string, sizes []int) {
	st, err := c.Bidi(ctx, method)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var kept [][]byte
	for i, n := range sizes {
		msg := bytes.Repeat([]byte{byte('a' + i)}, n)
		if err := st.SendRaw(msg); err != nil {
			t.Fatal(err)
		}
		recv := st.RecvRawView
		if i%2 == 1 {
			recv = st.RecvRaw
		}
		it, err := recv()
		if err != nil || !bytes.Equal(it, msg) {
			t.Fatalf("%s: item %d: %d bytes (want %d), %v", method, i, len(it), n, err)
		}
		if i%2 == 1 {
			kept = append(kept, it)
		}
	}
	for j, it := range kept {
		i := 2*j + 1
		if want := bytes.Repeat([]byte{byte('a' + i)}, sizes[i]); !bytes.Equal(it, want) {
			t.Fatalf("%s: item %d taken with RecvRaw was overwritten", method, i)
		}
	}
}
