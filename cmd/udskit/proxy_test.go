package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// These tests run the real CLI (the test binary re-executed as udskit, see
// scCLI in servecall_test.go) against echo servers on sockets in temp dirs.

// pxEcho serves an echo on a unix socket in a short temp dir and returns its path.
func pxEcho(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(testutil.ShortDir(t, 0o700), "echo.sock")
	testutil.Serve(t, testutil.ListenUnix(t, sock), testutil.Echo)
	return sock
}

type pxProc struct {
	stderr  *testutil.Buffer
	done    chan error
	signal  func(os.Signal)
	listens []string // resolved listen addresses, in route order
}

var pxListening = regexp.MustCompile(`msg="proxy listening" listen=(\S+)`)

// pxStart runs `udskit proxy args...` and waits for one "proxy listening"
// line per route.
func pxStart(t *testing.T, routes int, args ...string) *pxProc {
	t.Helper()
	cmd := scCLI(context.Background(), append([]string{"proxy"}, args...)...)
	p := &pxProc{stderr: &testutil.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.signal = func(s os.Signal) { cmd.Process.Signal(s) }
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := pxListening.FindAllStringSubmatch(p.stderr.String(), -1)
		if len(m) >= routes {
			for _, x := range m {
				p.listens = append(p.listens, x[1])
			}
			return p
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("proxy exited (%v) before listening:\n%s", err, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy not listening after 20s:\n%s", p.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wait returns the exit error, failing the test if the proxy runs on past d.
func (p *pxProc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for Cleanup
		return err
	case <-time.After(d):
		t.Fatalf("proxy still running after %v:\n%s", d, p.stderr)
	}
	return nil
}

func pxDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	network, a := "unix", strings.TrimPrefix(addr, "unix:")
	if strings.HasPrefix(addr, "tcp:") {
		network, a = "tcp", strings.TrimPrefix(addr, "tcp:")
	}
	c, err := net.DialTimeout(network, a, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

func pxRoundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo through the proxy: %q, %v; want %q", got, err, msg)
	}
}

func pxWaitLog(t *testing.T, p *pxProc, want string) {
	t.Helper()
	waitLog(t, "proxy", p.stderr, want)
}

// TestProxyCLIEcho: two routes in one process (tcp -> unix and unix -> unix);
// a small round trip and a 4 MiB half-closed upload echoed back intact on
// each; one log line per connection with the byte counts; SIGTERM with no
// open connection exits 0 at once.
func TestProxyCLIEcho(t *testing.T) {
	echo := pxEcho(t)
	front := filepath.Join(testutil.ShortDir(t, 0o700), "front.sock")
	p := pxStart(t, 2, "--listen", "tcp:127.0.0.1:0", "--to", echo, "--listen", front, "--to", "unix:"+echo)
	if !strings.HasPrefix(p.listens[0], "tcp:127.0.0.1:") || strings.HasSuffix(p.listens[0], ":0") {
		t.Fatalf("first route listens on %q, want a resolved loopback port", p.listens[0])
	}
	if fi, err := os.Stat(front); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("unix listen socket %s: %v %v, want an owner-only socket", front, fi, err)
	}
	big := make([]byte, 4<<20)
	rand.Read(big)
	for i, addr := range p.listens {
		c := pxDial(t, addr)
		pxRoundTrip(t, c, "hello through udskit proxy")
		// Upload, half-close, then read everything back: the EOF must travel
		// through the proxy only after the last byte.
		errc := make(chan error, 1)
		go func() {
			_, err := c.Write(big)
			if err == nil {
				err = c.(interface{ CloseWrite() error }).CloseWrite()
			}
			errc <- err
		}()
		back, err := io.ReadAll(c)
		if err != nil || !bytes.Equal(back, big) {
			t.Fatalf("route %d (%s): %d bytes back of %d, err %v", i, addr, len(back), len(big), err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("route %d upload: %v", i, err)
		}
		c.Close()
	}
	n := len("hello through udskit proxy") + len(big)
	pxWaitLog(t, p, "bytes_out="+strconv.Itoa(n))
	log := p.stderr.String()
	for _, want := range []string{`msg="proxy conn"`, "bytes_in=" + strconv.Itoa(n), "splice_in=true", "splice_out=true", "peer_uid=" + strconv.Itoa(os.Getuid())} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(t, 10*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.stderr)
	}
	if _, err := os.Stat(front); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("listen socket %s left behind after exit: %v", front, err)
	}
}

