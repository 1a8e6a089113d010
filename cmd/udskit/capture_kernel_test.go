//go:build linux

package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testsvc"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/kcapture"
)

// needKernelCapture skips only where the kernel cannot run the capture at
// all (not root, no BTF, BPF refused); UDSKIT_REQUIRE_KCAPTURE=1 (set by
// `make test`) turns that into a failure.
func needKernelCapture(t *testing.T) {
	t.Helper()
	r := kcapture.Check(true)
	if r.OK {
		return
	}
	msg := "kernel capture unavailable here: "
	for _, p := range r.Problems {
		msg += p.Error() + "; "
	}
	if os.Getenv("UDSKIT_REQUIRE_KCAPTURE") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// lineReader reads lines from a pipe with a timeout.
type lineReader struct{ r *bufio.Reader }

func (l lineReader) next(t *testing.T, d time.Duration) string {
	t.Helper()
	ch := make(chan string, 1)
	go func() {
		s, _ := l.r.ReadString('\n')
		ch <- strings.TrimRight(s, "\n")
	}()
	select {
	case s := <-ch:
		return s
	case <-time.After(d):
		t.Fatal("timed out waiting for a line")
		return ""
	}
}

// waitFor reads lines until one contains want.
func (l lineReader) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if s := l.next(t, time.Until(deadline)); strings.Contains(s, want) {
			return
		}
	}
	t.Fatalf("no line containing %q", want)
}

// A psql session to a real PostgreSQL opened BEFORE the capture: the query
// it sends afterwards, and the server's answer, are in the pcapng and tshark
// decodes them with its own PostgreSQL dissector.
func TestCaptureKernelPostgresExistingSession(t *testing.T) {
	needKernelCapture(t)
	testsvc.NeedBinary(t, "psql")
	testsvc.NeedBinary(t, "tshark")
	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	psql := testsvc.Psql(ctx, pg.Host, pg.Port)
	in, _ := psql.StdinPipe()
	outp, _ := psql.StdoutPipe()
	psql.Stderr = os.Stderr
	if err := psql.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); psql.Wait() }()
	out := lineReader{bufio.NewReader(outp)}
	io.WriteString(in, "select 'before capture';\n")
	if got := out.next(t, 30*time.Second); got != "before capture" {
		t.Fatalf("psql said %q", got)
	}

	file := filepath.Join(t.TempDir(), "pg.pcapng")
	capCmd := scCLI(ctx, "capture", "--kernel", pg.SocketPath(), "-w", file)
	errp, _ := capCmd.StderrPipe()
	if err := capCmd.Start(); err != nil {
		t.Fatal(err)
	}
	capErr := lineReader{bufio.NewReader(errp)}
	capErr.waitFor(t, "recording socket")

	io.WriteString(in, "select 40+2 as answer;\n")
	if got := out.next(t, 30*time.Second); got != "42" {
		t.Fatalf("psql said %q", got)
	}
	time.Sleep(100 * time.Millisecond)
	capCmd.Process.Signal(syscall.SIGINT)
	rest, _ := io.ReadAll(errp)
	if err := capCmd.Wait(); err != nil {
		t.Fatalf("capture: %v\n%s", err, rest)
	}
	t.Logf("capture said: %s", rest)

	fields := func(filter string, field ...string) string {
		args := []string{"-r", file, "-Y", filter, "-T", "fields"}
		for _, f := range field {
			args = append(args, "-e", f)
		}
		return tsharkFields(t, args...)
	}
	q := fields("pgsql.query", "pgsql.query")
	if !strings.Contains(q, "select 40+2 as answer;") {
		t.Errorf("tshark found no query in the capture: %q", q)
	}
	if strings.Contains(q, "before capture") {
		t.Errorf("a query from before the capture is in the file: %q", q)
	}
	// The server's answer, decoded: a column named "answer" and the row "42".
	if cols := fields("pgsql.col.name", "pgsql.col.name"); !strings.Contains(cols, "answer") {
		t.Errorf("no row description with column answer: %q", cols)
	}
	if rows := fields(`pgsql.type == "Data row"`, "pgsql.val.data"); !strings.Contains(rows, "3432") {
		t.Errorf("no data row 42 (hex 3432): %q", rows)
	}
	comments := fields("frame.comment", "frame.comment")
	if !strings.Contains(comments, "psql") || !strings.Contains(comments, "postgres") {
		t.Errorf("connection comment does not name both ends (psql, postgres): %q", comments)
	}
}

// --check says which modes work, and why.
func TestCaptureCheck(t *testing.T) {
	needKernelCapture(t)
	out, err := runCLI(t, "capture", "--check")
	if err != nil {
		t.Fatalf("capture --check: %v\n%s", err, out)
	}
	if !strings.Contains(out, "kernel (--kernel/--pid/--all): supported") || !strings.Contains(out, "syscall tracepoints") {
		t.Errorf("capture --check output: %s", out)
	}
}

