package main

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testutil"
)

// TestCallTimeoutAgainstHostileServers: `udskit call --timeout 1s` exits
// (with an error) within its timeout against a server that never says hello,
// one that stops reading a large request, one that only sends 1 MiB pings,
// and one that dribbles its response (a 16 MiB header, then a byte at a
// time: the CLI hung 40 s in it with --timeout 2s). The process's start-up
// is allowed on top.
func TestCallTimeoutAgainstHostileServers(t *testing.T) {
	ended := make(chan struct{}) // the servers' goroutines end with the test
	t.Cleanup(func() { close(ended) })
	hello := func() []byte {
		var b [frame.HelloSize]byte
		h := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit, MaxFrame: frame.DefaultMaxFrame, MaxInFlight: frame.DefaultMaxInFlight}
		h.Put(b[:])
		return b[:]
	}
	afterHello := func(then func(c net.Conn)) func(c net.Conn) {
		return func(c net.Conn) {
			if _, err := io.ReadFull(c, make([]byte, frame.HelloSize)); err != nil {
				return
			}
			c.Write(hello())
			then(c)
		}
	}
	cases := []struct {
		name  string
		stdin string // --raw request (large for the server that stops reading)
		serve func(c net.Conn)
	}{
		{"never says hello", "x", func(c net.Conn) { io.Copy(io.Discard, c) }},
		{"stops reading", string(bytes.Repeat([]byte("s"), 12<<20)), afterHello(func(c net.Conn) { <-ended })},
		{"pings only (1 MiB)", "x", afterHello(func(c net.Conn) {
			p := bytes.Repeat([]byte("p"), 1<<20)
			h := frame.Header{Type: frame.TypePing, PayloadLen: uint32(len(p))}
			ping := append(h.Append(nil), p...)
			go io.Copy(io.Discard, io.LimitReader(c, 64<<10))
			for {
				if _, err := c.Write(ping); err != nil {
					return
				}
			}
		})},
		{"dribbles a response", "x", afterHello(func(c net.Conn) {
			r := frame.NewReader(c, 64<<10)
			h, err := r.ReadHeader()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, c)
			resp := frame.Header{Type: frame.TypeResponse, ID: h.ID, PayloadLen: 16 << 20}
			c.Write(resp.Append(nil))
			for {
				time.Sleep(50 * time.Millisecond)
				if _, err := c.Write([]byte("d")); err != nil {
					return
				}
			}
		})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(testutil.ShortDir(t, 0o700), "h.sock")
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					defer c.Close()
					go tc.serve(c)
				}
			}()
			// The process's start, its reading of stdin and its exit, timed
			// now with the same stdin against a path with no socket (it
			// fails at once): a -race binary reading 12 MiB on 2 loaded cores
			// took 1.3 s more than the timeout.
			// Timed before and after the call, the larger counts: in a
			// clean-clone CI run (the whole -race suite on 2 cores) the call
			// took 3.1 s against an overhead of 0.6 s timed before it.
			noSocket := func() time.Duration {
				start := time.Now()
				if r := scRun(t, tc.stdin, "call", "--timeout", "1s", "--raw", path+".none", "echo"); r.code == 0 {
					t.Fatalf("call to a missing socket succeeded: %q", r.stdout)
				}
				return time.Since(start)
			}
			overhead := noSocket()
			start := time.Now()
			r := scRun(t, tc.stdin, "call", "--timeout", "1s", "--raw", path, "echo")
			el := time.Since(start)
			if r.code == 0 {
				t.Fatalf("call succeeded against a server that %s: %q", tc.name, r.stdout)
			}
			overhead = max(overhead, noSocket())
			// 1 s, + 100 ms, + that overhead, + 2 s (the hang was 40 s).
			if el > 1100*time.Millisecond+overhead+2*time.Second {
				t.Errorf("udskit call --timeout 1s took %v against a server that %s, the process's own overhead %v (stderr %q)", el.Round(time.Millisecond), tc.name, overhead.Round(time.Millisecond), r.stderr)
			}
			t.Logf("%v (overhead %v): %s", el.Round(time.Millisecond), overhead.Round(time.Millisecond), r.stderr)
		})
	}
}
