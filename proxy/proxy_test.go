package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// sockDir is a short temp dir for socket paths (sun_path is 108 bytes).
func sockDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "udsp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// serve runs handler for every conn accepted on addr until the test ends.
func serve(t *testing.T, addr string, handler func(net.Conn)) uds.Addr {
	t.Helper()
	l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
	if err != nil {
		t.Fatalf("upstream listen %s: %v", addr, err)
	}
	testutil.Serve(t, l, handler)
	return bound(l)
}

func bound(l *uds.Listener) uds.Addr {
	if ta, ok := l.Addr().(*net.TCPAddr); ok {
		return uds.Addr{Kind: uds.TCP, Name: ta.String()}
	}
	return l.UAddr()
}

// digestServer reads to EOF, then answers "<bytes> <sha256>\n" and closes:
// it only works if the proxy forwards the client's half-close.
func digestServer(c net.Conn) {
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil {
		fmt.Fprintf(c, "error %v\n", err)
		return
	}
	fmt.Fprintf(c, "%d %s\n", n, hex.EncodeToString(h.Sum(nil)))
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return fmt.Sprintf("%d %s\n", len(b), hex.EncodeToString(s[:]))
}

// startProxy runs a proxy for routes and returns it with its log.
func startProxy(t *testing.T, routes []Route, opts Options) (*Proxy, *testutil.Buffer) {
	t.Helper()
	lb := &testutil.Buffer{}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p, err := Listen(context.Background(), routes, opts)
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve() }()
	t.Cleanup(func() {
		p.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Serve did not return after Close")
		}
	})
	return p, lb
}

func dial(t *testing.T, a uds.Addr) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := uds.Dial(ctx, a.String(), uds.DialOptions{})
	if err != nil {
		t.Fatalf("dial %s: %v", a, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1, 2, 3})
	r.Read(b)
	return b
}

// sendCloseRead writes payload, half-closes, and reads the whole reply.
func sendCloseRead(t *testing.T, c net.Conn, payload []byte) string {
	t.Helper()
	reply, err := writeCloseRead(c, payload)
	if err != nil {
		t.Fatal(err)
	}
	return string(reply)
}

// writeCloseRead is sendCloseRead for any goroutine: it returns errors.
func writeCloseRead(c net.Conn, payload []byte) ([]byte, error) {
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		errc <- err
	}()
	reply, err := io.ReadAll(c)
	if err != nil {
		return nil, fmt.Errorf("read reply: %w", err)
	}
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	return reply, nil
}

// TestDirections sends 8 MiB, half-closes and checks the digest reply in every
// listen/upstream combination, on the splice path and the copy path.
func TestDirections(t *testing.T) {
	payload := randomBytes(8 << 20)
	want := digest(payload)
	kinds := []string{"tcp", "unix", "abstract"}
	addrFor := func(t *testing.T, kind, name string) string {
		switch kind {
		case "tcp":
			return "tcp:127.0.0.1:0"
		case "unix":
			return filepath.Join(sockDir(t), name+".sock")
		default:
			return fmt.Sprintf("@udskit-test-%d-%s", rand.Int64(), name)
		}
	}
	for _, from := range kinds {
		for _, to := range kinds {
			for _, noSplice := range []bool{false, true} {
				name := from + "->" + to
				if noSplice {
					name += "/copy"
				}
				t.Run(name, func(t *testing.T) {
					up := serve(t, addrFor(t, to, "up"), digestServer)
					p, _ := startProxy(t, []Route{{Listen: addrFor(t, from, "px"), To: up.String()}}, Options{NoSplice: noSplice})
					c := dial(t, p.Addrs()[0])
					if got := sendCloseRead(t, c, payload); got != want {
						t.Fatalf("reply %q, want %q", got, want)
					}
				})
			}
		}
	}
}

