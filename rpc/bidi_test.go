package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
)

// sumServer is echoServer plus the demo's "sum" (JSON bidi: a running total
// per number, stream_end after request_end) and "total" (JSON
// client-streaming: the sum of the numbers).
func sumServer() *Server {
	s := echoServer()
	registerSum(s)
	return s
}

func registerSum(s *Server) {
	HandleJSONBidi(s, "sum", func(ctx context.Context, recv func() (float64, error), send func(float64) error) error {
		total := 0.0
		for {
			n, err := recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			total += n
			if err := send(total); err != nil {
				return err
			}
		}
	})
	HandleJSONClientStream(s, "total", func(ctx context.Context, recv func() (float64, error)) (float64, error) {
		total := 0.0
		for {
			n, err := recv()
			if err == io.EOF {
				return total, nil
			}
			if err != nil {
				return 0, err
			}
			total += n
		}
	})
}

func TestBidiSum(t *testing.T) {
	addr := startServer(t, sumServer())
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := OpenJSONBidi[float64, float64](ctx, c, "sum")
	if err != nil {
		t.Fatal(err)
	}
	want := 0.0
	for _, n := range []float64{1, 2, 4.5, -3} {
		if err := st.Send(n); err != nil {
			t.Fatal(err)
		}
		want += n
		got, err := st.Recv()
		if err != nil || got != want {
			t.Fatalf("after %v: total %v %v, want %v", n, got, err, want)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: %v, want io.EOF", err)
	}
	if err := st.Send(1); err != io.EOF && !errors.Is(err, errSendClosed) {
		t.Fatalf("Send after the end: %v", err)
	}
}

// TestBidiUntyped: Client.Bidi with Send/Recv on plain values, the JSON
// codec chosen per value.
func TestBidiUntyped(t *testing.T) {
	addr := startServer(t, sumServer())
	c := dial(t, addr)
	st, err := c.Bidi(context.Background(), "sum")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i, n := range []int{5, 6} {
		if err := st.Send(n); err != nil {
			t.Fatal(err)
		}
		var got int
		if err := st.Recv(&got); err != nil || got != []int{5, 11}[i] {
			t.Fatalf("got %d %v", got, err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var x int
	if err := st.Recv(&x); err != io.EOF {
		t.Fatalf("%v, want io.EOF", err)
	}
}

func TestClientStreaming(t *testing.T) {
	s := sumServer()
	s.HandleRawClientStream("concat", func(ctx context.Context, recv func() ([]byte, error), dst []byte) ([]byte, error) {
		for {
			it, err := recv()
			if err == io.EOF {
				return dst, nil
			}
			if err != nil {
				return nil, err
			}
			dst = append(dst, it...)
		}
	})
	addr := startServer(t, s)
	c := dial(t, addr)
	ctx := context.Background()
	st, err := OpenJSONClientStream[int, int](ctx, c, "total")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 100; i++ {
		if err := st.Send(i); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := st.CloseAndRecv(); err != nil || got != 5050 {
		t.Fatalf("total %d %v, want 5050", got, err)
	}
	raw, err := c.ClientStreaming(ctx, "concat")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "", "bc"} {
		if err := raw.SendRaw([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := raw.CloseAndRecvRaw()
	if err != nil || string(out) != "abc" {
		t.Fatalf("%q %v", out, err)
	}
	// No items at all.
	empty, _ := c.ClientStreaming(ctx, "concat")
	if out, err := empty.CloseAndRecvRaw(); err != nil || len(out) != 0 {
		t.Fatalf("%q %v", out, err)
	}
}

// TestBidiHalfCloseServerKeepsSending: after the client's request_end the
// server still sends items until it ends the call.
func TestBidiHalfCloseServerKeepsSending(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRawBidi("after", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		var got [][]byte
		for {
			it, err := recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			got = append(got, it)
		}
		for _, it := range got { // only after the half-close
			if err := send(it); err != nil {
				return err
			}
		}
		return send([]byte("done"))
	})
	c := dial(t, startServer(t, s))
	st, err := c.Bidi(context.Background(), "after")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"x", "y"} {
		st.SendRaw([]byte(p))
	}
	st.CloseSend()
	var got []string
	for {
		it, err := st.RecvRaw()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(it))
	}
	if strings.Join(got, ",") != "x,y,done" {
		t.Fatalf("got %q", got)
	}
}

// TestBidiThousandConcurrent: 1,000 bidi calls at once on one connection,
// each a conversation of its own, all answered right.
func TestBidiThousandConcurrent(t *testing.T) {
	addr := startServer(t, sumServer())
	c := dialOpts(t, addr, ClientOptions{Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const calls, items = 1000, 5
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	start := make(chan struct{})
	for g := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := OpenJSONBidi[int, int](ctx, c, "sum")
			if err != nil {
				errs <- err
				return
			}
			<-start // every call open before any item
			total := 0
			for i := range items {
				n := g*10 + i
				total += n
				if err := st.Send(n); err != nil {
					errs <- fmt.Errorf("call %d send: %w", g, err)
					return
				}
				got, err := st.Recv()
				if err != nil || got != total {
					errs <- fmt.Errorf("call %d item %d: %d %v, want %d", g, i, got, err, total)
					return
				}
			}
			st.CloseSend()
			if _, err := st.Recv(); err != io.EOF {
				errs <- fmt.Errorf("call %d end: %v", g, err)
			}
		}()
	}
	// Let the calls open: all 1,000 are in flight on the one connection.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.mu.Lock()
		var n int
		for cc := range c.live {
			n += int(cc.inflight.Load())
		}
		conns := len(c.live)
		c.mu.Unlock()
		if n == calls {
			if conns != 1 {
				t.Fatalf("%d connections, want 1", conns)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls open", n, calls)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// blockingBidi registers "hold": a bidi handler that reads one item, then
// waits for its ctx and reports how recv ended on ended.
func blockingBidi(s *Server, ended chan<- error) {
	s.HandleRawBidi("hold", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		if _, err := recv(); err != nil {
			ended <- err
			return err
		}
		send([]byte("got it"))
		_, err := recv() // blocks: the client sends nothing more
		ended <- err
		return err
	})
}

func TestBidiCancelFromClient(t *testing.T) {
	s := echoServer()
	ended := make(chan error, 1)
	blockingBidi(s, ended)
	c := dial(t, startServer(t, s))
	st, err := c.Bidi(context.Background(), "hold")
	if err != nil {
		t.Fatal(err)
	}
	st.SendRaw([]byte("x"))
	if _, err := st.RecvRaw(); err != nil {
		t.Fatal(err)
	}
	st.Close()
	select {
	case err := <-ended:
		if CodeOf(err) != Canceled {
			t.Fatalf("handler's recv: %v, want Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's recv did not end after the client canceled")
	}
	if _, err := st.RecvRaw(); CodeOf(err) != Canceled {
		t.Fatalf("Recv after Close: %v", err)
	}
	if err := st.SendRaw([]byte("y")); CodeOf(err) != Canceled {
		t.Fatalf("Send after Close: %v", err)
	}
}

// TestBidiServerEndsCall: a handler that fails the call after one item ends
// both directions: Recv reports the error and Send stops (its items are
// dropped), even while it waits for credit.
func TestBidiServerEndsCall(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRawBidi("one", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		if _, err := recv(); err != nil {
			return err
		}
		return Errorf(FailedPrecondition, "one item is enough")
	})
	c := dial(t, startServer(t, s))
	st, err := c.Bidi(context.Background(), "one")
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 256<<10)
	var sendErr error
	for i := 0; i < 1000 && sendErr == nil; i++ { // far beyond the 1 MiB credit
		sendErr = st.SendRaw(big)
	}
	if CodeOf(sendErr) != FailedPrecondition {
		t.Fatalf("Send after the server ended the call: %v", sendErr)
	}
	if _, err := st.RecvRaw(); CodeOf(err) != FailedPrecondition || !strings.Contains(err.Error(), "one item is enough") {
		t.Fatalf("Recv: %v", err)
	}
}

func TestBidiDeadline(t *testing.T) {
	s := echoServer()
	ended := make(chan error, 1)
	blockingBidi(s, ended)
	c := dial(t, startServer(t, s))
	// 1 s: the first item's echo must come before it (300 ms was missed once
	// under -race at load 7, with the call in a stream slot).
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := c.Bidi(ctx, "hold")
	if err != nil {
		t.Fatal(err)
	}
	st.SendRaw([]byte("x"))
	if _, err := st.RecvRaw(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecvRaw(); CodeOf(err) != DeadlineExceeded {
		t.Fatalf("client Recv: %v, want DeadlineExceeded", err)
	}
	select {
	case err := <-ended:
		if CodeOf(err) != DeadlineExceeded {
			t.Fatalf("handler's recv: %v, want DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's recv did not end at the deadline")
	}
}

// TestBidiHandlerStopsReading: a handler that stops taking request items
// stalls only its call: the client's Send waits once it has sent the credit
// (1 MiB plus an item), the server holds no more than that for the call,
// and unary calls and other bidi calls on the same connection go on.
func TestBidiHandlerStopsReading(t *testing.T) {
	s := sumServer()
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	var taken atomic.Int64
	s.HandleRawBidi("stuck", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		<-release
		for {
			_, err := recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			taken.Add(1)
		}
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	t.Cleanup(free) // (runs before the server's close, which waits for the handler: a failed test does not hang)
	st, err := c.Bidi(context.Background(), "stuck")
	if err != nil {
		t.Fatal(err)
	}
	const item = 64 << 10
	var sent atomic.Int64
	sendDone := make(chan error, 1)
	go func() {
		for range 100 {
			if err := st.SendRaw(make([]byte, item)); err != nil {
				sendDone <- err
				return
			}
			sent.Add(1)
		}
		sendDone <- st.CloseSend()
	}()
	n := settled(&sent)
	window := int64(frame.InitialRequestCredit/(item+frame.HeaderSize)) + 1
	if n > window {
		t.Fatalf("the client sent %d items of 64 KiB to a handler that reads none; credit allows %d", n, window)
	}
	held := s.held.Load()
	t.Logf("client paused after %d items; the server holds %d bytes for the call (bound %d)", n, held, frame.InitialRequestCredit+item+frame.HeaderSize)
	if held > frame.InitialRequestCredit+item+frame.HeaderSize+64<<10 {
		t.Fatalf("server holds %d bytes for one stalled call", held)
	}
	// The connection is free for everyone else.
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := c.CallRaw(ctx, "echo", []byte{byte(i)}, nil)
		if err != nil || len(out) != 1 || out[0] != byte(i) {
			t.Fatalf("echo %d beside a stalled bidi call: %q %v", i, out, err)
		}
		other, err := OpenJSONBidi[int, int](ctx, c, "sum")
		if err != nil {
			t.Fatal(err)
		}
		other.Send(i)
		if got, err := other.Recv(); err != nil || got != i {
			t.Fatalf("sum beside a stalled bidi call: %d %v", got, err)
		}
		other.CloseSend()
		cancel()
	}
	free()
	if err := <-sendDone; err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	if taken.Load() != 100 {
		t.Fatalf("handler took %d items, want 100", taken.Load())
	}
	for deadline := time.Now().Add(10 * time.Second); s.held.Load() != 0; { // the other calls end too
		if time.Now().After(deadline) {
			t.Fatalf("server still holds %d bytes after the calls", s.held.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBidiClientStopsReading: a bidi call whose client stops reading
// responses holds back only itself (stream credit, as server streams).
func TestBidiClientStopsReading(t *testing.T) {
	s := sumServer()
	var sent atomic.Int64
	s.HandleRawBidi("spew", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for range 200 {
			if err := send(make([]byte, 64<<10)); err != nil {
				return err
			}
			sent.Add(1)
		}
		return nil
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	st, err := c.Bidi(context.Background(), "spew")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n := settled(&sent)
	if window := int64(frame.InitialStreamCredit/(64<<10)) + 1; n > window {
		t.Fatalf("server sent %d items to a client that reads none; credit allows %d", n, window)
	}
	st.mu.Lock()
	queued := st.outstanding
	st.mu.Unlock()
	t.Logf("server paused after %d items; the client holds %d bytes unread (bound %d)", n, queued, frame.InitialStreamCredit+64<<10+frame.HeaderSize)
	if queued > frame.InitialStreamCredit+64<<10+frame.HeaderSize {
		t.Fatalf("client holds %d bytes for one unread call", queued)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	other, err := OpenJSONBidi[int, int](ctx, c, "sum")
	if err != nil {
		t.Fatal(err)
	}
	other.Send(7)
	if got, err := other.Recv(); err != nil || got != 7 {
		t.Fatalf("sum beside an unread bidi call: %d %v", got, err)
	}
	for i := range 200 {
		if _, err := st.RecvRaw(); err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatal(err)
	}
}

// oldServer accepts one connection, answers the hello without the
// client_stream flag (a server from before spec 4.3) and records every
// frame it then reads.
func oldServer(t *testing.T) (net.Conn, <-chan frame.Header) {
	cli, srv := socketPair(t)
	frames := make(chan frame.Header, 16)
	go func() {
		defer srv.Close()
		defer close(frames)
		r := frame.NewReader(srv, 0)
		if _, err := r.ReadHello(); err != nil {
			return
		}
		var hb [frame.HelloSize]byte
		h := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit, MaxFrame: 1 << 20, MaxInFlight: 8}
		h.Put(hb[:])
		srv.Write(hb[:])
		for {
			f, err := r.ReadFrame(nil)
			if err != nil {
				return
			}
			frames <- f.Header
		}
	}()
	return cli, frames
}

func TestBidiOldServerFailsLocally(t *testing.T) {
	conn, frames := oldServer(t)
	c, err := NewClient(context.Background(), conn, ClientOptions{NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, open := range []func() (*BidiStream, error){
		func() (*BidiStream, error) { return c.Bidi(context.Background(), "sum") },
		func() (*BidiStream, error) { return c.ClientStreaming(context.Background(), "total") },
	} {
		st, err := open()
		if st != nil || CodeOf(err) != Unimplemented || !strings.Contains(err.Error(), "its hello lacks the client_stream flag); upgrade the server") {
			t.Fatalf("%v %v, want the local unimplemented refusal", st, err)
		}
	}
	c.Close()
	for h := range frames {
		t.Fatalf("the client sent a %s frame to a server without client streams", h.Type)
	}
}

func TestBidiKindMismatch(t *testing.T) {
	s := sumServer()
	s.HandleRawStream("count", func(ctx context.Context, req []byte, send func([]byte) error) error { return nil })
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Call(ctx, "sum", 1, nil); !errors.Is(err, ErrBidiMethod) {
		t.Fatalf("Call of a bidi method: %v", err)
	}
	if err := c.Call(ctx, "total", 1, nil); !errors.Is(err, ErrClientStreamMethod) {
		t.Fatalf("Call of a client-streaming method: %v", err)
	}
	st, err := c.Stream(ctx, "sum", 1)
	if err == nil {
		_, err = st.RecvRaw()
	}
	if !errors.Is(err, ErrBidiMethod) {
		t.Fatalf("Stream of a bidi method: %v", err)
	}
	recvErr := func(b *BidiStream, err error) error {
		if err != nil {
			return err
		}
		_, err = b.RecvRaw()
		return err
	}
	if err := recvErr(c.Bidi(ctx, "echo")); !errors.Is(err, ErrUnaryMethod) {
		t.Fatalf("Bidi of a unary method: %v", err)
	}
	if err := recvErr(c.Bidi(ctx, "count")); !errors.Is(err, ErrStreamingMethod) {
		t.Fatalf("Bidi of a server-streaming method: %v", err)
	}
	if err := recvErr(c.Bidi(ctx, "total")); !errors.Is(err, ErrClientStreamMethod) {
		t.Fatalf("Bidi of a client-streaming method: %v", err)
	}
	if err := recvErr(c.ClientStreaming(ctx, "sum")); !errors.Is(err, ErrBidiMethod) {
		t.Fatalf("ClientStreaming of a bidi method: %v", err)
	}
	// The connection is fine after all that.
	if out, err := c.CallRaw(ctx, "echo", []byte("ok"), nil); err != nil || string(out) != "ok" {
		t.Fatalf("%q %v", out, err)
	}
}

func TestBidiNDJSONRefused(t *testing.T) {
	addr := startServer(t, sumServer())
	conn, err := net.Dial("unix", strings.TrimPrefix(addr, "unix:"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(conn, `{"id":1,"func":"sum","data":1}`+"\n"+`{"id":2,"func":"total","data":1}`+"\n"+`{"id":3,"func":"echo","data":"still"}`+"\n")
	br := bufio.NewReader(conn)
	want := map[string]bool{
		`{"id":1,"error":"method \"sum\" is a bidirectional stream; NDJSON has no streams: use a udskit client","code":"unimplemented"}`: true,
		`{"id":2,"error":"method \"total\" is a client stream; NDJSON has no streams: use a udskit client","code":"unimplemented"}`:      true,
		`{"id":3,"data":"still"}`: true,
	}
	for range 3 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		line = strings.TrimSuffix(line, "\n")
		if !want[line] {
			t.Fatalf("unexpected line %s", line)
		}
		delete(want, line)
	}
}

func TestBidiMethodKinds(t *testing.T) {
	s := sumServer()
	s.HandleRawStream("count", func(ctx context.Context, req []byte, send func([]byte) error) error { return nil })
	c := dial(t, startServer(t, s))
	ms, err := ListMethods(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range ms {
		got[m.Name] = m.Kind + "/" + m.Format
	}
	for name, want := range map[string]string{"sum": "bidi/json", "total": "client_stream/json", "count": "stream/raw", "echo": "unary/raw"} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
}

// TestBidiInterceptors: a bidi call goes through the server's stream
// interceptors and a client-streaming call through its unary ones, both with
// CallInfo.ClientStream; the client's stream interceptors see both opens.
func TestBidiInterceptors(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	note := func(s string) { mu.Lock(); seen = append(seen, s); mu.Unlock() }
	s := NewServer(ServerOptions{
		StreamInterceptors: []StreamServerInterceptor{func(ctx context.Context, info CallInfo, req []byte, send func([]byte) error, next RawStreamHandler) error {
			note(fmt.Sprintf("server stream %s cs=%v stream=%v req=%v", info.Method, info.ClientStream, info.Stream, req == nil))
			n := 0
			err := next(ctx, req, func(b []byte) error { n++; return send(b) })
			note(fmt.Sprintf("server stream %s sent %d", info.Method, n))
			return err
		}},
		UnaryInterceptors: []UnaryServerInterceptor{func(ctx context.Context, info CallInfo, req, dst []byte, next RawHandler) ([]byte, error) {
			note(fmt.Sprintf("server unary %s cs=%v", info.Method, info.ClientStream))
			return next(ctx, req, dst)
		}},
	})
	registerSum(s)
	c := dialOpts(t, startServer(t, s), ClientOptions{StreamInterceptors: []StreamClientInterceptor{
		func(ctx context.Context, method string, req []byte, open StreamOpener) (*ClientStream, error) {
			note("client open " + method)
			return open(ctx, method, req)
		}}})
	ctx := context.Background()
	st, err := OpenJSONBidi[int, int](ctx, c, "sum")
	if err != nil {
		t.Fatal(err)
	}
	st.Send(1)
	st.Send(2)
	st.CloseSend()
	for {
		if _, err := st.Recv(); err != nil {
			break
		}
	}
	cs, err := OpenJSONClientStream[int, int](ctx, c, "total")
	if err != nil {
		t.Fatal(err)
	}
	cs.Send(3)
	if got, err := cs.CloseAndRecv(); err != nil || got != 3 {
		t.Fatalf("%d %v", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := "client open sum|server stream sum cs=true stream=true req=true|server stream sum sent 2|client open total|server unary total cs=true"
	if got := strings.Join(seen, "|"); got != want {
		t.Fatalf("interceptors saw\n%s\nwant\n%s", got, want)
	}
}

// TestBidiMetadata: a bidi call carries request metadata to the handler and
// the handler's response metadata back on its stream_end.
func TestBidiMetadata(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRawBidi("md", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		SetResponseMetadata(ctx, Metadata{"seen": MetadataFromContext(ctx)["who"]})
		for {
			if _, err := recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	})
	c := dial(t, startServer(t, s))
	var respMD Metadata
	ctx := WithResponseMetadata(WithMetadata(context.Background(), Metadata{"who": "me"}), &respMD)
	st, err := c.Bidi(ctx, "md")
	if err != nil {
		t.Fatal(err)
	}
	st.CloseSend()
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatal(err)
	}
	if respMD["seen"] != "me" {
		t.Fatalf("response metadata %v", respMD)
	}
}

// BenchmarkBidiPingPong: one 1 KiB item each way per round on one bidi
// call, next to a unary 1 KiB echo call (benchUdskit, BenchmarkUnary's
// udskit row) in the same run, so the two compare like with like (udskit
// bench's rpc-bidi and rpc-unix rows are the cross-process figures). "view"
// takes the items with RecvRawView and a HandleRawBidiView handler (buffers
// reused both sides), "owned" with RecvRaw and a HandleRawBidi handler.
func BenchmarkBidiPingPong(b *testing.B) {
	b.Run("unary/1KiB", func(b *testing.B) { benchUdskit(b, 1024, 1) })
	b.Run("bidi-view/1KiB", func(b *testing.B) { benchBidi(b, true) })
	b.Run("bidi-owned/1KiB", func(b *testing.B) { benchBidi(b, false) })
	b.Run("unary/1KiB/16", func(b *testing.B) { benchUdskit(b, 1024, 16) })
	b.Run("bidi-view/1KiB/16", func(b *testing.B) { benchBidi16(b) })
}

// benchBidi16 is 16 callers, each with its own bidi call (view both sides),
// spread over two connections as udskit bench's rpc-bidi row spreads them
// (and as the client's pool spreads benchUdskit's unary calls): one client
// with Conns 1 each, callers alternating (one default client spreads them
// too, 8 and 8, but measured a little slower: bench/bidi.go).
func benchBidi16(b *testing.B) {
	s := NewServer(ServerOptions{})
	rawEchoBidi(s)
	addr := startServer(b, s)
	cs := []*Client{dialOpts(b, addr, ClientOptions{Conns: 1}), dialOpts(b, addr, ClientOptions{Conns: 1})}
	var next atomic.Int32
	msg := make([]byte, 1024)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.SetParallelism(8) // GOMAXPROCS=2 here: 2*8 = 16 callers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		st, err := cs[next.Add(1)%2].Bidi(context.Background(), "echo-view")
		if err != nil {
			b.Error(err)
			return
		}
		defer st.Close()
		for pb.Next() {
			if err := st.SendRaw(msg); err != nil {
				b.Error(err)
				return
			}
			if it, err := st.RecvRawView(); err != nil || len(it) != len(msg) {
				b.Error(err)
				return
			}
		}
	})
}

func benchBidi(b *testing.B, view bool) {
	s := NewServer(ServerOptions{})
	rawEchoBidi(s)
	c := dial(b, startServer(b, s))
	method := "echo"
	if view {
		method = "echo-view"
	}
	st, err := c.Bidi(context.Background(), method)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	recv := st.RecvRaw
	if view {
		recv = st.RecvRawView
	}
	msg := make([]byte, 1024)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	lat := newLatencies(b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := st.SendRaw(msg); err != nil {
			b.Fatal(err)
		}
		if it, err := recv(); err != nil || len(it) != len(msg) {
			b.Fatal(err)
		}
		lat.add(time.Since(t0))
	}
	lat.report(b)
}

// TestBidiDrain: a bidi call in flight when the server drains (goaway) goes
// on to its end (items both ways after the goaway), and Shutdown returns
// once it has ended.
func TestBidiDrain(t *testing.T) {
	s := sumServer()
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := OpenJSONBidi[int, int](ctx, c, "sum")
	if err != nil {
		t.Fatal(err)
	}
	st.Send(1)
	if got, err := st.Recv(); err != nil || got != 1 {
		t.Fatalf("%d %v", got, err)
	}
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	time.Sleep(50 * time.Millisecond) // the goaway is out
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned with a bidi call in flight: %v", err)
	default:
	}
	st.Send(2)
	if got, err := st.Recv(); err != nil || got != 3 {
		t.Fatalf("after the goaway: %d %v", got, err)
	}
	st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}
