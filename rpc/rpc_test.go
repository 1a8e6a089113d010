package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestEchoRaw(t *testing.T) {
	addr := startServer(t, echoServer())
	c := dial(t, addr)
	ctx := context.Background()
	for _, n := range []int{0, 1, 100, 40 << 10, 1 << 20, 3<<20 + 7} {
		in := bytes.Repeat([]byte{byte(n), 1, 2}, n/3+1)[:n]
		out, err := c.CallRaw(ctx, "echo", in, nil)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("%d bytes: echo differs (got %d bytes)", n, len(out))
		}
	}
}

func TestConcurrentCallsOutOfOrder(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRaw("sleep", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		var ms int
		fmt.Sscan(string(req), &ms)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		return append(dst, req...), nil
	})
	c := dial(t, startServer(t, s))
	var wg sync.WaitGroup
	order := make(chan int, 10)
	for i := 10; i > 0; i-- {
		wg.Add(1)
		go func(ms int) {
			defer wg.Done()
			out, err := c.CallRaw(context.Background(), "sleep", []byte(fmt.Sprint(ms*15)), nil)
			if err != nil || string(out) != fmt.Sprint(ms*15) {
				t.Errorf("call %d: %q %v", ms, out, err)
			}
			order <- ms
		}(i)
	}
	wg.Wait()
	close(order)
	first := <-order
	if first > 3 {
		t.Errorf("shortest calls should finish first over one connection; first done was %d", first)
	}
}

type getServiceReq struct {
	Service string `json:"service"`
}
type serviceAddr struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

func TestJSONAndErrors(t *testing.T) {
	s := NewServer(ServerOptions{})
	HandleJSON(s, "getService", func(ctx context.Context, r getServiceReq) (serviceAddr, error) {
		if r.Service == "" {
			return serviceAddr{}, &Error{Code: InvalidArgument, Message: "service is required", Details: []byte(`{"field":"service"}`)}
		}
		if r.Service == "boom" {
			return serviceAddr{}, errors.New("plain failure")
		}
		if r.Service == "panic" {
			panic("handler bug")
		}
		return serviceAddr{Host: "1.2.3.4", Port: 8765}, nil
	})
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got serviceAddr
	if err := c.Call(ctx, "getService", getServiceReq{Service: "barista"}, &got); err != nil {
		t.Fatal(err)
	}
	if got != (serviceAddr{"1.2.3.4", 8765}) {
		t.Fatalf("got %+v", got)
	}
	err := c.Call(ctx, "getService", getServiceReq{}, &got)
	var e *Error
	if !errors.As(err, &e) || e.Code != InvalidArgument || e.Message != "service is required" || string(e.Details) != `{"field":"service"}` {
		t.Fatalf("want InvalidArgument with details, got %#v", err)
	}
	if err := c.Call(ctx, "getService", getServiceReq{Service: "boom"}, &got); CodeOf(err) != Unknown || !strings.Contains(err.Error(), "plain failure") {
		t.Fatalf("want Unknown plain failure, got %v", err)
	}
	start := time.Now()
	if err := c.Call(ctx, "getService", getServiceReq{Service: "panic"}, &got); CodeOf(err) != Internal || !strings.Contains(err.Error(), "handler bug") {
		t.Fatalf("want Internal panic, got %v", err)
	}
	if err := c.Call(ctx, "nope", getServiceReq{}, &got); CodeOf(err) != Unimplemented || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("want Unimplemented, got %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("errors must come back at once, took %v", time.Since(start))
	}
	// The connection still works after all that.
	if err := c.Call(ctx, "getService", getServiceReq{Service: "x"}, &got); err != nil {
		t.Fatal(err)
	}
	// A response the client cannot decode is the client's error, not the
	// server's invalid_argument: Internal, ErrDecode, and said so.
	var wrong []string
	err = c.Call(ctx, "getService", getServiceReq{Service: "x"}, &wrong)
	if !errors.Is(err, ErrDecode) || CodeOf(err) != Internal || !strings.Contains(err.Error(), "the server answered") {
		t.Fatalf("decoding an object into a []string: %v, want an Internal ErrDecode saying the server answered", err)
	}
	if err := c.Call(ctx, "getService", getServiceReq{}, &got); errors.Is(err, ErrDecode) || errors.Is(err, ErrEncode) {
		t.Fatalf("the server's own invalid_argument matches a client-side sentinel: %v", err)
	}
	err = c.Call(ctx, "getService", func() {}, &got)
	if !errors.Is(err, ErrEncode) || CodeOf(err) != InvalidArgument || !strings.Contains(err.Error(), "not sent") {
		t.Fatalf("encoding a func: %v, want an InvalidArgument ErrEncode saying it was not sent", err)
	}
}

