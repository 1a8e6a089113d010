package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testsvc"
	"github.com/udskit/udskit/internal/testutil"
)

// capRun is a running `udskit capture`.
type capRun struct {
	cmd    *exec.Cmd
	stderr *testutil.Buffer
	done   chan error
}

// startCapture runs udskit capture with args (stdout to out, may be nil)
// and returns once it says it has interposed.
func startCapture(t *testing.T, out io.Writer, args ...string) *capRun {
	t.Helper()
	cmd := scCLI(context.Background(), append([]string{"capture"}, args...)...)
	c := &capRun{cmd: cmd, stderr: &testutil.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr, cmd.Stdout = c.stderr, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
		}
	})
	testutil.WaitFor(t, "capture to interpose", func() bool {
		select {
		case err := <-c.done:
			t.Fatalf("capture exited: %v\n%s", err, c.stderr)
		default:
		}
		return strings.Contains(c.stderr.String(), "interposed on")
	})
	return c
}

// stop sends SIGINT and waits for a clean exit.
func (c *capRun) stop(t *testing.T) string {
	t.Helper()
	c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-c.done:
		c.done <- err
		if err != nil {
			t.Fatalf("capture: %v\n%s", err, c.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("capture did not stop:\n%s", c.stderr)
	}
	return c.stderr.String()
}

func tsharkFields(t *testing.T, args ...string) string {
	t.Helper()
	ts := testsvc.NeedBinary(t, "tshark")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, ts, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("tshark %v: %v\n%s", args, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestCaptureCLIPostgres: docs/capture.md's PostgreSQL recipe against a
// real server on a unix socket only.
func TestCaptureCLIPostgres(t *testing.T) {
	testsvc.NeedBinary(t, "tshark")
	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{})
	sock := pg.SocketPath()
	ino := testutil.Inode(t, sock)
	file := filepath.Join(t.TempDir(), "pg.pcapng")
	c := startCapture(t, nil, sock, "-w", file)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := testsvc.Psql(ctx, pg.Host, pg.Port, "-c", "select 40+2").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "42" {
		t.Fatalf("psql through the capture: %q %v", out, err)
	}
	notes := c.stop(t)
	if !strings.Contains(notes, "server port 5432") || !strings.Contains(notes, "original socket restored") {
		t.Errorf("capture's notes:\n%s", notes)
	}
	if got := tsharkFields(t, "-r", file, "-Y", "pgsql.query", "-T", "fields", "-e", "pgsql.query"); got != "select 40+2" {
		t.Fatalf("tshark pgsql.query = %q", got)
	}
	if got := tsharkFields(t, "-r", file, "-Y", "frame.comment", "-T", "fields", "-e", "frame.comment"); !strings.Contains(got, "comm psql") {
		t.Errorf("connection comment %q does not name psql", got)
	}
	if testutil.Inode(t, sock) != ino {
		t.Fatal("the original socket (same inode) is not back")
	}
	if got := pg.Query(t, "select 6*7"); got != "42" {
		t.Fatalf("psql after the capture: %q", got)
	}
}

// TestCaptureCLIRedis: redis-cli SET/GET through an interposed redis-server
// socket; tshark's RESP dissector shows the commands.
func TestCaptureCLIRedis(t *testing.T) {
	testsvc.NeedBinary(t, "tshark")
	testsvc.NeedBinary(t, "redis-cli")
	r := testsvc.StartRedis(t, testsvc.RedisOptions{})
	file := filepath.Join(t.TempDir(), "redis.pcapng")
	c := startCapture(t, nil, r.Socket, "-w", file)
	if got := run(t, "redis-cli", "-s", r.Socket, "SET", "greeting", "hello-from-capture"); got != "OK" {
		t.Fatalf("SET: %q", got)
	}
	if got := run(t, "redis-cli", "-s", r.Socket, "GET", "greeting"); got != "hello-from-capture" {
		t.Fatalf("GET: %q", got)
	}
	c.stop(t)
	// The Info column reads as text (resp.bulk_string.value is bytes, which
	// tshark 4.0 prints in hex), as docs/capture.md shows it.
	got := tsharkFields(t, "-r", file, "-Y", "resp", "-T", "fields", "-e", "_ws.col.Info")
	for _, want := range []string{"Request: SET greeting hello-from-capture", "Request: GET greeting", "Response: hello-from-capture"} {
		if !strings.Contains(got, want) {
			t.Errorf("the Info column lacks %q:\n%s", want, got)
		}
	}
	if got := run(t, "redis-cli", "-s", r.Socket, "PING"); got != "PONG" {
		t.Fatalf("after the capture: %q", got)
	}
}

// TestCaptureCLIDockerStyleHTTP: curl --unix-socket against a Go HTTP
// server on a docker.sock; http.request.uri shows the path. The text view
// (no -w) is checked on the same traffic.
func TestCaptureCLIDockerStyleHTTP(t *testing.T) {
	testsvc.NeedBinary(t, "tshark")
	testsvc.NeedBinary(t, "curl")
	dir := testutil.ShortDir(t, 0o755)
	sock := filepath.Join(dir, "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `[{"Id":"abc"}]`)
	})}
	go srv.Serve(l)
	defer srv.Close()
	file := filepath.Join(dir, "docker.pcapng")
	c := startCapture(t, nil, sock, "-w", file)
	if got := run(t, "curl", "-sS", "--unix-socket", sock, "http://localhost/v1.43/containers/json"); got != `[{"Id":"abc"}]` {
		t.Fatalf("curl: %q", got)
	}
	c.stop(t)
	if got := tsharkFields(t, "-r", file, "-Y", "http.request", "-T", "fields", "-e", "http.request.uri"); got != "/v1.43/containers/json" {
		t.Fatalf("http.request.uri = %q", got)
	}
	// The text view, ended by --count: two messages (the request and the
	// response, each one write), the meaning --count has in every mode.
	var out testutil.Buffer
	c = startCapture(t, &out, sock, "--count", "2")
	run(t, "curl", "-sS", "--unix-socket", sock, "http://localhost/_ping")
	select {
	case err := <-c.done:
		c.done <- err
		if err != nil {
			t.Fatalf("--count 2: %v\n%s", err, c.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("--count 2 did not end the capture")
	}
	text := out.String()
	if n := len(regexp.MustCompile(`(?m) \d+ bytes( \[.*\])?$`).FindAllString(text, -1)); n != 2 {
		t.Errorf("--count 2 recorded %d messages, want 2:\n%s", n, text)
	}
	for _, want := range []string{"comm curl", "> server pid " + strconv.Itoa(os.Getpid()) + " ", "GET /_ping HTTP/1.1", "server pid " + strconv.Itoa(os.Getpid()) + " > client pid", `[{"Id":"abc"}]`} {
		if !strings.Contains(text, want) {
			t.Errorf("text view lacks %q:\n%s", want, text)
		}
	}
}

// TestCaptureCLIUdskitLive: udskit call against udskit serve, captured to
// stdout and piped into tshark with the udskit dissector: tshark prints the
// method and id while the capture is still running.
func TestCaptureCLIUdskitLive(t *testing.T) {
	ts := testsvc.NeedBinary(t, "tshark")
	lua, _ := filepath.Abs("../../wireshark/udskit.lua")
	dir := testutil.ShortDir(t, 0o755)
	sock := filepath.Join(dir, "app.sock")
	scServe(t, sock)
	pr, pw, _ := os.Pipe()
	c := startCapture(t, pw, sock, "-w", "-")
	pw.Close()
	tsh := exec.Command(ts, "-X", "lua_script:"+lua, "-l", "-r", "-", "-Y", "udskit.method", "-T", "fields", "-e", "udskit.id", "-e", "udskit.method")
	tsh.Stdin = pr
	tout, _ := tsh.StdoutPipe()
	if err := tsh.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	defer func() { tsh.Process.Kill(); tsh.Wait() }()
	if r := scRun(t, "", "call", sock, "echo", `{"live":true}`); r.code != 0 {
		t.Fatalf("call: %+v", r)
	}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(tout).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if strings.TrimSpace(l) != "1\techo" {
			t.Fatalf("tshark printed %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tshark printed nothing while the capture ran")
	}
	c.stop(t)
}

// TestCaptureCLIKillRestoreDoctor: SIGKILL mid-run leaves the original
// aside; doctor explains it, --restore brings it back (same inode).
func TestCaptureCLIKillRestoreDoctor(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	sock := filepath.Join(dir, "app.sock")
	scServe(t, sock)
	ino := testutil.Inode(t, sock)
	c := startCapture(t, nil, sock, "-w", filepath.Join(dir, "x.pcapng"))
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	c.done <- nil
	r := scRun(t, "", "doctor", sock)
	if !strings.Contains(r.stdout, "udskit capture --restore "+sock) {
		t.Errorf("doctor does not explain the leftover:\n%s", r.stdout)
	}
	r = scRun(t, "", "capture", "--restore", sock)
	if r.code != 0 || !strings.Contains(r.stdout, "restored the original socket") {
		t.Fatalf("--restore: %+v", r)
	}
	if testutil.Inode(t, sock) != ino {
		t.Fatal("not the original inode")
	}
	if r := scRun(t, "", "call", sock, "echo", `1`); r.code != 0 {
		t.Fatalf("call after restore: %+v", r)
	}
	if r := scRun(t, "", "capture", "--restore", sock); r.code != 0 || !strings.Contains(r.stdout, "nothing to restore") {
		t.Fatalf("second --restore: %+v", r)
	}
}

// TestProxyCLICapture: mode 2, udskit proxy --capture.
func TestProxyCLICapture(t *testing.T) {
	testsvc.NeedBinary(t, "tshark")
	dir := testutil.ShortDir(t, 0o755)
	sock := filepath.Join(dir, "app.sock")
	scServe(t, sock)
	front := filepath.Join(dir, "front.sock")
	file := filepath.Join(dir, "proxy.pcapng")
	cmd := scCLI(context.Background(), "proxy", "--listen", front, "--to", sock, "--capture", file)
	var errb testutil.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	testutil.WaitFor(t, "proxy to listen", func() bool { _, err := os.Stat(front); return err == nil })
	if r := scRun(t, "", "call", front, "echo", `"via proxy"`); r.code != 0 || r.stdout != "\"via proxy\"\n" {
		t.Fatalf("call: %+v", r)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	lua, _ := filepath.Abs("../../wireshark/udskit.lua")
	got := tsharkFields(t, "-X", "lua_script:"+lua, "-r", file, "-Y", "udskit.method", "-T", "fields", "-e", "frame.interface_name", "-e", "udskit.method")
	if got != front+"\techo" {
		t.Fatalf("tshark: %q\nproxy log:\n%s", got, errb.String())
	}
}

func TestCaptureCLIErrors(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"capture"}, 2, "give the socket PATH"},
		{[]string{"capture", "a", "b"}, 2, "give the socket PATH"},
		{[]string{"capture", filepath.Join(dir, "x.sock"), "-W", "3"}, 2, "-W needs -C"},
		{[]string{"capture", filepath.Join(dir, "x.sock"), "-C", "10"}, 2, "-C needs -w"},
		{[]string{"capture", "127.0.0.1:80"}, 2, "TCP address"},
		{[]string{"capture", filepath.Join(dir, "missing.sock")}, 1, "no socket at this path"},
		{[]string{"capture", "@some-abstract-name"}, 1, "abstract socket name has no file"},
	} {
		r := scRun(t, "", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("udskit %s: exit %d, stderr %q; want exit %d with %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.code, tc.want)
		}
	}
	r := scRun(t, "", "capture", "--help")
	for _, want := range []string{"Mode 1", "Mode 2", "Mode 3", "udskit proxy --listen A --to B --capture FILE", "--restore", "tshark -r -"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("capture --help lacks %q", want)
		}
	}
	// It leads with the three commands people run, before any detail.
	mode1 := strings.Index(r.stdout, "Mode 1")
	for _, want := range []string{"udskit capture /run/app.sock  ", "udskit capture /run/app.sock -w app.pcapng", "udskit capture --kernel --pid 1234 -w app.pcapng"} {
		if i := strings.Index(r.stdout, want); i < 0 || i > mode1 {
			t.Errorf("capture --help does not lead with %q (at %d, Mode 1 at %d)", want, i, mode1)
		}
	}
}

