package capture

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/pcapng"
	"github.com/udskit/udskit/uds"
)

func TestInterposeRefuses(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	sink := NewTextSink(io.Discard, TextOptions{})
	try := func(path, want string) {
		t.Helper()
		_, err := Interpose(context.Background(), path, InterposeOptions{Sink: sink, Logger: quietLog()})
		var re *RefusedError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), want) {
			t.Errorf("Interpose(%s) = %v, want a refusal saying %q", path, err, want)
		}
	}
	dg := filepath.Join(dir, "dgram.sock")
	pc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: dg, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	try(dg, "datagram")
	try("@udskit-capture-test", "abstract socket name")
	live, _ := echoServer(t, dir, "live.sock")
	link := filepath.Join(dir, "link.sock")
	os.Symlink(live, link)
	try(link, "symlink")
	stale := filepath.Join(dir, "stale.sock")
	testutil.StaleSocket(t, stale)
	try(stale, "no server is listening")
	try(filepath.Join(dir, "missing.sock"), "no socket at this path")
	reg := filepath.Join(dir, "file")
	os.WriteFile(reg, nil, 0o600)
	try(reg, "not a socket")
	// Nothing was left behind by any refusal.
	names, _ := filepath.Glob(filepath.Join(dir, "*.udskit-*"))
	if len(names) > 0 {
		t.Errorf("left behind: %v", names)
	}
}

// TestInterposeRefusesUnwritableDir: a user who may connect to the socket
// but not write its directory is refused, and nothing changes.
func TestInterposeRefusesUnwritableDir(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path, ino := echoServer(t, dir, "app.sock")
	os.Chmod(path, 0o666)
	cmd := testutil.NobodyCmd(t, "interpose", path)
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "no write permission on "+dir) {
		t.Fatalf("nobody's capture said %q", out)
	}
	if testutil.Inode(t, path) != ino {
		t.Fatal("socket changed")
	}
}

