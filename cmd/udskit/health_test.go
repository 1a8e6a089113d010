package main

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// libServer serves an rpc.Server (with a "sleep" method that blocks until
// its ctx ends) on a temp socket in this process and returns it with its
// address.
func libServer(t *testing.T) (*rpc.Server, string) {
	t.Helper()
	addr := "unix:" + filepath.Join(t.TempDir(), "lib.sock")
	l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := rpc.NewServer(rpc.ServerOptions{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil && !errors.Is(err, rpc.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, addr
}

// `udskit health` against `udskit serve`: 0 and "serving"; an unknown
// --service is 1 with not_found; once the server has stopped, 1 with the
// reason.
func TestHealthVerbServing(t *testing.T) {
	srv := scServe(t, filepath.Join(t.TempDir(), "h.sock"), "-q")
	r := scRun(t, "", "health", srv.addr)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "serving" {
		t.Fatalf("health of a serving server: %+v; want exit 0, serving", r)
	}
	r = scRun(t, "", "health", srv.addr, "--service", "db")
	if r.code != 1 || !strings.Contains(r.stderr, "not_found") || !strings.Contains(r.stderr, `"db"`) {
		t.Fatalf("health --service db: %+v; want exit 1 with not_found naming db", r)
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-srv.done:
		srv.done <- err // for the cleanup, which waits for it too
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit on SIGTERM")
	}
	r = scRun(t, "", "health", srv.addr)
	if r.code != 1 || !strings.Contains(r.stderr, "unreachable") || !strings.Contains(r.stderr, "not started, stopped, or draining") {
		t.Fatalf("health of a stopped server: %+v; want exit 1, unreachable with the reason", r)
	}
}

// A server that is draining (a linger drain keeps serving and reports
// draining; a goaway drain's accepted connections answer it too) makes the
// probe exit 1 and say so; per-service statuses are reported.
func TestHealthVerbDraining(t *testing.T) {
	s, addr := libServer(t)
	s.SetHealth("db", rpc.HealthNotServing)
	s.SetHealth("cache", rpc.HealthServing)
	if r := scRun(t, "", "health", addr, "--service", "cache"); r.code != 0 || strings.TrimSpace(r.stdout) != "serving" {
		t.Fatalf("health --service cache: %+v; want exit 0", r)
	}
	if r := scRun(t, "", "health", addr, "--service", "db"); r.code != 1 || !strings.Contains(r.stderr, `not_serving: service "db"`) {
		t.Fatalf("health --service db: %+v; want exit 1, not_serving", r)
	}
	s.SetHealth("", rpc.HealthDraining)
	for _, args := range [][]string{{addr}, {addr, "--service", "cache"}} {
		r := scRun(t, "", append([]string{"health"}, args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "draining") || r.stdout != "" {
			t.Fatalf("health %v while draining: %+v; want exit 1 with draining", args, r)
		}
	}
}

// No server at all: 1 with the reason, quickly. Bad usage: 2.
func TestHealthVerbUnreachableAndUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	r := scRun(t, "", "health", missing, "--timeout", "2s")
	if r.code != 1 || !strings.Contains(r.stderr, "unreachable") || !strings.Contains(r.stderr, "none.sock") {
		t.Fatalf("health of no server: %+v; want exit 1, unreachable naming the socket", r)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"health", "--no-such-flag", missing}, "unknown flag: --no-such-flag"},
		{[]string{"health", "--timeout", "soon", missing}, "see udskit health --help"},
		{[]string{"health", "--timeout", "0s", missing}, "--timeout 0s: must be positive"},
		{[]string{"health", missing, "extra"}, "see udskit health --help"},
		{[]string{"health", "udp:1.2.3.4:5"}, `unknown scheme "udp"`},
	} {
		r := scRun(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("udskit %s: %+v; want exit 2 mentioning %q", strings.Join(tc.args, " "), r, tc.want)
		}
	}
}

// --wait: the probe starts before the server (as ExecStartPost= or a
// script would) and exits 0 once it serves; it gives up at --timeout with
// exit 1 while the server stays draining.
func TestHealthVerbWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "later.sock")
	probe := scCLI(context.Background(), "health", "--wait", "--timeout", "30s", path)
	var out, errb strings.Builder
	probe.Stdout, probe.Stderr = &out, &errb
	if err := probe.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- probe.Wait() }()
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-waited:
		t.Fatalf("health --wait returned before the server existed: %v %s", err, errb.String())
	default:
	}
	scServe(t, path, "-q")
	select {
	case err := <-waited:
		if err != nil || strings.TrimSpace(out.String()) != "serving" {
			t.Fatalf("health --wait: %v, stdout %q, stderr %q", err, out.String(), errb.String())
		}
	case <-time.After(30 * time.Second):
		probe.Process.Kill()
		t.Fatal("health --wait did not return once the server was up")
	}

	s, addr := libServer(t)
	s.SetHealth("", rpc.HealthDraining)
	start := time.Now()
	r := scRun(t, "", "health", "--wait", "--timeout", "1s", addr)
	if r.code != 1 || !strings.Contains(r.stderr, "draining") {
		t.Fatalf("health --wait on a draining server: %+v; want exit 1, draining", r)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("health --wait gave up after %v, before its 1s timeout", d)
	}
}

// A real drain in linger mode: `udskit serve --drain linger` keeps serving
// after SIGTERM while a client stays, and the probe exits 1 with
// "draining" from the first moment; once the client leaves, serve exits.
func TestHealthVerbLingerDrain(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "linger.sock")
	srv := scServe(t, sock, "-q", "--drain", "linger", "--drain-timeout", "30s")
	if r := scRun(t, "", "health", sock); r.code != 0 {
		t.Fatalf("health before the drain: %+v", r)
	}
	held, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := scRun(t, "", "health", sock)
		if r.code == 1 && strings.Contains(r.stderr, "draining") {
			break
		}
		if r.code != 0 || time.Now().After(deadline) {
			t.Fatalf("health during a linger drain: %+v; want exit 1 with draining", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := scRun(t, "", "call", sock, "echo", `"still"`); r.code != 0 || strings.TrimSpace(r.stdout) != `"still"` {
		t.Fatalf("a call during the linger drain: %+v (linger keeps serving)", r)
	}
	held.Close()
	select {
	case err := <-srv.done:
		srv.done <- err
		if err != nil {
			t.Fatalf("serve exit after the linger drain: %v\n%s", err, srv.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("serve still running 20s after its last client left:\n%s", srv.stderr)
	}
}
