package uds

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

func listenT(t *testing.T, addr string, opts ListenOptions) *Listener {
	t.Helper()
	l, err := Listen(context.Background(), addr, opts)
	if err != nil {
		t.Fatalf("Listen(%q): %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func roundTrip(t *testing.T, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, DialOptions{})
	if err != nil {
		t.Fatalf("Dial(%q): %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo: %q %v", buf, err)
	}
}

func TestListenStaleSocketRemoved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	testutil.StaleSocket(t, path)
	l := listenT(t, path, ListenOptions{})
	testutil.Serve(t, l, testutil.Echo)
	roundTrip(t, path) // a stale socket would refuse
}

func TestListenRegularFileLeftIntact(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, what string
		make       func(p string) error
	}{
		{"file", "regular file", func(p string) error { return os.WriteFile(p, []byte("precious"), 0o644) }},
		{"dir", "directory", func(p string) error { return os.Mkdir(p, 0o755) }},
		{"link", "symbolic link", func(p string) error { return os.Symlink("/nonexistent", p) }},
		{"fifo", "named pipe (FIFO)", func(p string) error { return syscall.Mkfifo(p, 0o600) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if err := tc.make(path); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(path)
			_, err := Listen(context.Background(), path, ListenOptions{})
			var nse *NotSocketError
			if !errors.As(err, &nse) || nse.What != tc.what || nse.Path != path {
				t.Fatalf("want NotSocketError(%s), got %v", tc.what, err)
			}
			if !strings.Contains(err.Error(), tc.what) || !strings.Contains(err.Error(), "refusing to remove") {
				t.Errorf("message does not say what is there: %v", err)
			}
			after, err := os.Lstat(path)
			if err != nil || !os.SameFile(before, after) {
				t.Fatalf("%s was touched: %v", tc.what, err)
			}
			if _, err := os.Lstat(path + ".lock"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the failed Listen left %s.lock behind (%v)", tc.name, err)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "file")); string(b) != "precious" {
		t.Fatalf("file content changed: %q", b)
	}
}

func TestListenLiveServerDetected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l := listenT(t, path, ListenOptions{})
	testutil.Serve(t, l, testutil.Echo)
	_, err := Listen(context.Background(), path, ListenOptions{})
	var iu *InUseError
	if !errors.Is(err, ErrInUse) || !errors.As(err, &iu) {
		t.Fatalf("want InUseError, got %v", err)
	}
	if iu.PID != os.Getpid() {
		t.Errorf("owner pid %d, want ours %d", iu.PID, os.Getpid())
	}
	if !strings.Contains(err.Error(), "in use by a live server (pid "+strconv.Itoa(os.Getpid())+")") {
		t.Errorf("message: %v", err)
	}
	roundTrip(t, path) // the live server is untouched
}

func TestListenLiveServerInChildProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	child := startListenHelper(t, path)
	_, err := Listen(context.Background(), path, ListenOptions{})
	var iu *InUseError
	if !errors.As(err, &iu) {
		t.Fatalf("want InUseError, got %v", err)
	}
	if iu.PID != child.PID {
		t.Fatalf("owner pid %d, want child's %d", iu.PID, child.PID)
	}
}

func TestOwnerPIDFromProc(t *testing.T) {
	// A socket whose listen(2) caller is gone is found through /proc/net/unix
	// and /proc/*/fd. Here: a hint pid that does not exist.
	if runtime.GOOS != "linux" {
		t.Skip("/proc lookup is Linux-only")
	}
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := ownerPID(path, 1<<30); got != os.Getpid() {
		t.Fatalf("ownerPID = %d, want %d", got, os.Getpid())
	}
}

func TestListenConcurrentExactlyOneWins(t *testing.T) {
	dir := t.TempDir()
	for round := range 20 {
		path := filepath.Join(dir, "r"+strconv.Itoa(round)+".sock")
		if round%2 == 0 {
			testutil.StaleSocket(t, path) // the dangerous case: all see a stale socket
		}
		const n = 8
		var wg sync.WaitGroup
		ls := make([]*Listener, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { ls[i], errs[i] = Listen(context.Background(), path, ListenOptions{}) })
		}
		wg.Wait()
		won := 0
		for i := range n {
			if errs[i] == nil {
				won++
				testutil.Serve(t, ls[i], testutil.Echo)
				defer ls[i].Close()
			} else if !errors.Is(errs[i], ErrInUse) {
				t.Fatalf("round %d: loser got %v, want ErrInUse", round, errs[i])
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d listeners won", round, won)
		}
		roundTrip(t, path)
	}
}

func TestListenDefaultMode0600NoWindow(t *testing.T) {
	old := syscall.Umask(0) // the most permissive umask must not matter
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "s.sock")
	listenT(t, path, ListenOptions{})
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("mode %v, want socket 0600", fi.Mode())
	}
}