// TestHalfCloseFromServer: the upstream sends a reply and half-closes first;
// the client sees EOF yet can keep sending, and the upstream receives it all.
func TestHalfCloseFromServer(t *testing.T) {
	banner := randomBytes(3 << 20)
	got := make(chan string, 1)
	up := serve(t, filepath.Join(sockDir(t), "up.sock"), func(c net.Conn) {
		c.Write(banner)
		c.(*uds.Conn).NetConn().(*net.UnixConn).CloseWrite()
		b, err := io.ReadAll(c)
		if err != nil {
			got <- "error " + err.Error()
			return
		}
		got <- digest(b)
	})
	p, _ := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: up.String()}}, Options{})
	c := dial(t, p.Addrs()[0])
	b, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(b, banner) {
		t.Fatalf("banner: %d bytes (want %d), err %v", len(b), len(banner), err)
	}
	later := randomBytes(1 << 20)
	if _, err := c.Write(later); err != nil {
		t.Fatalf("write after EOF from server: %v", err)
	}
	c.(*net.TCPConn).CloseWrite()
	select {
	case g := <-got:
		if g != digest(later) {
			t.Fatalf("upstream got %q, want %q", g, digest(later))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("upstream never saw the client's data and EOF")
	}
}

// TestTailBytes: the upstream writes a large burst and closes at once; every
// byte must still reach the client.
func TestTailBytes(t *testing.T) {
	burst := randomBytes(5<<20 + 17)
	up := serve(t, "tcp:127.0.0.1:0", func(c net.Conn) { c.Write(burst) })
	p, _ := startProxy(t, []Route{{Listen: filepath.Join(sockDir(t), "px.sock"), To: up.String()}}, Options{})
	c := dial(t, p.Addrs()[0])
	b, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(b, burst) {
		t.Fatalf("got %d bytes (want %d), err %v", len(b), len(burst), err)
	}
}

// echo copies back whatever it reads.
func echo(c net.Conn) { io.Copy(c, c) }

func roundTrip(c net.Conn, msg string) (string, error) {
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func TestLogLineHasPeerAndBytes(t *testing.T) {
	up := serve(t, "tcp:127.0.0.1:0", echo)
	p, lb := startProxy(t, []Route{{Listen: filepath.Join(sockDir(t), "px.sock"), To: up.String()}}, Options{})
	c := dial(t, p.Addrs()[0])
	if got, err := roundTrip(c, "hello proxy"); err != nil || got != "hello proxy" {
		t.Fatalf("round trip: %q %v", got, err)
	}
	c.Close()
	testutil.WaitFor(t, `strings.Contains(lb.String(), "bytes_out=11")`, func() bool { return strings.Contains(lb.String(), "bytes_out=11") })
	line := lb.String()
	for _, want := range []string{
		"msg=\"proxy conn\"", fmt.Sprintf("peer_pid=%d", os.Getpid()), fmt.Sprintf("peer_uid=%d", os.Getuid()),
		"peer_comm=", "bytes_in=11", "bytes_out=11", "duration=",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("log line lacks %q:\n%s", want, line)
		}
	}
	if s := p.Stats(); s.Total != 1 || s.BytesIn != 11 || s.BytesOut != 11 {
		t.Errorf("stats %+v", s)
	}
}

// TestMaxConns: by default a connection over MaxConns is closed at once,
// as by every udskit server (uds.Server).
func TestMaxConns(t *testing.T) {
	up := serve(t, "tcp:127.0.0.1:0", echo)
	p, _ := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: up.String()}}, Options{MaxConns: 1})
	c1 := dial(t, p.Addrs()[0])
	if _, err := roundTrip(c1, "one"); err != nil {
		t.Fatal(err)
	}
	c2 := dial(t, p.Addrs()[0])
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c2.Read(make([]byte, 3)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("second conn while the first is open: n=%d err=%v, want it closed", n, err)
	}
	if _, err := roundTrip(c1, "one"); err != nil {
		t.Fatalf("the first conn after the second was refused: %v", err)
	}
}

// TestMaxConnsBacklog: with uds.BacklogWhenFull the proxy stops accepting
// at MaxConns and serves the waiting connection once one ends.
func TestMaxConnsBacklog(t *testing.T) {
	up := serve(t, "tcp:127.0.0.1:0", echo)
	p, _ := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: up.String()}}, Options{MaxConns: 1, WhenFull: uds.BacklogWhenFull})
	c1 := dial(t, p.Addrs()[0])
	if _, err := roundTrip(c1, "one"); err != nil {
		t.Fatal(err)
	}
	c2 := dial(t, p.Addrs()[0]) // sits in the listen backlog
	io.WriteString(c2, "two")
	c2.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c2.Read(make([]byte, 3)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("second conn served while the first is open (n=%d err=%v)", n, err)
	}
	c1.Close()
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(c2, buf); err != nil || string(buf) != "two" {
		t.Fatalf("second conn after the first closed: %q %v", buf, err)
	}
}

