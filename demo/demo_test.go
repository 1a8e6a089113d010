package demo

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/rpc"
)

func startDemo(t *testing.T, addr string, opts ServerOptions) *Server {
	t.Helper()
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := Listen(context.Background(), addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func dial(t *testing.T, addr string) *rpc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestMethodsOverUnix(t *testing.T) {
	s := startDemo(t, filepath.Join(t.TempDir(), "d.sock"), ServerOptions{Methods: Options{MaxSleep: time.Second, MaxStream: 10}})
	c := dial(t, s.Addr())
	ctx := context.Background()

	out, err := c.CallRaw(ctx, "echo", []byte("\x00raw\xff"), nil)
	if err != nil || string(out) != "\x00raw\xff" {
		t.Fatalf("echo: %q %v", out, err)
	}
	var slept SleepReply
	t0 := time.Now()
	if err := c.Call(ctx, "sleep", SleepRequest{MS: 40}, &slept); err != nil || slept.SleptMS != 40 {
		t.Fatalf("sleep: %+v %v", slept, err)
	}
	if el := time.Since(t0); el < 40*time.Millisecond {
		t.Fatalf("sleep 40ms returned after %v", el)
	}
	if err := c.Call(ctx, "sleep", SleepRequest{MS: 5000}, nil); rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Fatalf("sleep over MaxSleep: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = c.Call(sctx, "sleep", SleepRequest{MS: 900}, nil)
	cancel()
	if rpc.CodeOf(err) != rpc.DeadlineExceeded {
		t.Fatalf("sleep past the deadline: %v", err)
	}

	err = c.Call(ctx, "fail", FailRequest{Code: "not_found", Message: "gone"}, nil)
	var e *rpc.Error
	if !errors.As(err, &e) || e.Code != rpc.NotFound || e.Message != "gone" {
		t.Fatalf("fail: %v", err)
	}
	if err := c.Call(ctx, "fail", FailRequest{Code: "7"}, nil); rpc.CodeOf(err) != rpc.PermissionDenied {
		t.Fatalf("fail by number: %v", err)
	}
	if err := c.Call(ctx, "fail", FailRequest{Code: "bogus"}, nil); rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Fatalf("fail with a bogus code: %v", err)
	}

	st, err := c.Stream(ctx, "stream", StreamRequest{N: 3, IntervalMS: 5})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		var it StreamItem
		err := st.Recv(&it)
		if errors.Is(err, io.EOF) {
			if i != 3 {
				t.Fatalf("stream ended after %d items, want 3", i)
			}
			break
		}
		if err != nil || it.I != i || it.N != 3 {
			t.Fatalf("item %d: %+v %v", i, it, err)
		}
	}
	st2, err := c.Stream(ctx, "stream", StreamRequest{N: 11})
	if err == nil {
		_, err = st2.RecvRaw()
	}
	if rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Fatalf("stream over MaxStream: %v", err)
	}

	var who WhoAmI
	if err := c.Call(ctx, "whoami", nil, &who); err != nil {
		t.Fatal(err)
	}
	if who.PID != int32(os.Getpid()) || who.UID != uint32(os.Getuid()) || who.GID != uint32(os.Getgid()) {
		t.Fatalf("whoami %+v, want pid %d uid %d gid %d", who, os.Getpid(), os.Getuid(), os.Getgid())
	}
}

func TestWhoAmIOverTCPFails(t *testing.T) {
	s := startDemo(t, "tcp:127.0.0.1:0", ServerOptions{})
	c := dial(t, s.Addr())
	err := c.Call(context.Background(), "whoami", nil, nil)
	if rpc.CodeOf(err) != rpc.FailedPrecondition {
		t.Fatalf("whoami over tcp: %v, want failed_precondition", err)
	}
}

