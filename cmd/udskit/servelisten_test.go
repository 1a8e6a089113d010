package main

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// TestServeSIGTERMWhileListening: a serve stuck in Listen (here: another
// process holds PATH.lock) stops at once on SIGTERM, with exit code 1.
func TestServeSIGTERMWhileListening(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "held.sock")
	f, err := os.OpenFile(sock+".lock", os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	cmd := scCLI(context.Background(), "serve", sock)
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
	}()
	// Signal once serve waits for the lock: it has PATH.lock open, which
	// service.Run does only after it catches the signals. (A fixed 500 ms
	// sleep here once signaled a -race build under load before that, and
	// SIGTERM's default action killed it: exit code -1.)
	testutil.WaitFor(t, "serve to wait for "+sock+".lock", func() bool {
		return hasOpen(cmd.Process.Pid, sock+".lock")
	})
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		done <- err
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("serve took %v to stop after SIGTERM", el)
		}
		if cmd.ProcessState.ExitCode() != 1 {
			t.Errorf("exit code %d, want 1; stderr %s", cmd.ProcessState.ExitCode(), stderr.String())
		}
	case <-time.After(4 * time.Second):
		t.Fatalf("serve still running 4s after SIGTERM while stuck in Listen; stderr %s", stderr.String())
	}
}

// hasOpen reports whether process pid has path open (Linux's
// /proc/PID/fd); where there is no /proc it waits 500 ms and says yes.
func hasOpen(pid int, path string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	fds, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat("/proc/self/fd"); err != nil {
			time.Sleep(500 * time.Millisecond)
			return true
		}
	}
	for _, fd := range fds {
		if l, err := os.Readlink(dir + "/" + fd.Name()); err == nil && l == path {
			return true
		}
	}
	return false
}

// TestServeWarnsAboutUnsafeDirectory: serving in a directory anyone may
// write (no sticky bit) logs a warning with the fix.
func TestServeWarnsAboutUnsafeDirectory(t *testing.T) {
	dir := testutil.ShortDir(t, 0o777)
	s := scServe(t, filepath.Join(dir, "open.sock"))
	waitLog(t, "serve", s.stderr, "unsafe socket directory") // dir is 0777 without the sticky bit
	if !strings.Contains(s.stderr.String(), "chmod o-w "+dir) {
		t.Errorf("the warning does not give the fix:\n%s", s.stderr)
	}
}

// TestServeDefaultsProtectFDsAndIdle: under a 100-fd limit, 150 idle
// connections meet the default --max-conns (limit minus 64) rather than
// EMFILE, and idle connections are closed after --idle-timeout.
func TestServeDefaultsProtectFDsAndIdle(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) not installed; scripts/install-deps.sh installs it")
	}
	sock := filepath.Join(t.TempDir(), "fd.sock")
	cmd := scCLI(context.Background(), "serve", sock, "--idle-timeout", "1s")
	cmd.Args = append([]string{prlimit, "--nofile=100:100", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = prlimit
	s := startServed(t, cmd)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 150; i++ {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	waitLog(t, "serve", s.stderr, "connection limit reached")
	if strings.Contains(s.stderr.String(), "too many open files") {
		t.Fatalf("the server ran out of fds:\n%s", s.stderr)
	}
	// The accepted ones are idle (not even a hello): closed by the
	// handshake timeout at the latest; send an NDJSON call on one to see
	// the idle timeout close it after it is answered.
	c := conns[0]
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(`{"id":1,"func":"echo","data":1}` + "\n")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	b, _ := io.ReadAll(c)
	if !strings.Contains(string(b), `"data":1`) {
		t.Fatalf("got %q", b)
	}
	if d := time.Since(start); d < 900*time.Millisecond || d > 4*time.Second {
		t.Fatalf("idle connection closed after %v with --idle-timeout 1s", d)
	}
}
