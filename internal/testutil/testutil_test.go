package testutil

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	Main(m, map[string]HelperFunc{
		"whoami": func(arg string) int { return PrintJSON([]string{arg, itoa(os.Getuid())}) },
		"hold":   func(string) int { Ready(); return 0 },
		"silent": func(string) int { return 0 },
	})
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestHelperRunsAsUs(t *testing.T) {
	var got []string
	RunJSON(t, HelperCmd(t, "whoami", "arg with spaces"), &got)
	if len(got) != 2 || got[0] != "arg with spaces" || got[1] != itoa(os.Getuid()) {
		t.Fatalf("helper said %q", got)
	}
}

func TestNobodyCmd(t *testing.T) {
	var got []string
	RunJSON(t, NobodyCmd(t, "whoami", "x"), &got)
	if len(got) != 2 || got[1] != itoa(NobodyUID) {
		t.Fatalf("helper as nobody said %q, want uid %d", got, NobodyUID)
	}
}

func TestStartHelperStopsChildAtCleanup(t *testing.T) {
	var c *Child
	t.Run("inner", func(t *testing.T) {
		c = StartHelper(t, HelperCmd(t, "hold", ""))
		if c.PID == os.Getpid() || syscall.Kill(c.PID, 0) != nil {
			t.Fatalf("child pid %d not running", c.PID)
		}
	})
	if c.Cmd.ProcessState == nil || !c.Cmd.ProcessState.Success() {
		t.Fatalf("child not reaped cleanly after the test: %v", c.Cmd.ProcessState)
	}
}

func TestServeEchoLeavesNothingBehind(t *testing.T) {
	dir := ShortDir(t, 0o700)
	// Warm up the netpoller before the baseline.
	t.Run("warm", func(t *testing.T) {
		l := ListenUnix(t, filepath.Join(dir, "w.sock"))
		Serve(t, l, Hangup)
		DialUnix(t, l.Addr().String())
	})
	check := LeakCheck(t)
	t.Run("echo", func(t *testing.T) {
		l := ListenUnix(t, filepath.Join(dir, "e.sock"))
		Serve(t, l, Echo)
		for range 3 {
			c := DialUnix(t, l.Addr().String())
			c.Write([]byte("hi"))
			b := make([]byte, 2)
			if _, err := io.ReadFull(c, b); err != nil || string(b) != "hi" {
				t.Fatalf("echo %q %v", b, err)
			}
		}
		// Conns still open here: Serve's cleanup must close its ends.
	})
	check()
}

func TestAcceptAndStaleSocket(t *testing.T) {
	dir := ShortDir(t, 0o755)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("ShortDir mode %v %v", fi.Mode(), err)
	}
	p := filepath.Join(dir, "a.sock")
	l := ListenUnix(t, p)
	c := DialUnix(t, p)
	s := Accept(t, l)
	c.Write([]byte("x"))
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "stale.sock")
	StaleSocket(t, stale)
	err := syscall.Connect(mustSocket(t), &syscall.SockaddrUnix{Name: stale})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect to stale socket: %v, want ECONNREFUSED", err)
	}
}

func mustSocket(t *testing.T) int {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	return fd
}

func parkedForLeakTest(release chan struct{}) { <-release }

func TestNoGoroutinesIn(t *testing.T) {
	release := make(chan struct{})
	go parkedForLeakTest(release)
	WaitFor(t, "parked goroutine", func() bool { return len(goroutinesIn("parkedForLeakTest")) == 1 })
	close(release)
	NoGoroutinesIn(t, "parkedForLeakTest")
}

func TestBufferMax(t *testing.T) {
	b := &Buffer{Max: 5}
	for _, s := range []string{"abc", "defg", "h"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if b.String() != "abcde" {
		t.Fatalf("kept %q, want abcde", b.String())
	}
	var u Buffer
	u.Write([]byte(strings.Repeat("z", 1000)))
	if len(u.String()) != 1000 {
		t.Fatalf("uncapped buffer kept %d", len(u.String()))
	}
}

// TestPair: both ends of each network's pair are connected to each other.
func TestPair(t *testing.T) {
	for _, network := range []string{"unix", "tcp"} {
		c1, c2 := Pair(t, network)
		if got := c1.RemoteAddr().Network(); got != network {
			t.Errorf("%s pair: network %q", network, got)
		}
		for _, dir := range [][2]net.Conn{{c1, c2}, {c2, c1}} {
			if _, err := dir[0].Write([]byte("ping")); err != nil {
				t.Fatalf("%s write: %v", network, err)
			}
			buf := make([]byte, 4)
			if _, err := io.ReadFull(dir[1], buf); err != nil || string(buf) != "ping" {
				t.Fatalf("%s read %q, %v", network, buf, err)
			}
		}
	}
}

func TestWorkersBounds(t *testing.T) {
	var calls [3]atomic.Int64
	Workers(3, 10*time.Second, 50, func(g, i int) bool {
		calls[g].Add(1)
		return !(g == 1 && i == 9) // worker 1 stops itself after 10 calls
	})
	if calls[0].Load() != 50 || calls[1].Load() != 10 || calls[2].Load() != 50 {
		t.Fatalf("calls per worker %d %d %d, want 50 10 50", calls[0].Load(), calls[1].Load(), calls[2].Load())
	}
	t0 := time.Now()
	Workers(2, 50*time.Millisecond, 1<<30, func(g, i int) bool { time.Sleep(time.Millisecond); return true })
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("Workers ran %v past its 50ms bound", d)
	}
}
