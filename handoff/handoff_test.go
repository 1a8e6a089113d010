package handoff

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// tagServer answers every line on every connection with its tag.
type tagServer struct {
	srv *uds.Server
	err chan error
}

func serveTag(l net.Listener, tag string) *tagServer {
	s := &tagServer{err: make(chan error, 1), srv: &uds.Server{Logger: quiet, Handler: func(_ context.Context, c net.Conn) {
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			if _, err := io.WriteString(c, tag+"\n"); err != nil {
				return
			}
		}
	}}}
	go func() { s.err <- s.srv.Serve(l) }()
	return s
}

func ask(t testing.TB, path string) string {
	t.Helper()
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "who\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	return line[:len(line)-1]
}

type oldSide struct {
	path, ctl string
	l         *Listener
	srv       *tagServer
	off       *Offerer
}

func startOld(t *testing.T, opts OfferOptions) *oldSide {
	t.Helper()
	dir := testutil.ShortDir(t, 0o700)
	o := &oldSide{path: filepath.Join(dir, "svc.sock")}
	o.ctl = ControlPath(o.path)
	var err error
	o.l, err = Listen(context.Background(), "svc", o.path, uds.ListenOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	o.srv = serveTag(o.l, "old")
	opts.Control, opts.Logger = o.ctl, quiet
	if o.off, err = Offer(context.Background(), []*Listener{o.l}, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.off.Close(); o.srv.srv.Close() })
	return o
}

func acquire(t testing.TB, ctl string) (*Acquired, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return Acquire(ctx, ctl, AcquireOptions{Logger: quiet})
}

func TestHandoffCommit(t *testing.T) {
	o := startOld(t, OfferOptions{State: func() ([]byte, error) { return []byte("sessions:3"), nil }})
	ino := testutil.Inode(t, o.path)
	if got := ask(t, o.path); got != "old" {
		t.Fatalf("before: %q", got)
	}
	a, err := acquire(t, o.ctl)
	if err != nil {
		t.Fatal(err)
	}
	if string(a.State()) != "sessions:3" || len(a.Listeners()) != 1 || a.Listeners()[0].Addr.Name != o.path {
		t.Fatalf("offer: %q %+v", a.State(), a.Listeners())
	}
	if _, err := a.Listener("nope", uds.ListenOptions{}); err == nil {
		t.Fatal("took a listener that was not offered")
	}
	nl, err := a.Listener("svc", uds.ListenOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ns := serveTag(nl, "new")
	defer ns.srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	serving, err := a.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("acquire -> serving: %v", serving)
	select {
	case <-o.off.Committed():
	case <-time.After(5 * time.Second):
		t.Fatal("old side never saw the commit")
	}
	if cr := o.off.Successor(); cr.PID != int32(os.Getpid()) {
		t.Fatalf("successor %v", cr)
	}
	// The old one drains and exits; its Close leaves the socket file.
	o.srv.srv.Shutdown(ctx)
	for range 20 {
		if got := ask(t, o.path); got != "new" {
			t.Fatalf("after commit: answered by %q", got)
		}
	}
	if testutil.Inode(t, o.path) != ino {
		t.Fatal("the socket file was replaced")
	}
	// The control path is free for the successor to offer on in its turn.
	off2, err := Offer(ctx, []*Listener{nl}, OfferOptions{Control: o.ctl, Logger: quiet})
	if err != nil {
		t.Fatalf("successor cannot offer: %v", err)
	}
	off2.Close()
	// The successor owns the file now: its Close removes it.
	ns.srv.Close()
	if _, err := os.Lstat(o.path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("successor's close left the socket file: %v", err)
	}
}

func TestAbortAndTimeoutLeaveOldServing(t *testing.T) {
	o := startOld(t, OfferOptions{CommitTimeout: 300 * time.Millisecond})
	a, err := acquire(t, o.ctl)
	if err != nil {
		t.Fatal(err)
	}
	nl, _ := a.Listener("svc", uds.ListenOptions{Logger: quiet})
	ns := serveTag(nl, "new")
	if err := a.Abort("changed my mind"); err != nil {
		t.Fatal(err)
	}
	ns.srv.Close()
	for range 10 {
		if got := ask(t, o.path); got != "old" {
			t.Fatalf("after abort: %q", got)
		}
	}
	// An acquirer that never commits: the offer is withdrawn after
	// CommitTimeout and the next acquirer gets it. (Abort returns before
	// the offerer has ended the aborted session: ErrBusy until it has.)
	var stale *Acquired
	testutil.WaitFor(t, "the offer back after the abort", func() bool {
		stale, err = acquire(t, o.ctl)
		if err != nil && !errors.Is(err, ErrBusy) {
			t.Fatal(err)
		}
		return err == nil
	})
	defer stale.finish()
	var next *Acquired
	testutil.WaitFor(t, "the offer to come back after the commit timeout", func() bool {
		next, err = acquire(t, o.ctl)
		return err == nil
	})
	next.Abort("test")
	if got := ask(t, o.path); got != "old" {
		t.Fatalf("after timeout: %q", got)
	}
	select {
	case <-o.off.Committed():
		t.Fatal("committed without a commit")
	default:
	}
	if _, err := os.Lstat(o.path); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentAcquirersExactlyOneWins(t *testing.T) {
	o := startOld(t, OfferOptions{})
	const n = 6
	var wg sync.WaitGroup
	wins := make(chan *Acquired, n)
	busy := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := acquire(t, o.ctl)
			if err == nil {
				wins <- a
				return
			}
			busy <- err
		}()
	}
	wg.Wait()
	close(wins)
	close(busy)
	if len(wins) != 1 {
		t.Fatalf("%d acquirers won, want exactly 1", len(wins))
	}
	for err := range busy {
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("loser: %v, want ErrBusy", err)
		}
	}
	(<-wins).Abort("test")
}