func TestListenModeAndOwner(t *testing.T) {
	old := syscall.Umask(0o077) // a restrictive umask must not narrow an explicit mode
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "s.sock")
	opts := ListenOptions{Mode: 0o660}
	if os.Geteuid() == 0 {
		uid, gid := 65534, 65534
		opts.UID, opts.GID = &uid, &gid
	}
	listenT(t, path, opts)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Fatalf("mode %v, want 0660", fi.Mode())
	}
	if os.Geteuid() == 0 {
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 65534 || st.Gid != 65534 {
			t.Fatalf("owner %d:%d, want 65534:65534", st.Uid, st.Gid)
		}
	}
}

func TestListenCreatesParentDirs(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	base := t.TempDir()
	path := filepath.Join(base, "a", "b", "s.sock")
	listenT(t, path, ListenOptions{})
	for _, d := range []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b")} {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v, want 0700", d, fi, err)
		}
	}
	path2 := filepath.Join(base, "c", "s.sock")
	listenT(t, path2, ListenOptions{DirMode: 0o750})
	if fi, _ := os.Stat(filepath.Dir(path2)); fi.Mode().Perm() != 0o750 {
		t.Fatalf("DirMode: %v", fi.Mode())
	}
	_, err := Listen(context.Background(), filepath.Join(base, "d", "s.sock"), ListenOptions{NoMkdir: true})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("NoMkdir: want not-exist error, got %v", err)
	}
}

func TestListenPathTooLong(t *testing.T) {
	base := t.TempDir()
	path := filepath.Join(base, "nodir", strings.Repeat("x", 120)+".sock")
	_, err := Listen(context.Background(), path, ListenOptions{})
	var tl *PathTooLongError
	if !errors.As(err, &tl) {
		t.Fatalf("want PathTooLongError, got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{strconv.Itoa(len(path)) + " bytes", "limit of " + strconv.Itoa(sunPathMax-1), "relative path", "abstract"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "nodir")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a directory was created before the length check")
	}
	// The longest path that fits works.
	fit := filepath.Join(base, "f")
	fit += strings.Repeat("y", sunPathMax-1-len(fit))
	listenT(t, fit, ListenOptions{})
	_, err = Listen(context.Background(), fit+"z", ListenOptions{})
	if !errors.As(err, &tl) {
		t.Fatalf("one byte over: %v", err)
	}
	_, err = Listen(context.Background(), "@"+strings.Repeat("a", sunPathMax), ListenOptions{})
	if !errors.As(err, &tl) {
		t.Fatalf("abstract too long: %v", err)
	}
}

func TestListenCloseUnlinksOnlyOwnSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	a := listenT(t, path, ListenOptions{})
	if _, err := os.Stat(path + ".lock"); err != nil {
		t.Fatalf("lock file: %v", err)
	}
	// Someone removes A's socket and B binds the path.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	b := listenT(t, path, ListenOptions{})
	testutil.Serve(t, b, testutil.Echo)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("A's Close removed B's socket: %v", err)
	}
	roundTrip(t, path)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + ".lock"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left after Close: %v", p, err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestListenAbstract(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("abstract names are Linux-only")
	}
	name := "@udskit-test-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	l := listenT(t, name, ListenOptions{})
	if l.UAddr().Kind != Abstract {
		t.Fatalf("kind %v", l.UAddr().Kind)
	}
	testutil.Serve(t, l, testutil.Echo)
	roundTrip(t, name)
	roundTrip(t, "unix:"+name)
	if _, err := os.Lstat(name); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("an abstract listener created a file")
	}
	_, err := Listen(context.Background(), name, ListenOptions{})
	var iu *InUseError
	if !errors.As(err, &iu) || iu.PID != os.Getpid() {
		t.Fatalf("second listen on abstract name: %v", err)
	}
	l.Close()
	l2 := listenT(t, name, ListenOptions{})
	l2.Close()
}