// TestCaptureDocRecipesParse: every `udskit capture` line of
// docs/capture.md has flags this binary accepts (run against a missing
// socket, each fails only because there is no socket; --restore finds
// nothing to restore).
func TestCaptureDocRecipesParse(t *testing.T) {
	dir := t.TempDir()
	n := 0
	for _, rc := range captureRecipes(t, "../../docs/capture.md") {
		line, args := rc.line, rc.args
		restore := false
		for i, a := range args {
			switch {
			case a == "--restore":
				restore = true
			case strings.HasPrefix(a, "/") || strings.HasPrefix(a, "./"):
				args[i] = filepath.Join(dir, "missing.sock")
			case i > 0 && args[i-1] == "-w" && a != "-":
				args[i] = filepath.Join(dir, "out.pcapng")
			}
		}
		n++
		r := scRun(t, "", args...)
		switch {
		case restore && (r.code != 0 || !strings.Contains(r.stdout, "nothing to restore")):
			t.Errorf("%q: %+v", line, r)
		case !restore && (r.code != 1 || !strings.Contains(r.stderr, "no socket at this path")):
			t.Errorf("%q: exit %d, stderr %q", line, r.code, r.stderr)
		}
	}
	if n < 6 {
		t.Fatalf("only %d recipes found", n)
	}
}
