package kcapture

import (
	"cmp"
	"slices"
	"sort"
)

// reorder holds messages for a short window and releases them in timestamp
// order. Events from different CPUs reach the ring buffer slightly out of
// order (a reply can be read before the request's send has left its
// syscall); sorting within the window puts a connection's packets in the
// order they happened. Bounded: beyond maxHeld messages the oldest are
// released early.
type reorder struct {
	held []*Message
	emit func(*Message)
	// sorted: held is in order (nothing pushed since the last sort), so a
	// drain that finds nothing to release costs a search, not a sort.
	sorted bool
}

const maxHeld = 65536

func (r *reorder) push(m *Message) {
	if n := len(r.held); n > 0 && r.held[n-1].Mono > m.Mono {
		r.sorted = false
	}
	r.held = append(r.held, m)
	if len(r.held) > maxHeld {
		r.release(len(r.held) - maxHeld/2)
	}
}

// drain releases every message stamped at or before cutoff.
func (r *reorder) drain(cutoff uint64) {
	r.sort()
	n := sort.Search(len(r.held), func(i int) bool { return r.held[i].Mono > cutoff })
	r.emitFirst(n)
}

// release releases the n oldest messages.
func (r *reorder) release(n int) {
	r.sort()
	r.emitFirst(n)
}

func (r *reorder) flush() { r.release(len(r.held)) }

func (r *reorder) sort() {
	if !r.sorted {
		slices.SortStableFunc(r.held, func(a, b *Message) int { return cmp.Compare(a.Mono, b.Mono) })
		r.sorted = true
	}
}

func (r *reorder) emitFirst(n int) {
	for _, m := range r.held[:n] {
		r.emit(m)
	}
	clear(r.held[:n])
	r.held = append(r.held[:0], r.held[n:]...)
}
