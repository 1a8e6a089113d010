package socklist

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/rpc"
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
	httpish := listen(t, filepath.Join(dir, "http.sock"), func(c net.Conn) {
		c.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n"))
		c.Close()
	})
	silent := listen(t, filepath.Join(dir, "silent.sock"), func(c net.Conn) {})
	_, _ = httpish, silent

	snap, err := List(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	socks := snap.Select(Filter{Listening: true, Glob: filepath.Join(dir, "*")})
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
	WriteTable(&b, socks)
	if !strings.Contains(b.String(), "; udskit, shm 1 region ") || !strings.Contains(b.String(), "full (") || !strings.Contains(b.String(), "0 waits") {
		t.Fatalf("table lacks the shared-memory summary:\n%s", b.String())
	}
	if strings.Count(b.String(), "udskit") != 1 {
		t.Fatalf("table names other servers udskit:\n%s", b.String())
	}
}

// listen serves path with handle on each connection until the test ends.
func listen(t *testing.T, path string, handle func(net.Conn)) net.Listener {
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
	socks := []Socket{
		{Path: "/run/nothing-here/activated.sock", Type: "stream", State: StateListening, Procs: []Proc{{1, "systemd"}}},
		{Path: "/run/nothing-here/conn.sock", Type: "stream", State: StateConnected},
		{Type: "stream", State: StateListening},
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

// TestUdskitSummary: the words of each state.
func TestUdskitSummary(t *testing.T) {
	on := func(sh rpc.ShmServerStats) *Udskit {
		sh.Enabled = true
		return &Udskit{Stats: &rpc.ServerStats{Conns: 1, Shm: sh}}
	}
	for _, c := range []struct {
		u    *Udskit
		want string
	}{
		{nil, ""},
		{&Udskit{Error: "no statistics: x"}, "udskit (no statistics: x)"},
		{&Udskit{Stats: &rpc.ServerStats{}}, "udskit, shm off"},
		{on(rpc.ShmServerStats{Waits: 1}), "udskit, shm on (no regions), 1 wait"},
		{on(rpc.ShmServerStats{Conns: 2, InUse: 8 << 20, Capacity: 64 << 20, Waits: 3}), "udskit, shm 2 regions 13% full (8 MiB of 64 MiB), 3 waits"},
		{on(rpc.ShmServerStats{Conns: 1, InUse: 300 << 10, Capacity: 32 << 20}), "udskit, shm 1 region <1% full (300 KiB of 32 MiB), 0 waits"},
		{on(rpc.ShmServerStats{Conns: 1, InUse: 1536 << 10, Capacity: 32 << 20}), "udskit, shm 1 region 5% full (1.5 MiB of 32 MiB), 0 waits"},
	} {
		if got := UdskitSummary(c.u); got != c.want {
			t.Errorf("UdskitSummary(%+v) = %q, want %q", c.u, got, c.want)
		}
	}
}
