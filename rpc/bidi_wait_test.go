package rpc

import (
	"context"
	"io"
	"testing"
	"time"
)

// TestBidiParkedWaitsEnd: a bidi Recv parked behind another call that
// reads the socket, and a handler parked in recv without the read role,
// each wait on one channel (the stream's arrived, the inbox's wake); the
// end of their call must signal it: the server ending the call, the
// client's Close, and the call's deadline.
func TestBidiParkedWaitsEnd(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.noBidiLead = true // handlers wait in recv on their inbox, never in the socket read
	handlerEnded := make(chan error, 4)
	s.HandleRawBidi("wait", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for {
			it, err := recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				handlerEnded <- err
				return err
			}
			switch string(it) {
			case "fail":
				return Errorf(FailedPrecondition, "asked to fail")
			case "ping":
				if err := send(it); err != nil {
					return err
				}
			}
		}
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(ctx context.Context) *BidiStream {
		st, err := c.Bidi(ctx, "wait")
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SendRaw([]byte("ping")); err != nil { // the call is up on both sides
			t.Fatal(err)
		}
		if _, err := st.RecvRaw(); err != nil {
			t.Fatal(err)
		}
		return st
	}
	// A call parks in Recv first: from then on the read role is held by it
	// or by the background reader, so the next Recv parks without it.
	reader := open(ctx)
	readerDone := make(chan error, 1)
	go func() { _, err := reader.RecvRaw(); readerDone <- err }()
	waitInRecv(t, c.slots[0].cur.Load(), reader) // (it reads, or the background reader holds the role)

	recvIn := func(st *BidiStream) chan error {
		ch := make(chan error, 1)
		go func() { _, err := st.RecvRaw(); ch <- err }()
		waitRecvWaiting(t, c.slots[0].cur.Load(), st)
		return ch
	}
	within := func(what string, ch <-chan error) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still waiting after 10 s", what)
			return nil
		}
	}

	// The server ends the call: the parked Recv gets its error.
	b := open(ctx)
	got := recvIn(b)
	if err := b.SendRaw([]byte("fail")); err != nil {
		t.Fatal(err)
	}
	if err := within("Recv of a call the server ended", got); CodeOf(err) != FailedPrecondition {
		t.Fatalf("Recv: %v, want FailedPrecondition", err)
	}

	// Close: the parked Recv and the parked handler both end.
	b = open(ctx)
	got = recvIn(b)
	b.Close()
	if err := within("Recv of a closed call", got); CodeOf(err) != Canceled {
		t.Fatalf("Recv: %v, want Canceled", err)
	}
	if err := within("handler's recv after Close", handlerEnded); CodeOf(err) != Canceled {
		t.Fatalf("handler's recv: %v, want Canceled", err)
	}

	// The deadline: both end with DeadlineExceeded.
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer dcancel()
	b = open(dctx)
	got = recvIn(b)
	if err := within("Recv past the deadline", got); CodeOf(err) != DeadlineExceeded {
		t.Fatalf("Recv: %v, want DeadlineExceeded", err)
	}
	if err := within("handler's recv past the deadline", handlerEnded); CodeOf(err) != DeadlineExceeded && CodeOf(err) != Canceled {
		t.Fatalf("handler's recv: %v, want DeadlineExceeded (or Canceled: the client's cancel may come first)", err)
	}

	// The reader's own call ends normally.
	reader.CloseSend()
	if err := within("the reading call's Recv", readerDone); err != io.EOF {
		t.Fatalf("reading call: %v, want io.EOF", err)
	}
}

// waitRecvWaiting waits until st's Recv is parked (not reading).
func waitRecvWaiting(t *testing.T, cc *clientConn, st *BidiStream) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		cc.mu.Lock()
		ok := st.cl.recvWaiting && !st.cl.recvLeading
		cc.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the Recv never parked")
		}
	}
}

// waitInRecv waits until st's Recv waits for its item, reading or not.
func waitInRecv(t *testing.T, cc *clientConn, st *BidiStream) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		cc.mu.Lock()
		ok := st.cl.recvWaiting || st.cl.recvLeading
		cc.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the Recv never started waiting")
		}
	}
}
