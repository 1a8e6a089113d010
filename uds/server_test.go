package uds

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// startServer serves path with h and returns the server and Serve's result.
func startServer(t *testing.T, path string, s *Server) chan error {
	t.Helper()
	l := listenT(t, path, ListenOptions{})
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	return served
}

func dialT(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := Dial(context.Background(), path, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// lineEcho echoes lines until EOF.
func lineEcho() Handler {
	return func(ctx context.Context, c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			c.Write([]byte(line))
		}
	}
}

func TestServerShutdownWaitsForOpenConn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	s := &Server{Handler: lineEcho()}
	served := startServer(t, path, s)
	c := dialT(t, path)
	c.Write([]byte("one\n"))
	r := bufio.NewReader(c)
	if l, err := r.ReadString('\n'); l != "one\n" {
		t.Fatalf("echo %q %v", l, err)
	}
	if s.ActiveConns() != 1 {
		t.Fatalf("ActiveConns = %d", s.ActiveConns())
	}
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	select {
	case <-s.Draining():
	case <-time.After(5 * time.Second):
		t.Fatal("Draining not closed")
	}
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v", err)
	}
	// No new connections (the socket file is gone with the listener)...
	if _, err := Dial(context.Background(), path, DialOptions{}); err == nil {
		t.Fatal("dial succeeded during shutdown")
	}
	// ...but the open one is still served, and Shutdown waits for it.
	c.Write([]byte("two\n"))
	if l, err := r.ReadString('\n'); l != "two\n" {
		t.Fatalf("echo during drain %q %v", l, err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a connection open", err)
	case <-time.After(200 * time.Millisecond):
	}
	c.Close()
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the last conn closed")
	}
	if s.ActiveConns() != 0 {
		t.Fatalf("ActiveConns = %d after Shutdown", s.ActiveConns())
	}
}

func TestServerShutdownForceClosesAtDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	var handlerCtxDone atomic.Bool
	s := &Server{Handler: func(ctx context.Context, c net.Conn) {
		io.Copy(io.Discard, c) // ignores Draining: only a force-close ends it
		handlerCtxDone.Store(ctx.Err() != nil)
	}}
	startServer(t, path, s)
	c := dialT(t, path)
	testutil.WaitFor(t, "conn active", func() bool { return s.ActiveConns() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := s.Shutdown(ctx)
	took := time.Since(t0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want DeadlineExceeded", err)
	}
	if took < 250*time.Millisecond || took > 3*time.Second {
		t.Fatalf("Shutdown took %v with a 300ms deadline", took)
	}
	if !handlerCtxDone.Load() {
		t.Error("handler ctx was not canceled by the force-close")
	}
	if s.ActiveConns() != 0 {
		t.Fatalf("ActiveConns = %d", s.ActiveConns())
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("client conn not closed by force-close: %d %v", n, err)
	}
}

func TestServerMaxConns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	var logs testutil.Buffer
	s := &Server{Handler: lineEcho(), MaxConns: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	startServer(t, path, s)
	defer s.Close()
	c1, c2 := dialT(t, path), dialT(t, path)
	testutil.WaitFor(t, "two conns", func() bool { return s.ActiveConns() == 2 })
	c3 := dialT(t, path)
	c3.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c3.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("third conn: %d %v, want EOF", n, err)
	}
	if s.Rejected() != 1 || s.ActiveConns() != 2 {
		t.Fatalf("Rejected %d Active %d", s.Rejected(), s.ActiveConns())
	}
	// The excess conn was accepted and closed (not left in the backlog), with a log line.
	if out := logs.String(); !strings.Contains(out, "connection limit reached") || !strings.Contains(out, "max_conns=2") {
		t.Fatalf("no log line for the closed excess connection: %q", out)
	}
	for _, c := range []net.Conn{c1, c2} {
		c.Write([]byte("x\n"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if l, err := bufio.NewReader(c).ReadString('\n'); l != "x\n" {
			t.Fatalf("held conn broken: %q %v", l, err)
		}
	}
	c1.Close()
	testutil.WaitFor(t, "slot freed", func() bool { return s.ActiveConns() == 1 })
	c4 := dialT(t, path)
	c4.Write([]byte("y\n"))
	c4.SetReadDeadline(time.Now().Add(5 * time.Second))
	if l, err := bufio.NewReader(c4).ReadString('\n'); l != "y\n" {
		t.Fatalf("conn after a slot freed: %q %v", l, err)
	}
}

func TestServerHandlerPanicCostsOnlyItsConn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	s := &Server{Handler: func(ctx context.Context, c net.Conn) {
		line, _ := bufio.NewReader(c).ReadString('\n')
		if line == "panic\n" {
			panic("malformed peer")
		}
		c.Write([]byte(line))
	}}
	startServer(t, path, s)
	defer s.Close()
	bad := dialT(t, path)
	bad.Write([]byte("panic\n"))
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bad.Read(make([]byte, 1)); err == nil {
		t.Fatal("panicking handler's conn not closed")
	}
	good := dialT(t, path)
	good.Write([]byte("ok\n"))
	good.SetReadDeadline(time.Now().Add(5 * time.Second))
	if l, _ := bufio.NewReader(good).ReadString('\n'); l != "ok\n" {
		t.Fatalf("server broken after a panic: %q", l)
	}
}

func TestServerNoLeaksAfterCloseAndShutdown(t *testing.T) {
	for _, how := range []string{"Close", "Shutdown"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			// Warm up the runtime's poller and any lazily started goroutines.
			func() {
				s := &Server{Handler: func(ctx context.Context, c net.Conn) {}}
				startServer(t, filepath.Join(dir, "warm.sock"), s)
				dialT(t, filepath.Join(dir, "warm.sock")).Close()
				s.Close()
			}()
			noLeaks := testutil.LeakCheck(t)

			path := filepath.Join(dir, "s.sock")
			l, err := Listen(context.Background(), path, ListenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s := &Server{}
			// A long-lived conn that leaves when the drain starts, with a
			// goroutine of its own that must end too.
			s.Handler = func(ctx context.Context, c net.Conn) {
				done := make(chan struct{})
				defer close(done)
				go func() {
					select {
					case <-s.Draining():
						c.SetReadDeadline(time.Now())
					case <-done:
					}
				}()
				c.Read(make([]byte, 1))
			}
			served := make(chan error, 1)
			go func() { served <- s.Serve(l) }()
			var clients []net.Conn
			for range 20 {
				c, err := Dial(context.Background(), path, DialOptions{})
				if err != nil {
					t.Fatal(err)
				}
				clients = append(clients, c)
			}
			testutil.WaitFor(t, "20 conns", func() bool { return s.ActiveConns() == 20 })
			if how == "Close" {
				s.Close()
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := s.Shutdown(ctx); err != nil {
					t.Fatal(err)
				}
				cancel()
			}
			<-served
			for _, c := range clients {
				c.Close()
			}
			noLeaks() // goroutines and fds back to baseline
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("socket file left: %v", err)
			}
		})
	}
}