// TestProxyCLIBadUsage: unpaired --listen/--to and other usage errors exit 2
// with a message that says what to do, before anything is bound.
func TestProxyCLIBadUsage(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", a, "--listen", b, "--to", "tcp:127.0.0.1:1"},
			"2 listen address(es) but 1 upstream address(es): give one --to per --listen, paired in order"},
		{[]string{"--listen", a}, "1 listen address(es) but 0 upstream"},
		{nil, "no routes: give at least one --listen ADDR --to ADDR pair"},
		{[]string{"--listen", "udp:127.0.0.1:9", "--to", b}, "listen address #1"},
		{[]string{"--listen", a, "--to", b, "--mode", "rw"}, "--mode \"rw\": want octal permission bits"},
		{[]string{"--listen", a, "--to", b, "--log-format", "xml"}, "--log-format \"xml\": want text or json"},
	} {
		r := scRun(t, "", append([]string{"proxy"}, tc.args...)...)
		if r.code != 2 {
			t.Errorf("proxy %v: exit %d, want 2\nstderr: %s", tc.args, r.code, r.stderr)
		}
		if !strings.Contains(r.stderr, "udskit: ") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("proxy %v: stderr %q, want it to contain %q", tc.args, r.stderr, tc.want)
		}
	}
	for _, p := range []string{a, b} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("usage error left %s behind: %v", p, err)
		}
	}
}

// TestProxyCLISIGTERMDrain: after SIGTERM the listen socket goes away at once,
// an open connection keeps working (including a half-close and its reply),
// and the process exits 0 only when that connection ends.
func TestProxyCLISIGTERMDrain(t *testing.T) {
	echo := pxEcho(t)
	front := filepath.Join(testutil.ShortDir(t, 0o700), "front.sock")
	p := pxStart(t, 1, "--listen", front, "--to", echo, "--drain-timeout", "30s")
	c := pxDial(t, "unix:"+front)
	pxRoundTrip(t, c, "before")
	p.signal(syscall.SIGTERM)
	pxWaitLog(t, p, "proxy draining")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(front); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("listen socket still there 5s after SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c2, err := net.Dial("unix", front); err == nil {
		c2.Close()
		t.Fatal("a new client connected while draining")
	}
	pxRoundTrip(t, c, "during drain")
	select {
	case err := <-p.done:
		p.done <- err
		t.Fatalf("proxy exited (%v) with a connection still open:\n%s", err, p.stderr)
	case <-time.After(200 * time.Millisecond):
	}
	// The client finishes: last words, half-close, and the reply still arrives.
	io.WriteString(c, "last words")
	c.(*net.UnixConn).CloseWrite()
	rest, err := io.ReadAll(c)
	if err != nil || string(rest) != "last words" {
		t.Fatalf("reply after half-close during drain: %q %v", rest, err)
	}
	c.Close()
	if err := p.wait(t, 10*time.Second); err != nil {
		t.Fatalf("exit after drain: %v\n%s", err, p.stderr)
	}
	log := p.stderr.String()
	if !strings.Contains(log, "proxy drained; stopped") || !strings.Contains(log, "bytes_in=28") {
		t.Errorf("log lacks the clean drain or the connection's bytes:\n%s", log)
	}
}

// TestProxyCLIDrainTimeout: a connection still open at --drain-timeout is
// closed and the process exits 0.
func TestProxyCLIDrainTimeout(t *testing.T) {
	echo := pxEcho(t)
	p := pxStart(t, 1, "--listen", "tcp:127.0.0.1:0", "--to", echo, "--drain-timeout", "300ms")
	c := pxDial(t, p.listens[0])
	pxRoundTrip(t, c, "x")
	start := time.Now()
	p.signal(syscall.SIGTERM)
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still delivering after the drain timeout")
	}
	if err := p.wait(t, 10*time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.stderr)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("exited %v after SIGTERM, before the 300ms drain timeout", d)
	}
	if log := p.stderr.String(); !strings.Contains(log, "closed by proxy shutdown") {
		t.Errorf("log lacks the forced close:\n%s", log)
	}
}
