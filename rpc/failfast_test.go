package rpc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

func ffServer(t *testing.T, sock string, policy uds.Policy) (*Server, *uds.Listener) {
	t.Helper()
	l, err := uds.Listen(context.Background(), sock, uds.ListenOptions{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ServerOptions{})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return s, l
}

// TestFailFastAfterShutdown: the issue-27 case. A call with
// context.Background() after the server went away fails with Unavailable once
// a reconnect attempt has failed (spec 4.2), instead of blocking forever;
// WaitForReady waits for the server to come back.
func TestFailFastAfterShutdown(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t, 0o700), "ff.sock")
	s, _ := ffServer(t, sock, nil)
	c, err := Dial(context.Background(), sock, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Call(context.Background(), "echo", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// The first call may see the broken connection itself (unavailable, send
	// failed); the ones after it find no connection: each fails fast.
	sawFailFast := false
	for i := 0; i < 3; i++ {
		done := make(chan error, 1)
		go func() { done <- c.Call(context.Background(), "echo", []byte("x"), nil) }()
		select {
		case err := <-done:
			var e *Error
			if !errors.As(err, &e) || e.Code != Unavailable || !e.Retryable() {
				t.Fatalf("call %d: want a retryable Unavailable, got %v", i, err)
			}
			sawFailFast = sawFailFast || strings.Contains(e.Message, "WaitForReady")
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d with context.Background() still blocked 10s after the server shut down", i)
		}
	}
	if !sawFailFast {
		t.Fatal("no call said it failed fast (WaitForReady)")
	}
}

// TestWaitForReadyWaits: with WaitForReady a call blocks through a restart and
// then succeeds.
func TestWaitForReadyWaits(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t, 0o700), "wr.sock")
	s, _ := ffServer(t, sock, nil)
	c, err := Dial(context.Background(), sock, ClientOptions{WaitForReady: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Call(context.Background(), "echo", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// A call on the connection the server just closed may fail with the
	// broken connection itself; WaitForReady is about finding no connection.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	c.Call(ctx, "echo", []byte("x"), nil)
	cancel()
	done := make(chan error, 1)
	go func() {
		err := c.Call(context.Background(), "echo", []byte("y"), nil)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("WaitForReady call returned before a server came back: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	ffServer(t, sock, nil)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitForReady call did not finish after the server came back")
	}
}

// TestPolicyRefusalIsPermanent: a peer the server's policy refuses gets, in
// place of the hello, an error frame (spec 5.4): Dial fails with
// PermissionDenied, not retryable, saying so.
func TestPolicyRefusalIsPermanent(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t, 0o700), "pol.sock")
	_, l := ffServer(t, sock, func(uds.Cred) error { return uds.ErrPeerRefused })
	_, err := Dial(context.Background(), sock, ClientOptions{})
	var re *RefusedError
	if !errors.As(err, &re) || CodeOf(err) != PermissionDenied {
		t.Fatalf("want a RefusedError with PermissionDenied, got %T %v", err, err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Retryable() || !strings.Contains(err.Error(), "retrying will not help") ||
		!strings.Contains(err.Error(), "uid "+strconv.Itoa(os.Geteuid())) {
		t.Fatalf("message/retryable: %v", err)
	}
	if l.Refused() == 0 {
		t.Fatal("the listener did not count the refusal")
	}
}