// Every `udskit capture` line of docs/capture-kernel.md runs: against a
// missing socket or a pid that does not exist it fails only for that reason;
// --all (bounded with --duration) and --check succeed.
func TestCaptureKernelDocRecipes(t *testing.T) {
	needKernelCapture(t)
	dir := t.TempDir()
	n := 0
	for _, rc := range captureRecipes(t, "../../docs/capture-kernel.md") {
		line, args := rc.line, rc.args
		want := "ok"
		for i, a := range args {
			switch {
			case strings.HasPrefix(a, "/"):
				args[i] = filepath.Join(dir, "missing.sock")
				want = "no socket at this path"
			case i > 0 && args[i-1] == "--pid":
				args[i] = "4194305" // above the largest pid_max
				want = "no process"
			case i > 0 && args[i-1] == "-w":
				args[i] = filepath.Join(dir, "out.pcapng")
			}
		}
		if want == "ok" && !strings.Contains(line, "--check") {
			args = append(args, "--duration", "300ms")
			if !strings.Contains(line, " -w ") {
				args = append(args, "-w", filepath.Join(dir, "all.pcapng"))
			}
		}
		n++
		r := scRun(t, "", args...)
		switch {
		case want == "ok" && r.code != 0:
			t.Errorf("%q: exit %d, stderr %q", line, r.code, r.stderr)
		case want != "ok" && (r.code != 1 || !strings.Contains(r.stderr, want)):
			t.Errorf("%q: exit %d, stderr %q; want exit 1 and %q", line, r.code, r.stderr, want)
		}
	}
	if n < 4 {
		t.Fatalf("only %d recipes found", n)
	}
}

// --kernel as people type it: beside --pid or --all, or with the PATH after
// it; the forms that cannot work say exactly what to type (exit 2).
func TestCaptureKernelFlagForms(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.sock")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"capture", "--kernel"}, "--kernel needs what to record: udskit capture --kernel PATH, --kernel --pid PID or --kernel --all"},
		{[]string{"capture", "--kernel", missing, "--pid", "7"}, "use exactly one of --kernel PATH, --pid PID, --all"},
		{[]string{"capture", "--kernel", "--all", missing}, "use exactly one of --kernel PATH, --pid PID, --all"},
		{[]string{"capture", "--kernel", missing, missing}, "extra arguments"},
		{[]string{"capture", "--pid", "7", missing}, "extra arguments"},
		{[]string{"capture", "--check", missing}, "--check takes no PATH"},
	} {
		r := scRun(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("udskit %s: exit %d, stderr %q; want exit 2 with %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
	needKernelCapture(t)
	// Accepted: each fails only because the selection does not exist.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"capture", "--kernel", "--pid", "4194305"}, "no process 4194305"},
		{[]string{"capture", "--pid", "4194305", "--kernel"}, "no process 4194305"},
		{[]string{"capture", "--kernel", missing}, "no socket at this path"},
		{[]string{"capture", "--kernel=" + missing}, "no socket at this path"},
	} {
		r := scRun(t, "", tc.args...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("udskit %s: exit %d, stderr %q; want exit 1 with %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
	r := scRun(t, "", "capture", "--kernel", "--all", "--duration", "200ms", "-w", filepath.Join(dir, "all.pcapng"))
	if r.code != 0 {
		t.Errorf("capture --kernel --all: exit %d, stderr %q", r.code, r.stderr)
	}
}

// --count means recorded messages in kernel mode too (as in every mode):
// --count 3 on a process that sends a message every 20ms stops after three,
// and exactly three are in the output.
func TestCaptureKernelCount(t *testing.T) {
	needKernelCapture(t)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer syscall.Close(fds[0])
		defer syscall.Close(fds[1])
		buf := make([]byte, 64)
		for i := 0; i < 3000; i++ { // at most a minute
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			syscall.Write(fds[0], []byte("count-me"))
			syscall.Read(fds[1], buf)
		}
	}()
	defer func() { close(stop); <-done }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, stderr testutil.Buffer
	cmd := scCLI(ctx, "capture", "--kernel", "--pid", strconv.Itoa(os.Getpid()), "--count", "3")
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("--count 3 (killed after 30s if it did not end): %v\n%s", err, stderr.String())
	}
	text := out.String()
	if n := len(regexp.MustCompile(`(?m) \d+ bytes( \[.*\])?$`).FindAllString(text, -1)); n != 3 {
		t.Errorf("--count 3 recorded %d messages, want 3:\n%s", n, text)
	}
	if n := strings.Count(text, "count-me"); n != 3 {
		t.Errorf("%d copies of the message, want 3:\n%s", n, text)
	}
}
