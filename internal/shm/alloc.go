package shm

import (
	"context"
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Granule is the allocation unit of Alloc: slots start on Granule
// boundaries and take whole granules.
const Granule = 4096

// ErrClosed is returned by Alloc.Get once the connection has closed.
var ErrClosed = errors.New("udskit shm: region closed (connection ended)")

// ErrTooLarge is returned by Alloc.Get for a payload larger than the half:
// it cannot ever fit, and travels on the socket instead.
var ErrTooLarge = errors.New("udskit shm: payload larger than the region's half")

// Alloc hands out slots in the writer's half of the region: first fit over
// a bitmap of granules, all of it private memory (nothing is read back from
// the region). A slot is outstanding from Get until the peer releases it
// (Put); Put accepts only exactly an outstanding slot.
type Alloc struct {
	base, size uint32 // the half: [base, base+size)

	mu     sync.Mutex
	used   []uint64          // one bit per granule, 1 = taken
	out    map[uint32]uint32 // outstanding slots: offset → length
	inUse  uint64            // bytes in outstanding slots (whole granules)
	wake   chan struct{}     // closed by Put when someone waits; nil otherwise
	closed bool

	waits atomic.Uint64 // Gets that had to wait for a release
}

// NewAlloc returns an allocator for the half [base, base+size); size must be
// a multiple of Granule.
func NewAlloc(base, size uint32) *Alloc {
	n := size / Granule
	return &Alloc{base: base, size: size, used: make([]uint64, (n+63)/64), out: make(map[uint32]uint32, 64)}
}

// Cap is the half's size in bytes.
func (a *Alloc) Cap() uint64 { return uint64(a.size) }

// InUse is the bytes of the half held by outstanding slots.
func (a *Alloc) InUse() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inUse
}

// Waits counts the Gets that found the half full and waited.
func (a *Alloc) Waits() uint64 { return a.waits.Load() }

// Get allocates a slot of n bytes (n ≥ 1), waiting within ctx while the half
// is full (back-pressure: never a fallback). It fails with ErrTooLarge when
// n can never fit, ErrClosed after Close, or ctx's error.
func (a *Alloc) Get(ctx context.Context, n uint32) (Desc, error) {
	d, _, err := a.GetUnless(ctx, n, nil)
	return d, err
}

// GetUnless is Get that stops waiting once giveUp reports true: then ok is
// false and err nil (the wait is counted once, as Get counts it). It asks
// giveUp before it first waits and at every wake-up, so whoever makes it
// true calls Wake afterwards: a waiting GetUnless then returns at once. A
// nil giveUp waits as Get does.
func (a *Alloc) GetUnless(ctx context.Context, n uint32, giveUp func() bool) (d Desc, ok bool, err error) {
	if n == 0 || uint64(n) > uint64(a.size) {
		return Desc{}, false, ErrTooLarge
	}
	g := int((uint64(n) + Granule - 1) / Granule)
	counted := false
	for {
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			return Desc{}, false, ErrClosed
		}
		if i := a.find(g); i >= 0 {
			a.mark(i, g, true)
			d := Desc{Off: a.base + uint32(i)*Granule, Len: n}
			a.out[d.Off] = n
			a.inUse += uint64(g) * Granule
			a.mu.Unlock()
			return d, true, nil
		}
		if a.wake == nil {
			a.wake = make(chan struct{})
		}
		wake := a.wake // taken before giveUp is read: a Wake after a set closes it
		a.mu.Unlock()
		if !counted {
			a.waits.Add(1)
			counted = true
		}
		if giveUp != nil && giveUp() {
			return Desc{}, false, nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return Desc{}, false, ctx.Err()
		}
	}
}

// Wake wakes every waiting Get and GetUnless to look again (GetUnless at
// its giveUp flag too); those that still find no room wait again.
func (a *Alloc) Wake() {
	a.mu.Lock()
	if a.wake != nil {
		close(a.wake)
		a.wake = nil
	}
	a.mu.Unlock()
}

// TryGet is Get without waiting: ok is false when the half has no free run
// of n bytes now (or n is 0, too large, or the allocator closed). It does
// not count a wait.
func (a *Alloc) TryGet(n uint32) (d Desc, ok bool) {
	if n == 0 || uint64(n) > uint64(a.size) {
		return Desc{}, false
	}
	g := int((uint64(n) + Granule - 1) / Granule)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return Desc{}, false
	}
	i := a.find(g)
	if i < 0 {
		return Desc{}, false
	}
	a.mark(i, g, true)
	d = Desc{Off: a.base + uint32(i)*Granule, Len: n}
	a.out[d.Off] = n
	a.inUse += uint64(g) * Granule
	return d, true
}

// Shrink cuts the outstanding slot d (exactly as Get returned it) to its
// first n bytes, 1 ≤ n ≤ d.Len, freeing the granules past them, and returns
// the shorter slot; the peer must then release exactly that. It fails, and
// nothing changes, for anything else.
func (a *Alloc) Shrink(d Desc, n uint32) (Desc, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.out[d.Off]; !ok || l != d.Len {
		return d, errf(NameBadRelease, "shrink of slot (offset %d, length %d), which is not outstanding", d.Off, d.Len)
	}
	if n == 0 || n > d.Len {
		return d, errf(NameBadRelease, "shrink of slot (offset %d, length %d) to %d bytes", d.Off, d.Len, n)
	}
	had := int((uint64(d.Len) + Granule - 1) / Granule)
	keep := int((uint64(n) + Granule - 1) / Granule)
	a.out[d.Off] = n
	if keep < had {
		a.mark(int((d.Off-a.base)/Granule)+keep, had-keep, false)
		a.inUse -= uint64(had-keep) * Granule
		if a.wake != nil {
			close(a.wake)
			a.wake = nil
		}
	}
	return Desc{Off: d.Off, Len: n}, nil
}

