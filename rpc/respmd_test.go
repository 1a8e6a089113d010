package rpc

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestResponseMetadata: a handler's SetResponseMetadata reaches a caller
// that asked with WithResponseMetadata, for unary calls (small and large
// responses) and streams; reserved keys and oversize metadata are refused in
// the handler with a clear error.
func TestResponseMetadata(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRaw("md", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		if err := SetResponseMetadata(ctx, Metadata{"a": "1", "b": "x"}); err != nil {
			return nil, err
		}
		if err := SetResponseMetadata(ctx, Metadata{"b": "2"}); err != nil { // merged over
			return nil, err
		}
		return append(dst, req...), nil
	})
	s.HandleRaw("plain", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, "ok"...), nil
	})
	s.HandleRaw("reserved", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return nil, SetResponseMetadata(ctx, Metadata{":status": "x"})
	})
	s.HandleRaw("huge", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return nil, SetResponseMetadata(ctx, Metadata{"k": strings.Repeat("v", 17<<10)})
	})
	s.HandleRawStream("items", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for i := 0; i < 3; i++ {
			if err := send([]byte{byte('0' + i)}); err != nil {
				return err
			}
		}
		return SetResponseMetadata(ctx, Metadata{"count": "3"})
	})
	addr := startServer(t, s)
	c, err := Dial(context.Background(), addr, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	for _, size := range []int{3, 2 << 20} { // inline and large (read aside, padded) responses
		var md Metadata
		ctx, cancel := context.WithTimeout(WithResponseMetadata(context.Background(), &md), 10e9)
		out, err := c.CallRaw(ctx, "md", make([]byte, size), nil)
		cancel()
		if err != nil || len(out) != size {
			t.Fatalf("size %d: %d bytes, %v", size, len(out), err)
		}
		if len(md) != 2 || md["a"] != "1" || md["b"] != "2" {
			t.Fatalf("size %d: response metadata %v, want a=1 b=2", size, md)
		}
	}

	md := Metadata{"stale": "x"}
	if _, err := c.CallRaw(WithResponseMetadata(context.Background(), &md), "plain", nil, nil); err != nil {
		t.Fatal(err)
	}
	if md != nil {
		t.Fatalf("no metadata sent, got %v", md)
	}

	for _, m := range []string{"reserved", "huge"} {
		_, err := c.CallRaw(context.Background(), m, nil, nil)
		var e *Error
		if !errors.As(err, &e) || e.Code != InvalidArgument {
			t.Fatalf("%s: %v, want invalid_argument", m, err)
		}
		want := map[string]string{"reserved": "reserved for the protocol", "huge": "over the head limit"}[m]
		if !strings.Contains(e.Message, want) {
			t.Fatalf("%s: message %q lacks %q", m, e.Message, want)
		}
	}

	var smd Metadata
	st, err := c.Stream(WithResponseMetadata(context.Background(), &smd), "items", nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		_, err := st.RecvRaw()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 3 || smd["count"] != "3" || len(smd) != 1 {
		t.Fatalf("stream: %d items, metadata %v", n, smd)
	}

	if err := SetResponseMetadata(context.Background(), Metadata{"a": "b"}); err == nil {
		t.Fatal("SetResponseMetadata outside a handler: no error")
	}
}
