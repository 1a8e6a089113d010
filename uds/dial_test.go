package uds

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

func TestDialErrorsExplain(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	testutil.StaleSocket(t, stale)
	regular := filepath.Join(dir, "file")
	os.WriteFile(regular, []byte("x"), 0o644)
	long := filepath.Join(dir, strings.Repeat("l", 120))
	ctx := context.Background()
	for _, tc := range []struct {
		name, addr, cause string
		errno             error
	}{
		{"missing", filepath.Join(dir, "none.sock"), "no socket at " + filepath.Join(dir, "none.sock") + ": the server is not running", syscall.ENOENT},
		{"stale", stale, "stale socket: the file exists but nothing listens", syscall.ECONNREFUSED},
		{"not a socket", regular, regular + " is a regular file, not a socket", syscall.ECONNREFUSED},
		{"abstract", "@udskit-nobody-listens-" + t.Name(), "nothing listens on the abstract name", syscall.ECONNREFUSED},
		{"tcp", "tcp:127.0.0.1:1", "connection refused", syscall.ECONNREFUSED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "abstract" && runtime.GOOS != "linux" {
				t.Skip("abstract names are Linux-only")
			}
			_, err := Dial(ctx, tc.addr, DialOptions{})
			var de *DialError
			if !errors.As(err, &de) {
				t.Fatalf("want *DialError, got %T %v", err, err)
			}
			if !strings.Contains(de.Cause, tc.cause) {
				t.Errorf("cause %q lacks %q", de.Cause, tc.cause)
			}
			// Each thing said once: not "refused ... (refused)" or "X is a file (X is a file: ...)".
			if n := strings.Count(err.Error(), tc.cause); n != 1 {
				t.Errorf("%q says %q %d times", err, tc.cause, n)
			}
			if !errors.Is(err, tc.errno) {
				t.Errorf("errors.Is(%v, %v) false", err, tc.errno)
			}
		})
	}
	_, err := Dial(ctx, regular, DialOptions{})
	var nse *NotSocketError
	if !errors.As(err, &nse) || nse.What != "regular file" {
		t.Errorf("not a socket: want *NotSocketError, got %v", err)
	}
	_, err = Dial(ctx, long, DialOptions{})
	var tl *PathTooLongError
	if !errors.As(err, &tl) || strings.Count(err.Error(), "over the OS limit") != 1 {
		t.Errorf("too long: %v", err)
	}
	_, err = Dial(ctx, "bogus:scheme:1", DialOptions{})
	var ae *AddrError
	if !errors.As(err, &ae) {
		t.Errorf("bad address: %v", err)
	}
	if b, _ := os.ReadFile(regular); string(b) != "x" {
		t.Error("dial touched the regular file")
	}
}

func TestDialPermissionDeniedAsNobody(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path := filepath.Join(dir, "s.sock")
	l := listenT(t, path, ListenOptions{}) // 0600 root
	testutil.Serve(t, l, testutil.Echo)
	res := dialAsNobody(t, path)
	if res.Errno != syscall.EACCES.Error() {
		t.Fatalf("want EACCES, got %+v", res)
	}
	for _, want := range []string{"permission denied", "write permission on the socket", "search permission on every directory"} {
		if !strings.Contains(res.Err, want) {
			t.Errorf("message lacks %q: %s", want, res.Err)
		}
	}
}

func TestDialWaitsForLateServer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "late", "s.sock")
	const delay = 500 * time.Millisecond
	started := make(chan *Listener, 1)
	go func() {
		time.Sleep(delay)
		l, err := Listen(context.Background(), path, ListenOptions{})
		if err != nil {
			t.Error(err)
			close(started)
			return
		}
		testutil.Serve(t, l, testutil.Echo)
		started <- l
	}()
	// Without Wait: fails at once.
	if _, err := Dial(context.Background(), path, DialOptions{}); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("no wait: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	c, err := Dial(ctx, path, DialOptions{Wait: true, MaxBackoff: 100 * time.Millisecond})
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	c.Close()
	if l := <-started; l != nil {
		defer l.Close()
	}
	if took < delay-50*time.Millisecond || took > 3*time.Second {
		t.Fatalf("connected after %v, server started after %v", took, delay)
	}
	roundTrip(t, path)
}

func TestDialWaitGivesUpAtDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "never.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, path, DialOptions{Wait: true})
	var de *DialError
	if !errors.As(err, &de) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("want DialError matching DeadlineExceeded and ENOENT, got %v", err)
	}
	if !strings.Contains(de.Cause, "gave up after") || !strings.Contains(de.Cause, "no socket at") {
		t.Errorf("cause: %s", de.Cause)
	}
}

func TestDialWaitFailsFastOnPermanentErrors(t *testing.T) {
	regular := filepath.Join(t.TempDir(), "file")
	os.WriteFile(regular, nil, 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	_, err := Dial(ctx, regular, DialOptions{Wait: true})
	var nse *NotSocketError
	if !errors.As(err, &nse) {
		t.Fatalf("want NotSocketError, got %v", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("retried a permanent error for %v", d)
	}
}