func TestServerServeAfterCloseAndNilHandler(t *testing.T) {
	if err := (&Server{}).Serve(nil); err == nil || !strings.Contains(err.Error(), "Handler") {
		t.Fatalf("nil handler: %v", err)
	}
	s := &Server{Handler: func(context.Context, net.Conn) {}}
	s.Close()
	l := listenT(t, filepath.Join(t.TempDir(), "s.sock"), ListenOptions{})
	if err := s.Serve(l); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Close: %v", err)
	}
}

// TestServerMaxConnsBacklog: with BacklogWhenFull the conn over the limit
// waits in the backlog, unread, and is served as soon as a slot frees; a
// Shutdown while full returns at once.
func TestServerMaxConnsBacklog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	var logs testutil.Buffer
	s := &Server{Handler: lineEcho(), MaxConns: 1, WhenFull: BacklogWhenFull, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	served := startServer(t, path, s)
	c1 := dialT(t, path)
	testutil.WaitFor(t, "one conn", func() bool { return s.ActiveConns() == 1 })
	c2 := dialT(t, path) // connect succeeds: the backlog holds it
	c2.Write([]byte("two\n"))
	c2.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c2.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("second conn served while the first is open (n=%d err=%v)", n, err)
	}
	if s.Rejected() != 0 || !strings.Contains(logs.String(), "not accepting until a connection ends") {
		t.Fatalf("Rejected %d; log %q", s.Rejected(), logs.String())
	}
	c1.Close()
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if l, err := bufio.NewReader(c2).ReadString('\n'); l != "two\n" {
		t.Fatalf("second conn after the first closed: %q %v", l, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	s.Shutdown(ctx) // c2 is still open: force-closed at the deadline
	select {
	case err := <-served:
		if !errors.Is(err, ErrServerClosed) {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still waiting for room after Shutdown")
	}
}

// TestServerConnContext: the handler's ctx comes from ConnContext, which
// sees the listener that accepted the conn.
func TestServerConnContext(t *testing.T) {
	type key struct{}
	dir := t.TempDir()
	la := listenT(t, filepath.Join(dir, "a.sock"), ListenOptions{})
	lb := listenT(t, filepath.Join(dir, "b.sock"), ListenOptions{})
	names := map[net.Listener]string{la: "a", lb: "b"}
	got := make(chan string, 2)
	s := &Server{
		ConnContext: func(ctx context.Context, l net.Listener, c net.Conn) context.Context {
			return context.WithValue(ctx, key{}, names[l])
		},
		Handler: func(ctx context.Context, c net.Conn) { got <- ctx.Value(key{}).(string) },
	}
	go s.Serve(la)
	go s.Serve(lb)
	defer s.Close()
	dialT(t, filepath.Join(dir, "b.sock"))
	if g := <-got; g != "b" {
		t.Fatalf("conn on b.sock got %q", g)
	}
	dialT(t, filepath.Join(dir, "a.sock"))
	if g := <-got; g != "a" {
		t.Fatalf("conn on a.sock got %q", g)
	}
}

// lateListener returns one conn from Accept only after release is closed,
// whatever Close does meanwhile: a connection the kernel handed over just
// as the server began to stop.
type lateListener struct {
	c       net.Conn
	entered chan struct{}
	release chan struct{}
	done    chan struct{}
}

func (l *lateListener) Accept() (net.Conn, error) {
	if l.c != nil {
		close(l.entered)
		<-l.release
		c := l.c
		l.c = nil
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}
func (l *lateListener) Close() error   { return nil }
func (l *lateListener) Addr() net.Addr { return &net.UnixAddr{Name: "late", Net: "unix"} }

// TestServerServesConnAcceptedWhileStopping: a conn Accept returns after
// Shutdown began is handed to the handler (which sees Draining), not closed
// unread: rpc.Server serves such a connection through its drain (hello,
// then goaway) instead of resetting a client that already sent a request.
func TestServerServesConnAcceptedWhileStopping(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	l := &lateListener{c: a, entered: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	defer close(l.done)
	handled := make(chan bool, 1)
	s := &Server{Handler: func(ctx context.Context, c net.Conn) {
		c.Write([]byte("served"))
		handled <- true
	}}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	<-l.entered
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	<-s.Draining()
	close(l.release)
	buf := make([]byte, 6)
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "served" {
		t.Fatalf("conn accepted while stopping: %q %v, want it served", buf, err)
	}
	<-handled
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}