func TestPolicyAndHostileBytes(t *testing.T) {
	o := startOld(t, OfferOptions{Policy: uds.AllowUIDs(4242)})
	if a, err := acquire(t, o.ctl); err == nil {
		a.Abort("")
		t.Fatal("an acquirer the policy refuses got the offer")
	}
	o2 := startOld(t, OfferOptions{})
	for _, junk := range []string{"", "GET / HTTP/1.1\r\n\r\n", "\x01\x01\x00\x00\xff\xff\xff\xff", "\x02\x01\x00\x00\x00\x00\x00\x00"} {
		c, err := net.Dial("unix", o2.ctl)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, junk)
		if uc, ok := c.(*net.UnixConn); ok {
			uc.CloseWrite()
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, c)
		c.Close()
	}
	// A hostile session may still be winding down (ErrBusy is transient);
	// then the offer is there again.
	var a *Acquired
	var err error
	testutil.WaitFor(t, "an acquire after the hostile sessions", func() bool {
		a, err = acquire(t, o2.ctl)
		if err != nil && !errors.Is(err, ErrBusy) {
			t.Fatalf("after hostile bytes: %v", err)
		}
		return err == nil
	})
	a.Abort("")
	if got := ask(t, o2.path); got != "old" {
		t.Fatalf("%q", got)
	}
}

// TestOffererLeavesNothingBehind: sessions that abort, time out, are
// refused as busy or send junk, and a Close: no goroutine of the package
// and no descriptor is left.
func TestOffererLeavesNothingBehind(t *testing.T) {
	check := testutil.LeakCheck(t)
	dir := testutil.ShortDir(t, 0o700)
	path := filepath.Join(dir, "leak.sock")
	l, err := Listen(context.Background(), "svc", path, uds.ListenOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	off, err := Offer(context.Background(), []*Listener{l}, OfferOptions{Control: ControlPath(path), Logger: quiet, CommitTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a, err := acquire(t, off.opts.Control)
	if err != nil {
		t.Fatal(err)
	}
	nl, err := a.Listener("svc", uds.ListenOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(t, off.opts.Control); !errors.Is(err, ErrBusy) {
		t.Fatalf("second acquirer: %v", err)
	}
	a.Abort("test")
	nl.Close()
	var b *Acquired
	testutil.WaitFor(t, "the offer back after the abort", func() bool { // ErrBusy until the session ends
		b, err = acquire(t, off.opts.Control)
		return err == nil
	})
	time.Sleep(400 * time.Millisecond) // past the commit timeout: the offer is withdrawn
	b.finish()
	c, err := net.Dial("unix", off.opts.Control)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "junk junk junk")
	c.Close()
	off.Close()
	l.Close()
	testutil.NoGoroutinesIn(t, "udskit/handoff.")
	check()
}
