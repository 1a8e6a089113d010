package shm

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestAllocFirstFitAndExactRelease(t *testing.T) {
	a := NewAlloc(1<<20, 1<<20) // 256 granules at 1 MiB
	ctx := context.Background()
	d1, err := a.Get(ctx, 1)
	if err != nil || d1.Off != 1<<20 || d1.Len != 1 {
		t.Fatalf("first slot %+v %v", d1, err)
	}
	d2, _ := a.Get(ctx, Granule+1) // two granules
	if d2.Off != 1<<20+Granule {
		t.Fatalf("second slot at %d", d2.Off)
	}
	if a.InUse() != 3*Granule {
		t.Fatalf("in use %d", a.InUse())
	}
	for _, bad := range []Desc{{d1.Off, 2}, {d1.Off + 1, 1}, {d2.Off + Granule, 1}} {
		if err := a.Put(bad); errName(err) != NameBadRelease {
			t.Fatalf("Put(%+v) = %v, want bad_release", bad, err)
		}
	}
	if err := a.Put(d1); err != nil {
		t.Fatal(err)
	}
	if err := a.Put(d1); errName(err) != NameBadRelease {
		t.Fatalf("double release: %v", err)
	}
	d3, _ := a.Get(ctx, 100) // reuses the first granule
	if d3.Off != 1<<20 {
		t.Fatalf("first fit: %d", d3.Off)
	}
	if _, err := a.Get(ctx, 1<<20+1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
}

func TestAllocWaitsForRelease(t *testing.T) {
	a := NewAlloc(0, 64*Granule)
	ctx := context.Background()
	whole, err := a.Get(ctx, 64*Granule)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := a.Get(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("full half: %v, want deadline", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := a.Get(ctx, 10*Granule)
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := a.Put(whole); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken by the release")
	}
	if a.Waits() != 2 {
		t.Fatalf("waits %d, want 2", a.Waits())
	}
	go func() {
		_, err := a.Get(ctx, 64*Granule)
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	a.Close()
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestAllocProperty checks the allocator against a model: no two
// outstanding slots overlap, all lie in the half, and a slot is found
// whenever a model first-fit would find one.
func TestAllocProperty(t *testing.T) {
	const gran = 200
	r := rand.New(rand.NewPCG(1, 2))
	a := NewAlloc(Granule*7, gran*Granule)
	model := make([]bool, gran)
	var out []Desc
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // never wait: a full half returns at once
	inUse := func() (n uint64) {
		for _, b := range model {
			if b {
				n += Granule
			}
		}
		return n
	}
	defer func() {
		if a.InUse() != inUse() {
			t.Fatalf("in use %d, model %d", a.InUse(), inUse())
		}
	}()
	for step := 0; step < 20000; step++ {
		if len(out) > 0 && r.IntN(4) == 0 { // shrink one to a random prefix
			i := r.IntN(len(out))
			d := out[i]
			n := uint32(1 + r.IntN(int(d.Len)))
			nd, err := a.Shrink(d, n)
			if err != nil || nd != (Desc{d.Off, n}) {
				t.Fatalf("step %d: Shrink(%+v, %d) = %+v, %v", step, d, n, nd, err)
			}
			g0 := int(d.Off-Granule*7) / Granule
			for j := g0 + int((n+Granule-1)/Granule); j < g0+int((d.Len+Granule-1)/Granule); j++ {
				model[j] = false
			}
			out[i] = nd
			if _, err := a.Shrink(d, n); d.Len != n && errName(err) != NameBadRelease {
				t.Fatalf("step %d: the old slot %+v could still be shrunk: %v", step, d, err)
			}
			continue
		}
		if len(out) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(out))
			d := out[i]
			out = append(out[:i], out[i+1:]...)
			if err := a.Put(d); err != nil {
				t.Fatal(err)
			}
			g0 := int(d.Off-Granule*7) / Granule
			for j := g0; j < g0+int((d.Len+Granule-1)/Granule); j++ {
				model[j] = false
			}
			continue
		}
		n := uint32(1 + r.IntN(70*Granule))
		g := int((n + Granule - 1) / Granule)
		want := -1
		for i, run := 0, 0; i < gran; i++ {
			if model[i] {
				run = 0
				continue
			}
			if run++; run == g {
				want = i - g + 1
				break
			}
		}
		d, err := a.Get(ctx, n)
		if want < 0 {
			if err == nil {
				t.Fatalf("step %d: got %+v where the model has no room", step, d)
			}
			continue
		}
		if err != nil || int(d.Off-Granule*7)/Granule != want {
			t.Fatalf("step %d: %+v %v, model first fit at granule %d", step, d, err, want)
		}
		for j := want; j < want+g; j++ {
			model[j] = true
		}
		out = append(out, d)
	}
}

// TestAllocShrinkAndTryGet: Shrink frees the tail granules (a waiter
// wakes), the peer must then release exactly the shorter slot, and TryGet
// never waits.
func TestAllocShrinkAndTryGet(t *testing.T) {
	a := NewAlloc(0, 8*Granule)
	d, ok := a.TryGet(8 * Granule)
	if !ok || d != (Desc{0, 8 * Granule}) {
		t.Fatalf("TryGet of the whole half: %+v %v", d, ok)
	}
	if _, ok := a.TryGet(1); ok {
		t.Fatal("TryGet on a full half succeeded")
	}
	if a.Waits() != 0 {
		t.Fatalf("TryGet counted %d waits", a.Waits())
	}
	got := make(chan Desc, 1)
	go func() {
		w, err := a.Get(context.Background(), 3*Granule)
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	waitUntil(t, func() bool { return a.Waits() == 1 })
	for _, bad := range []struct {
		d Desc
		n uint32
	}{{d, 0}, {d, d.Len + 1}, {Desc{0, 100}, 50}, {Desc{Granule, Granule}, 1}} {
		if _, err := a.Shrink(bad.d, bad.n); errName(err) != NameBadRelease {
			t.Fatalf("Shrink(%+v, %d) = %v, want bad_release", bad.d, bad.n, err)
		}
	}
	s, err := a.Shrink(d, 4*Granule+1) // keeps 5 granules, frees 3
	if err != nil || s != (Desc{0, 4*Granule + 1}) {
		t.Fatalf("Shrink: %+v %v", s, err)
	}
	select {
	case w := <-got:
		if w.Off != 5*Granule {
			t.Fatalf("the waiter got %+v, want the freed tail at %d", w, 5*Granule)
		}
		if err := a.Put(w); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the shrink")
	}
	if a.InUse() != 5*Granule {
		t.Fatalf("in use %d, want %d", a.InUse(), 5*Granule)
	}
	if err := a.Put(d); errName(err) != NameBadRelease {
		t.Fatalf("release of the slot's old length: %v", err)
	}
	s2, err := a.Shrink(s, 10) // within the same granule: nothing freed
	if err != nil || a.InUse() != Granule {
		t.Fatalf("second shrink %+v %v, in use %d", s2, err, a.InUse())
	}
	if err := a.Put(s2); err != nil || a.InUse() != 0 {
		t.Fatalf("release of the shrunk slot: %v, in use %d", err, a.InUse())
	}
	a.Close()
	if _, ok := a.TryGet(1); ok {
		t.Fatal("TryGet after Close succeeded")
	}
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("timed out")
		}
	}
}

func TestTrackerOverlapAndDrop(t *testing.T) {
	tr := NewTracker(0, 1<<20, 1<<20)
	for _, d := range []Desc{{100, 50}, {0, 100}, {150, 10}, {4096, 1}} {
		if err := tr.Accept(d); err != nil {
			t.Fatal(d, err)
		}
	}
	for _, d := range []Desc{{99, 2}, {0, 1}, {159, 1}, {4000, 200}, {120, 1}} {
		if err := tr.Accept(d); errName(err) != NameBadDesc {
			t.Fatalf("%+v: %v", d, err)
		}
	}
	tr.Drop(Desc{100, 50})
	if err := tr.Accept(Desc{120, 30}); err != nil {
		t.Fatal(err)
	}
	if tr.Held() != 4 {
		t.Fatalf("held %d", tr.Held())
	}
}

// FuzzDescriptor feeds arbitrary payloads and outstanding sets to the
// receiver's checks: no panic, and an accepted slot always lies in the half
// and overlaps nothing outstanding, so Region.Bytes can never go out of range.
func FuzzDescriptor(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0}, uint32(0), uint32(10))
	f.Add([]byte{0xff, 0xff, 0xff, 0xf0, 0, 1, 0, 0}, uint32(5), uint32(5))
	f.Add([]byte{1, 2, 3}, uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, payload []byte, oOff, oLen uint32) {
		const lo, hi = 1 << 16, 1 << 17
		tr := NewTracker(lo, hi, 1<<15)
		held := Desc{oOff, oLen}
		heldOK := tr.Accept(held) == nil
		d, err := ParseDesc(payload)
		if err != nil {
			if len(payload) == DescSize {
				t.Fatalf("8 bytes refused: %v", err)
			}
			return
		}
		if tr.Accept(d) != nil {
			return
		}
		if d.Len == 0 || uint64(d.Off) < lo || d.End() > hi || d.Len > 1<<15 {
			t.Fatalf("accepted %+v outside the half", d)
		}
		if heldOK && uint64(d.Off) < held.End() && uint64(held.Off) < d.End() {
			t.Fatalf("accepted %+v overlapping %+v", d, held)
		}
	})
}

