package rpc

import (
	"bytes"
	"context"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/udskit/udskit/internal/shm"
)

// TestShmCallsSleepersCapped: 16 callers of one connection whose answers
// are held back sleep with at most maxDirectSleepers OS threads in
// FUTEX_WAIT on the region (counted in /proc/self/task/*/syscall by the
// futex word's address); the others are parked with the waiter, which
// hands each its answer once the server lets them go, byte for byte.
// Without the waiter all 16 sat in FUTEX_WAIT, one thread each.
func TestShmCallsSleepersCapped(t *testing.T) {
	s := echoServer()
	gate := make(chan struct{})
	entered := make(chan struct{}, 64)
	s.HandleRaw("gate", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		entered <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append(dst, req...), nil
	})
	addr := startServer(t, s)
	c, x := slotClient(t, addr)
	if !x.waitv {
		t.Fatal("the kernel has no futex_waitv (Linux 5.16 or later is needed); the waiter is off")
	}
	const callers = 16
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := pattern(64<<10, g)
			resp, err := c.CallRaw(ctx, "gate", req, nil)
			if err == nil && !bytes.Equal(resp, req) {
				err = fmt.Errorf("caller %d: the answer differs", g)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	for range callers {
		select {
		case <-entered:
		case <-time.After(20 * time.Second):
			t.Fatal("the calls did not all arrive")
		}
	}
	waitFor(t, "15 callers parked with the waiter, 1 in its own FUTEX_WAIT", func() bool {
		return bits.OnesCount32(x.wmask.Load()) == callers-maxDirectSleepers && x.direct.Load() == maxDirectSleepers
	})
	lo := uintptr(unsafe.Pointer(x.calls.AnsSeq(0))) - shm.CallLine0
	if n := futexWaitersIn(t, lo, lo+shm.CallsBlock); n > maxDirectSleepers {
		t.Fatalf("%d threads in FUTEX_WAIT on the region's words, want at most %d", n, maxDirectSleepers)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if m := x.wmask.Load(); m != 0 || x.direct.Load() != 0 {
		t.Fatalf("after the answers: parked mask %#x, %d direct sleepers", m, x.direct.Load())
	}
	echoes(t, c, 40, 64<<10) // the slots and the waiter are all right after
}

// futexWaitersIn counts this process's threads blocked in futex(2) on a
// word in [lo, hi) (/proc/self/task/*/syscall: the syscall's number, then
// its first argument, the word's address).
func futexWaitersIn(t *testing.T, lo, hi uintptr) int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/syscall")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no /proc/self/task: %v", err)
	}
	nr := map[string]string{"amd64": "202", "arm64": "98", "386": "240", "arm": "240"}[runtime.GOARCH]
	if nr == "" {
		t.Fatalf("the futex syscall number of %s is not known to this test", runtime.GOARCH)
	}
	n := 0
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) < 2 || f[0] != nr {
			continue
		}
		a, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
		if err == nil && uintptr(a) >= lo && uintptr(a) < hi {
			n++
		}
	}
	return n
}
