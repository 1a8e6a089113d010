package rpc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/udskit/udskit/uds"
)

type ctxTag struct{}

// Server interceptors see the method, metadata, peer and deadline, run
// first-outermost, can wrap the handler's ctx and refuse with a code.
func TestServerUnaryInterceptors(t *testing.T) {
	var mu sync.Mutex
	var order []string
	var seen CallInfo
	var seenMD Metadata
	var seenDeadline bool
	var outcome error
	outer := func(ctx context.Context, info CallInfo, req, dst []byte, next RawHandler) ([]byte, error) {
		mu.Lock()
		order = append(order, "outer:"+info.Method)
		mu.Unlock()
		out, err := next(ctx, req, dst)
		mu.Lock()
		outcome = err
		mu.Unlock()
		return out, err
	}
	inner := func(ctx context.Context, info CallInfo, req, dst []byte, next RawHandler) ([]byte, error) {
		mu.Lock()
		order = append(order, "inner:"+info.Method)
		seen, seenMD = info, MetadataFromContext(ctx)
		_, seenDeadline = ctx.Deadline()
		mu.Unlock()
		if MetadataFromContext(ctx)["role"] != "admin" && info.Method == "secret" {
			return nil, Errorf(PermissionDenied, "secret needs role admin")
		}
		return next(context.WithValue(ctx, ctxTag{}, "tagged"), req, dst)
	}
	s := NewServer(ServerOptions{UnaryInterceptors: []UnaryServerInterceptor{outer, inner}})
	handled := 0
	s.HandleRaw("secret", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		handled++
		tag, _ := ctx.Value(ctxTag{}).(string)
		if MethodFromContext(ctx) != "secret" || MetadataFromContext(ctx)["role"] != "admin" {
			return nil, Errorf(Internal, "the wrapped ctx lost the call's method or metadata")
		}
		if _, ok := CredFromContext(ctx); !ok {
			return nil, Errorf(Internal, "the wrapped ctx lost the caller's credentials")
		}
		return append(dst, tag...), nil
	})
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err := c.CallRaw(ctx, "secret", nil, nil)
	if CodeOf(err) != PermissionDenied || handled != 0 {
		t.Fatalf("call without the role: %v, handler ran %d times; want permission_denied before the handler", err, handled)
	}
	if CodeOf(outcome) != PermissionDenied {
		t.Fatalf("the outer interceptor saw %v as the outcome", outcome)
	}
	out, err := c.CallRaw(WithMetadata(ctx, Metadata{"role": "admin"}), "secret", nil, nil)
	if err != nil || string(out) != "tagged" {
		t.Fatalf("call with the role: %q, %v", out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(order, ",") != "outer:secret,inner:secret,outer:secret,inner:secret" {
		t.Fatalf("interceptor order %v", order)
	}
	if seen.Method != "secret" || seen.Stream || seen.NDJSON || !seen.HasCred || seen.Cred.PID != int32(os.Getpid()) || seenMD["role"] != "admin" || !seenDeadline {
		t.Fatalf("interceptor saw %+v md %v deadline %v", seen, seenMD, seenDeadline)
	}
}

// A stream interceptor can wrap send; NDJSON calls go through the unary
// chain marked NDJSON.
func TestServerStreamAndNDJSONInterceptors(t *testing.T) {
	var items, ndjson int
	var mu sync.Mutex
	s := NewServer(ServerOptions{
		StreamInterceptors: []StreamServerInterceptor{func(ctx context.Context, info CallInfo, req []byte, send func([]byte) error, next RawStreamHandler) error {
			if !info.Stream || info.Method != "count" {
				return Errorf(Internal, "stream interceptor got %+v", info)
			}
			return next(ctx, req, func(b []byte) error {
				mu.Lock()
				items++
				mu.Unlock()
				return send(append([]byte("<"), append(b, '>')...))
			})
		}},
		UnaryInterceptors: []UnaryServerInterceptor{func(ctx context.Context, info CallInfo, req, dst []byte, next RawHandler) ([]byte, error) {
			if info.NDJSON {
				mu.Lock()
				ndjson++
				mu.Unlock()
			}
			return next(ctx, req, dst)
		}},
	})
	s.HandleRawStream("count", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for _, s := range []string{"1", "2", "3"} {
			if err := send([]byte(s)); err != nil {
				return err
			}
		}
		return nil
	})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	addr := startServer(t, s)
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Stream(ctx, "count", []byte{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		b, err := st.RecvRaw()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(b))
	}
	mu.Lock()
	n := items
	mu.Unlock()
	if strings.Join(got, "") != "<1><2><3>" || n != 3 {
		t.Fatalf("stream items %v, counted %d", got, n)
	}
	nc, r := ndjsonConn(t, addr)
	nc.Write([]byte(`{"id":1,"func":"echo","data":"x"}` + "\n"))
	line, err := r.ReadString('\n')
	if err != nil || !strings.Contains(line, `"data":"x"`) {
		t.Fatalf("NDJSON echo: %q, %v", line, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ndjson != 1 {
		t.Fatalf("unary interceptor saw %d NDJSON calls, want 1", ndjson)
	}
}

// Client interceptors add metadata, refuse locally, see the outcome; a
// stream interceptor learns the stream's end through OnDone.
func TestClientInterceptors(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRaw("md", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, MetadataFromContext(ctx)["x-trace"]...), nil
	})
	s.HandleRawStream("two", func(ctx context.Context, req []byte, send func([]byte) error) error {
		send([]byte("a"))
		return send([]byte("b"))
	})
	s.HandleRawStream("forever", func(ctx context.Context, req []byte, send func([]byte) error) error {
		<-ctx.Done()
		return ctx.Err()
	})
	var mu sync.Mutex
	var outcomes []Code
	ends := map[string]error{} // by method: OnDone may run on the reading goroutine after Recv saw the end
	unary := func(ctx context.Context, method string, req, dst []byte, invoke UnaryInvoker) ([]byte, error) {
		if method == "forbidden" {
			return dst, Errorf(FailedPrecondition, "not from this client")
		}
		out, err := invoke(WithMetadata(ctx, Metadata{"x-trace": "abc"}), method, req, dst)
		mu.Lock()
		outcomes = append(outcomes, CodeOf(err))
		mu.Unlock()
		return out, err
	}
	stream := func(ctx context.Context, method string, req []byte, open StreamOpener) (*ClientStream, error) {
		st, err := open(ctx, method, req)
		if err != nil {
			return nil, err
		}
		st.OnDone(func(err error) {
			mu.Lock()
			if _, twice := ends[method]; twice {
				t.Errorf("OnDone ran twice for %s", method)
			}
			ends[method] = err
			mu.Unlock()
		})
		return st, nil
	}
	c := dialOpts(t, startServer(t, s), ClientOptions{UnaryInterceptors: []UnaryClientInterceptor{unary}, StreamInterceptors: []StreamClientInterceptor{stream}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []byte
	if err := c.Call(ctx, "md", []byte("x"), &got); err != nil || string(got) != "abc" {
		t.Fatalf("Call through the interceptor: %q, %v", got, err)
	}
	if _, err := c.CallRaw(ctx, "nosuch", nil, nil); CodeOf(err) != Unimplemented {
		t.Fatalf("unknown method: %v", err)
	}
	if _, err := c.CallRaw(ctx, "forbidden", nil, nil); CodeOf(err) != FailedPrecondition {
		t.Fatalf("refused by the client interceptor: %v", err)
	}
	st, err := c.Stream(ctx, "two", []byte{})
	if err != nil {
		t.Fatal(err)
	}
	var item []byte
	for st.Recv(&item) == nil {
	}
	st2, err := c.Stream(ctx, "forever", []byte{})
	if err != nil {
		t.Fatal(err)
	}
	st2.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(ends)
		mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != 2 || outcomes[0] != OK || outcomes[1] != Unimplemented {
		t.Fatalf("outcomes seen by the unary interceptor: %v", outcomes)
	}
	two, ok2 := ends["two"]
	forever, okf := ends["forever"]
	if len(ends) != 2 || !ok2 || two != nil || !okf || CodeOf(forever) != Canceled {
		t.Fatalf("stream ends seen through OnDone: %v; want two: nil, forever: canceled", ends)
	}
	// OnDone after the end runs at once.
	ran := false
	st.OnDone(func(error) { ran = true })
	if !ran {
		t.Fatal("OnDone on an ended stream did not run")
	}
}

// Pass-through interceptors on both sides add no allocation to a call: the
// call info is a value, the next step a func made once.
func TestInterceptorsAddNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race sync.Pool drops items at random: allocation counts mean nothing (make allocs runs this without -race)")
	}
	s := NewServer(ServerOptions{UnaryInterceptors: []UnaryServerInterceptor{func(ctx context.Context, info CallInfo, req, dst []byte, next RawHandler) ([]byte, error) {
		return next(ctx, req, dst)
	}}})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	c := dialOpts(t, startServer(t, s), ClientOptions{UnaryInterceptors: []UnaryClientInterceptor{func(ctx context.Context, method string, req, dst []byte, invoke UnaryInvoker) ([]byte, error) {
		return invoke(ctx, method, req, dst)
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, dst := make([]byte, 64), make([]byte, 0, 64)
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
		t.Errorf("%.2f allocations per call with pass-through interceptors, client + server; want at most 1 (as without)", n)
	}
}

// ndjsonConn dials addr as a newline-JSON client.
func ndjsonConn(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}
