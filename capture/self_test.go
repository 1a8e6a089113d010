package capture

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/pcapng"
	"github.com/udskit/udskit/proxy"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// TestRPCRecordsItsOwnTraffic: mode 3. A server and a client each record
// their own connections (WrapConn); the comments name the calls, and the
// udskit dissector decodes the capture.
func TestRPCRecordsItsOwnTraffic(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	addr := filepath.Join(dir, "self.sock")
	file := filepath.Join(dir, "self.pcapng")
	w, closeOut, err := CreatePcap(file, OutputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sink := NewPcapSink(w, PcapOptions{})
	s := rpc.NewServer(rpc.ServerOptions{WrapConn: ServerWrap(sink, addr)})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	c, err := rpc.Dial(context.Background(), addr, rpc.ClientOptions{Conns: 1, WrapConn: ClientWrap(sink, addr+" (client)")})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	if err := c.Call(context.Background(), "echo", []byte("ping"), &out); err != nil || string(out) != "ping" {
		t.Fatalf("call: %q %v", out, err)
	}
	if err := c.Call(context.Background(), "nope", []byte("x"), &out); err == nil {
		t.Fatal("unknown method succeeded")
	}
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	s.Shutdown(ctx)
	cancel()
	if err := closeOut(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(file)
	_, _, comments := streamBytes(t, b)
	all := strings.Join(comments, "\n")
	for _, want := range []string{`request id=1 method="echo"`, "response id=1", `request id=2 method="nope"`, "error id=2 code=12 unimplemented", "recorded by the process itself"} {
		if !strings.Contains(all, want) {
			t.Errorf("comments lack %q:\n%s", want, all)
		}
	}
	// Both ends recorded: each call shows up twice, on two interfaces.
	got := tsharkLua(t, file, "-Y", "udskit.method", "-T", "fields", "-e", "frame.interface_name", "-e", "udskit.id", "-e", "udskit.method")
	if strings.Count(got, "\t1\techo") != 2 || strings.Count(got, "\t2\tnope") != 2 {
		t.Fatalf("tshark:\n%s", got)
	}
}

// TestProxyTapRecords: mode 2 at the library level: a unix -> unix proxy
// with the tap records both directions exactly, half-close included.
func TestProxyTapRecords(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	up, _ := echoServer(t, dir, "up.sock")
	front := filepath.Join(dir, "front.sock")
	out, sink := newPcap(t)
	p, err := proxy.Listen(context.Background(), []proxy.Route{{Listen: front, To: up}}, proxy.Options{Tap: ProxyTap(sink), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve()
	msg := bytes.Repeat([]byte("tapped "), 50_000)
	if err := roundTrip(front, msg); err != nil {
		t.Fatal(err)
	}
	// Drain, not Close: the client has its echo and EOF, but the proxy may
	// still be finishing the connection (recording its FINs); Close would
	// cut it and record a reset.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	c2s, s2c, comments := streamBytes(t, out.Bytes())
	if !bytes.Equal(c2s, msg) || !bytes.Equal(s2c, msg) {
		t.Fatalf("recorded %d/%d bytes, want %d", len(c2s), len(s2c), len(msg))
	}
	if len(comments) == 0 || !strings.Contains(comments[0], "udskit proxy "+front) {
		t.Fatalf("comments %q", comments)
	}
	// The FIN of each side is in the capture (a clean close, no reset).
	r := pcapng.NewReader(bytes.NewReader(out.Bytes()))
	fins, rsts := 0, 0
	for {
		pk, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		fl := pk.Data[33]
		fins += int(fl & 1)
		rsts += int(fl >> 2 & 1)
	}
	if fins != 2 || rsts != 0 {
		t.Fatalf("%d FINs and %d RSTs, want 2 and 0", fins, rsts)
	}
}
