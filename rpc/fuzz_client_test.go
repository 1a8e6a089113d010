package rpc

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
)

// socketPair returns the two ends of a unix stream socketpair.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	// No SOCK_CLOEXEC (macOS lacks it): net.FileConn dups each fd close-on-exec
	// and the originals are closed right away.
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// FuzzClientAgainstServerBytes: whatever a server sends after a valid hello
// (frames for the client's own calls, wrong-direction frames, stream items
// without credit, garbage, a cut-off frame), the client never panics or
// hangs: a unary call and a stream each end (with a result or an error)
// once the server stops, and Close returns.
func FuzzClientAgainstServerBytes(f *testing.F) {
	frameBytes := func(h frame.Header, head, payload []byte) []byte {
		h.HeadLen, h.PayloadLen = uint16(len(head)), uint32(len(payload))
		return append(append(h.Append(nil), head...), payload...)
	}
	resp := frameBytes(frame.Header{Type: frame.TypeResponse, ID: 1}, nil, []byte("ok"))
	item := frameBytes(frame.Header{Type: frame.TypeStreamData, ID: 2}, nil, []byte("item"))
	end := frameBytes(frame.Header{Type: frame.TypeStreamEnd, ID: 2}, nil, nil)
	f.Add(append(append(append([]byte{}, resp...), item...), end...))
	f.Add(frameBytes(frame.Header{Type: frame.TypeError, ID: 1, Aux: 5}, []byte("not found"), nil))
	f.Add(frameBytes(frame.Header{Type: frame.TypeError, ID: 0, Aux: 32}, []byte("bye"), nil))
	f.Add(frameBytes(frame.Header{Type: frame.TypeGoAway}, []byte("draining"), nil))
	f.Add(frameBytes(frame.Header{Type: frame.TypeStreamCredit, ID: 2, Aux: 1 << 20}, nil, nil))
	f.Add(frameBytes(frame.Header{Type: frame.TypePing, Aux: 7}, nil, []byte("p")))
	f.Add(frameBytes(frame.Header{Type: 200, ID: 9}, []byte("x"), []byte("y")))
	f.Add(resp[:9])
	// Response metadata (spec 3.1) on a response and a stream_end, a reserved
	// key, and heads that do not parse (an entry cut short).
	md := frame.AppendMD(frame.AppendMD(nil, "k", "v"), ":pad", "")
	f.Add(append(frameBytes(frame.Header{Type: frame.TypeResponse, ID: 1}, md, []byte("ok")),
		frameBytes(frame.Header{Type: frame.TypeStreamEnd, ID: 2}, md, nil)...))
	f.Add(frameBytes(frame.Header{Type: frame.TypeResponse, ID: 1}, md[:4], []byte("ok")))
	f.Add(frameBytes(frame.Header{Type: frame.TypeStreamEnd, ID: 2}, []byte{0xff, 0xff, 'k'}, nil))
	f.Add([]byte("garbage that is not a frame at all"))
	// Client streams (spec 4.3): the bidi call is id 3 (after the unary
	// call and the stream), the client-streaming one id 4.
	f.Add(append(append(frameBytes(frame.Header{Type: frame.TypeRequestCredit, ID: 3, Aux: 1 << 20}, nil, nil),
		frameBytes(frame.Header{Type: frame.TypeStreamData, ID: 3}, nil, []byte("7"))...),
		frameBytes(frame.Header{Type: frame.TypeStreamEnd, ID: 3}, nil, nil)...))
	f.Add(frameBytes(frame.Header{Type: frame.TypeResponse, ID: 4}, nil, []byte("total")))
	f.Add(frameBytes(frame.Header{Type: frame.TypeRequestCredit, ID: 99, Aux: 0xFFFFFFFF}, nil, nil))
	f.Add(frameBytes(frame.Header{Type: frame.TypeRequestData, ID: 3}, nil, []byte("wrong way")))
	f.Add(frameBytes(frame.Header{Type: frame.TypeError, ID: 3, Aux: 3}, []byte("bad item"), nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		cli, srv := socketPair(t)
		defer srv.Close()
		go func() {
			var hb [frame.HelloSize]byte
			srv.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := srv.Read(hb[:]); err != nil {
				return
			}
			h := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit | frame.FeatureClientStream, MaxFrame: 64 << 10, MaxInFlight: 8}
			h.Put(hb[:])
			srv.Write(hb[:])
			time.Sleep(time.Millisecond) // let the calls and the streams go out first
			srv.Write(data)
			srv.Close()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := NewClient(ctx, cli, ClientOptions{})
		if err != nil {
			return
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			st, err := c.Stream(ctx, "s", nil)
			if err != nil {
				return
			}
			for i := 0; i < 1<<16; i++ {
				if _, err := st.RecvRaw(); err != nil {
					return
				}
			}
		}()
		clientStreamsDone := make(chan struct{})
		go func() {
			defer close(clientStreamsDone)
			bd, err := c.Bidi(ctx, "b")
			if err != nil {
				return
			}
			cs, err := c.ClientStreaming(ctx, "c")
			if err != nil {
				bd.Close()
				return
			}
			go func() { // a sender that keeps going until the call ends
				for i := 0; i < 1<<12; i++ {
					if bd.SendRaw([]byte("1")) != nil {
						return
					}
				}
				bd.CloseSend()
			}()
			cs.SendRaw([]byte("x"))
			cs.CloseAndRecvRaw()
			for i := 0; i < 1<<16; i++ {
				if _, err := bd.RecvRaw(); err != nil {
					return
				}
			}
		}()
		var respMD Metadata
		c.CallRaw(WithResponseMetadata(ctx, &respMD), "u", []byte("x"), nil)
		for k := range respMD {
			if frame.Reserved(k) {
				t.Fatalf("reserved key %q shown to the caller", k)
			}
		}
		for _, ch := range []chan struct{}{done, clientStreamsDone} {
			select {
			case <-ch:
			case <-ctx.Done():
				t.Fatal("a stream did not end after the server closed")
			}
		}
		if ctx.Err() != nil {
			t.Fatal("a call did not end after the server closed")
		}
		c.Close()
	})
}

