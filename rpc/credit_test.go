package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

const floodItem = 64 << 10

// floodServer streams numbered floodItem-byte items ("flood"), at most max
// of them, until its ctx ends; sent counts the items handed to send.
func floodServer(max int, sent *atomic.Int64, ended chan<- error) *Server {
	s := echoServer()
	s.HandleRawStream("flood", func(ctx context.Context, req []byte, send func([]byte) error) error {
		var err error
		for i := range max {
			item := make([]byte, floodItem)
			binary.LittleEndian.PutUint64(item, uint64(i))
			if err = send(item); err != nil {
				break
			}
			sent.Add(1)
		}
		if ended != nil {
			ended <- err
		}
		return err
	})
	return s
}

// settled waits until v stops changing for a while and returns its value.
func settled(v *atomic.Int64) int64 {
	last := v.Load()
	for range 100 {
		time.Sleep(30 * time.Millisecond)
		if n := v.Load(); n == last {
			return n
		} else {
			last = n
		}
	}
	return last
}

// TestSlowStreamDoesNotStallConnection: a stream its caller stops reading
// holds back only itself. The server stops after the stream's credit (1 MiB
// plus an item), unary calls on the same connection go on, and the stream
// resumes, in order and complete, when read again.
func TestSlowStreamDoesNotStallConnection(t *testing.T) {
	var sent atomic.Int64
	ended := make(chan error, 1)
	addr := startServer(t, floodServer(100, &sent, ended))
	c, err := Dial(context.Background(), addr, ClientOptions{Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stream(context.Background(), "flood", []byte("go"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecvRaw(); err != nil {
		t.Fatal(err)
	}
	n := settled(&sent)
	window := int64(frame.InitialStreamCredit/floodItem) + 1
	if n > window+1 {
		t.Fatalf("the server sent %d items of %d KiB to a stream nobody reads; credit allows %d", n, floodItem>>10, window+1)
	}
	t.Logf("server paused after %d items (credit: %d)", n, window)
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p := []byte{byte(i)}
		out, err := c.CallRaw(ctx, "echo", p, nil)
		cancel()
		if err != nil || !bytes.Equal(out, p) {
			t.Fatalf("call %d on the connection of an unread stream: %q %v", i, out, err)
		}
	}
	for i := 1; i < 100; i++ {
		it, err := st.RecvRaw()
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
		if got := binary.LittleEndian.Uint64(it); got != uint64(i) || len(it) != floodItem {
			t.Fatalf("item %d: got number %d, %d bytes", i, got, len(it))
		}
	}
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatalf("after the last item: %v, want io.EOF", err)
	}
	if err := <-ended; err != nil {
		t.Fatalf("handler: %v", err)
	}
}

// TestBlockedStreamEndsOnClose: a handler waiting for credit ends (its ctx
// canceled) when the client closes the stream.
func TestBlockedStreamEndsOnClose(t *testing.T) {
	var sent atomic.Int64
	ended := make(chan error, 1)
	addr := startServer(t, floodServer(1000, &sent, ended))
	c := dial(t, addr)
	st, err := c.Stream(context.Background(), "flood", nil)
	if err != nil {
		t.Fatal(err)
	}
	settled(&sent)
	st.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler ended with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a handler waiting for credit did not end when the stream was closed")
	}
}

// readStream reads frames of call id from a raw peer until it has seen
// least bytes or more and then nothing arrives for quiet, and returns the
// stream_data payload bytes it saw. Until least, it waits up to 10 s for the
// next frame: a loaded CI machine once sent nothing for the 300 ms quiet
// after a grant.
func readStream(t *testing.T, c net.Conn, r *frame.Reader, least int, quiet time.Duration) int {
	t.Helper()
	total := 0
	for {
		wait := quiet
		if total < least {
			wait = 10 * time.Second
		}
		c.SetReadDeadline(time.Now().Add(wait))
		f, err := r.ReadFrame(nil)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return total
		}
		if err != nil {
			t.Fatal(err)
		}
		switch f.Type {
		case frame.TypeStreamData:
			total += len(f.Payload)
		case frame.TypeStreamEnd:
			return total
		default:
			t.Fatalf("unexpected %s frame", f.Type)
		}
	}
}

// TestServerHonoursStreamCredit, at the frame level: a client that offers
// stream credit gets 1 MiB (plus at most one item), then exactly what it
// grants; so does one whose hello does not set the flag (credit is v1).
func TestServerHonoursStreamCredit(t *testing.T) {
	var sent atomic.Int64
	addr := startServer(t, floodServer(48, &sent, nil))
	request := func(c net.Conn) {
		w := frame.NewWriter(c)
		h := frame.Header{Type: frame.TypeRequest, Flags: frame.FlagStream, ID: 1}
		if err := w.WriteFrame(&h, frame.AppendRequestHead(nil, "flood"), nil); err != nil {
			t.Fatal(err)
		}
	}

	c, r := rawPeerWith(t, addr, frame.FeatureStreamCredit)
	request(c)
	got := readStream(t, c, r, frame.InitialStreamCredit, 300*time.Millisecond)
	if got < frame.InitialStreamCredit || got > frame.InitialStreamCredit+floodItem {
		t.Fatalf("with stream credit: got %d bytes before any grant, want 1 MiB to 1 MiB + one item", got)
	}
	w := frame.NewWriter(c)
	h := frame.Header{Type: frame.TypeStreamCredit, ID: 1, Aux: 256 << 10}
	if err := w.WriteFrame(&h, nil, nil); err != nil {
		t.Fatal(err)
	}
	more := readStream(t, c, r, 256<<10-floodItem, 300*time.Millisecond)
	if more < 256<<10-floodItem || more > 256<<10+floodItem {
		t.Fatalf("after granting 256 KiB: got %d more bytes", more)
	}
	c.Close()

	// Stream credit is part of v1 (protocol/spec.md, 4.1): a peer whose
	// hello does not set the flag gets no more.
	c, r = rawPeerWith(t, addr, 0)
	request(c)
	if got := readStream(t, c, r, frame.InitialStreamCredit, 300*time.Millisecond); got < frame.InitialStreamCredit || got > frame.InitialStreamCredit+floodItem {
		t.Fatalf("hello without the flag: got %d bytes before any grant, want 1 MiB to 1 MiB + one item", got)
	}
}

// floodingServer is a raw server that offers the given hello features,
// reads one request and answers it with n stream items of 64 KiB, ignoring
// any credit. wrote is closed when it has written them all or found the
// connection closed.
func floodingServer(t *testing.T, features uint8, n int) (addr string, wrote <-chan struct{}) {
	addr = "unix:" + t.TempDir() + "/flood.sock"
	l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); l.Close() })
	go func() {
		signaled := false
		defer func() {
			if !signaled {
				close(done)
			}
		}()
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := frame.NewReader(c, 0)
		if _, err := r.ReadHello(); err != nil {
			return
		}
		var hb [frame.HelloSize]byte
		mine := frame.Hello{Version: 1, Flags: features, MaxFrame: 64 << 10, MaxInFlight: 16}
		mine.Put(hb[:])
		c.Write(hb[:])
		h, err := r.ReadHeader()
		if err != nil || h.Type != frame.TypeRequest {
			return
		}
		r.Discard(int(h.HeadLen) + int(h.PayloadLen))
		w := frame.NewWriter(c)
		item := make([]byte, 64<<10)
		for range n {
			d := frame.Header{Type: frame.TypeStreamData, ID: h.ID}
			if w.WriteFrame(&d, nil, item) != nil {
				return // the client closed the connection
			}
		}
		signaled = true
		close(done)
		<-stop // keep the connection open: the client must close it
	}()
	return addr, done
}

// TestClientRejectsCreditOverrun: a server that sends more stream items
// than it was given credit for is a protocol violation; the client closes
// the connection instead of buffering without bound. A server whose hello
// leaves the stream_credit flag unset is held to the same credit: every
// version-1 peer implements it (protocol/spec.md 4.1), and Close returns.
func TestClientRejectsCreditOverrun(t *testing.T) {
	for _, flags := range []uint8{frame.FeatureStreamCredit, 0} {
		t.Run(fmt.Sprintf("flags=%d", flags), func(t *testing.T) { testCreditOverrun(t, flags) })
	}
}

func testCreditOverrun(t *testing.T, flags uint8) {
	addr, wrote := floodingServer(t, flags, 40) // 2.5 MiB: over 1 MiB + one max frame
	c, err := Dial(context.Background(), addr, ClientOptions{NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stream(context.Background(), "flood", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Take nothing until the server has sent it all (or found the
	// connection closed): a reading client would grant credit as it goes.
	select {
	case <-wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("the misbehaving server is stuck writing")
	}
	deadline := time.Now().Add(10 * time.Second)
	items := 0
	for {
		_, err := st.RecvRaw()
		if err == nil {
			items++
			if time.Now().After(deadline) {
				t.Fatal("the client kept taking items past the credit")
			}
			continue
		}
		if CodeOf(err) != ProtocolViolation || !strings.Contains(err.Error(), "beyond the credit") {
			t.Fatalf("after %d items: %v, want a protocol violation about credit", items, err)
		}
		break
	}
	if items > 17 {
		t.Fatalf("the client queued %d items of 64 KiB, over 1 MiB + one max frame", items)
	}
}

// TestEmptyItemsUseCredit: empty items cost their header against the credit,
// so a stream of them nobody reads also stops (after 1 MiB / 16 items).
func TestEmptyItemsUseCredit(t *testing.T) {
	var sent atomic.Int64
	s := echoServer()
	s.HandleRawStream("empties", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for range 1 << 20 {
			if err := send(nil); err != nil {
				return err
			}
			sent.Add(1)
		}
		return nil
	})
	c := dial(t, startServer(t, s))
	st, err := c.Stream(context.Background(), "empties", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	want := int64(frame.InitialStreamCredit / frame.HeaderSize)
	testutil.WaitFor(t, "the credit's worth of empty items", func() bool { return sent.Load() >= want })
	if n := settled(&sent); n > want+1 {
		t.Fatalf("the server sent %d empty items to a stream nobody reads; credit allows %d", n, want)
	}
}
