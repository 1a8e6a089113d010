package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// The test binary doubles as the udskit CLI: run with UDSKIT_TEST_AS_CLI=1 it
// executes main with its arguments. This keeps serve/call/bench tests on the
// real binary path (signals, exit codes, re-exec of bench-server) without a
// separate go build.
func init() {
	if os.Getenv("UDSKIT_TEST_AS_CLI") == "1" {
		main()
		os.Exit(0)
	}
}

// cli returns an exec.Cmd running the udskit CLI with args.
func scCLI(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	// GORACE: a -race binary otherwise sleeps a second at exit.
	cmd.Env = append(os.Environ(), "UDSKIT_TEST_AS_CLI=1", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

type scResult struct {
	stdout, stderr string
	code           int
}

func scRun(t *testing.T, stdin string, args ...string) scResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := scCLI(ctx, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("udskit %v: %v", args, err)
	}
	return scResult{out.String(), errb.String(), code}
}

type scServed struct {
	cmd    *exec.Cmd
	addr   string
	stderr *testutil.Buffer
	done   chan error
}

// scServe runs `udskit serve` with args and waits for its address line.
func scServe(t *testing.T, args ...string) *scServed {
	t.Helper()
	return startServed(t, scCLI(context.Background(), append([]string{"serve"}, args...)...))
}

// startServed starts cmd, a `udskit serve`, and waits for its address line.
func startServed(t *testing.T, cmd *exec.Cmd) *scServed {
	t.Helper()
	s := &scServed{cmd: cmd, stderr: &testutil.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr = s.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-s.done
	})
	lines := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		lines <- l
	}()
	select {
	case l := <-lines:
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "listening" {
			t.Fatalf("serve printed %q, stderr %s", l, s.stderr)
		}
		s.addr = f[2]
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not start; stderr: %s", s.stderr)
	}
	return s
}

// waitLog waits up to 10 s for want in a process's log (its stderr) and
// fails the test with the log if it does not come; who names the process.
func waitLog(t *testing.T, who string, log *testutil.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s log lacks %q after 10s:\n%s", who, want, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *scServed) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for Cleanup
		return err
	case <-time.After(d):
		t.Fatalf("serve still running after %v; stderr: %s", d, s.stderr)
	}
	return nil
}

func TestServeCallEveryMethod(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "demo.sock")
	s := scServe(t, sock)
	if s.addr != "unix:"+sock {
		t.Fatalf("serve says it listens on %q, want unix:%s", s.addr, sock)
	}
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600 owner-only by default", st.Mode().Perm(), err)
	}

	r := scRun(t, "", "call", s.addr, "echo", `{"hello":"world","n":[1,2]}`)
	if r.code != 0 || r.stdout != "{\"hello\":\"world\",\"n\":[1,2]}\n" {
		t.Fatalf("echo: %+v", r)
	}
	r = scRun(t, "", "call", s.addr, "sleep", `{"ms":30}`)
	if r.code != 0 || strings.TrimSpace(r.stdout) != `{"slept_ms":30}` {
		t.Fatalf("sleep: %+v", r)
	}
	r = scRun(t, "", "call", s.addr, "fail", `{"code":"not_found","message":"no such thing"}`)
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "not_found (5): no such thing") {
		t.Fatalf("fail: %+v", r)
	}
	r = scRun(t, "", "call", s.addr, "fail")
	if r.code != 1 || !strings.Contains(r.stderr, "failed_precondition (9)") {
		t.Fatalf("fail with no request: %+v", r)
	}
	r = scRun(t, "", "call", s.addr, "stream", `{"n":4}`)
	if r.code != 0 || r.stdout != "{\"i\":0,\"n\":4}\n{\"i\":1,\"n\":4}\n{\"i\":2,\"n\":4}\n{\"i\":3,\"n\":4}\n" {
		t.Fatalf("stream: %+v", r)
	}
	r = scRun(t, "", "call", s.addr, "whoami")
	var who struct {
		PID int32
		UID uint32
		GID uint32
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &who) != nil {
		t.Fatalf("whoami: %+v", r)
	}
	if who.UID != uint32(os.Getuid()) || who.GID != uint32(os.Getgid()) || who.PID <= 0 || who.PID == int32(os.Getpid()) {
		t.Fatalf("whoami says %+v; want this uid/gid and the call process's pid (not the test's %d)", who, os.Getpid())
	}
	raw := "\x00\x01binary\xff\n"
	r = scRun(t, raw, "call", "--raw", s.addr, "echo")
	if r.code != 0 || r.stdout != raw {
		t.Fatalf("--raw echo: got %q, %+v", r.stdout, r)
	}
	r = scRun(t, "", "call", s.addr, "sleep", `{"ms":2000}`, "--timeout", "100ms")
	if r.code != 1 || !strings.Contains(r.stderr, "deadline_exceeded") {
		t.Fatalf("sleep past --timeout: %+v", r)
	}
	r = scRun(t, "", "call", s.addr, "nope")
	if r.code != 1 || !strings.Contains(r.stderr, `unimplemented (12): unknown method "nope"`) {
		t.Fatalf("unknown method: %+v", r)
	}
	r = scRun(t, "", "call", s.addr, "echo", `"x"`, "-n", "300", "-c", "4")
	if r.code != 0 || !strings.Contains(r.stdout, "requests 300  ok 300  errors 0") || !strings.Contains(r.stdout, "p99") {
		t.Fatalf("-n 300 -c 4: %+v", r)
	}
	// Connect and disconnect lines carry the peer's credentials.
	log := s.stderr.String()
	if !strings.Contains(log, "msg=connect pid=") || !strings.Contains(log, fmt.Sprintf("uid=%d", os.Getuid())) || !strings.Contains(log, "msg=disconnect") {
		t.Errorf("serve log lacks connect/disconnect lines with credentials:\n%s", log)
	}
}

func TestServeNDJSONAndUdskitOnOneSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	s := scServe(t, sock)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(c, `{"id":1,"func":"echo","data":{"k":"v"}}`+"\n"+`{"id":"two","func":"whoami"}`+"\n"+`{"id":3,"func":"fail"}`+"\n")
	got := map[string]map[string]any{}
	br := bufio.NewReader(c)
	for len(got) < 3 {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("after %d replies: %v", len(got), err)
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("reply %q is not JSON: %v", line, err)
		}
		got[fmt.Sprint(m["id"])] = m
	}
	if d, _ := json.Marshal(got["1"]["data"]); string(d) != `{"k":"v"}` {
		t.Errorf("ndjson echo: %v", got["1"])
	}
	if w, ok := got["two"]["data"].(map[string]any); !ok || w["uid"] != float64(os.Getuid()) || w["pid"] != float64(os.Getpid()) {
		t.Errorf("ndjson whoami: %v, want this process's pid %d", got["two"], os.Getpid())
	}
	if got["3"]["code"] != "failed_precondition" {
		t.Errorf("ndjson fail: %v", got["3"])
	}
	// A udskit client on the same socket at the same time.
	r := scRun(t, "", "call", s.addr, "echo", `[1,2,3]`)
	if r.code != 0 || r.stdout != "[1,2,3]\n" {
		t.Fatalf("udskit call next to an NDJSON client: %+v", r)
	}
}

func TestServeSIGTERMDrainsInFlightCall(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "drain.sock")
	s := scServe(t, sock, "--drain-timeout", "10s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := scCLI(ctx, "call", s.addr, "sleep", `{"ms":1000}`)
	var out, errb bytes.Buffer
	call.Stdout, call.Stderr = &out, &errb
	if err := call.Start(); err != nil {
		t.Fatal(err)
	}
	// The server has the call's connection, and the request is in flight
	// (sent right after connect).
	waitLog(t, "serve", s.stderr, "msg=connect")
	time.Sleep(300 * time.Millisecond) // the request is in flight (sent right after connect)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// New connections are refused once draining: the socket file goes away.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(sock); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("socket file still there 5s after SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := call.Wait(); err != nil {
		t.Fatalf("in-flight call failed during drain: %v; stderr %s", err, errb.String())
	}
	if strings.TrimSpace(out.String()) != `{"slept_ms":1000}` {
		t.Fatalf("in-flight call printed %q", out.String())
	}
	if err := s.wait(t, 10*time.Second); err != nil {
		t.Fatalf("serve exited with %v after drain; log %s", err, s.stderr)
	}
	if log := s.stderr.String(); !strings.Contains(log, "draining") || !strings.Contains(log, "drained") {
		t.Errorf("serve log lacks the drain lines:\n%s", log)
	}
}

func TestServeSecondInterruptExitsAtOnce(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "int.sock")
	s := scServe(t, sock, "--drain-timeout", "30s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := scCLI(ctx, "call", s.addr, "sleep", `{"ms":20000}`, "--timeout", "25s")
	var errb bytes.Buffer
	call.Stderr = &errb
	if err := call.Start(); err != nil {
		t.Fatal(err)
	}
	waitLog(t, "serve", s.stderr, "msg=connect")
	time.Sleep(100 * time.Millisecond)
	s.cmd.Process.Signal(os.Interrupt)
	waitLog(t, "serve", s.stderr, "draining")
	start := time.Now()
	s.cmd.Process.Signal(os.Interrupt)
	s.wait(t, 5*time.Second)
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("second interrupt took %v to stop the server", el)
	}
	if err := call.Wait(); err == nil {
		t.Errorf("the 20s call succeeded although the server was stopped hard")
	}
}

func TestCallWaitsForServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "late.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := scCLI(ctx, "call", "--wait", "--timeout", "15s", sock, "echo", `"late"`)
	var out, errb bytes.Buffer
	call.Stdout, call.Stderr = &out, &errb
	if err := call.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	scServe(t, sock)
	if err := call.Wait(); err != nil || out.String() != "\"late\"\n" {
		t.Fatalf("call --wait: %v, out %q, stderr %s", err, out.String(), errb.String())
	}
	r := scRun(t, "", "call", filepath.Join(t.TempDir(), "none.sock"), "echo")
	if r.code != 1 || !strings.Contains(r.stderr, "no socket") {
		t.Fatalf("call without --wait to a missing socket: %+v", r)
	}
}

func TestServeAllowUIDAndMaxConns(t *testing.T) {
	dir := t.TempDir()
	s := scServe(t, filepath.Join(dir, "only.sock"), "--allow-uid", "4242", "--mode", "0660")
	if st, err := os.Stat(filepath.Join(dir, "only.sock")); err != nil || st.Mode().Perm() != 0o660 {
		t.Fatalf("--mode 0660: socket mode %v, %v", st.Mode().Perm(), err)
	}
	r := scRun(t, "", "call", "--timeout", "3s", s.addr, "echo", `1`)
	if r.code != 1 || !strings.Contains(r.stderr, "permission_denied (7)") ||
		!strings.Contains(r.stderr, "retrying will not help") || !strings.Contains(r.stderr, "--allow-uid") {
		t.Fatalf("uid %d not in --allow-uid 4242: want exit 1 with a hint, got %+v", os.Getuid(), r)
	}
	waitLog(t, "serve", s.stderr, "refused by policy")

	// A user name is as good as a number (the same lookup as proxy --allow-uid).
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	byName := scServe(t, filepath.Join(dir, "name.sock"), "--allow-uid", "4242,"+me.Username)
	if r := scRun(t, "", "call", "--timeout", "3s", byName.addr, "echo", `1`); r.code != 0 || r.stdout != "1\n" {
		t.Fatalf("--allow-uid 4242,%s: the call as %s failed: %+v", me.Username, me.Username, r)
	}

	m := scServe(t, filepath.Join(dir, "max.sock"), "--max-conns", "1")
	hold, err := net.Dial("unix", filepath.Join(dir, "max.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	fmt.Fprint(hold, `{"id":1,"func":"echo","data":1}`+"\n")
	hold.SetReadDeadline(time.Now().Add(5 * time.Second))
	if l, err := bufio.NewReader(hold).ReadString('\n'); err != nil || !strings.Contains(l, `"data":1`) {
		t.Fatalf("first connection: %q %v", l, err)
	}
	r = scRun(t, "", "call", "--timeout", "3s", m.addr, "echo", `2`)
	if r.code != 1 || !strings.Contains(r.stderr, "closed the connection before its hello") || !strings.Contains(r.stderr, "--max-conns") {
		t.Fatalf("second connection over --max-conns 1: want exit 1 with a hint, got %+v", r)
	}
}

func TestServeCallBadUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--mode", "999"}, "--mode"},
		{[]string{"serve", "--allow-uid", "no-such-user-udskit"}, `--allow-uid: no user "no-such-user-udskit"`},
		{[]string{"serve", "tcp:127.0.0.1:0", "--allow-uid", "0"}, "needs a unix socket"},
		{[]string{"serve", "udp:1.2.3.4:5"}, "bad address"},
		{[]string{"call", "/tmp/x.sock"}, "want [ADDR] METHOD [JSON]"},
		{[]string{"call"}, "want [ADDR] METHOD [JSON]"},
		{[]string{"call", "app", "echo"}, `if "app" is a socket, write it as ./app`},
		{[]string{"call", "/tmp/x.sock", "echo", "{nope"}, "not valid JSON"},
		{[]string{"call", "--raw", "/tmp/x.sock", "echo", "1"}, "--raw reads the request from stdin"},
		{[]string{"call", "/tmp/x.sock", "echo", "-n", "0"}, "at least 1"},
		{[]string{"call", "/tmp/x.sock", "echo", "--conns", "0"}, "--conns 0: must be at least 1"},
		{[]string{"bench", "--sizes", "0"}, "--sizes"},
		{[]string{"bench", "--sizes", "1g"}, "--sizes"},
		{[]string{"bench", "--transports", "carrier-pigeon"}, `unknown transport "carrier-pigeon"`},
		{[]string{"bench", "--conc", "x"}, "--conc"},
		{[]string{"bench", "--duration", "-1s"}, "--duration"},
		{[]string{"bench", "--repeat", "0"}, "--repeat"},
		{[]string{"bench", "--chart", "out.txt"}, ".svg or .png"},
	} {
		r := scRun(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("udskit %s: exit %d, stderr %q; want exit 2 mentioning %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
}
