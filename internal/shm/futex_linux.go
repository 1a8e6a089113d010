package shm

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FUTEX_WAIT and FUTEX_WAKE, not _PRIVATE: the words are in a mapping
// shared with another process.
const (
	futexWait = 0
	futexWake = 1
)

// FutexWait sleeps while *p == val, at most d, or until a FutexWake on p.
// It may return early (a signal, a spurious wake): callers look again.
// It reports whether it slept the whole of d (ETIMEDOUT).
func FutexWait(p *atomic.Uint32, val uint32, d time.Duration) (timedOut bool) {
	ts := unix.NsecToTimespec(int64(d))
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
	return errno == unix.ETIMEDOUT
}

// FutexWake wakes up to n sleepers on p.
func FutexWake(p *atomic.Uint32, n int) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWake, uintptr(n), 0, 0, 0)
}

// FutexSleep is FutexWait that also reports whether a FutexWake ended the
// sleep (woken): not a timeout, a signal, or *p != val when it was called.
// A wake-up that finds the word unchanged is spurious; a peer sharing the
// region can cause them at will (the caller counts and bounds them).
func FutexSleep(p *atomic.Uint32, val uint32, d time.Duration) (timedOut, woken bool) {
	ts := unix.NsecToTimespec(int64(d))
	r, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
	return errno == unix.ETIMEDOUT, errno == 0 && r == 0
}