func TestIdleTimeout(t *testing.T) {
	up := serve(t, "tcp:127.0.0.1:0", echo)
	p, lb := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: up.String()}}, Options{IdleTimeout: 300 * time.Millisecond})
	c := dial(t, p.Addrs()[0])
	// Activity keeps it open past the timeout...
	for i := range 6 {
		if _, err := roundTrip(c, "tick"); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// ...silence closes it.
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	if err != io.EOF {
		t.Fatalf("idle conn: read err %v, want EOF", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("closed after %v", d)
	}
	testutil.WaitFor(t, `strings.Contains(lb.String(), "idle timeout")`, func() bool { return strings.Contains(lb.String(), "idle timeout") })
}

func TestShutdownDrains(t *testing.T) {
	up := serve(t, "tcp:127.0.0.1:0", echo)
	p, _ := startProxy(t, []Route{{Listen: filepath.Join(sockDir(t), "px.sock"), To: up.String()}}, Options{})
	addr := p.Addrs()[0]
	c := dial(t, addr)
	if _, err := roundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- p.Shutdown(ctx)
	}()
	// New clients are turned away (the socket file is gone)...
	testutil.WaitFor(t, "the socket file removed by Shutdown", func() bool {
		_, err := os.Stat(addr.Name)
		return errors.Is(err, os.ErrNotExist)
	})
	// ...while the open one keeps working.
	if got, err := roundTrip(c, "during drain"); err != nil || got != "during drain" {
		t.Fatalf("during drain: %q %v", got, err)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a connection open", err)
	case <-time.After(100 * time.Millisecond):
	}
	c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the last connection closed")
	}
}

func TestShutdownDrainTimeout(t *testing.T) {
	up := serve(t, "tcp:127.0.0.1:0", echo)
	p, lb := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: up.String()}}, Options{})
	c := dial(t, p.Addrs()[0])
	if _, err := roundTrip(c, "x"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := p.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want deadline exceeded", err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("conn still open after the drain timeout")
	}
	testutil.WaitFor(t, `strings.Contains(lb.String(), "closed by proxy shutdown")`, func() bool { return strings.Contains(lb.String(), "closed by proxy shutdown") })
}

func TestPolicyRefuses(t *testing.T) {
	up := serve(t, "tcp:127.0.0.1:0", echo)
	other := uint32(os.Getuid()) + 4242
	p, _ := startProxy(t, []Route{{Listen: filepath.Join(sockDir(t), "px.sock"), To: up.String()}},
		Options{Listen: uds.ListenOptions{Policy: uds.AllowUIDs(other)}})
	c := dial(t, p.Addrs()[0])
	if _, err := roundTrip(c, "let me in"); err == nil {
		t.Fatal("peer with a uid outside the policy was proxied")
	}
	if s := p.Stats(); s.Total != 0 {
		t.Fatalf("refused peer counted as a connection: %+v", s)
	}
}

func TestPolicyOnTCPIsAnError(t *testing.T) {
	_, err := Listen(context.Background(), []Route{{Listen: "tcp:127.0.0.1:0", To: "/nonexistent.sock"}},
		Options{Listen: uds.ListenOptions{Policy: uds.AllowRoot()}})
	if !errors.Is(err, uds.ErrPolicyOnTCP) || strings.Count(err.Error(), "listen") != 1 {
		t.Fatalf("err = %v, want uds.ErrPolicyOnTCP naming the address once", err)
	}
}

func TestUpstreamDownClosesClient(t *testing.T) {
	dir := sockDir(t)
	p, lb := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: filepath.Join(dir, "absent.sock")}}, Options{})
	c := dial(t, p.Addrs()[0])
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("client not closed when the upstream is down")
	}
	testutil.WaitFor(t, `strings.Contains(lb.String(), "upstream dial failed")`, func() bool { return strings.Contains(lb.String(), "upstream dial failed") })
	if p.Stats().Failed != 1 {
		t.Fatalf("stats %+v", p.Stats())
	}
}

func TestWaitForUpstream(t *testing.T) {
	dir := sockDir(t)
	upPath := filepath.Join(dir, "late.sock")
	p, _ := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: upPath}}, Options{Wait: true, DialTimeout: 10 * time.Second})
	c := dial(t, p.Addrs()[0])
	time.Sleep(200 * time.Millisecond)
	serve(t, upPath, echo)
	if got, err := roundTrip(c, "late"); err != nil || got != "late" {
		t.Fatalf("round trip via a late upstream: %q %v", got, err)
	}
}