func TestDeadlinePropagatesAndCancel(t *testing.T) {
	s := NewServer(ServerOptions{})
	ended := make(chan error, 1)
	s.HandleRaw("wait", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		if _, ok := ctx.Deadline(); !ok && string(req) == "deadline" {
			return nil, errors.New("no deadline in handler ctx")
		}
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	})
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.CallRaw(ctx, "wait", []byte("deadline"), nil)
	if !errors.Is(err, context.DeadlineExceeded) || CodeOf(err) != DeadlineExceeded {
		t.Fatalf("want DeadlineExceeded, got %v", err)
	}
	select {
	case herr := <-ended:
		if !errors.Is(herr, context.DeadlineExceeded) {
			t.Fatalf("handler ctx ended with %v, want deadline exceeded", herr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler ctx did not end with the caller's deadline")
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel2() }()
	_, err = c.CallRaw(ctx2, "wait", nil, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want Canceled, got %v", err)
	}
	select {
	case herr := <-ended:
		if !errors.Is(herr, context.Canceled) {
			t.Fatalf("handler ctx ended with %v, want canceled", herr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancel did not reach the handler")
	}
}

func TestMetadataAndCred(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRaw("who", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		cr, ok := CredFromContext(ctx)
		if !ok {
			return nil, errors.New("no cred")
		}
		md := MetadataFromContext(ctx)
		return fmt.Appendf(dst, "%d %s %s %s", cr.UID, md["trace"], md["tenant"], MethodFromContext(ctx)), nil
	})
	c := dial(t, startServer(t, s))
	ctx := WithMetadata(context.Background(), Metadata{"trace": "abc"})
	ctx = WithMetadata(ctx, Metadata{"tenant": "t1"})
	out, err := c.CallRaw(ctx, "who", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d abc t1 who", uidSelf())
	if string(out) != want {
		t.Fatalf("got %q want %q", out, want)
	}
}

func TestServerStream(t *testing.T) {
	s := NewServer(ServerOptions{})
	HandleJSONStream(s, "count", func(ctx context.Context, n int, send func(int) error) error {
		for i := range n {
			if err := send(i); err != nil {
				return err
			}
		}
		if n == 3 {
			return Errorf(Aborted, "stopped at %d", n)
		}
		return nil
	})
	c := dial(t, startServer(t, s))
	ctx := context.Background()
	st, err := c.Stream(ctx, "count", 500)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		var v int
		if err := st.Recv(&v); err != nil || v != i {
			t.Fatalf("item %d: %d %v", i, v, err)
		}
	}
	if err := st.Recv(new(int)); err != io.EOF {
		t.Fatalf("want io.EOF, got %v", err)
	}
	st.Close()

	st, err = c.Stream(ctx, "count", 3)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		var v int
		err = st.Recv(&v)
		if err != nil {
			break
		}
		n++
	}
	if n != 3 || CodeOf(err) != Aborted {
		t.Fatalf("want 3 items then Aborted, got %d items, %v", n, err)
	}
	// Calling a stream method as unary fails clearly, and the refusal is
	// typed: ErrStreamingMethod (what `udskit call` branches on), not
	// ErrUnaryMethod.
	if err := c.Call(ctx, "count", 1, nil); CodeOf(err) != Unimplemented ||
		!errors.Is(err, ErrStreamingMethod) || errors.Is(err, ErrUnaryMethod) {
		t.Fatalf("want Unimplemented matching ErrStreamingMethod only, got %v", err)
	}
}

// TestWrongKindErrors: a server's wrong-kind refusals match their sentinels
// and nothing else does (an unknown method, another code with the same words).
func TestWrongKindErrors(t *testing.T) {
	s := NewServer(ServerOptions{})
	HandleJSONStream(s, "count", func(ctx context.Context, n int, send func(int) error) error { return nil })
	HandleJSON(s, "echo", func(ctx context.Context, v int) (int, error) { return v, nil })
	c := dial(t, startServer(t, s))
	ctx := context.Background()
	st, err := c.Stream(ctx, "echo", 1)
	if err == nil {
		var v int
		err = st.Recv(&v)
		st.Close()
	}
	if !errors.Is(err, ErrUnaryMethod) || errors.Is(err, ErrStreamingMethod) {
		t.Fatalf("Stream of a unary method: want ErrUnaryMethod only, got %v", err)
	}
	err = c.Call(ctx, "nope", 1, nil)
	if CodeOf(err) != Unimplemented || errors.Is(err, ErrStreamingMethod) || errors.Is(err, ErrUnaryMethod) {
		t.Fatalf("unknown method: want Unimplemented matching neither sentinel, got %v", err)
	}
	other := Errorf(Internal, "method %q is server-streaming; call it with Stream", "x")
	if errors.Is(other, ErrStreamingMethod) {
		t.Fatal("an internal error with the same words matched ErrStreamingMethod")
	}
	// The NDJSON refusal is typed too (its own words after the marker).
	if !errors.Is(wrongKind("count", false, true), ErrStreamingMethod) {
		t.Fatal("the NDJSON wrong-kind refusal does not match ErrStreamingMethod")
	}
}
