package testutil

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/proc"
)

// WaitTimeout bounds WaitFor, LeakCheck and NoGoroutinesIn.
const WaitTimeout = 10 * time.Second

// WaitFor polls cond every few milliseconds until it holds, failing the test
// with what when WaitTimeout passes first. Use it to await an event instead
// of sleeping for a guessed time.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", WaitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// CountFDs returns how many file descriptors this process has open; it skips
// the test where /proc/self/fd does not exist.
func CountFDs(t testing.TB) int {
	t.Helper()
	n, err := proc.CountFDs(0)
	if err != nil {
		t.Skipf("cannot count fds here (%v)", err)
	}
	return n
}

// LeakCheck records the open fds and running goroutines now and returns a
// check that waits until both are back to at most that baseline, failing the
// test when they are not within WaitTimeout. Warm up lazily started runtime
// parts (the netpoller, a first conn) before taking the baseline.
func LeakCheck(t testing.TB) (check func()) {
	t.Helper()
	runtime.GC()
	fds0, g0 := CountFDs(t), runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(WaitTimeout)
		for {
			fds, g := CountFDs(t), runtime.NumGoroutine()
			if fds <= fds0 && g <= g0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("leak: %d fds (baseline %d), %d goroutines (baseline %d):\n%s",
					fds, fds0, g, g0, stacks())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// NoGoroutinesIn waits until no goroutine has a frame whose function name
// contains pkg (for example "udskit/rpc."), other than the test's own
// goroutines, and fails with their stacks when some remain after WaitTimeout.
// Call it after everything the test opened is closed.
func NoGoroutinesIn(t testing.TB, pkg string) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for {
		leaked := goroutinesIn(pkg)
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines in %s leaked:\n%s", len(leaked), pkg, strings.Join(leaked, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func goroutinesIn(pkg string) []string {
	var leaked []string
	for _, g := range strings.Split(stacks(), "\n\n") {
		// A test function's own goroutine (run by testing.tRunner) and this
		// one are not leaks.
		if strings.Contains(g, pkg) && !strings.Contains(g, "testing.tRunner") &&
			!strings.Contains(g, "testutil.goroutinesIn") {
			leaked = append(leaked, g)
		}
	}
	return leaked
}

func stacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) || len(buf) >= 64<<20 {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}
