package rpc

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/uds"
)

// clientHello is a client's hello with the given feature flags, as sent.
func clientHello(features uint8) []byte {
	var hb [frame.HelloSize]byte
	h := frame.Hello{Version: 1, Flags: features, MaxFrame: frame.DefaultMaxFrame}
	h.Put(hb[:])
	return hb[:]
}

// appendRequest appends the header and head of request id for method,
// announcing payloadLen bytes of payload (which the caller sends, or not).
func appendRequest(b []byte, id uint32, method string, payloadLen uint32) []byte {
	head := frame.AppendRequestHead(nil, method)
	h := frame.Header{Type: frame.TypeRequest, ID: id, HeadLen: uint16(len(head)), PayloadLen: payloadLen}
	return append(h.Append(b), head...)
}

// rawPeer dials addr and does the hello exchange by hand.
func rawPeer(t *testing.T, addr string) (net.Conn, *frame.Reader) {
	t.Helper()
	return rawPeerWith(t, addr, 0)
}

// rawPeerWith is rawPeer with the given hello feature flags.
func rawPeerWith(t *testing.T, addr string, features uint8) (net.Conn, *frame.Reader) {
	t.Helper()
	c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(clientHello(features)); err != nil {
		t.Fatal(err)
	}
	r := frame.NewReader(c, 0)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadHello(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Time{})
	return c, r
}

// expectConnError reads until a connection-level error frame, then EOF.
func expectConnError(t *testing.T, c net.Conn, r *frame.Reader, code Code) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := r.ReadFrame(nil)
		if err != nil {
			t.Fatalf("want a connection error frame (code %s), got %v", code, err)
		}
		if f.Type == frame.TypeError && f.ID == 0 {
			if Code(f.Aux) != code {
				t.Fatalf("connection error code %s (%s), want %s", Code(f.Aux), f.Head, code)
			}
			break
		}
	}
	if _, err := r.ReadFrame(nil); err == nil {
		t.Fatal("connection stays open after a connection error")
	}
}

// TestHostilePeers: each misbehaving peer costs only its own connection; a
// well-behaved client on the same server keeps getting answers throughout.
func TestHostilePeers(t *testing.T) {
	defer checkNoLeaks(t)
	s := echoServer()
	s.opts.MaxInFlight = 512
	s.HandleRaw("block", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	addr := startServer(t, s)
	good := dial(t, addr)
	stop := make(chan struct{})
	var goodCalls atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p := bytes.Repeat([]byte("ok"), 100)
		for i := 0; i < 1_000_000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			out, err := good.CallRaw(ctx, "echo", p, nil)
			cancel()
			if err != nil || !bytes.Equal(out, p) {
				t.Errorf("good client failed during hostile traffic: %v", err)
				return
			}
			goodCalls.Add(1)
		}
	}()
	progress := func(what string) {
		t.Helper()
		n := goodCalls.Load()
		deadline := time.Now().Add(5 * time.Second)
		for goodCalls.Load() < n+20 {
			if time.Now().After(deadline) {
				t.Fatalf("good client stalled after %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}

	t.Run("garbage", func(t *testing.T) {
		c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 1000))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			t.Fatalf("server should close a garbage connection, got %v", err)
		}
		progress("garbage")
	})
	t.Run("bad hello", func(t *testing.T) {
		c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("UDSK\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"))
		r := frame.NewReader(c, 0)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := r.ReadHello(); err != nil {
			t.Fatalf("server should answer with its hello: %v", err)
		}
		expectConnError(t, c, r, ProtocolViolation)
		progress("bad hello")
	})
	t.Run("4GiB length", func(t *testing.T) {
		c, r := rawPeer(t, addr)
		h := frame.Header{Type: frame.TypeRequest, ID: 1, PayloadLen: 0xFFFFFFFF}
		c.Write(h.Append(nil))
		expectConnError(t, c, r, ProtocolViolation)
		progress("4GiB length")
	})
	t.Run("half frame then silence", func(t *testing.T) {
		c, _ := rawPeer(t, addr)
		c.Write(appendRequest(nil, 1, "echo", 8<<20))
		c.Write(make([]byte, 1000)) // then nothing more
		progress("half frame")
		c.Close()
		progress("half frame closed")
	})
	t.Run("100k in-flight ids", func(t *testing.T) {
		c, r := rawPeer(t, addr)
		go func() {
			head := frame.AppendRequestHead(nil, "block")
			var buf []byte
			for id := uint32(1); id <= 100_000; id++ {
				h := frame.Header{Type: frame.TypeRequest, ID: id, HeadLen: uint16(len(head))}
				buf = append(h.Append(buf), head...)
				if len(buf) > 64<<10 {
					if _, err := c.Write(buf); err != nil {
						return
					}
					buf = buf[:0]
				}
			}
			c.Write(buf)
		}()
		expectConnError(t, c, r, ResourceExhausted)
		progress("100k in-flight")
	})
	t.Run("duplicate id", func(t *testing.T) {
		c, r := rawPeer(t, addr)
		one := appendRequest(nil, 9, "block", 0)
		c.Write(append(one, one...))
		expectConnError(t, c, r, ProtocolViolation)
		progress("duplicate id")
	})
	t.Run("slow reader", func(t *testing.T) {
		// Sends many large requests and never reads the responses: the
		// server's writes to it block, nobody else's do.
		c, _ := rawPeer(t, addr)
		go func() {
			p := make([]byte, 256<<10)
			for id := uint32(1); id <= 200; id++ {
				if _, err := c.Write(append(appendRequest(nil, id, "echo", uint32(len(p))), p...)); err != nil {
					return
				}
			}
		}()
		time.Sleep(200 * time.Millisecond)
		progress("slow reader")
		c.Close()
	})
	t.Run("server-only frame from client", func(t *testing.T) {
		c, r := rawPeer(t, addr)
		h := frame.Header{Type: frame.TypeResponse, ID: 1}
		c.Write(h.Append(nil))
		expectConnError(t, c, r, ProtocolViolation)
	})
	t.Run("unknown frame type is skipped", func(t *testing.T) {
		c, r := rawPeer(t, addr)
		u := frame.Header{Type: 200, HeadLen: 2, PayloadLen: 3}
		msg := append(u.Append(nil), "xyabc"...)
		msg = append(appendRequest(msg, 5, "echo", 2), "hi"...)
		c.Write(msg)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		f, err := r.ReadFrame(nil)
		if err != nil || f.Type != frame.TypeResponse || f.ID != 5 || string(f.Payload) != "hi" {
			t.Fatalf("got %+v %q %v", f.Header, f.Payload, err)
		}
	})
	t.Run("ping", func(t *testing.T) {
		c, r := rawPeer(t, addr)
		h := frame.Header{Type: frame.TypePing, Aux: 77, PayloadLen: 4}
		c.Write(append(h.Append(nil), "abcd"...))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		f, err := r.ReadFrame(nil)
		if err != nil || f.Type != frame.TypePong || f.Aux != 77 || string(f.Payload) != "abcd" {
			t.Fatalf("got %+v %q %v", f.Header, f.Payload, err)
		}
	})
	t.Run("NDJSON line too long", func(t *testing.T) {
		s2 := NewServer(ServerOptions{MaxFrame: 4096})
		a2 := startServer(t, s2)
		c, err := uds.Dial(context.Background(), a2, uds.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go c.Write(append([]byte(`{"id":1,"func":"x","data":"`), bytes.Repeat([]byte("a"), 1<<20)...))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		out, _ := io.ReadAll(c)
		if !bytes.Contains(out, []byte(`"code":"resource_exhausted"`)) {
			t.Fatalf("got %q", out)
		}
	})
	close(stop)
	wg.Wait()
	if goodCalls.Load() < 100 {
		t.Fatalf("good client made only %d calls", goodCalls.Load())
	}
	good.Close()
	s.Close()
}
