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
	// futexPrivate (FUTEX_PRIVATE_FLAG): a word of this process only.
	futexPrivate = 128
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

// futex_waitv(2) (Linux 5.16): one thread waits on several words at once.
const (
	futex2SizeU32 = 0x02
	futex2Private = 128
)

// WaitvEntry is one word of a FutexWaitv: sleep while *Addr == Val.
type WaitvEntry struct {
	Val   uint64
	Addr  uint64
	Flags uint32
	_     uint32
}

// SetWord makes e wait on p while it holds val; private for a word in this
// process's own memory (not in a mapping shared with another process).
func (e *WaitvEntry) SetWord(p *atomic.Uint32, val uint32, private bool) {
	e.Val, e.Addr, e.Flags = uint64(val), uint64(uintptr(unsafe.Pointer(p))), futex2SizeU32
	if private {
		e.Flags |= futex2Private
	}
}

// FutexWaitv sleeps while every word of es holds its value, at most d, or
// until a FUTEX_WAKE on one of them (FutexWake, FutexWakePrivate for a
// private entry). It may return early: callers look again. ok is false
// when the kernel has no futex_waitv (ENOSYS: before Linux 5.16).
func FutexWaitv(es []WaitvEntry, d time.Duration) (ok bool) {
	if len(es) == 0 {
		return true
	}
	var now unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &now)
	ts := unix.NsecToTimespec(now.Nano() + int64(d))
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&es[0])), uintptr(len(es)), 0, uintptr(unsafe.Pointer(&ts)), unix.CLOCK_MONOTONIC, 0)
	return errno != unix.ENOSYS
}

// FutexWakePrivate wakes up to n sleepers on p, a word of this process's
// own memory waited on with a private entry.
func FutexWakePrivate(p *atomic.Uint32, n int) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWake|futexPrivate, uintptr(n), 0, 0, 0)
}
