//go:build !linux

package shm

import (
	"sync/atomic"
	"time"
)

// FutexWait sleeps d at most (call slots are never negotiated off Linux:
// Supported is false).
func FutexWait(p *atomic.Uint32, val uint32, d time.Duration) (timedOut bool) {
	if p.Load() == val {
		time.Sleep(min(d, time.Millisecond))
	}
	return false
}

// FutexWake does nothing off Linux.
func FutexWake(p *atomic.Uint32, n int) {}

// FutexSleep is FutexWait; no wake-up is ever reported off Linux.
func FutexSleep(p *atomic.Uint32, val uint32, d time.Duration) (timedOut, woken bool) {
	return FutexWait(p, val, d), false
}