func TestShutdownFinishesInFlight(t *testing.T) {
	s := startDemo(t, filepath.Join(t.TempDir(), "d.sock"), ServerOptions{})
	c := dial(t, s.Addr())
	res := make(chan error, 1)
	go func() {
		var r SleepReply
		err := c.Call(context.Background(), "sleep", SleepRequest{MS: 300}, &r)
		if err == nil && r.SleptMS != 300 {
			err = errors.New("wrong reply")
		}
		res <- err
	}()
	for s.ActiveConns() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the call is in flight
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	if err := <-res; err != nil {
		t.Fatalf("in-flight call during Shutdown: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if el := time.Since(t0); el < 200*time.Millisecond {
		t.Fatalf("Shutdown returned after %v, before the in-flight call could finish", el)
	}
}

func TestDefaultAddressIsPrivate(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("XDG_RUNTIME_DIR", "")
	want := "unix:" + filepath.Join(tmp, "udskit-"+strconv.Itoa(os.Geteuid()), "udskit.sock")
	// A client finds the same address serve will use, before serve made the dir.
	if a, err := DefaultCallAddress(); err != nil || a != want {
		t.Fatalf("DefaultCallAddress = %s, %v; want %s", a, err, want)
	}
	addr, cleanup, err := DefaultAddress()
	if err != nil || addr != want {
		t.Fatalf("DefaultAddress = %s, %v; want %s", addr, err, want)
	}
	dir := filepath.Dir(addr[len("unix:"):])
	st, err := os.Lstat(dir)
	if err != nil || st.Mode().Perm() != 0o700 || !st.IsDir() {
		t.Fatalf("default socket dir %s mode %v (%v), want a 0700 directory", dir, st.Mode(), err)
	}
	cleanup()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cleanup left the empty dir %s: %v", dir, err)
	}
	// A directory of that name that others may write, or a symlink, is refused
	// by server and client alike.
	os.Mkdir(dir, 0o777)
	os.Chmod(dir, 0o777)
	if _, _, err := DefaultAddress(); err == nil || !strings.Contains(err.Error(), "not a private (0700) directory") {
		t.Fatalf("serve accepted a world-writable %s: %v", dir, err)
	}
	if _, err := DefaultCallAddress(); err == nil {
		t.Fatalf("call accepted a world-writable %s", dir)
	}
	os.Remove(dir)
	os.Symlink(t.TempDir(), dir)
	if _, _, err := DefaultAddress(); err == nil {
		t.Fatalf("serve accepted a symlink at %s", dir)
	}
	os.Remove(dir)

	rt := t.TempDir()
	os.Chmod(rt, 0o700)
	t.Setenv("XDG_RUNTIME_DIR", rt)
	if a, _, _ := DefaultAddress(); a != "unix:"+filepath.Join(rt, "udskit.sock") {
		t.Fatalf("with XDG_RUNTIME_DIR: %s", a)
	}
	if a, _ := DefaultCallAddress(); a != "unix:"+filepath.Join(rt, "udskit.sock") {
		t.Fatalf("call with XDG_RUNTIME_DIR: %s", a)
	}
	os.Chmod(rt, 0o755)
	a, c, _ := DefaultAddress()
	c()
	if a == "unix:"+filepath.Join(rt, "udskit.sock") {
		t.Fatalf("used a world-readable XDG_RUNTIME_DIR %s", rt)
	}
}

// TestSumAndTotal: the demo's bidirectional "sum" answers each number with
// the running total and ends after the client's last one; "total" answers
// once; a non-number item fails the call with invalid_argument.
func TestSumAndTotal(t *testing.T) {
	s := startDemo(t, filepath.Join(t.TempDir(), "d.sock"), ServerOptions{})
	c := dial(t, s.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Bidi(ctx, "sum")
	if err != nil {
		t.Fatal(err)
	}
	for i, item := range []string{"1", "2", "4.5"} {
		if err := st.SendRaw([]byte(item)); err != nil {
			t.Fatal(err)
		}
		got, err := st.RecvRaw()
		if err != nil || string(got) != []string{"1", "3", "7.5"}[i] {
			t.Fatalf("after %s: %q %v", item, got, err)
		}
	}
	st.CloseSend()
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatalf("after CloseSend: %v", err)
	}
	bad, _ := c.Bidi(ctx, "sum")
	bad.SendRaw([]byte(`"x"`))
	if _, err := bad.RecvRaw(); rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Fatalf("a string item: %v, want invalid_argument", err)
	}
	tot, err := rpc.OpenJSONClientStream[float64, float64](ctx, c, "total")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []float64{10, 20, 0.5} {
		tot.Send(n)
	}
	if got, err := tot.CloseAndRecv(); err != nil || got != 30.5 {
		t.Fatalf("total: %v %v", got, err)
	}
}
