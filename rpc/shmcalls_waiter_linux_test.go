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

// TestShmCallsLargeOffPoller: a quick handler's call with a request of
// slotInlineMax or more runs on a worker, not on the server's poller: while
// it waits for another call of the same connection, that call is taken and
// answered (on the poller it waited for nothing: the poller was its thread).
func TestShmCallsLargeOffPoller(t *testing.T) {
	s := echoServer()
	other := make(chan struct{}, 1)
	s.HandleRaw("big", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		if len(req) < slotInlineMax {
			return append(dst, req...), nil
		}
		select {
		case <-other:
			return append(dst, req...), nil
		case <-time.After(5 * time.Second):
			return nil, Errorf(Internal, "the other call was not taken while this one ran")
		}
	})
	s.HandleRaw("other", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		other <- struct{}{}
		return append(dst, req...), nil
	})
	addr := startServer(t, s)
	c, _ := slotClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 20 { // a quick handler (handler.quick) by now
		if _, err := c.CallRaw(ctx, "big", pattern(64, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	if !s.lookup([]byte("big")).quick() {
		t.Fatal("the handler is not quick: the test would prove nothing")
	}
	n0 := c.slotCallCount()
	errc := make(chan error, 1)
	req := pattern(slotInlineMax, 2)
	go func() {
		resp, err := c.CallRaw(ctx, "big", req, nil)
		if err == nil && !bytes.Equal(resp, req) {
			err = fmt.Errorf("the large answer differs")
		}
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it be taken first (the test holds either way)
	if _, err := c.CallRaw(ctx, "other", pattern(64, 3), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if n := c.slotCallCount() - n0; n != 2 {
		t.Fatalf("%d of the 2 calls went through call slots", n)
	}
}