// TestCutOffResponseIsAnError: a server that dies in the middle of a
// response (here: announces 200 KiB, more than the client's read buffer, and
// sends 100 KiB) gives its callers an Unavailable error, never the bytes
// that made it as if they were the answer, whether the call was reading the
// socket itself or waiting for another call to read for it.
func TestCutOffResponseIsAnError(t *testing.T) {
	for round := range 20 {
		cli, srv := socketPair(t)
		go func() {
			defer srv.Close()
			r := frame.NewReader(srv, 0)
			if _, err := r.ReadHello(); err != nil {
				return
			}
			var hb [frame.HelloSize]byte
			h := frame.Hello{Version: frame.Version, MaxFrame: 1 << 20, MaxInFlight: 8}
			h.Put(hb[:])
			srv.Write(hb[:])
			var first uint32
			for range 2 { // both requests
				f, err := r.ReadFrame(nil)
				if err != nil {
					return
				}
				if first == 0 {
					first = f.ID
				}
			}
			resp := frame.Header{Type: frame.TypeResponse, ID: first, PayloadLen: 200 << 10}
			srv.Write(resp.Append(nil))
			srv.Write(make([]byte, 100<<10))
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := NewClient(ctx, cli, ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				out, err := c.CallRaw(ctx, "big", []byte("x"), nil)
				if err == nil {
					err = fmt.Errorf("round %d: a cut-off response of %d bytes came back as the answer", round, len(out))
				} else if CodeOf(err) != Unavailable {
					err = fmt.Errorf("round %d: %v, want Unavailable", round, err)
				} else {
					err = nil
				}
				errs <- err
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		c.Close()
	}
}

// FuzzServerAgainstClientBytes: whatever a client sends after a valid hello
// (requests for unary and streaming methods, cancels, credit, pings, frames
// only servers send, garbage, a cut-off frame), the server neither panics
// nor hangs: once the client stops sending, it answers what it took, closes
// the connection, and its goroutine for the connection ends.
func FuzzServerAgainstClientBytes(f *testing.F) {
	s := echoServer()
	s.HandleRawStream("count", func(ctx context.Context, req []byte, send func([]byte) error) error {
		n := 0
		if len(req) > 0 {
			n = int(req[0])
		}
		for i := range n {
			if err := send([]byte{byte(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	registerSum(s)
	defer s.Close()
	frameBytes := func(h frame.Header, head, payload []byte) []byte {
		h.HeadLen, h.PayloadLen = uint16(len(head)), uint32(len(payload))
		return append(append(h.Append(nil), head...), payload...)
	}
	// Client streams (spec 4.3): sum (bidi) and total (client-streaming).
	sum := frameBytes(frame.Header{Type: frame.TypeRequest, ID: 5, Flags: frame.FlagStream | frame.FlagClientStream}, frame.AppendRequestHead(nil, "sum"), nil)
	item := frameBytes(frame.Header{Type: frame.TypeRequestData, ID: 5}, nil, []byte("2"))
	rend := frameBytes(frame.Header{Type: frame.TypeRequestEnd, ID: 5}, nil, nil)
	total := frameBytes(frame.Header{Type: frame.TypeRequest, ID: 6, Flags: frame.FlagClientStream}, frame.AppendRequestHead(nil, "total"), nil)
	f.Add(append(append(append(append([]byte{}, sum...), item...), item...), rend...))
	f.Add(append(append([]byte{}, total...), frameBytes(frame.Header{Type: frame.TypeRequestData, ID: 6}, nil, []byte("1.5"))...))
	f.Add(append(append(append([]byte{}, sum...), rend...), item...))
	f.Add(append(append([]byte{}, sum...), frameBytes(frame.Header{Type: frame.TypeRequestData, ID: 5}, nil, []byte("not json"))...))
	f.Add(frameBytes(frame.Header{Type: frame.TypeRequestCredit, ID: 5, Aux: 9}, nil, nil))
	f.Add(append(append([]byte{}, sum...), frameBytes(frame.Header{Type: frame.TypeCancel, ID: 5, Aux: 1}, nil, nil)...))
	echo := frameBytes(frame.Header{Type: frame.TypeRequest, ID: 1}, frame.AppendRequestHead(nil, "echo"), []byte("hi"))
	count := frameBytes(frame.Header{Type: frame.TypeRequest, ID: 2, Flags: frame.FlagStream}, frame.AppendRequestHead(nil, "count"), []byte{5})
	f.Add(append(append([]byte{}, echo...), count...))
	f.Add(frameBytes(frame.Header{Type: frame.TypeCancel, ID: 2, Aux: 1}, nil, nil))
	f.Add(frameBytes(frame.Header{Type: frame.TypeStreamCredit, ID: 2, Aux: 0xFFFFFFFF}, nil, nil))
	f.Add(frameBytes(frame.Header{Type: frame.TypePing, Aux: 3}, nil, []byte("p")))
	f.Add(frameBytes(frame.Header{Type: frame.TypeResponse, ID: 1}, nil, nil))
	f.Add(frameBytes(frame.Header{Type: frame.TypeRequest, ID: 3, Aux: 1}, frame.AppendRequestHead(nil, "nope"), nil))
	f.Add(echo[:20])
	f.Fuzz(func(t *testing.T, data []byte) {
		cli, srv := socketPair(t)
		defer cli.Close()
		served := make(chan struct{})
		go func() { s.ServeConn(srv); close(served) }()
		var hb [frame.HelloSize]byte
		h := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit, MaxFrame: frame.DefaultMaxFrame}
		h.Put(hb[:])
		cli.SetDeadline(time.Now().Add(10 * time.Second))
		go func() {
			cli.Write(hb[:])
			cli.Write(data)
			cli.(*net.UnixConn).CloseWrite()
		}()
		buf := make([]byte, 64<<10)
		for {
			if _, err := cli.Read(buf); err != nil {
				if os.IsTimeout(err) {
					t.Fatal("the server neither finished nor closed the connection")
				}
				break
			}
		}
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("the server's goroutine for the connection did not end")
		}
	})
}