// TestInterposeCyclesUnderLoad: 50 interpose/restore cycles while clients
// keep connecting; not one connect is refused and every round trip comes
// back whole.
func TestInterposeCyclesUnderLoad(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path, ino := echoServer(t, dir, "busy.sock")
	var connects, refused, broken atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := []byte(fmt.Sprintf("client %d says hello\n", g))
			for {
				select {
				case <-stop:
					return
				default:
				}
				connects.Add(1)
				err := roundTrip(path, msg)
				var oe *net.OpError
				switch {
				case err == nil:
				case errors.As(err, &oe) && oe.Op == "dial":
					refused.Add(1)
					firstErr.CompareAndSwap(nil, err)
				default:
					broken.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	cycles := 0
	for ; cycles < 50 && time.Now().Before(deadline); cycles++ {
		ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewTextSink(io.Discard, TextOptions{}), Logger: quietLog(), Grace: 50 * time.Millisecond})
		if err != nil {
			t.Fatalf("cycle %d: %v", cycles, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		if err := ip.Serve(ctx); err != nil {
			t.Fatalf("cycle %d: %v", cycles, err)
		}
		cancel()
		if testutil.Inode(t, path) != ino {
			t.Fatalf("cycle %d: original not back", cycles)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d cycles, %d connects, %d refused, %d broken", cycles, connects.Load(), refused.Load(), broken.Load())
	if cycles < 50 {
		t.Fatalf("only %d cycles in a minute", cycles)
	}
	if refused.Load() != 0 || broken.Load() != 0 {
		t.Fatalf("%d refused and %d broken of %d connects; first: %v", refused.Load(), broken.Load(), connects.Load(), firstErr.Load())
	}
	if connects.Load() < 200 {
		t.Fatalf("only %d connects: no real load", connects.Load())
	}
}

// TestInterposeHostilePeer: 100 MB of random bytes in one write go through
// whole, are recorded up to the snaplen per packet, and the relay's memory
// stays bounded.
func TestInterposeHostilePeer(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path := filepath.Join(dir, "sink.sock")
	l := testutil.ListenUnix(t, path)
	got := make(chan []byte, 1)
	testutil.Serve(t, l, func(c net.Conn) {
		h := newHasher()
		n, _ := io.Copy(h, c)
		c.Write([]byte(fmt.Sprintf("%d %x\n", n, h.sum())))
		c.Close()
		got <- nil
	})
	out := &countWriter{}
	w, _ := pcapng.NewWriter(out, pcapng.Options{Snaplen: 1000})
	ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewPcapSink(w, PcapOptions{}), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ip.Serve(ctx) }()
	const size = 100 << 20
	payload := make([]byte, size)
	rand.Read(payload)
	want := newHasher()
	want.Write(payload)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	sampling := make(chan struct{})
	go func() {
		defer close(sampling)
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-got:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	c.(*net.UnixConn).CloseWrite()
	reply, _ := io.ReadAll(c)
	c.Close()
	<-sampling
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if exp := fmt.Sprintf("%d %x\n", size, want.sum()); string(reply) != exp {
		t.Fatalf("server got %q, want %q", reply, exp)
	}
	grow := int64(peak.Load()) - int64(base)
	t.Logf("heap grew by at most %d KiB while 100 MB went through; capture %d bytes", grow>>10, out.n.Load())
	if grow > 32<<20 {
		t.Fatalf("heap grew by %d MiB relaying 100 MB", grow>>20)
	}
	if n := out.n.Load(); n > 4<<20 {
		t.Fatalf("capture is %d bytes with a 1000-byte snaplen", n)
	}
}

type countWriter struct{ n atomic.Int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// hasher is a running CRC-32C.
type hasher struct{ h uint32 }

func newHasher() *hasher { return &hasher{} }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (h *hasher) Write(p []byte) (int, error) {
	h.h = crc32.Update(h.h, castagnoli, p)
	return len(p), nil
}

func (h *hasher) sum() uint32 { return h.h }

// TestInterposeForwardsFDs: a descriptor passed with SCM_RIGHTS reaches the
// server through the relay, and the recording says so.
func TestInterposeForwardsFDs(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path := filepath.Join(dir, "fd.sock")
	l := testutil.ListenUnix(t, path)
	testutil.Serve(t, l, func(c net.Conn) {
		buf, oob := make([]byte, 16), make([]byte, 64)
		_, oobn, _, _, err := c.(*net.UnixConn).ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			for _, fd := range fds {
				unix.Write(fd, []byte("written by the server"))
				unix.Close(fd)
			}
		}
		c.Write([]byte("done"))
	})
	out, sink := newPcap(t)
	ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: sink, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ip.Serve(ctx) }()
	pr, pw, _ := os.Pipe()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte("x"), unix.UnixRights(int(pw.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	io.ReadAll(c)
	c.Close()
	pr.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 100)
	n, _ := pr.Read(b)
	cancel()
	<-done
	if string(b[:n]) != "written by the server" {
		t.Fatalf("pipe got %q", b[:n])
	}
	_, _, comments := streamBytes(t, out.Bytes())
	if !strings.Contains(strings.Join(comments, "\n"), "SCM_RIGHTS: 1 fd(s) passed (pipe)") {
		t.Fatalf("comments %q", comments)
	}
}

// TestInterposeConnectsAsTheClient: run as root, the relay reaches the
// server with the client's uid and gid, so the server's SO_PEERCRED checks
// are not fooled into seeing root.
func TestInterposeConnectsAsTheClient(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir := testutil.ShortDir(t, 0o755)
	path := filepath.Join(dir, "cred.sock")
	l := testutil.ListenUnix(t, path)
	os.Chmod(path, 0o666)
	testutil.Serve(t, l, func(c net.Conn) {
		cr, err := uds.PeerCred(c)
		if err != nil {
			fmt.Fprintf(c, "error %v\n", err)
			return
		}
		fmt.Fprintf(c, "uid=%d gid=%d\n", cr.UID, cr.GID)
	})
	ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewTextSink(io.Discard, TextOptions{}), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ip.Serve(ctx) }()
	out, err := testutil.NobodyCmd(t, "dial", path).CombinedOutput()
	cancel()
	<-done
	if want := fmt.Sprintf("uid=%d gid=%d\n", testutil.NobodyUID, testutil.NobodyUID); string(out) != want || err != nil {
		t.Fatalf("the server saw %q (%v), want %q", out, err, want)
	}
	// And root's own process is untouched.
	if os.Geteuid() != 0 || syscall.Getuid() != 0 {
		t.Fatal("the test process lost root")
	}
}

// TestKilledCaptureIsRestored: a capture killed with SIGKILL leaves the
// original aside; Restore (udskit capture --restore) and the next capture
// each put it back, same inode.
func TestKilledCaptureIsRestored(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path, ino := echoServer(t, dir, "victim.sock")
	kill := func() {
		t.Helper()
		child := testutil.StartHelper(t, testutil.HelperCmd(t, "interpose", path))
		if testutil.Inode(t, path) == ino {
			t.Fatal("not interposed")
		}
		if err := roundTrip(path, []byte("via the relay")); err != nil {
			t.Fatal(err)
		}
		child.Cmd.Process.Signal(syscall.SIGKILL)
		// StartHelper's goroutine reaps it; wait until it is gone.
		testutil.WaitFor(t, "the killed capture to be gone", func() bool { return syscall.Kill(child.PID, 0) != nil })
		if err := roundTrip(path, []byte("x")); err == nil {
			t.Fatal("the dead relay still answers")
		}
	}
	kill()
	if _, err := Restore(path); err != nil {
		t.Fatal(err)
	}
	if testutil.Inode(t, path) != ino || roundTrip(path, []byte("after restore")) != nil {
		t.Fatal("Restore did not bring the original back")
	}
	if _, err := Restore(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("second Restore: %v, want nothing to restore", err)
	}
	kill()
	ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewTextSink(io.Discard, TextOptions{}), Logger: quietLog()})
	if err != nil {
		t.Fatalf("the next capture: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ip.Serve(ctx)
	if testutil.Inode(t, path) != ino || roundTrip(path, []byte("after the next capture")) != nil {
		t.Fatal("the next capture did not leave the original in place")
	}
	for _, s := range []string{AsideSuffix, TempSuffix, StateSuffix} {
		if _, err := os.Lstat(path + s); err == nil {
			t.Errorf("%s left behind", path+s)
		}
	}
}

// TestRestoreRefusesWhileRunning: Restore leaves a live capture alone.
func TestRestoreRefusesWhileRunning(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path, _ := echoServer(t, dir, "busy.sock")
	ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewTextSink(io.Discard, TextOptions{}), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ip.Serve(ctx) }()
	if _, err := Restore(path); !errors.Is(err, ErrCaptureRunning) {
		t.Fatalf("Restore during a capture: %v", err)
	}
	if _, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewTextSink(io.Discard, TextOptions{}), Logger: quietLog()}); !errors.Is(err, ErrCaptureRunning) {
		t.Fatalf("a second capture: %v", err)
	}
	cancel()
	<-done
	if err := roundTrip(path, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	_ = bytes.MinRead
}

// TestSecondCaptureWhileOneStarts: the state file is the lock: while a
// capture of the path is starting (its state file is there, its pid
// alive, nothing set aside yet), another is refused and nothing changes.
func TestSecondCaptureWhileOneStarts(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path, ino := echoServer(t, dir, "lock.sock")
	if err := createState(path, &State{PID: os.Getpid(), Path: path, Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	_, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewTextSink(io.Discard, TextOptions{}), Logger: quietLog()})
	if !errors.Is(err, ErrCaptureRunning) {
		t.Fatalf("second capture: %v", err)
	}
	if testutil.Inode(t, path) != ino {
		t.Fatal("socket changed")
	}
	if _, err := os.Lstat(path + StateSuffix); err != nil {
		t.Fatal("the starting capture's state file was removed")
	}
}
