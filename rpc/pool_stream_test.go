package rpc

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"
)

// streamPoolServer serves a bidi echo ("echo-view") and a server stream
// ("tick": its request back as one item, then open until the client closes
// it) behind a countingListener.
func streamPoolServer(t *testing.T) (string, *countingListener) {
	s := NewServer(ServerOptions{})
	rawEchoBidi(s)
	s.HandleRawStream("tick", func(ctx context.Context, req []byte, send func([]byte) error) error {
		if err := send(req); err != nil {
			return err
		}
		<-ctx.Done() // the client closes the stream
		return nil
	})
	return poolServer(t, s, 0)
}

// openStreamBurst opens n long-lived streams of kind ("bidi" or "server")
// on c at once, each checked with one item, and returns them with the
// connection each landed on.
func openStreamBurst(t *testing.T, c *Client, kind string, n int) (conns []*clientConn, closeAll func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	conns = make([]*clientConn, n)
	closers := make([]func() error, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			switch kind {
			case "bidi":
				st, err := c.Bidi(ctx, "echo-view")
				if err != nil {
					errs <- err
					return
				}
				closers[i], conns[i] = st.Close, st.cc
				if err := st.SendRaw([]byte{byte(i)}); err != nil {
					errs <- err
					return
				}
				if it, err := st.RecvRawView(); err != nil || len(it) != 1 || it[0] != byte(i) {
					errs <- &Error{Code: Internal, Message: "bad echo"}
				}
			default:
				st, err := c.Stream(ctx, "tick", []byte{byte(i)})
				if err != nil {
					errs <- err
					return
				}
				closers[i], conns[i] = st.Close, st.cc
				var got []byte
				if err := st.Recv(&got); err != nil || len(got) != 1 || got[0] != byte(i) {
					errs <- &Error{Code: Internal, Message: "bad item"}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		cancel()
		t.Fatal(err)
	}
	return conns, func() {
		for _, f := range closers {
			if f != nil {
				f()
			}
		}
		cancel()
	}
}

// TestPoolSpreadsStreamBurst: a burst of 16 long-lived streams (bidi, or
// server streams) opened at once on a default client (Conns 2) spreads over
// both connections, 8 each, as unary calls do, where it used to land
// entirely on the first (the second connection is still being dialed when
// the burst arrives); and the pool opens no more than Conns connections.
func TestPoolSpreadsStreamBurst(t *testing.T) {
	for _, kind := range []string{"bidi", "server"} {
		t.Run(kind, func(t *testing.T) {
			addr, l := streamPoolServer(t)
			c := dial(t, addr)
			conns, closeAll := openStreamBurst(t, c, kind, 16)
			defer closeAll()
			per := map[*clientConn]int{}
			for _, cc := range conns {
				per[cc]++
			}
			if len(per) != DefaultConns {
				t.Fatalf("16 streams on %d connections, want %d: %v", len(per), DefaultConns, per)
			}
			for cc, n := range per {
				if n != 8 {
					t.Errorf("connection %p carries %d of the 16 streams, want 8 (least busy first)", cc, n)
				}
			}
			if n := l.accepted.Load(); n != DefaultConns {
				t.Fatalf("the pool opened %d connections, want %d", n, DefaultConns)
			}
		})
	}
}

// TestPoolLoneStreamTakesFirstConnection: a lone stream, opened one after
// another, always takes the pool's first connection and the pool never
// grows (it waits for a dial only when every connection is busy).
func TestPoolLoneStreamTakesFirstConnection(t *testing.T) {
	addr, l := streamPoolServer(t)
	c := dial(t, addr)
	first := c.slots[0].cur.Load()
	for i := range 50 {
		st, err := c.Bidi(context.Background(), "echo-view")
		if err != nil {
			t.Fatal(err)
		}
		if st.cc != first {
			t.Fatalf("stream %d went to another connection than the first", i)
		}
		if err := st.SendRaw([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := st.RecvRawView(); err != nil {
			t.Fatal(err)
		}
		st.CloseSend()
		if _, err := st.RecvRaw(); err != io.EOF {
			t.Fatalf("end: %v", err)
		}
		ss, err := c.Stream(context.Background(), "tick", []byte("y"))
		if err != nil {
			t.Fatal(err)
		}
		if ss.cc != first {
			t.Fatalf("server stream %d went to another connection than the first", i)
		}
		ss.Close()
	}
	if n := l.accepted.Load(); n != 1 {
		t.Fatalf("lone streams opened %d connections, want 1", n)
	}
}

// TestPoolStreamDoesNotWaitWhenGrowingBacksOff: when the pool cannot grow
// (the server closes every connection past the first, so the dial fails and
// growing backs off), a stream opened while the first connection is busy
// goes to it: it waits for at most the one failed dial, never for the
// back-off.
func TestPoolStreamDoesNotWaitWhenGrowingBacksOff(t *testing.T) {
	s := NewServer(ServerOptions{})
	rawEchoBidi(s)
	addr, l := poolServer(t, s, 1)
	c := dialOpts(t, addr, ClientOptions{MaxBackoff: time.Hour})
	conns, closeAll := openStreamBurst(t, c, "bidi", 8)
	defer closeAll()
	for i, cc := range conns {
		if cc != conns[0] {
			t.Fatalf("stream %d on another connection though only one can be open", i)
		}
	}
	if n := l.accepted.Load(); n != 2 {
		t.Fatalf("%d connections accepted, want 2 (the first, one failed growth)", n)
	}
	// Later opens do not dial again (back-off) and do not wait.
	t0 := time.Now()
	st, err := c.Bidi(context.Background(), "echo-view")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.cc != conns[0] {
		t.Fatal("stream went to another connection")
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("open took %v while growing backs off", d)
	}
	if n := l.accepted.Load(); n != 2 {
		t.Fatalf("%d connections accepted after the back-off, want 2", n)
	}
}
