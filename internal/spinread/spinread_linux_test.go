package spinread

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A poll sharing its CPU with a busy thread stops at its first late round
// (its yield gave the CPU away, or it was preempted) and counts a miss:
// on a busy machine it would only take turns with the threads that need
// the CPU. Both threads are pinned to one CPU; the poll's bound is an hour.
func TestPollStopsWhenDescheduled(t *testing.T) {
	a, b := pair(t)
	r := New(a, time.Hour, nil)
	r.Arm()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	cpu := -1
	for i := range 1024 {
		if set.IsSet(i) {
			cpu = i
			break
		}
	}
	var one unix.CPUSet
	one.Set(cpu)
	pin := func() {
		runtime.LockOSThread()
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			t.Error(err)
		}
	}
	var stop atomic.Bool
	hogDone := make(chan struct{})
	go func() { // the busy thread
		defer close(hogDone)
		pin() // (never unlocked: the pinned thread exits with the goroutine)
		for !stop.Load() {
		}
	}()
	defer func() { stop.Store(true); <-hogDone }()
	writeAfter(b, 500*time.Millisecond, []byte("x"))
	done := make(chan error, 1)
	go func() {
		pin() // (as the busy one's)
		_, err := r.Read(make([]byte, 8))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read did not return")
	}
	if r.Busy.Load() != 1 || r.Misses.Load() != 1 || r.Hits.Load() != 0 {
		t.Fatalf("busy %d misses %d hits %d, want 1 1 0", r.Busy.Load(), r.Misses.Load(), r.Hits.Load())
	}
}