// FuzzRelease: arbitrary shm_release payloads never panic, and an
// allocator only ever frees exactly what it handed over.
func FuzzRelease(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0}, uint16(0))
	f.Add([]byte{0, 16, 0, 0, 0, 16, 0, 0, 0, 0}, uint16(0))
	f.Add([]byte{0, 0, 0, 0, 0x88, 0x13, 0, 0}, uint16(1))
	f.Add([]byte{0, 0, 0, 0, 0xe8, 0x03, 0, 0}, uint16(1000))
	f.Fuzz(func(t *testing.T, payload []byte, shrinkTo uint16) {
		a := NewAlloc(0, 64*Granule)
		d, _ := a.Get(context.Background(), 5000)
		if shrinkTo != 0 { // the writer shrank the slot first (a response made in place)
			s, err := a.Shrink(d, uint32(shrinkTo))
			if (err == nil) != (uint32(shrinkTo) <= d.Len) {
				t.Fatalf("Shrink(%+v, %d): %v", d, shrinkTo, err)
			}
			d = s
		}
		_ = ParseRelease(0, 0, payload, a.Put)
		if a.InUse() != 0 && a.InUse() != uint64((d.Len+Granule-1)/Granule)*Granule {
			t.Fatalf("in use %d", a.InUse())
		}
		if a.InUse() == 0 && a.Put(d) == nil {
			t.Fatal("released twice")
		}
	})
}

