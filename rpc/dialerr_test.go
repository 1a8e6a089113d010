package rpc

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// TestDialRefusedBeforeHello: a server whose peer policy refuses the client
// tells it so in place of its hello (spec 5.4): Dial fails with a
// RefusedError, code PermissionDenied, not retryable, whatever the race
// between the refusal and our hello. (A server that just closes: TestDialSilentClose.)
func TestDialRefusedBeforeHello(t *testing.T) {
	addr := "unix:" + filepath.Join(t.TempDir(), "p.sock")
	l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{
		Policy: func(uds.Cred) error { return errors.New("nobody may connect") },
	})
	if err != nil {
		t.Fatal(err)
	}
	s := echoServer()
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 20 {
		_, err = Dial(ctx, addr, ClientOptions{})
		var re *RefusedError
		if !errors.As(err, &re) || CodeOf(err) != PermissionDenied || !strings.Contains(err.Error(), "retrying will not help") {
			t.Fatalf("want a permanent PermissionDenied refusal, got %T %v", err, err)
		}
		var e *Error
		if !errors.As(err, &e) || e.Retryable() {
			t.Fatalf("a refusal must not be retryable: %v", err)
		}
	}
}

// TestDialSilentClose: a listener that reads the hello and closes without a
// word (not a udskit server, or one that drops us) gives the same error,
// with io.EOF underneath.
func TestDialSilentClose(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, l, func(c net.Conn) { c.Read(make([]byte, 16)) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Dial(ctx, "unix:"+sock, ClientOptions{})
	checkNoHelloErr(t, err)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("want io.EOF underneath: %v", err)
	}
}

// TestDialNotUdskit: a server that answers with something else is named as
// such, not as a refusal.
func TestDialNotUdskit(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "h.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, l, func(c net.Conn) {
		c.Read(make([]byte, 16))
		c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		time.Sleep(100 * time.Millisecond)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Dial(ctx, "unix:"+sock, ClientOptions{})
	if err == nil || errors.Is(err, ErrClosedBeforeHello) || !strings.Contains(err.Error(), "not a udskit rpc server") {
		t.Fatalf("want a not-udskit error, got %v", err)
	}
}

func checkNoHelloErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("Dial succeeded")
	}
	if !errors.Is(err, ErrClosedBeforeHello) {
		t.Fatalf("want ErrClosedBeforeHello: %v", err)
	}
	for _, want := range []string{"closed the connection before its hello", "peer policy", "connection limit", "not a udskit"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
	}
}
