package rpc

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/uds"
)

// startServer serves s on a fresh unix socket in a temp dir and returns its address.
func startServer(t testing.TB, s *Server) string {
	t.Helper()
	return serveWrapped(t, s, nil)
}

// serveWrapped is startServer with the listener wrapped by wrap (if not nil)
// before s serves it; the server is closed at cleanup.
func serveWrapped(t testing.TB, s *Server, wrap func(net.Listener) net.Listener) string {
	t.Helper()
	addr := "unix:" + filepath.Join(t.TempDir(), "rpc.sock")
	var l net.Listener
	l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		l = wrap(l)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil && !errors.Is(err, ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return addr
}

func echoServer() *Server {
	s := NewServer(ServerOptions{})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req...), nil
	})
	return s
}

func dial(t testing.TB, addr string) *Client {
	t.Helper()
	return dialOpts(t, addr, ClientOptions{})
}

// dialShmStreams (bothWays) makes dial and dialOpts turn ShmCalls on, so
// that bidi and client-streaming calls go through stream slots.
var dialShmStreams bool

// dialOpts is dial with options.
func dialOpts(t testing.TB, addr string, opts ClientOptions) *Client {
	t.Helper()
	if dialShmStreams {
		opts.ShmCalls = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// checkNoLeaks fails if goroutines of this module are still running after
// a grace period. Call it (deferred) after everything is closed.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		var leaked []string
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "udskit/rpc.") && !strings.Contains(g, "checkNoLeaks") &&
				!strings.Contains(g, "testing.tRunner") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines leaked:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// onlyConn returns the server's one connection.
func onlyConn(t *testing.T, s *Server) *serverConn {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) != 1 {
		t.Fatalf("%d server connections, want 1", len(s.conns))
	}
	for sc := range s.conns {
		return sc
	}
	return nil
}
