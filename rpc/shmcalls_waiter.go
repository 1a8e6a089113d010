package rpc

import (
	"context"
	"math/bits"
	"runtime"
	"sync/atomic"

	"github.com/udskit/udskit/internal/shm"
)

// The client's waiter. A caller whose answer is not in after its spins
// sleeps; in FUTEX_WAIT it holds an OS thread (and, until the runtime's
// monitor takes it back, its P), so 16 sleeping callers meant 16 threads
// handed off and woken one by one. Only maxDirectSleepers callers sleep so;
// the others park on a channel, and one goroutine per connection, the
// waiter, sleeps for all of them at once in futex_waitv(2) on their slots'
// ans_seq words (and a private word, reg, that a newly parked caller
// rings). Woken, it hands every answer that is in to its caller through
// the channel (a goroutine wake, no thread), so one futex wake can deliver
// several answers. For the server nothing changes (spec 10.8): the waiter
// stores each parked slot's `sleeping` = 1 before it re-reads the words, and
// the server wakes on `ans_seq` as before. Kernels without futex_waitv
// (before 5.16) keep every caller in its own FUTEX_WAIT.

// maxDirectSleepers is how many callers of a connection sleep in their own
// FUTEX_WAIT before the others park with the waiter.
const maxDirectSleepers = 1

// waitvWorks: futex_waitv is there (FutexWaitv(nil) only says the stub is
// not in use); a wait of one private word with a wrong value returns at once.
func waitvWorks() bool {
	var w [1]shm.WaitvEntry
	var p atomic.Uint32
	w[0].SetWord(&p, 1, true) // p holds 0: EAGAIN at once, or ENOSYS
	return shm.FutexWaitv(w[:], 0)
}

// park waits for slot k's answer s with the waiter. It returns nil when the
// answer is in, or the call's error (the ctx ended, the connection ended,
// a sequence jumped).
func (x *clientCalls) park(ctx context.Context, k int, s, id uint32) *Error {
	bit := uint32(1) << k
	x.want[k].Store(s)
	x.wmask.Or(bit)
	x.reg.Add(1)
	if x.wsleep.Load() != 0 {
		shm.FutexWakePrivate(&x.reg, 1)
	}
	select {
	case <-x.wch[k]:
	case <-ctx.Done():
		x.unpark(k)
		if x.calls.AnsSeq(k).Load() == s {
			return nil // the answer came anyway: take it
		}
		e := ctxError(ctx)
		x.cc.cancelRemote(id, e.Code)
		x.mu.Lock()
		x.gone = append(x.gone, k)
		x.mu.Unlock()
		return e
	case <-x.end:
		x.unpark(k)
		return x.cc.lostErr()
	}
	if x.closed.Load() {
		return x.cc.lostErr()
	}
	if v := x.calls.AnsSeq(k).Load(); v != s {
		return x.violate(callViolation("call slot %d's answer sequence jumped to %d (request %d)", k, v, s))
	}
	return nil
}

// unpark takes slot k back from the waiter: if the waiter already handed
// it over, its word is in the channel, and is taken out.
func (x *clientCalls) unpark(k int) {
	bit := uint32(1) << k
	if x.wmask.And(^bit)&bit == 0 {
		<-x.wch[k]
	}
}

// wait is the waiter (see above). It holds a region reference until it ends.
func (x *clientCalls) wait() {
	defer close(x.wdone)
	defer x.cs.region.Release()
	calls := x.calls
	var es [shm.CallSlots + 1]shm.WaitvEntry
	idle := 0
	for !x.closed.Load() {
		r := x.reg.Load()
		m := x.wmask.Load()
		if x.deliver(m) {
			idle = 0
			continue
		}
		if idle < callerSpins {
			idle++
			runtime.Gosched()
			continue
		}
		idle = 0
		x.wsleep.Store(1)
		for b := m; b != 0; b &= b - 1 {
			calls.CallerSleeping(bits.TrailingZeros32(b)).Store(1)
		}
		n := 0
		es[n].SetWord(&x.reg, r, true)
		n++
		ready := x.reg.Load() != r || x.closed.Load()
		for b := m; b != 0 && !ready; b &= b - 1 {
			k := bits.TrailingZeros32(b)
			w := calls.AnsSeq(k)
			v := w.Load()
			if v == x.want[k].Load() || v != x.want[k].Load()-1 {
				ready = true // in (or a jump: the caller sees it)
				break
			}
			es[n].SetWord(w, v, false)
			n++
		}
		if !ready {
			shm.FutexWaitv(es[:n], shmCallNap)
		}
		x.wsleep.Store(0)
		for b := m; b != 0; b &= b - 1 { // awake: the server need not wake us
			calls.CallerSleeping(bits.TrailingZeros32(b)).Store(0)
		}
	}
	// The end: hand every parked caller its word; it sees closed.
	m := x.wmask.Load()
	for b := m; b != 0; b &= b - 1 {
		k := bits.TrailingZeros32(b)
		if x.wmask.And(^(uint32(1)<<k))&(uint32(1)<<k) != 0 {
			x.wch[k] <- struct{}{}
		}
	}
}

// deliver hands the answers that are in (or whose sequence jumped) among
// the parked slots m to their callers; it reports whether it handed any.
func (x *clientCalls) deliver(m uint32) bool {
	did := false
	for b := m; b != 0; b &= b - 1 {
		k := bits.TrailingZeros32(b)
		v := x.calls.AnsSeq(k).Load()
		s := x.want[k].Load()
		if v == s-1 {
			continue
		}
		bit := uint32(1) << k
		if x.wmask.And(^bit)&bit != 0 {
			x.calls.CallerSleeping(k).Store(0)
			x.wch[k] <- struct{}{}
			did = true
		}
	}
	return did
}
