package grpcecho

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// startEcho serves the echo service on a unix socket in a temp dir and dials it;
// both are stopped in t.Cleanup.
func startEcho(t testing.TB) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "g.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer()
	go s.Serve(l)
	t.Cleanup(s.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestEchoOverUnix(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := startEcho(t)
	// 8 MiB is over grpc-go's default 4 MiB receive limit: MaxMessageSize
	// must be in effect on both sides.
	for _, n := range []int{0, 1, 1024, 100 << 10, 8 << 20} {
		in := bytes.Repeat([]byte{byte(n)}, n)
		out, err := c.Echo(ctx, in)
		if err != nil {
			t.Fatalf("echo %d bytes: %v", n, err)
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("echo %d bytes: got %d bytes back, different", n, len(out))
		}
	}
}

// TestOverMaxMessageSize: a message over MaxMessageSize fails cleanly (a
// ResourceExhausted status), it does not hang or kill the connection.
func TestOverMaxMessageSize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := startEcho(t)
	if _, err := c.Echo(ctx, make([]byte, MaxMessageSize+1)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("echo of MaxMessageSize+1 bytes: %v, want ResourceExhausted", err)
	}
	if _, err := c.Echo(ctx, []byte("still fine")); err != nil {
		t.Fatalf("connection unusable after an oversized message: %v", err)
	}
}

func TestDialBadNetwork(t *testing.T) {
	if _, err := Dial(context.Background(), "udp", "x"); err == nil {
		t.Fatal("want error for udp")
	}
}

func BenchmarkEcho1K(b *testing.B) {
	c := startEcho(b)
	p := make([]byte, 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Echo(context.Background(), p); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEchoStream: the bidirectional echo answers each message on the same
// stream, in order, and ends when the client closes its side.
func TestEchoStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := startEcho(t)
	st, err := c.OpenEchoStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 1024, 100 << 10} {
		in := bytes.Repeat([]byte{byte(n + 1)}, n)
		out, err := st.Echo(in)
		if err != nil || !bytes.Equal(in, out) {
			t.Fatalf("stream echo %d bytes: %d bytes back, %v", n, len(out), err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}
