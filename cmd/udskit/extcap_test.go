package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/capture"
	"github.com/udskit/udskit/internal/testsvc"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/kcapture"
)

// extcapHome installs the launcher into a fresh HOME's personal extcap
// folder with `udskit extcap --install` and returns the environment that
// tshark runs with (that HOME; the test binary acting as udskit).
func extcapHome(t *testing.T) []string {
	t.Helper()
	home := t.TempDir()
	env := []string{"HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config")}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := scCLI(ctx, "extcap", "--install")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "installed "+home) {
		t.Fatalf("udskit extcap --install: %v\n%s", err, out)
	}
	return append(scCLI(ctx).Env, env...)
}

func tsharkCmd(ctx context.Context, t *testing.T, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, testsvc.NeedBinary(t, "tshark"), args...)
	cmd.Env = env
	return cmd
}

// TestExtcapTsharkPostgres: with the launcher installed, tshark -D lists
// the udskit interface, and tshark -i udskit -a duration:3 records psql's
// query through the interposed PostgreSQL socket, decoded as pgsql.query;
// when tshark stops, the socket is the server's again.
func TestExtcapTsharkPostgres(t *testing.T) {
	env := extcapHome(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	list, err := tsharkCmd(ctx, t, env, "-D").Output()
	if err != nil || !strings.Contains(string(list), ". udskit (Unix domain sockets (udskit capture))") {
		t.Fatalf("tshark -D: %v\n%s", err, list)
	}

	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{})
	sock := pg.SocketPath()
	ino := testutil.Inode(t, sock)
	var out bytes.Buffer
	errb := &testutil.Buffer{}
	ts := tsharkCmd(ctx, t, env, "-i", "udskit", "-o", "extcap.udskit.socket:"+sock, "-a", "duration:3",
		"-l", "-Y", "pgsql.query", "-T", "fields", "-e", "pgsql.query")
	ts.Stdout, ts.Stderr = &out, errb
	if err := ts.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ts.Wait() }()
	testutil.WaitFor(t, "tshark's udskit capture to interpose", func() bool {
		_, err := os.Lstat(sock + capture.AsideSuffix)
		return err == nil
	})
	q, err := testsvc.Psql(ctx, pg.Host, pg.Port, "-c", "select 40+2").CombinedOutput()
	if err != nil || strings.TrimSpace(string(q)) != "42" {
		t.Fatalf("psql through the capture: %q %v", q, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("tshark: %v\n%s", err, errb)
		}
	case <-time.After(60 * time.Second):
		ts.Process.Kill()
		t.Fatalf("tshark -a duration:3 still running after 60s\n%s", errb)
	}
	if got := strings.TrimSpace(out.String()); got != "select 40+2" {
		t.Fatalf("tshark pgsql.query = %q\nstderr:\n%s", got, errb)
	}
	// Wireshark's stop restored the socket: the server's own inode, nothing beside it.
	testutil.WaitFor(t, "the socket to be restored", func() bool {
		_, err := os.Lstat(sock + capture.AsideSuffix)
		return errors.Is(err, os.ErrNotExist)
	})
	if testutil.Inode(t, sock) != ino {
		t.Fatal("the PostgreSQL socket is not the server's after tshark stopped")
	}
	if _, err := os.Lstat(sock + capture.StateSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file left: %v", err)
	}
	if got := pg.Query(t, "select 1"); got != "1" {
		t.Fatalf("psql after the capture: %q", got)
	}
}

// TestExtcapSIGTERMRestores: Wireshark's stop button is SIGTERM to the
// extcap: it ends the capture cleanly (exit 0) and the socket is restored.
func TestExtcapSIGTERMRestores(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	sock := filepath.Join(dir, "app.sock")
	testutil.Serve(t, testutil.ListenUnix(t, sock), testutil.Echo)
	ino := testutil.Inode(t, sock)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := scCLI(ctx, "extcap", "--capture", "--extcap-interface", "udskit", "--fifo", fifo, "--socket", sock, "--mode", "interpose", "--snaplen", "0", "--port", "0", "--pid", "0")
	errb := &testutil.Buffer{}
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go io.Copy(io.Discard, r)
	testutil.WaitFor(t, "interposition", func() bool {
		_, err := os.Lstat(sock + capture.AsideSuffix)
		return err == nil
	})
	c := testutil.DialUnix(t, sock)
	c.Write([]byte("x"))
	io.ReadFull(c, make([]byte, 1))
	c.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("udskit extcap after SIGTERM: %v\n%s", err, errb)
	}
	if testutil.Inode(t, sock) != ino {
		t.Fatal("socket not restored after SIGTERM")
	}
	if _, err := os.Lstat(sock + capture.AsideSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("aside file left: %v", err)
	}
	if s := errb.String(); s != "" {
		t.Fatalf("stderr not empty (Wireshark shows it as an error): %s", s)
	}
}

