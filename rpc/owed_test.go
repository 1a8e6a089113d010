package rpc

import (
	"sync"
	"testing"
)

// TestOwedMarksEpochs: marks count until an idle yield ends their epoch;
// settling a mark of an ended epoch changes nothing; new marks count again;
// a settle that ran during the yield keeps the epoch.
func TestOwedMarksEpochs(t *testing.T) {
	var o owedMarks
	var a, b, c owedMark
	o.owe(&a)
	o.owe(&a) // set once
	o.owe(&b)
	if n := o.n(); n != 2 {
		t.Fatalf("n = %d, want 2", n)
	}
	before := o.v.Load()
	o.settle(&b) // answered during the yield: the epoch stays
	o.expireIfIdle(before)
	if n := o.n(); n != 1 {
		t.Fatalf("after a yield that gathered: n = %d, want 1", n)
	}
	before = o.v.Load()
	o.expireIfIdle(before) // nobody answered: a is stale
	if n := o.n(); n != 0 {
		t.Fatalf("after an idle yield: n = %d, want 0", n)
	}
	o.owe(&c)
	o.settle(&a) // a mark of the ended epoch: no effect on the count
	if n := o.n(); n != 1 {
		t.Fatalf("a new mark after the expiry: n = %d, want 1", n)
	}
	o.owe(&a) // a settled stale mark can be set again, and counts
	if n := o.n(); n != 2 {
		t.Fatalf("n = %d, want 2", n)
	}
	o.settle(&a)
	o.settle(&c)
	if n := o.n(); n != 0 {
		t.Fatalf("all settled: n = %d, want 0", n)
	}
}

// TestOwedMarksConcurrent: marks set and settled from many goroutines, with
// expiries among them, leave the count at 0 once every mark is settled,
// and the count never leaves its field (no carry into the others).
func TestOwedMarksConcurrent(t *testing.T) {
	var o owedMarks
	marks := make([]owedMark, 64)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 20000 {
				m := &marks[(g*8+i)%len(marks)]
				o.owe(m)
				if i%97 == 0 {
					o.expireIfIdle(o.v.Load())
				}
				o.settle(m)
			}
		})
	}
	wg.Wait()
	if n := o.n(); n != 0 {
		t.Fatalf("every mark settled: n = %d, want 0", n)
	}
	for i := range marks {
		if marks[i].v.Load() != 0 {
			t.Fatalf("mark %d left set", i)
		}
	}
	// The fields: a count of -1 does not borrow from settles or the epoch.
	w := owedWord(5, 7, -1)
	if owedEpoch(w) != 5 || owedSettles(w) != 7 || owedCount(w) != -1 {
		t.Fatalf("word %x: epoch %d settles %d count %d", w, owedEpoch(w), owedSettles(w), owedCount(w))
	}
	w = owedWord(owedEpochMask+1, 0xFFFF+0, 1<<22)
	if owedEpoch(w) != 0 || owedSettles(w) != 0xFFFF || owedCount(w) != 1<<22 {
		t.Fatalf("word %x: epoch %d settles %d count %d", w, owedEpoch(w), owedSettles(w), owedCount(w))
	}
}
