package uds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/testutil"
)

func init() {
	helpers["systemd"] = helperSystemd
	helpers["listenpassed"] = helperListenPassed
}

func TestListenFDChecksAndOwnership(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	path := filepath.Join(dir, "s.sock")
	orig, err := Listen(context.Background(), path, ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dup, err := orig.DupFD()
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListenFD(dup, ListenOptions{Policy: AllowSameUser()})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.UAddr(); got.Kind != Unix || got.Name != path {
		t.Fatalf("inherited addr %v, want unix:%s", got, path)
	}
	if _, err := unix.FcntlInt(uintptr(dup), unix.F_GETFD, 0); err == nil {
		t.Fatal("ListenFD left the original fd open")
	}
	// Both serve the same kernel socket: a connect is accepted by the copy.
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	ac, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if cr, ok := CredOf(ac); !ok || cr.PID != int32(os.Getpid()) {
		t.Fatalf("accepted conn creds %v %v", cr, ok)
	}
	ac.Close()
	// Inherited and not owned: its Close leaves the file to the original.
	l.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("inherited listener's Close removed the socket file: %v", err)
	}
	// Released: the original's Close leaves it too.
	orig.Release()
	orig.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("released listener's Close removed the socket file: %v", err)
	}
	os.Remove(path)

	// Own: the adopter's Close removes the file.
	orig, err = Listen(context.Background(), path, ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dup, _ = orig.DupFD()
	l, err = ListenFD(dup, ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orig.Release()
	orig.Close()
	if err := l.Own(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("owning listener's Close left the socket file: %v", err)
	}
}

func TestListenFDRefusesWrongDescriptors(t *testing.T) {
	base := testutil.CountFDs(t)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	dgram, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	unbound, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	for _, tc := range []struct {
		fd   int
		want string
	}{{p[0], "not a socket"}, {dgram, "stream socket"}, {unbound, "not listening"}} {
		if _, err := ListenFD(tc.fd, ListenOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fd %d: %v, want %q", tc.fd, err, tc.want)
		}
		// Refused descriptors stay the caller's: still open.
		if _, err := unix.FcntlInt(uintptr(tc.fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("ListenFD closed a descriptor it refused: %v", err)
		}
		unix.Close(tc.fd)
	}
	unix.Close(p[1])
	if now := testutil.CountFDs(t); now != base {
		t.Fatalf("fds %d, want %d", now, base)
	}
	for _, bad := range []string{"fd:", "fd:x", "systemd:", "systemd:a:b", "systemd:a b"} {
		if _, err := ParseAddr(bad); err == nil {
			t.Errorf("ParseAddr(%q) accepted", bad)
		}
	}
	if _, err := Dial(context.Background(), "fd:3", DialOptions{}); err == nil {
		t.Error("Dial(fd:3) accepted")
	}
}

// systemdResult is what helperSystemd prints.
type systemdResult struct {
	Addr    string `json:"addr"`
	Env     string `json:"env"`
	Fd3Open bool   `json:"fd3_open"`
	Again   string `json:"again"`
	Missing string `json:"missing"`
	Read    string `json:"read"`
}

// helperSystemd runs under systemd-socket-activate: it listens on
// systemd:NAME, reports what it sees, and serves one connection.
func helperSystemd(name string) int {
	var res systemdResult
	l, err := Listen(context.Background(), "systemd:"+name, ListenOptions{Policy: AllowSameUser()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	res.Addr = l.UAddr().String()
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		if x, ok := os.LookupEnv(v); ok {
			res.Env += v + "=" + x + " "
		}
	}
	_, err = unix.FcntlInt(3, unix.F_GETFD, 0)
	res.Fd3Open = err == nil
	if _, err := Listen(context.Background(), "systemd:"+name, ListenOptions{}); err != nil {
		res.Again = err.Error()
	}
	if _, err := Listen(context.Background(), "systemd:nope", ListenOptions{}); err != nil {
		res.Missing = err.Error()
	}
	c, err := l.Accept()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b, _ := io.ReadAll(io.LimitReader(c, 64))
	res.Read = string(b)
	c.Close()
	return testutil.PrintJSON(res)
}

// TestSystemdSocketActivation starts the test binary under the real
// systemd-socket-activate, which binds the socket and passes it as fd 3
// named "api" on the first connect.
func TestSystemdSocketActivation(t *testing.T) {
	path := filepath.Join(testutil.ShortDir(t, 0o700), "act.sock")
	cmd := testutil.SocketActivated(t, testutil.HelperCmd(t, "systemd", "api"), path, "api")
	var res systemdResult
	done := make(chan struct{})
	go func() { defer close(done); testutil.RunJSON(t, cmd, &res) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, DialOptions{Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hi"))
	c.(*net.UnixConn).CloseWrite()
	<-done
	c.Close()
	if res.Addr != "unix:"+path || res.Env != "" || res.Fd3Open || res.Read != "hi" {
		t.Fatalf("helper saw %+v", res)
	}
	if !strings.Contains(res.Again, "no unused systemd socket") || !strings.Contains(res.Missing, `"nope"`) {
		t.Fatalf("helper errors: %+v", res)
	}
}

// helperListenPassed listens on its argument (a passed-socket address) and
// prints the error, or "ok" and the environment left.
func helperListenPassed(addr string) int {
	l, err := Listen(context.Background(), addr, ListenOptions{})
	if err != nil {
		fmt.Println(err)
		return 0
	}
	l.Close()
	fmt.Println("ok", os.Getenv("LISTEN_FDS"))
	return 0
}

// TestSystemdEnvironmentChecked: sockets meant for another pid, or a
// LISTEN_FDS that is no count, are not taken, and the variables are gone
// either way.
func TestSystemdEnvironmentChecked(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"LISTEN_PID=1", "LISTEN_FDS=1", "LISTEN_FDNAMES=api"}, "is not this process"},
		{[]string{"LISTEN_FDS=1"}, "is not this process"},
		{[]string{}, "LISTEN_FDS is not set"},
	} {
		cmd := testutil.HelperCmd(t, "listenpassed", "systemd:api")
		cmd.Env = append(cmd.Env, tc.env...)
		out, err := cmd.Output()
		if err != nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("env %v: %q %v, want %q", tc.env, out, err, tc.want)
		}
	}
}
