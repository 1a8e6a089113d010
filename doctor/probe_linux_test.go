package doctor

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/socklist"
	"github.com/udskit/udskit/uds"
)

// TestProbeUdskit: among a udskit server (a Go client using its shared
// memory), an HTTP-like server and one that never answers, ProbeUdskit
// finds the udskit server's statistics and leaves the others alone, within
// its timeout; the table and JSON show them.
func TestProbeUdskit(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	l, err := uds.Listen(ctx, "unix:"+filepath.Join(dir, "app.sock"), uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := rpc.NewServer(rpc.ServerOptions{})
	srv.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	go srv.Serve(l)
	defer srv.Close()
	c, err := rpc.Dial(ctx, l.Addr().String(), rpc.ClientOptions{Conns: 1, LargeConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := bytes.Repeat([]byte("x"), 64<<10)
	for range 2 {
		if _, err := c.CallRaw(ctx, "echo", req, nil); err != nil {
			t.Fatal(err)
		}
	}

	// A server that speaks first and closes, and one that never answers.
	httpish := probeListen(t, filepath.Join(dir, "http.sock"), func(c net.Conn) {
		c.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n"))
		c.Close()
	})
	silent := probeListen(t, filepath.Join(dir, "silent.sock"), func(c net.Conn) {})
	_, _ = httpish, silent

	snap, err := socklist.List(ctx, socklist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	socks := snap.Select(socklist.Filter{Listening: true, Glob: filepath.Join(dir, "*")})
	if len(socks) != 3 {
		t.Fatalf("%d listeners in %s, want 3: %+v", len(socks), dir, socks)
	}
	start := time.Now()
	notes := ProbeUdskit(ctx, socks, ProbeOptions{Timeout: 500 * time.Millisecond})
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the probe took %v", took)
	}
	if len(notes) != 0 {
		t.Fatalf("notes %q", notes)
	}
	for _, s := range socks {
		switch filepath.Base(s.Path) {
		case "app.sock":
			if s.Udskit == nil || s.Udskit.Stats == nil {
				t.Fatalf("app.sock: %+v, want its statistics", s.Udskit)
			}
			st := s.Udskit.Stats
			if st.Conns != 2 || !st.Shm.Enabled || st.Shm.Conns != 1 || st.Shm.Sent != 2 || st.Shm.Received != 2 || st.Shm.Capacity == 0 {
				t.Fatalf("app.sock stats %+v: want 2 connections (the client's and the probe's), 1 region, 2 payloads each way", st)
			}
		default:
			if s.Udskit != nil {
				t.Fatalf("%s is no udskit server, got %+v", s.Path, s.Udskit)
			}
		}
	}
	var b bytes.Buffer
	socklist.WriteTable(&b, socks)
	if !strings.Contains(b.String(), "; udskit, shm 1 region ") || !strings.Contains(b.String(), "full (") || !strings.Contains(b.String(), "0 waits") {
		t.Fatalf("table lacks the shared-memory summary:\n%s", b.String())
	}
	if strings.Count(b.String(), "udskit") != 1 {
		t.Fatalf("table names other servers udskit:\n%s", b.String())
	}
}

// probeListen serves path with handle on each connection until the test ends.
func probeListen(t *testing.T, path string, handle func(net.Conn)) net.Listener {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			handle(c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return l
}

// TestProbeSkipsInit: a socket held by pid 1 (systemd socket activation)
// is not connected to; the note names it. Connections and unnamed sockets
// are not probed either.
func TestProbeSkipsInit(t *testing.T) {
	socks := []socklist.Socket{
		{Path: "/run/nothing-here/activated.sock", Type: "stream", State: socklist.StateListening, Procs: []socklist.Proc{{PID: 1, Command: "systemd"}}},
		{Path: "/run/nothing-here/conn.sock", Type: "stream", State: socklist.StateConnected},
		{Type: "stream", State: socklist.StateListening},
	}
	notes := ProbeUdskit(context.Background(), socks, ProbeOptions{})
	if len(notes) != 1 || !strings.Contains(notes[0], "/run/nothing-here/activated.sock") || !strings.Contains(notes[0], "socket activation") {
		t.Fatalf("notes %q", notes)
	}
	for _, s := range socks {
		if s.Udskit != nil {
			t.Fatalf("%+v probed", s)
		}
	}
}
