package testutil

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The environment that tells a re-run test binary to be a helper.
const (
	envHelper = "UDSKIT_TEST_HELPER"
	envArg    = "UDSKIT_TEST_ARG"
)

// NobodyUID is the uid and gid NobodyCmd runs as (nobody/nogroup on Debian).
const NobodyUID = 65534

// HelperFunc is code the test binary runs in a child process instead of the
// tests. It gets the argument given to HelperCmd/NobodyCmd and returns the
// process's exit code.
type HelperFunc func(arg string) int

// Main is TestMain's body: when this process was started by HelperCmd or
// NobodyCmd it runs the named helper and exits with its code (2 for an
// unknown name), otherwise it runs the tests.
func Main(m *testing.M, helpers map[string]HelperFunc) {
	name, ok := os.LookupEnv(envHelper)
	if !ok {
		os.Exit(m.Run())
	}
	h, ok := helpers[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "testutil: unknown helper %q\n", name)
		os.Exit(2)
	}
	os.Exit(h(os.Getenv(envArg)))
}

// HelperCmd returns a command that runs this test binary as helper name with
// arg, as the current user. Its stderr goes to the test's stderr unless the
// caller sets cmd.Stderr.
func HelperCmd(t testing.TB, name, arg string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	return helperCmd(exe, name, arg)
}

func helperCmd(bin, name, arg string, prefix ...string) *exec.Cmd {
	args := append(append([]string{}, prefix...), bin, "-test.run=^$")
	cmd := exec.Command(args[0], args[1:]...)
	// A -race binary sleeps a second at exit by default (atexit_sleep_ms);
	// a helper has no reason to.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), envHelper+"="+name, envArg+"="+arg, "GORACE="+gorace)
	return cmd
}

// NobodyCmd returns a command that runs helper name with arg as uid and gid
// NobodyUID with no supplementary groups, through setpriv(1), from a copy of
// this test binary in a dir nobody may search (also its working directory).
// It skips the test when not root or when setpriv is not installed.
func NobodyCmd(t testing.TB, name, arg string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a helper as nobody (tests run as root in CI)")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed; scripts/install-deps.sh installs it")
	}
	bin := copyTestBinary(t)
	uid := fmt.Sprint(NobodyUID)
	cmd := helperCmd(bin, name, arg, setpriv, "--reuid="+uid, "--regid="+uid, "--clear-groups")
	cmd.Dir = filepath.Dir(bin)
	return cmd
}

// copyTestBinary copies this test binary into a fresh dir any user may
// search: the original sits under a private go-build dir.
func copyTestBinary(t testing.TB) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	src, err := os.Open(exe)
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	defer src.Close()
	bin := filepath.Join(ShortDir(t, 0o755), filepath.Base(exe))
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatalf("testutil: copy test binary: %v", err)
	}
	if err := dst.Close(); err != nil {
		t.Fatalf("testutil: copy test binary: %v", err)
	}
	return bin
}

// PrintJSON writes v as JSON on stdout, for RunJSON in the parent, and
// returns exit code 0 (1 when v cannot be encoded).
func PrintJSON(v any) int {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, "testutil:", err)
		return 1
	}
	return 0
}

// RunJSON runs cmd to completion (at most a minute) and decodes its stdout
// into v, failing the test with the child's stderr when it fails or prints
// something else.
func RunJSON(t testing.TB, cmd *exec.Cmd, v any) {
	t.Helper()
	var stdout, stderr Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("testutil: start helper: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("testutil: helper %v still running after a minute; stderr:\n%s", cmd.Args, stderr.String())
	}
	if err != nil {
		t.Fatalf("testutil: helper %v: %v\nstdout: %s\nstderr: %s", cmd.Args, err, stdout.String(), stderr.String())
	}
	if err := json.Unmarshal([]byte(stdout.String()), v); err != nil {
		t.Fatalf("testutil: helper output %q: %v; stderr:\n%s", stdout.String(), err, stderr.String())
	}
}

// readyLine is what Ready prints and StartHelper waits for.
const readyLine = "ready"

// Ready is for a helper started by StartHelper: it tells the parent the
// helper is set up, then blocks until the parent closes stdin (at the end
// of the test).
func Ready() {
	fmt.Println(readyLine)
	io.Copy(io.Discard, os.Stdin)
}

// Child is a helper process started by StartHelper.
type Child struct {
	Cmd *exec.Cmd
	PID int
}

// StartHelper starts cmd (from HelperCmd or NobodyCmd) and returns once the
// helper has called Ready. A helper that prints anything else first, exits,
// or takes over 20 seconds fails the test with that line. In t.Cleanup the
// child's stdin is closed (Ready returns) and it gets 5 seconds to exit
// before it is killed.
func StartHelper(t testing.TB, cmd *exec.Cmd) *Child {
	t.Helper()
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testutil: start helper: %v", err)
	}
	lines := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		// Read stdout to EOF before Wait closes the pipe.
		defer close(done)
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		io.Copy(io.Discard, stdout)
		cmd.Wait()
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	select {
	case line := <-lines:
		if strings.TrimSpace(line) != readyLine {
			t.Fatalf("testutil: helper %v said %q instead of %q", cmd.Args, line, readyLine)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("testutil: helper %v not ready after 20s", cmd.Args)
	}
	return &Child{Cmd: cmd, PID: cmd.Process.Pid}
}
