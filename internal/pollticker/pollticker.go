package pollticker

import (
	"container/heap"
	"sync"
	"time"
)

// Ticker delivers ticks on C every period, like time.Ticker.
type Ticker struct {
	C <-chan time.Time

	c  chan time.Time
	h  *hub
	rt *time.Ticker // the fallback: no shared clock on this system

	// (hub.mu)
	period time.Duration
	next   int64 // when the next tick is due (hub time, ns)
	index  int   // position in hub.due; -1 when stopped
}

// NewTicker returns a Ticker whose first tick comes after d. d must be
// positive.
func NewTicker(d time.Duration) *Ticker {
	if d <= 0 {
		panic("pollticker: non-positive interval for NewTicker")
	}
	return newTicker(getHub(), d)
}

// newTicker returns a Ticker on h, or a time.Ticker when h is nil.
func newTicker(h *hub, d time.Duration) *Ticker {
	if h == nil {
		rt := time.NewTicker(d)
		return &Ticker{C: rt.C, rt: rt, index: -1}
	}
	c := make(chan time.Time, 1)
	t := &Ticker{C: c, c: c, h: h, index: -1}
	h.reset(t, d)
	return t
}

// Reset stops t and restarts it with period d: the next tick comes after d.
// d must be positive.
func (t *Ticker) Reset(d time.Duration) {
	if d <= 0 {
		panic("pollticker: non-positive interval for Ticker.Reset")
	}
	if t.rt != nil {
		t.rt.Reset(d)
		return
	}
	t.h.reset(t, d)
}

// Stop turns t off: no tick is sent after Stop returns. It does not close C
// nor drain a tick already in it.
func (t *Ticker) Stop() {
	if t.rt != nil {
		t.rt.Stop()
		return
	}
	t.h.stop(t)
}

// clock is the system part of the hub: one timer that the hub's goroutine
// waits on without a runtime timer (clock_linux.go).
type clock interface {
	// arm makes wait return after d (d > 0); d == 0 disarms. It cannot
	// fail on a clock openClock returned (timerfd_settime fails only for a
	// bad descriptor or value).
	arm(d time.Duration)
	// wait blocks until the timer expires.
	wait() error
}

// hub holds every running Ticker of the process in a heap ordered by the
// next tick, and keeps its clock armed for the earliest one.
//
// Invariants (under mu): a Ticker is in due iff it runs (index >= 0);
// armed is the hub time the clock was last armed for (0: disarmed), never
// later than due[0].next, so no tick is late by more than the clock's own
// latency. A tick is sent (never blocking) only under mu, so after Stop
// returns no tick is sent.
type hub struct {
	clk   clock
	base  time.Time // hub time is nanoseconds since base (monotonic)
	mu    sync.Mutex
	due   tickHeap
	armed int64
}

var theHub struct {
	once sync.Once
	h    *hub
}

// getHub returns the process's hub, starting it on first use; nil when this
// system has no clock for it.
func getHub() *hub {
	theHub.once.Do(func() {
		clk, err := openClock()
		if err != nil {
			return
		}
		h := &hub{clk: clk, base: time.Now()}
		theHub.h = h
		go h.run()
	})
	return theHub.h
}

func (h *hub) now() int64 { return h.since(time.Now()) }

func (h *hub) since(t time.Time) int64 { return int64(t.Sub(h.base)) }

func (h *hub) reset(t *Ticker, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t.period = d
	t.next = h.now() + int64(d)
	if t.index < 0 {
		heap.Push(&h.due, t)
	} else {
		heap.Fix(&h.due, t.index)
	}
	h.rearmLocked()
}

func (h *hub) stop(t *Ticker) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t.index >= 0 {
		heap.Remove(&h.due, t.index)
	}
	if len(h.due) == 0 && h.armed != 0 {
		h.armed = 0
		h.clk.arm(0) // nothing left: no wake-up for nothing
	}
}

// rearmLocked arms the clock for the earliest tick when that is earlier than
// what it is armed for. A clock armed too early only wakes the hub for
// nothing (it re-arms then), so a later first tick needs no system call.
func (h *hub) rearmLocked() {
	if len(h.due) == 0 {
		return
	}
	first := h.due[0].next
	if h.armed != 0 && h.armed <= first {
		return
	}
	h.armed = first
	h.clk.arm(time.Duration(max(first-h.now(), 1)))
}

// run waits for the clock and sends the ticks that are due, for the life of
// the process.
func (h *hub) run() {
	for {
		if err := h.clk.wait(); err != nil {
			// Not expected for a timerfd; keep the process's tickers alive
			// on a runtime timer rather than spin or stop.
			time.Sleep(time.Millisecond)
		}
		h.mu.Lock()
		h.armed = 0
		wall := time.Now()
		now := h.since(wall)
		for len(h.due) > 0 && h.due[0].next <= now {
			t := h.due[0]
			select {
			case t.c <- wall:
			default: // the receiver has not taken the last tick: skip this one
			}
			t.next += int64(t.period)
			if t.next <= now { // fell behind: skip the missed ticks
				t.next = now + int64(t.period)
			}
			heap.Fix(&h.due, 0)
		}
		h.rearmLocked()
		h.mu.Unlock()
	}
}

// tickHeap orders running Tickers by their next tick.
type tickHeap []*Ticker

func (q tickHeap) Len() int           { return len(q) }
func (q tickHeap) Less(i, j int) bool { return q[i].next < q[j].next }
func (q tickHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *tickHeap) Push(x any) {
	t := x.(*Ticker)
	t.index = len(*q)
	*q = append(*q, t)
}
func (q *tickHeap) Pop() any {
	old := *q
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	t.index = -1
	return t
}
