package shm

import (
	"context"
	"errors"
	"math/rand/v2"
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
	for step := 0; step < 20000; step++ {
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
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0})
	f.Add([]byte{0, 16, 0, 0, 0, 16, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		a := NewAlloc(0, 64*Granule)
		d, _ := a.Get(context.Background(), 5000)
		_ = ParseRelease(0, 0, payload, a.Put)
		if a.InUse() != 0 && a.InUse() != 2*Granule {
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
