package shm

import (
	"sync/atomic"
)

// Region is one connection's mapping of the shared memory. Readers and
// writers of its bytes hold a reference (Acquire/Release) so that Close,
// which may run on any goroutine when the connection ends, unmaps only once
// nobody copies from or into it.
type Region struct {
	mem   []byte
	size  uint64
	state atomic.Int64 // references, plus closedBit once closed
	unmap func([]byte)
}

const closedBit = int64(1) << 62

// Size is the region's size in bytes.
func (r *Region) Size() uint64 { return r.size }

// Acquire takes a reference; false once the region is closed.
func (r *Region) Acquire() bool {
	for {
		s := r.state.Load()
		if s&closedBit != 0 {
			return false
		}
		if r.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// Release drops a reference; the last one after Close unmaps.
func (r *Region) Release() {
	if r.state.Add(-1) == closedBit {
		r.doUnmap()
	}
}

// Close marks the region closed and unmaps it once no reference is held.
// Safe to call more than once.
func (r *Region) Close() {
	for {
		s := r.state.Load()
		if s&closedBit != 0 {
			return
		}
		if r.state.CompareAndSwap(s, s|closedBit) {
			if s == 0 {
				r.doUnmap()
			}
			return
		}
	}
}

func (r *Region) doUnmap() {
	mem := r.mem
	r.mem = nil
	if mem != nil && r.unmap != nil {
		r.unmap(mem)
	}
}

// Bytes returns the slot's bytes. d must have been checked (Tracker.Accept
// or Alloc.Get) and a reference must be held.
func (r *Region) Bytes(d Desc) []byte {
	return r.mem[d.Off:d.End():d.End()]
}