func FuzzOffer(f *testing.F) {
	f.Add(AppendOffer(nil, DefaultRegion))
	f.Fuzz(func(t *testing.T, b []byte) {
		size, err := ParseOffer(b)
		if err == nil && CheckSize(size) != nil {
			t.Fatalf("accepted size %d", size)
		}
	})
}

// TestAllocGetUnless: with room it is Get; waiting, it gives up once its
// flag is set and Wake is called (ok false, no error, one wait counted),
// takes the slot when one is freed first, and ends with ctx; a flag set
// before it waits stops it at once. The flag alone, without Wake, does not
// stop a wait (the setter wakes it: no polling).
func TestAllocGetUnless(t *testing.T) {
	a := NewAlloc(0, 4*Granule)
	var stop atomic.Bool
	full, ok, err := a.GetUnless(context.Background(), 4*Granule, stop.Load)
	if err != nil || !ok || a.Waits() != 0 {
		t.Fatalf("with room: ok %v, err %v, waits %d", ok, err, a.Waits())
	}

	done := getUnlessFull(a, &stop)
	for a.Waits() == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("returned before its flag was set: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	stop.Store(true)
	select {
	case err := <-done:
		t.Fatalf("returned on its flag without a Wake: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	a.Wake()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok, err := a.GetUnless(context.Background(), Granule, stop.Load); ok || err != nil {
		t.Fatalf("flag set before the wait: ok %v, err %v; want false, nil at once", ok, err)
	}
	if a.Waits() != 2 {
		t.Fatalf("waits %d, want 2 (one per waiting call)", a.Waits())
	}

	stop.Store(false)
	got := make(chan Desc, 1)
	go func() {
		d, ok, err := a.GetUnless(context.Background(), Granule, stop.Load)
		if !ok || err != nil {
			t.Errorf("after a release: ok %v, err %v", ok, err)
		}
		got <- d
	}()
	for a.Waits() == 2 {
		time.Sleep(time.Millisecond)
	}
	a.Wake() // a wake without room or flag: it waits on
	if err := a.Put(full); err != nil {
		t.Fatal(err)
	}
	if d := <-got; d.Len != Granule {
		t.Fatalf("slot %+v", d)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	a.TryGet(3 * Granule)
	if _, ok, err := a.GetUnless(ctx, 2*Granule, stop.Load); ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx ended: ok %v, err %v", ok, err)
	}
}

// TestAllocWakeRace: a flag set and a Wake racing a GetUnless that is about
// to wait never leave it waiting (it takes the wake channel before it reads
// the flag), over many rounds.
func TestAllocWakeRace(t *testing.T) {
	a := NewAlloc(0, Granule)
	if _, ok := a.TryGet(Granule); !ok {
		t.Fatal("no room in an empty half")
	}
	for i := range 2000 {
		var stop atomic.Bool
		done := getUnlessFull(a, &stop)
		if i%2 == 0 {
			runtime.Gosched()
		}
		stop.Store(true)
		a.Wake()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: GetUnless still waits after its flag was set and Wake called", i)
		}
	}
}

// getUnlessFull starts a GetUnless of one granule on a full half, giving up
// when stop is set; the channel gets nil once it gave up, or the error.
func getUnlessFull(a *Alloc, stop *atomic.Bool) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, ok, err := a.GetUnless(context.Background(), Granule, stop.Load)
		if ok {
			err = errors.New("got a slot of a full half")
		}
		done <- err
	}()
	return done
}
