package rpc

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/internal/shm"
)

// The client's bell (protocol/spec.md 10.8, hello bit 4 shm_calls_bell).
// With it, a slot caller that did not find its answer after its short
// look does not sleep in FUTEX_WAIT on its own ans_seq: it parks as a
// goroutine on its slot's channel, and one poller goroutine per
// connection sleeps on cbell, which the server bumps after each answer
// (and wakes only while csleeping is 1). On each wake the poller scans the
// slots whose callers wait and hands each answer in to its caller through
// the channel, so the Go scheduler sees every hand-off: a single thread
// sleeps in the kernel instead of one per waiting caller, each of whose
// wakes cost a thread hand-off (tools/shmprobe futex against futexd).
//
// The poller's states (pstate): pollNone until the first caller parks
// (which starts it), pollRun while it scans, spins or sleeps on cbell,
// pollIdle while no caller waits and it is parked on kick. It ends with the
// connection (closed, cc.done), holding a region reference until then.
//
// A slot's hand-off (slotWait): the caller stores expect = its req_seq,
// then waiting = 1, then looks at ans_seq once more. Whoever moves waiting
// from 1 to 0 (CompareAndSwap) owns the answer's hand-off: the poller sends
// one token on ch; the caller that wins itself (its own look, or its ctx
// or the connection ending) gets no token, and one that loses to the
// poller receives the token before it returns, so ch is empty whenever a
// slot is free. A caller checks ans_seq after every token (a token that
// finds it unchanged sends it back to wait), so a stale look by the poller
// costs a look, never a wrong answer.

const (
	pollNone int32 = iota
	pollRun
	pollIdle
)

// slotWait is slot k's hand-off between its caller and the poller.
type slotWait struct {
	waiting atomic.Uint32 // 1 while the caller is parked for the poller
	expect  atomic.Uint32 // the req_seq the caller waits for
	ch      chan struct{} // the poller's token (buffered 1)
	_       [48]byte
}

// await parks slot k's caller until its answer to request s is in (nil),
// its ctx ends (the call is abandoned: the slot frees once the answer is
// in) or the connection ends.
func (x *clientCalls) await(ctx context.Context, k int, s, id uint32) *Error {
	w, ans := &x.waits[k], x.calls.AnsSeq(k)
	w.expect.Store(s)
	done := ctx.Done()
	for {
		w.waiting.Store(1)
		if ans.Load() == s-1 || !w.waiting.CompareAndSwap(1, 0) {
			x.wakePoller()
			select {
			case <-w.ch:
			case <-done:
				if w.waiting.CompareAndSwap(1, 0) {
					e := ctxError(ctx)
					x.cc.cancelRemote(id, e.Code)
					x.mu.Lock()
					x.gone = append(x.gone, k)
					x.mu.Unlock()
					return e
				}
				<-w.ch // the poller handed the answer in meanwhile: take it
			case <-x.cc.done:
				if w.waiting.CompareAndSwap(1, 0) {
					return x.cc.lostErr() // the slot went with the connection
				}
				<-w.ch
			}
		}
		switch v := ans.Load(); {
		case v == s:
			return nil
		case v != s-1:
			return x.violate(callViolation("call slot %d's answer sequence jumped to %d (request %d)", k, v, s))
		case x.closed.Load():
			return x.cc.lostErr()
		}
	}
}

// wakePoller makes sure the poller runs: it starts it, or wakes it from idle.
func (x *clientCalls) wakePoller() {
	switch x.pstate.Load() {
	case pollIdle:
		if x.pstate.CompareAndSwap(pollIdle, pollRun) {
			x.kick <- struct{}{}
		}
	case pollNone:
		if x.pstate.CompareAndSwap(pollNone, pollRun) {
			go x.pollAnswers()
		}
	}
}

// handOff gives every waiting caller whose answer moved its token; it
// returns how many it woke and how many still wait.
func (x *clientCalls) handOff() (woke, waiting int) {
	for k := range x.waits {
		w := &x.waits[k]
		if w.waiting.Load() != 1 {
			continue
		}
		if x.calls.AnsSeq(k).Load() != w.expect.Load()-1 && w.waiting.CompareAndSwap(1, 0) {
			w.ch <- struct{}{}
			x.handed.Add(1)
			woke++
			continue
		}
		waiting++
	}
	return woke, waiting
}

// ready reports whether a waiting caller's answer moved (the poller's
// re-read after it says it sleeps).
func (x *clientCalls) ready() bool {
	if x.streams != nil && x.streams.ready() {
		return true
	}
	for k := range x.waits {
		w := &x.waits[k]
		if w.waiting.Load() == 1 && x.calls.AnsSeq(k).Load() != w.expect.Load()-1 {
			return true
		}
	}
	return false
}

// anyWaiting reports whether a caller is parked for the poller.
func (x *clientCalls) anyWaiting() bool {
	if x.streams != nil && x.streams.n.Load() > 0 {
		return true
	}
	for k := range x.waits {
		if x.waits[k].waiting.Load() == 1 {
			return true
		}
	}
	return false
}

// pollAnswers is the poller: it hands answers in, keeps looking for
// pollerSpin (yielding to the callers it woke) when none came, then says
// it sleeps (csleeping), looks once more and waits on cbell, at most
// shmCallNap (shmIdleNap once idleNaps naps in a row found nothing). With no caller waiting it parks on kick instead, so an idle
// connection costs no wake-up.
func (x *clientCalls) pollAnswers() {
	if !x.cs.region.Acquire() {
		return
	}
	defer x.cs.region.Release()
	cbell, csleeping := x.calls.CBell(), x.calls.CSleeping()
	idle := 0
	quiet := 0 // naps in a row that ran out with nothing in (pollerNap)
	var idleSince time.Time
	for !x.closed.Load() {
		woke, waiting := x.handOff()
		if y := x.streams; y != nil { // stream slots (shmstreams.go)
			d, n := y.turn()
			woke, waiting = woke+d, waiting+n
		}
		if woke > 0 {
			idle, quiet = 0, 0
			continue // (no Gosched here: the callers just woken wait on this P's queue while the poller looks again; a yield put it behind all of them)
		}
		if waiting == 0 {
			if !x.park() {
				return
			}
			idle = 0
			continue
		}
		if idle == 0 {
			idleSince = time.Now()
		}
		idle++
		if idle&15 != 0 || time.Since(idleSince) < pollerSpin {
			runtime.Gosched()
			continue
		}
		b := cbell.Load()
		csleeping.Store(nextSleep(&x.sleeps))
		timedOut, woken := false, false
		if !x.ready() && !x.closed.Load() {
			timedOut, woken = shm.FutexSleep(cbell, b, pollerNap(quiet))
		}
		csleeping.Store(0)
		if woken { // (a timeout or an interrupted sleep counts as quiet; an answer found resets it above)
			quiet = 0
		} else {
			quiet++
		}
		if timedOut {
			x.naps.Add(1)
			if x.ready() {
				x.missed.Add(1)
			}
		}
		if woken && cbell.Load() == b && !x.ready() && !x.closed.Load() && x.cs.spuriousWake() {
			x.violate(wakeFlood("the client's call-slot poller"))
			return
		}
		idle = 0
	}
}

// park is the poller with no caller waiting: it says it is idle, looks
// once more, and waits for a caller's kick (wakePoller) or the
// connection's end (false).
func (x *clientCalls) park() bool {
	x.pstate.Store(pollIdle)
	if x.anyWaiting() && x.pstate.CompareAndSwap(pollIdle, pollRun) {
		return true
	}
	select {
	case <-x.kick:
		return true
	case <-x.cc.done:
		return false
	}
}