// TestExtcapCLI: the answers Wireshark asks for, and bad usage.
func TestExtcapCLI(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	sock := filepath.Join(dir, "listed.sock")
	testutil.Serve(t, testutil.ListenUnix(t, sock), testutil.Echo)
	r := scRun(t, "", "extcap", "--extcap-interfaces", "--extcap-version=4.0")
	if r.code != 0 || !strings.Contains(r.stdout, "interface {value=udskit}") {
		t.Fatalf("--extcap-interfaces: %+v", r)
	}
	r = scRun(t, "", "extcap", "--extcap-interface", "udskit", "--extcap-dlts")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "dlt {number=101}") {
		t.Fatalf("--extcap-dlts: %+v", r)
	}
	r = scRun(t, "", "extcap", "--extcap-interface", "udskit", "--extcap-config")
	if r.code != 0 || !strings.Contains(r.stdout, "value {arg=0}{value="+sock+"}") {
		t.Fatalf("--extcap-config does not offer %s: %+v", sock, r)
	}
	r = scRun(t, "", "extcap", "--extcap-interface", "udskit", "--extcap-capture-filter", "tcp port 80")
	if r.code != 0 || !strings.Contains(r.stdout, "display filter") {
		t.Fatalf("capture filter check: %+v", r)
	}
	r = scRun(t, "", "extcap", "--extcap-interface", "udskit", "--capture", "--fifo", filepath.Join(dir, "out"))
	if r.code != 2 || !strings.Contains(r.stderr, "extcap.udskit.socket") {
		t.Fatalf("capture without a socket: %+v", r)
	}
	r = scRun(t, "", "extcap", "--extcap-interface", "eth0", "--extcap-dlts")
	if r.code != 1 || !strings.Contains(r.stderr, "unknown interface") {
		t.Fatalf("unknown interface: %+v", r)
	}
	r = scRun(t, "", "extcap", "--extcap-interfaces", "--extcap-some-future-flag", "x")
	if r.code != 0 {
		t.Fatalf("an unknown Wireshark argument failed: %+v", r)
	}
}

// TestExtcapTsharkKernel: the same interface in kernel mode (eBPF):
// tshark -i udskit -o extcap.udskit.mode:kernel decodes psql's queries on
// the PostgreSQL socket, with nothing interposed.
func TestExtcapTsharkKernel(t *testing.T) {
	needKernelCapture(t)
	env := extcapHome(t)
	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{})
	sock := pg.SocketPath()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	errb := &testutil.Buffer{}
	ts := tsharkCmd(ctx, t, env, "-i", "udskit", "-o", "extcap.udskit.socket:"+sock, "-o", "extcap.udskit.mode:kernel",
		"-a", "duration:4", "-l", "-Y", "pgsql.query", "-T", "fields", "-e", "pgsql.query")
	ts.Stdout, ts.Stderr = &out, errb
	if err := ts.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ts.Wait() }()
	// No file changes show when the kernel program is attached: query
	// until tshark ends (bounded), each query its own text.
	var tsErr error
	sent := 0
loop:
	for i := 0; i < 60; i++ {
		select {
		case tsErr = <-done:
			break loop
		case <-time.After(300 * time.Millisecond):
		}
		q, err := testsvc.Psql(ctx, pg.Host, pg.Port, "-c", "select 1000+"+strconv.Itoa(i)).CombinedOutput()
		if err != nil {
			t.Fatalf("psql: %q %v", q, err)
		}
		sent++
	}
	if tsErr == nil && sent == 60 {
		tsErr = <-done
	}
	if tsErr != nil {
		t.Fatalf("tshark: %v\n%s", tsErr, errb)
	}
	got := strings.Fields(strings.ReplaceAll(out.String(), "select ", "select_"))
	if len(got) == 0 {
		t.Fatalf("no pgsql.query decoded from %d queries\nstderr:\n%s", sent, errb)
	}
	for _, q := range got {
		if !strings.HasPrefix(q, "select_1000+") {
			t.Fatalf("decoded %q; all: %q", q, out.String())
		}
	}
	if _, err := os.Lstat(sock + capture.AsideSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("kernel mode left something beside the socket: %v", err)
	}
}

// TestKernelLossAdvice: the end-of-capture warning gives the drop rate as
// a percentage and the three ways to keep every byte.
func TestKernelLossAdvice(t *testing.T) {
	st := &kcapture.Stats{LostChunks: 3, LostBytes: 250, Tracker: kcapture.TrackerStats{Bytes: 750}}
	msg := lossAdvice(st, 0)
	for _, want := range []string{"3 events", "25.0% of the data bytes", "--snaplen", "--buffer-size MiB, now the default", "udskit capture PATH"} {
		if !strings.Contains(msg, want) {
			t.Errorf("advice lacks %q: %s", want, msg)
		}
	}
	if msg := lossAdvice(st, 64); !strings.Contains(msg, "now 64 MiB") {
		t.Errorf("advice with --buffer-size 64: %s", msg)
	}
	if r := scRun(t, "", "capture", "--kernel", "--pid", "1", "--buffer-size", "300"); r.code != 2 || !strings.Contains(r.stderr, "--buffer-size 300") {
		t.Fatalf("--buffer-size 300: %+v", r)
	}
}
