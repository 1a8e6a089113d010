package extcap

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/capture"
	"github.com/udskit/udskit/internal/testutil"
)

// TestCaptureReaderLeaves: Wireshark going away (the fifo's reader closes)
// ends the capture even with no traffic flowing, and the interposed
// socket is put back: same inode at the path, nothing left beside it.
func TestCaptureReaderLeaves(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	path := filepath.Join(dir, "s.sock")
	testutil.Serve(t, testutil.ListenUnix(t, path), testutil.Echo)
	ino := testutil.Inode(t, path)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res *Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := Capture(context.Background(), CaptureOptions{Fifo: fifo, Socket: path})
		done <- result{res, err}
	}()
	r, err := os.Open(fifo) // as dumpcap does
	if err != nil {
		t.Fatal(err)
	}
	shb := make([]byte, 4)
	if _, err := io.ReadFull(r, shb); err != nil || string(shb) != "\x0a\x0d\x0d\x0a" {
		t.Fatalf("pcapng section header: %x %v", shb, err)
	}
	testutil.WaitFor(t, "interposition", func() bool {
		_, err := os.Lstat(path + capture.AsideSuffix)
		return err == nil
	})
	c := testutil.DialUnix(t, path)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the capture: %q %v", buf, err)
	}
	c.Close()
	// Read what is there, then leave without a word.
	r.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	got, _ := io.ReadAll(r)
	r.Close()
	var res result
	select {
	case res = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("capture still running 15s after the fifo's reader left")
	}
	if res.err != nil {
		t.Fatalf("capture: %v", res.err)
	}
	if res.res.Interpose == nil || res.res.Interpose.Accepted != 1 || res.res.Packets == 0 {
		t.Fatalf("result %+v %+v", res.res, res.res.Interpose)
	}
	if len(got) == 0 {
		t.Fatal("nothing after the section header reached the fifo")
	}
	if testutil.Inode(t, path) != ino {
		t.Fatal("the server's socket is not back at the path")
	}
	for _, s := range []string{capture.AsideSuffix, capture.StateSuffix, capture.TempSuffix} {
		if _, err := os.Lstat(path + s); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left beside the socket: %v", s, err)
		}
	}
	testutil.DialUnix(t, path).Close()
}

func TestCaptureOptionErrors(t *testing.T) {
	never := filepath.Join(t.TempDir(), "never") // no case may get as far as creating it
	for _, o := range []CaptureOptions{
		{Socket: "/x.sock"},                           // no fifo
		{Fifo: never},                                 // no socket
		{Fifo: never, Socket: "/x.sock", PID: 3},      // pid in interpose mode
		{Fifo: never, Mode: ModeKernel},               // kernel: nothing selected
		{Fifo: never, Mode: "tap", Socket: "/x.sock"}, // unknown mode
		{Fifo: never, Socket: "/x.sock", Snaplen: -1}, // negative
	} {
		if _, err := Capture(context.Background(), o); !errors.Is(err, ErrOptions) {
			t.Errorf("%+v: %v, want ErrOptions", o, err)
		}
		if _, err := os.Lstat(never); err == nil {
			t.Fatalf("%+v: the output was created", o)
		}
	}
	// An existing path that is not a fifo is never written through.
	f := filepath.Join(t.TempDir(), "file")
	os.WriteFile(f, []byte("keep"), 0o600)
	if _, err := Capture(context.Background(), CaptureOptions{Fifo: f, Socket: "/x.sock"}); err == nil {
		t.Fatal("wrote into a regular file")
	}
	if b, _ := os.ReadFile(f); string(b) != "keep" {
		t.Fatalf("file changed: %q", b)
	}
}

// TestKernelPIDWins: Wireshark's dialog passes the socket list's selection
// with every capture; in kernel mode a process id, when set, selects.
func TestKernelPIDWins(t *testing.T) {
	o := CaptureOptions{Fifo: "/f", Mode: ModeKernel, Socket: "/x.sock", PID: 3}
	if err := o.check(); err != nil || o.Socket != "" || o.PID != 3 {
		t.Fatalf("check: %v, socket %q pid %d", err, o.Socket, o.PID)
	}
}