func TestListenTCP(t *testing.T) {
	l := listenT(t, "tcp:127.0.0.1:0", ListenOptions{Mode: 0o777})
	if l.UAddr().Kind != TCP || strings.HasSuffix(l.UAddr().Name, ":0") {
		t.Fatalf("UAddr %v", l.UAddr())
	}
	testutil.Serve(t, l, testutil.Echo)
	roundTrip(t, l.UAddr().String())
	_, err := Listen(context.Background(), "tcp:127.0.0.1:0", ListenOptions{Policy: AllowSameUser()})
	if !errors.Is(err, ErrPolicyOnTCP) {
		t.Fatalf("policy on TCP: %v", err)
	}
}

func TestListenBadAddress(t *testing.T) {
	_, err := Listen(context.Background(), "udp:1.2.3.4:5", ListenOptions{})
	var ae *AddrError
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), AddrForms) {
		t.Fatalf("want AddrError naming forms, got %v", err)
	}
}

func TestPolicyRefusesBeforeReading(t *testing.T) {
	var logs testutil.Buffer
	var mu sync.Mutex
	calls := 0
	pol := func(c Cred) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return AllowUIDs(c.UID + 1)(c) // refuses
		}
		return AllowSameUser()(c)
	}
	path := filepath.Join(t.TempDir(), "s.sock")
	l := listenT(t, path, ListenOptions{Policy: pol, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	ctx := context.Background()
	bad, err := Dial(ctx, path, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad.Write([]byte("refused-bytes"))
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := bad.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("refused peer read %d, %v; want closed", n, err)
	}
	bad.Close()
	good, err := Dial(ctx, path, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	good.Write([]byte("ok"))
	c := <-accepted
	defer c.Close()
	// The first conn Accept returns is the allowed one: the refused peer's
	// bytes never reached the application.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("accepted conn read %q %v", buf, err)
	}
	cr, ok := c.(*Conn).Cred()
	if !ok || cr.PID != int32(os.Getpid()) || cr.UID != uint32(os.Getuid()) {
		t.Fatalf("cred %v %v", cr, ok)
	}
	if l.Refused() != 1 {
		t.Fatalf("Refused() = %d, want 1", l.Refused())
	}
	out := logs.String()
	if !strings.Contains(out, "peer refused") || !strings.Contains(out, "pid="+strconv.Itoa(os.Getpid())) {
		t.Fatalf("refusal not logged: %s", out)
	}
}

func TestNobodyRefusedByModeAndPolicy(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	// Default 0600: the file mode refuses nobody (EACCES at connect).
	p1 := filepath.Join(dir, "private.sock")
	l1 := listenT(t, p1, ListenOptions{})
	testutil.Serve(t, l1, testutil.Echo)
	res := dialAsNobody(t, p1)
	if res.Errno != syscall.EACCES.Error() || !strings.Contains(res.Err, "permission denied") || !strings.Contains(res.Err, "search permission") {
		t.Fatalf("nobody vs 0600: %+v", res)
	}
	// 0666 lets nobody connect; AllowUIDs(0) refuses it at Accept.
	var logs testutil.Buffer
	p2 := filepath.Join(dir, "open.sock")
	l2 := listenT(t, p2, ListenOptions{Mode: 0o666, Policy: AllowUIDs(0),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	testutil.Serve(t, l2, testutil.Echo)
	res = dialAsNobody(t, p2)
	if res.Err != "" && !strings.Contains(res.Err, "reset") || res.Read != "" {
		t.Fatalf("nobody vs policy: %+v", res)
	}
	if l2.Refused() != 1 {
		t.Fatalf("Refused() = %d", l2.Refused())
	}
	if !strings.Contains(logs.String(), "uid=65534") {
		t.Fatalf("log: %s", logs.String())
	}
	// And root, allowed by the policy, gets through.
	roundTrip(t, p2)
}