func TestSeveralRoutes(t *testing.T) {
	upA := serve(t, "tcp:127.0.0.1:0", func(c net.Conn) { io.WriteString(c, "A") })
	upB := serve(t, filepath.Join(sockDir(t), "b.sock"), func(c net.Conn) { io.WriteString(c, "B") })
	p, _ := startProxy(t, []Route{
		{Listen: filepath.Join(sockDir(t), "a.sock"), To: upA.String()},
		{Listen: "tcp:127.0.0.1:0", To: upB.String()},
	}, Options{})
	for i, want := range []string{"A", "B"} {
		b, err := io.ReadAll(dial(t, p.Addrs()[i]))
		if err != nil || string(b) != want {
			t.Fatalf("route %d: %q %v", i, b, err)
		}
	}
}

func TestPairRoutes(t *testing.T) {
	if _, err := PairRoutes([]string{"a.sock", "b.sock"}, []string{"tcp:127.0.0.1:1"}); err == nil {
		t.Fatal("mismatched lists accepted")
	} else if !strings.Contains(err.Error(), "2 listen address(es) but 1 upstream") {
		t.Fatalf("unclear error: %v", err)
	}
	if _, err := PairRoutes([]string{"udp:1.2.3.4:5"}, []string{"x.sock"}); err == nil {
		t.Fatal("bad address accepted")
	}
	r, err := PairRoutes([]string{"a.sock", "127.0.0.1:9"}, []string{"tcp:127.0.0.1:1", "@b"})
	if err != nil || len(r) != 2 || r[1].To != "@b" {
		t.Fatalf("%v %v", r, err)
	}
}

// TestSpliceUsedOnLinux makes sure the fast path is really taken for plain sockets.
func TestJoinReportsSplice(t *testing.T) {
	type pairFunc func(*testing.T) (net.Conn, net.Conn)
	for _, tc := range []struct {
		name       string
		a, b       pairFunc // Join(a's server end, b's client end)
		opts       JoinOptions
		atob, btoa bool // on Linux
	}{
		{"tcp-tcp", tcpPair, tcpPair, JoinOptions{}, true, true},
		{"unix-unix", unixPair, unixPair, JoinOptions{}, true, true},
		{"tcp-unix", tcpPair, unixPair, JoinOptions{}, true, false},
		{"unix-tcp", unixPair, tcpPair, JoinOptions{}, false, true},
		{"unix-tcp forced", unixPair, tcpPair, JoinOptions{SpliceUnixToTCP: true}, true, true},
		{"no splice", tcpPair, unixPair, JoinOptions{NoSplice: true}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a1, a2 := tc.a(t)
			b1, b2 := tc.b(t)
			done := make(chan JoinResult, 1)
			go func() { done <- Join(context.Background(), a2, b1, tc.opts) }()
			// Bulk both ways so the splice path (not only small reads) runs.
			big := randomBytes(1 << 20)
			go func() { a1.Write(big); a1.(interface{ CloseWrite() error }).CloseWrite() }()
			go func() { b2.Write(big); b2.(interface{ CloseWrite() error }).CloseWrite() }()
			gotB, errB := io.ReadAll(b2)
			gotA, errA := io.ReadAll(a1)
			if errA != nil || errB != nil || !bytes.Equal(gotA, big) || !bytes.Equal(gotB, big) {
				t.Fatalf("a got %d bytes (%v), b got %d bytes (%v), want %d each", len(gotA), errA, len(gotB), errB, len(big))
			}
			res := <-done
			want := [2]bool{tc.atob && canSplice(a2), tc.btoa && canSplice(a2)}
			if got := [2]bool{res.SplicedAtoB, res.SplicedBtoA}; got != want {
				t.Fatalf("spliced a->b, b->a = %v, want %v", got, want)
			}
			if res.AtoB != int64(len(big)) || res.BtoA != int64(len(big)) || res.Err != nil {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

func tcpPair(t *testing.T) (net.Conn, net.Conn)  { return testutil.Pair(t, "tcp") }
func unixPair(t *testing.T) (net.Conn, net.Conn) { return testutil.Pair(t, "unix") }
