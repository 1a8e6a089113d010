package rpc

import (
	"bytes"
	"context"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testutil"
)

// hostileServer listens on a fresh socket and runs serve on each accepted
// connection (until the test ends).
func hostileServer(t *testing.T, serve func(c net.Conn)) string {
	t.Helper()
	path := filepath.Join(testutil.ShortDir(t, 0o700), "h.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go serve(c)
		}
	}()
	return "unix:" + path
}

// serverHello is a server's hello.
func serverHello() []byte {
	var b [frame.HelloSize]byte
	h := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit, MaxFrame: frame.DefaultMaxFrame, MaxInFlight: frame.DefaultMaxInFlight}
	h.Put(b[:])
	return b[:]
}

// within fails unless f returns within d + 3 s: the slack is for a loaded
// 2-core machine under -race (658 ms was seen against a 500 ms deadline, and
// 2.05 s at -cpu 1 with the rpc package's other tests' goroutines still
// winding down); the hangs this guards against lasted 40 s.
func within(t *testing.T, what string, d time.Duration, f func() error) error {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if el := time.Since(start); el > d+3*time.Second {
			t.Errorf("%s returned after %v, want within %v + 3 s (err %v)", what, el.Round(time.Millisecond), d, err)
		}
		return err
	case <-time.After(d + 10*time.Second):
		t.Fatalf("%s still running %v after its %v deadline", what, 10*time.Second, d)
		return nil
	}
}

// TestClientDeadlinesAgainstHostileServers: every blocking step of Dial and
// a call (connect, hello, send, wait, read) ends by the caller's deadline,
// whatever the server does: stops reading, sends only (1 MiB) pings, never
// says hello, or dribbles a frame (a 16 MiB header, then a byte at a time;
// `udskit call --timeout 2s` hung 40 s in it), and the client's memory stays
// bounded.
func TestClientDeadlinesAgainstHostileServers(t *testing.T) {
	const timeout = 500 * time.Millisecond
	ended := make(chan struct{}) // the servers' goroutines end with the test
	t.Cleanup(func() { close(ended) })
	afterHello := func(then func(c net.Conn)) func(c net.Conn) {
		return func(c net.Conn) {
			if _, err := io.ReadFull(c, make([]byte, frame.HelloSize)); err != nil {
				return
			}
			c.Write(serverHello())
			then(c)
		}
	}
	cases := []struct {
		name  string
		serve func(c net.Conn)
		req   int // request payload size
	}{
		{"stops reading", afterHello(func(c net.Conn) { <-ended }), 16 << 20},
		{"pings only (1 MiB)", afterHello(func(c net.Conn) {
			p := bytes.Repeat([]byte("p"), 1<<20)
			h := frame.Header{Type: frame.TypePing, PayloadLen: uint32(len(p))}
			ping := append(h.Append(nil), p...)
			go io.Copy(io.Discard, io.LimitReader(c, 64<<10)) // then stop reading
			for {
				if _, err := c.Write(ping); err != nil {
					return
				}
			}
		}), 10},
		{"dribbles a frame", afterHello(func(c net.Conn) {
			r := frame.NewReader(c, 64<<10)
			h, err := r.ReadHeader()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, c)
			resp := frame.Header{Type: frame.TypeResponse, ID: h.ID, PayloadLen: 16 << 20}
			c.Write(resp.Append(nil))
			for {
				time.Sleep(20 * time.Millisecond)
				if _, err := c.Write([]byte("d")); err != nil {
					return
				}
			}
		}), 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := hostileServer(t, tc.serve)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			c, err := Dial(ctx, addr, ClientOptions{NoReconnect: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				err := within(t, "call", timeout, func() error {
					_, err := c.CallRaw(ctx, "echo", make([]byte, tc.req), nil)
					return err
				})
				cancel()
				if err == nil {
					t.Fatalf("call %d succeeded against a server that %s", i, tc.name)
				}
			}
			within(t, "Close", timeout, c.Close)
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if grown := int64(after.HeapInuse) - int64(before.HeapInuse); grown > 128<<20 {
				t.Errorf("client heap grew %d MiB", grown>>20)
			}
		})
	}
	t.Run("never says hello", func(t *testing.T) {
		addr := hostileServer(t, func(c net.Conn) { io.Copy(io.Discard, c) })
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		err := within(t, "Dial", timeout, func() error {
			c, err := Dial(ctx, addr, ClientOptions{NoReconnect: true})
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			t.Fatal("Dial succeeded against a server that never says hello")
		}
	})
}