// Put returns slot d: it must be exactly (offset and length) an outstanding
// slot, else it is the peer's protocol violation (NameBadRelease) and nothing
// changes.
func (a *Alloc) Put(d Desc) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n, ok := a.out[d.Off]; !ok || n != d.Len {
		return errf(NameBadRelease, "release of slot (offset %d, length %d), which is not a slot handed over and unreleased", d.Off, d.Len)
	}
	delete(a.out, d.Off)
	g := int((uint64(d.Len) + Granule - 1) / Granule)
	a.mark(int((d.Off-a.base)/Granule), g, false)
	a.inUse -= uint64(g) * Granule
	if a.wake != nil {
		close(a.wake)
		a.wake = nil
	}
	return nil
}

// Close fails every waiting and later Get with ErrClosed.
func (a *Alloc) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.wake != nil {
		close(a.wake)
		a.wake = nil
	}
}

// find returns the first granule of a free run of g granules, or -1.
func (a *Alloc) find(g int) int {
	total := int(a.size / Granule)
	run, start := 0, 0
	for i := 0; i < total; {
		w := a.used[i/64]
		if i%64 == 0 && i+64 <= total {
			if w == 0 { // 64 free granules
				if run == 0 {
					start = i
				}
				run += 64
				if run >= g {
					return start
				}
				i += 64
				continue
			}
			if w == ^uint64(0) {
				run = 0
				i += 64
				continue
			}
		}
		if w&(1<<(uint(i)%64)) == 0 {
			if run == 0 {
				start = i
			}
			run++
			if run >= g {
				return start
			}
			i++
			continue
		}
		run = 0
		// skip the run of taken bits
		rest := w >> (uint(i) % 64)
		skip := bits.TrailingZeros64(^rest)
		if skip == 0 {
			skip = 1
		}
		i += skip
	}
	return -1
}

func (a *Alloc) mark(i, g int, taken bool) {
	for j := i; j < i+g; j++ {
		if j%64 == 0 && j+64 <= i+g {
			if taken {
				a.used[j/64] = ^uint64(0)
			} else {
				a.used[j/64] = 0
			}
			j += 63
			continue
		}
		if taken {
			a.used[j/64] |= 1 << (uint(j) % 64)
		} else {
			a.used[j/64] &^= 1 << (uint(j) % 64)
		}
	}
}

// Tracker checks the descriptors a receiver gets from one writer
// (protocol/spec.md, 10.4): within the writer's half, 1 ≤ length ≤ max
// frame, overlapping no slot accepted and not yet dropped.
type Tracker struct {
	lo, hi uint64 // the writer's half
	max    uint32

	mu  sync.Mutex
	out []Desc // accepted, not yet released; sorted by Off
}

// NewTracker returns a tracker for the writer's half [lo, hi) and payloads
// up to maxLen bytes.
func NewTracker(lo, hi uint64, maxLen uint32) *Tracker {
	return &Tracker{lo: lo, hi: hi, max: maxLen, out: make([]Desc, 0, 16)}
}

// Accept checks d and records it as held by the receiver until Drop.
func (t *Tracker) Accept(d Desc) error {
	switch {
	case d.Len == 0:
		return errf(NameBadDesc, "descriptor of length 0")
	case d.Len > t.max:
		return errf(NameBadDesc, "descriptor length %d over the max frame %d", d.Len, t.max)
	case uint64(d.Off) < t.lo || d.End() > t.hi:
		return errf(NameBadDesc, "slot [%d, %d) outside the sender's half [%d, %d)", d.Off, d.End(), t.lo, t.hi)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// first slot starting at or after d.Off
	i, j := 0, len(t.out)
	for i < j {
		m := int(uint(i+j) >> 1)
		if t.out[m].Off < d.Off {
			i = m + 1
		} else {
			j = m
		}
	}
	if i > 0 && t.out[i-1].End() > uint64(d.Off) {
		p := t.out[i-1]
		return errf(NameBadDesc, "slot [%d, %d) overlaps the unreleased slot [%d, %d)", d.Off, d.End(), p.Off, p.End())
	}
	if i < len(t.out) && uint64(t.out[i].Off) < d.End() {
		p := t.out[i]
		return errf(NameBadDesc, "slot [%d, %d) overlaps the unreleased slot [%d, %d)", d.Off, d.End(), p.Off, p.End())
	}
	t.out = append(t.out, Desc{})
	copy(t.out[i+1:], t.out[i:])
	t.out[i] = d
	return nil
}

// Drop forgets an accepted slot (the receiver releases it).
func (t *Tracker) Drop(d Desc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, o := range t.out {
		if o == d {
			t.out = append(t.out[:i], t.out[i+1:]...)
			return
		}
	}
}

// Held is the number of accepted slots not yet dropped.
func (t *Tracker) Held() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.out)
}
