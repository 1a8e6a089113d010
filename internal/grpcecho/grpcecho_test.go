package grpcecho

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"
)

func TestEchoOverUnix(t *testing.T) {
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
	defer c.Close()
	for _, n := range []int{0, 1, 1024, 100 << 10} {
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

func TestDialBadNetwork(t *testing.T) {
	if _, err := Dial(context.Background(), "udp", "x"); err == nil {
		t.Fatal("want error for udp")
	}
}

func BenchmarkEcho1K(b *testing.B) {
	sock := filepath.Join(b.TempDir(), "g.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	s := NewServer()
	go s.Serve(l)
	defer s.Stop()
	c, err := Dial(context.Background(), "unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	p := make([]byte, 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Echo(context.Background(), p); err != nil {
			b.Fatal(err)
		}
	}
}
