package main

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

func TestVersionAndHelp(t *testing.T) {
	r := scRun(t, "", "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "udskit ") || !strings.Contains(r.stdout, "go1.") {
		t.Fatalf("udskit version: %+v", r)
	}
	r = scRun(t, "", "--help")
	if r.code != 0 {
		t.Fatalf("udskit --help: %+v", r)
	}
	cmds := []string{"bench", "call", "doctor", "ls", "serve", "timing", "version"}
	for _, c := range cmds {
		if !strings.Contains(r.stdout, "\n  "+c+" ") {
			t.Errorf("--help does not list %q:\n%s", c, r.stdout)
		}
	}
	for _, c := range cmds {
		if r := scRun(t, "", c, "--help"); r.code != 0 || !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stdout, "udskit "+c) {
			t.Errorf("udskit %s --help: exit %d\n%s%s", c, r.code, r.stdout, r.stderr)
		}
	}
}

// Bad usage exits 2 (exit 1 means the command ran and failed, e.g. a call's
// error or a doctor that could not connect): flag parse errors, wrong
// argument counts and unknown commands included.
func TestUsageErrorsExit2(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"call", "--timeout", "abc", "/tmp/x.sock", "echo"}, "see udskit call --help"},
		{[]string{"call", "--no-such-flag", "/tmp/x.sock", "echo"}, "unknown flag: --no-such-flag"},
		{[]string{"serve", "/tmp/a.sock", "/tmp/b.sock"}, "see udskit serve --help"},
		{[]string{"ls", "--pid", "x"}, "see udskit ls --help"},
		{[]string{"ls", "a", "b"}, "see udskit ls --help"},
		{[]string{"doctor"}, "see udskit doctor --help"},
		{[]string{"timing", "--duration", "soon"}, "see udskit timing --help"},
		{[]string{"bench", "--rate", "fast"}, "see udskit bench --help"},
		{[]string{"version", "extra"}, "see udskit version --help"},
		// Values that parse as flags but make no sense are bad usage too.
		{[]string{"timing", "--duration", "0"}, "--duration 0s: want between 100ms and 10m"},
		{[]string{"ls", "--pid", "-1"}, "--pid -1: want a process id"},
		{[]string{"doctor", "udp:x"}, "udskit speaks unix:, tcp:, tls: and ssh://"},
		{[]string{"doctor", "udp:1.2.3.4:5"}, `unknown scheme "udp"`},
		{[]string{"doctor", "/tmp/x.sock", "--probe", "ftp"}, `--probe "ftp"`},
		{[]string{"call", "udp:1.2.3.4:5", "echo"}, `unknown scheme "udp"`},
		{[]string{"proxy", "--listen", "tcp:127.0.0.1:0", "--to", "/tmp/x.sock", "--allow-uid", "0"}, "--allow-uid needs unix listen addresses"},
		{[]string{"serve", "tcp:127.0.0.1:0", "--allow-uid", "0"}, "needs a unix socket"},
		{[]string{"serve", "/tmp/x.sock", "--drain-timeout", "0s"}, "--drain-timeout 0s: must be positive"},
		{[]string{"proxy", "--listen", "/tmp/x.sock", "--to", "/tmp/y.sock", "--drain-timeout", "0s"}, "--drain-timeout 0s: must be positive"},
	} {
		r := scRun(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("udskit %s: exit %d, stderr %q; want exit 2 mentioning %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
}

// serveWithEnv starts `udskit serve` (no address) with env changed by edit
// and returns the address it prints and a func that SIGTERMs it and waits.
func serveWithEnv(t *testing.T, edit func([]string) []string) (addr string, stop func()) {
	t.Helper()
	cmd := scCLI(context.Background(), "serve", "-q")
	cmd.Env = edit(cmd.Env)
	var errb testutil.Buffer
	cmd.Stderr = &errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done; done <- nil })
	lines := make(chan string, 1)
	go func() { l, _ := bufio.NewReader(out).ReadString('\n'); lines <- l }()
	select {
	case l := <-lines:
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "listening" {
			t.Fatalf("serve printed %q; stderr %s", l, errb.String())
		}
		addr = f[2]
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not start; stderr %s", errb.String())
	}
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			done <- err
			if err != nil {
				t.Fatalf("serve after SIGTERM: %v; stderr %s", err, errb.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("serve still running 10s after SIGTERM")
		}
	}
	return addr, stop
}

func withoutEnv(env []string, key string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// Without ADDR, serve listens on $XDG_RUNTIME_DIR/udskit.sock, or without
// that variable in the private dir $TMPDIR/udskit-UID that it removes on exit;
// either way it prints the address, the socket is owner-only, and call
// without an address finds it.
func TestServeDefaultAddress(t *testing.T) {
	tmp := t.TempDir()
	addr, stop := serveWithEnv(t, func(env []string) []string {
		return append(withoutEnv(withoutEnv(env, "XDG_RUNTIME_DIR"), "TMPDIR"), "TMPDIR="+tmp)
	})
	sock := strings.TrimPrefix(addr, "unix:")
	dir := filepath.Dir(sock)
	if want := filepath.Join(tmp, "udskit-"+strconv.Itoa(os.Geteuid()), "udskit.sock"); sock != want {
		t.Fatalf("without XDG_RUNTIME_DIR serve listens on %s, want %s", addr, want)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("temp socket dir %s: %v %v, want 0700", dir, st, err)
	}
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v %v, want 0600", sock, st, err)
	}
	if r := scRun(t, "", "call", addr, "echo", `"hi"`); r.code != 0 || r.stdout != "\"hi\"\n" {
		t.Fatalf("call on the default address: %+v", r)
	}
	// call without an address finds serve's default, with the same environment.
	for _, args := range [][]string{{"echo", `"hi"`}, {"whoami"}} {
		c := scCLI(context.Background(), append([]string{"call"}, args...)...)
		c.Env = append(withoutEnv(withoutEnv(c.Env, "XDG_RUNTIME_DIR"), "TMPDIR"), "TMPDIR="+tmp)
		out, err := c.Output()
		if err != nil || len(out) == 0 {
			t.Fatalf("udskit call %v without an address: %v %q", args, err, out)
		}
	}
	stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("private socket dir %s left after exit: %v", dir, err)
	}

	rt := t.TempDir()
	os.Chmod(rt, 0o700)
	addr, stop = serveWithEnv(t, func(env []string) []string {
		return append(withoutEnv(env, "XDG_RUNTIME_DIR"), "XDG_RUNTIME_DIR="+rt)
	})
	if addr != "unix:"+filepath.Join(rt, "udskit.sock") {
		t.Fatalf("with XDG_RUNTIME_DIR=%s serve listens on %s", rt, addr)
	}
	if r := scRun(t, "", "call", addr, "echo", `1`); r.code != 0 {
		t.Fatalf("call: %+v", r)
	}
	stop()
	if _, err := os.Stat(filepath.Join(rt, "udskit.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket left in XDG_RUNTIME_DIR after exit: %v", err)
	}
}
