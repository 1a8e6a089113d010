package rpc

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/grpcecho"
	"github.com/udskit/udskit/internal/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Side-by-side benchmarks, in-process over real unix sockets:
//
//	go test -run '^$' -bench . -benchtime 2s ./rpc
//
// Unary/* is one caller; Parallel16/* is 16 concurrent callers on one client
// (udskit, grpc) or 16 connections (raw). Raw is a plain net.UnixConn
// length-prefixed echo, the practical limit.

var benchSizes = []int{64, 1 << 10, 10 << 10, 100 << 10, 1 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func benchUdskit(b *testing.B, size, callers int) {
	addr := startServer(b, echoServer())
	c := dial(b, addr)
	payload := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	if callers == 1 {
		dst := make([]byte, 0, size)
		lat := newLatencies(b.N)
		for b.Loop() {
			t0 := time.Now()
			out, err := c.CallRaw(context.Background(), "echo", payload, dst[:0])
			lat.add(time.Since(t0))
			if err != nil || len(out) != size {
				b.Fatal(err)
			}
		}
		lat.report(b)
		return
	}
	b.SetParallelism((callers + 1) / 2) // GOMAXPROCS=2 here: 2*8 = 16 callers
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]byte, 0, size)
		for pb.Next() {
			out, err := c.CallRaw(context.Background(), "echo", payload, dst[:0])
			if err != nil || len(out) != size {
				b.Error(err)
				return
			}
		}
	})
}

func benchGRPC(b *testing.B, size, callers int) {
	sock := filepath.Join(b.TempDir(), "g.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	s := grpcecho.NewServer()
	go s.Serve(l)
	defer s.Stop()
	c, err := grpcecho.Dial(context.Background(), "unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism((callers + 1) / 2)
	if callers == 1 {
		lat := newLatencies(b.N)
		for b.Loop() {
			t0 := time.Now()
			if _, err := c.Echo(context.Background(), payload); err != nil {
				b.Fatal(err)
			}
			lat.add(time.Since(t0))
		}
		lat.report(b)
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Echo(context.Background(), payload); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// rawEcho serves a u32-length-prefixed echo on each conn.
func rawEcho(c net.Conn) {
	defer c.Close()
	var hdr [4]byte
	buf := make([]byte, 0, 64<<10)
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(uint32(hdr[0]) | uint32(hdr[1])<<8 | uint32(hdr[2])<<16 | uint32(hdr[3])<<24)
		if cap(buf) < 4+n {
			buf = make([]byte, 0, 4+n)
		}
		buf = buf[:4+n]
		copy(buf, hdr[:])
		if _, err := io.ReadFull(c, buf[4:]); err != nil {
			return
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

func benchRaw(b *testing.B, size, conns int) {
	sock := filepath.Join(b.TempDir(), "raw.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	testutil.Serve(b, l, rawEcho)
	pool := make(chan net.Conn, conns)
	var all []net.Conn
	for range conns {
		c, err := net.Dial("unix", sock)
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, c)
		pool <- c
	}
	defer func() {
		for _, c := range all {
			c.Close()
		}
	}()
	one := func(c net.Conn, msg, in []byte) {
		if _, err := c.Write(msg); err != nil {
			b.Error(err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			b.Error(err)
		}
	}
	mk := func() ([]byte, []byte) {
		msg := make([]byte, 4+size)
		msg[0], msg[1], msg[2], msg[3] = byte(size), byte(size>>8), byte(size>>16), byte(size>>24)
		return msg, make([]byte, 4+size)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	if conns == 1 {
		c := <-pool
		msg, in := mk()
		lat := newLatencies(b.N)
		for b.Loop() {
			t0 := time.Now()
			one(c, msg, in)
			lat.add(time.Since(t0))
		}
		lat.report(b)
		return
	}
	b.SetParallelism((conns + 1) / 2)
	b.RunParallel(func(pb *testing.PB) {
		c := <-pool
		defer func() { pool <- c }()
		msg, in := mk()
		for pb.Next() {
			one(c, msg, in)
		}
	})
}

func BenchmarkUnary(b *testing.B) {
	for _, size := range benchSizes[:1] {
		b.Run("udskit/"+sizeName(size), func(b *testing.B) { benchUdskit(b, size, 1) })
		b.Run("grpc/"+sizeName(size), func(b *testing.B) { benchGRPC(b, size, 1) })
		b.Run("raw/"+sizeName(size), func(b *testing.B) { benchRaw(b, size, 1) })
	}
}

func BenchmarkParallel16(b *testing.B) {
	for _, size := range benchSizes[1:] {
		b.Run("udskit/"+sizeName(size), func(b *testing.B) { benchUdskit(b, size, 16) })
		b.Run("grpc/"+sizeName(size), func(b *testing.B) { benchGRPC(b, size, 16) })
		b.Run("raw/"+sizeName(size), func(b *testing.B) { benchRaw(b, size, 16) })
	}
}

// latencies records per-call round trips (preallocated: no allocation in the
// timed loop) and reports the median as the p50-ns metric.
type latencies struct{ d []time.Duration }

func newLatencies(n int) *latencies { return &latencies{d: make([]time.Duration, 0, max(n, 1<<16))} }

func (l *latencies) add(d time.Duration) {
	if len(l.d) < cap(l.d) {
		l.d = append(l.d, d)
	}
}

func (l *latencies) report(b *testing.B) {
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	b.ReportMetric(float64(l.d[len(l.d)/2].Nanoseconds()), "p50-ns")
}

// BenchmarkCodecs reports allocations per call, client and server together,
// for each codec on a small message.
func BenchmarkCodecs(b *testing.B) {
	s := echoServer()
	HandleJSON(s, "json", func(ctx context.Context, r serviceAddr) (serviceAddr, error) { return r, nil })
	HandleProto(s, "proto", func(ctx context.Context, r *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) { return r, nil })
	c := dial(b, startServer(b, s))
	ctx := context.Background()
	b.Run("raw", func(b *testing.B) {
		p, dst := make([]byte, 64), make([]byte, 0, 64)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.CallRaw(ctx, "echo", p, dst[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-cancelable", func(b *testing.B) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		p, dst := make([]byte, 64), make([]byte, 0, 64)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.CallRaw(ctx, "echo", p, dst[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		in, out := serviceAddr{Host: "1.2.3.4", Port: 8765}, serviceAddr{}
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Call(ctx, "json", in, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		in, out := wrapperspb.Bytes(make([]byte, 64)), &wrapperspb.BytesValue{}
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Call(ctx, "proto", in, out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStream measures one server stream of b.N items, client reading as
// fast as it can (with stream credit: the grants are part of the cost).
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(sizeName(size), func(b *testing.B) {
			s := NewServer(ServerOptions{})
			item := make([]byte, size)
			s.HandleRawStream("items", func(ctx context.Context, req []byte, send func([]byte) error) error {
				n := int(binary.LittleEndian.Uint64(req))
				for range n {
					if err := send(item); err != nil {
						return err
					}
				}
				return nil
			})
			c := dial(b, startServer(b, s))
			req := binary.LittleEndian.AppendUint64(nil, uint64(b.N))
			b.SetBytes(int64(size))
			b.ResetTimer()
			st, err := c.Stream(context.Background(), "items", req)
			if err != nil {
				b.Fatal(err)
			}
			for range b.N {
				if it, err := st.RecvRaw(); err != nil || len(it) != size {
					b.Fatal(err)
				}
			}
			if _, err := st.RecvRaw(); err != io.EOF {
				b.Fatal(err)
			}
		})
	}
}
