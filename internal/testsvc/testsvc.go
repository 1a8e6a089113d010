package testsvc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// StartTimeout bounds how long a server may take to come up.
const StartTimeout = 30 * time.Second

// NeedBinary returns the path of the named program, or skips the test with a
// clear reason when it is not installed.
func NeedBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (run scripts/install-deps.sh): %v", name, err)
	}
	return p
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testsvc: find a free port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// TempDir makes a short-named temp dir under os.TempDir (socket paths must fit
// in 108 bytes, and t.TempDir paths can be long), removed in t.Cleanup. When
// owner is non-nil the dir is chowned to it.
func TempDir(t testing.TB, owner *Owner) string {
	t.Helper()
	dir := testutil.ShortDir(t, 0o700)
	if owner != nil {
		if err := os.Chown(dir, owner.UID, owner.GID); err != nil {
			t.Fatalf("testsvc: chown %s: %v", dir, err)
		}
	}
	return dir
}

// Owner is a uid/gid pair a server runs as.
type Owner struct {
	Name     string
	UID, GID int
}

// maxOutput caps what is kept of a server's output.
const maxOutput = 1 << 20

// process is a started server with its output kept for failure messages.
type process struct {
	cmd  *exec.Cmd
	out  *testutil.Buffer
	done chan struct{}
	err  error
}

func start(t testing.TB, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{cmd: cmd, out: &testutil.Buffer{Max: maxOutput}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("testsvc: start %s: %v", cmd.Path, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p
}

// stop sends sig, waits up to grace, then kills.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitReady polls ready until it returns nil, the process exits or StartTimeout passes.
func waitReady(t testing.TB, what string, p *process, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		if p.exited() {
			t.Fatalf("testsvc: %s exited during start-up (%v); output:\n%s", what, p.err, p.out.String())
		}
		if last = ready(); last == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("testsvc: %s not ready after %v (last: %v); output:\n%s", what, StartTimeout, last, p.out.String())
}

// runCmd runs cmd with a timeout and returns its combined output.
func runCmd(ctx context.Context, timeout time.Duration, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

func itoa(i int) string { return strconv.Itoa(i) }

func execCommand(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }
