package pollticker

import (
	"testing"
	"time"
)

// impls runs a test on the shared clock (where this system has one) and on
// the time.Ticker fallback.
func impls(t *testing.T, f func(t *testing.T, h *hub)) {
	t.Run("fallback", func(t *testing.T) { f(t, nil) })
	h := getHub()
	if h == nil {
		if hasClock {
			t.Fatal("no shared clock on a system that has one")
		}
		return
	}
	t.Run("shared", func(t *testing.T) { f(t, h) })
}

// recv waits for a tick for at most limit (a liveness guard on a loaded
// machine, not a timing assertion).
func recv(t *testing.T, tk *Ticker, limit time.Duration) time.Time {
	t.Helper()
	select {
	case w := <-tk.C:
		return w
	case <-time.After(limit):
		t.Fatalf("no tick within %v", limit)
		return time.Time{}
	}
}

func TestTicksEveryPeriod(t *testing.T) {
	impls(t, func(t *testing.T, h *hub) {
		const d = 20 * time.Millisecond
		start := time.Now()
		tk := newTicker(h, d)
		defer tk.Stop()
		for i := 1; i <= 5; i++ {
			recv(t, tk, 5*time.Second)
		}
		// Five ticks take at least five periods (never early); an upper
		// bound would only measure the machine's load.
		if el := time.Since(start); el < 5*d-time.Millisecond {
			t.Fatalf("5 ticks of %v in %v: ticks came early", d, el)
		}
	})
}

func TestStopStopsTicks(t *testing.T) {
	impls(t, func(t *testing.T, h *hub) {
		tk := newTicker(h, 5*time.Millisecond)
		recv(t, tk, 5*time.Second)
		tk.Stop()
		select { // a tick sent before Stop may be waiting: take it
		case <-tk.C:
		default:
		}
		select {
		case <-tk.C:
			t.Fatal("a tick after Stop")
		case <-time.After(50 * time.Millisecond):
		}
		tk.Reset(5 * time.Millisecond) // and Reset starts it again
		recv(t, tk, 5*time.Second)
		tk.Stop()
	})
}

func TestResetChangesPeriod(t *testing.T) {
	impls(t, func(t *testing.T, h *hub) {
		tk := newTicker(h, time.Hour)
		defer tk.Stop()
		start := time.Now()
		tk.Reset(10 * time.Millisecond) // earlier than what the clock was armed for
		recv(t, tk, 5*time.Second)
		if el := time.Since(start); el < 10*time.Millisecond-time.Millisecond {
			t.Fatalf("first tick after Reset(10ms) came after %v", el)
		}
		tk.Reset(time.Hour) // later: no tick now
		select {
		case <-tk.C:
			t.Fatal("a tick after Reset to an hour")
		case <-time.After(50 * time.Millisecond):
		}
	})
}

// TestManyTickers: tickers of different periods share the clock, each gets
// its own ticks, and a receiver that does not keep up misses ticks instead
// of holding up the others.
func TestManyTickers(t *testing.T) {
	impls(t, func(t *testing.T, h *hub) {
		slow := newTicker(h, time.Millisecond) // never read until the end
		defer slow.Stop()
		var tks []*Ticker
		for _, d := range []time.Duration{3, 7, 11, 2, 5} {
			tk := newTicker(h, d*time.Millisecond)
			defer tk.Stop()
			tks = append(tks, tk)
		}
		for round := 0; round < 3; round++ {
			for _, tk := range tks {
				recv(t, tk, 5*time.Second)
			}
		}
		recv(t, slow, 5*time.Second) // it kept a tick and did not hold up the others
	})
}

func TestNonPositiveIntervalPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"NewTicker": func() { NewTicker(0) },
		"Reset":     func() { tk := NewTicker(time.Hour); defer tk.Stop(); tk.Reset(-1) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}
