package capture

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// TestInterposerShutdown: Shutdown ends Serve and puts the original back;
// a relayed connection still open when Shutdown's ctx ends is cut and
// Shutdown returns ctx's error; Shutdown before Serve restores too, and
// Serve after it refuses.
func TestInterposerShutdown(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path, ino := echoServer(t, dir, "app.sock")
	_, sink := newPcap(t)
	ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: sink, Logger: quietLog(), Drain: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- ip.Serve(context.Background()) }()
	held, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err != nil {
		t.Fatalf("echo through the relay: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := ip.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a connection held open: %v, want deadline exceeded", err)
	}
	if el := time.Since(t0); el > 5*time.Second {
		t.Errorf("Shutdown took %v", el)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		// Serve closes ip.served in its last deferred step, so Shutdown can
		// return a moment before Serve's caller sees the result; anything
		// longer means Shutdown did not wait for Serve.
		t.Fatal("Serve did not return within 5 s of Shutdown")
	}
	if got := testutil.Inode(t, path); got != ino {
		t.Fatalf("inode after Shutdown %d, want the original %d", got, ino)
	}
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil {
		t.Error("the held connection is still open after its drain was cut")
	}

	ip, err = Interpose(context.Background(), path, InterposeOptions{Sink: sink, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := ip.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown before Serve: %v", err)
	}
	if got := testutil.Inode(t, path); got != ino {
		t.Fatalf("inode after Shutdown before Serve %d, want the original %d", got, ino)
	}
	for _, suffix := range []string{AsideSuffix, TempSuffix, StateSuffix} {
		if _, err := os.Lstat(path + suffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", path+suffix, err)
		}
	}
	if err := ip.Serve(context.Background()); err == nil {
		t.Error("Serve after Shutdown did not fail")
	}
}
