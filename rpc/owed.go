package rpc

import (
	"sync/atomic"

	"github.com/udskit/udskit/frame"
)

// Owed marks (docs/internals.md, "Bidi items gathered"): a bidi call handed
// an item it has not answered yet is marked, and an item sent on the
// connection while another call is marked waits for the marked callers to
// run once (frame.Writer.GatherFrame), so that their answers join its write.
//
// A caller that keeps its item and neither sends nor waits again would stay
// marked for as long as it likes, and every send of the other calls would
// yield for it. So the marks belong to an epoch, and a yield that gathered
// nothing ends the epoch: when no mark was settled while the sender let the
// others run, the marks it saw are stale and no longer count. The next marks
// (items handed out from then on) count again. One idle holder costs the
// connection's senders one yield, not one per send
// (TestBidiStaleOwedMarkExpires).

// owedMarks is a connection's marks, in one word: the epoch (high 24
// bits), how many marks of it were settled (16 bits, wrapping: only ever
// compared for a change), and how many count now (low 24 bits, signed: a
// settle may run before the add of the mark it settles).
type owedMarks struct{ v atomic.Uint64 }

// owedMark is one call's mark: 0 when not marked, else 1 + the epoch it was
// set in.
type owedMark struct{ v atomic.Uint32 }

const (
	owedEpochBits = 24
	owedEpochMask = 1<<owedEpochBits - 1
	owedCountMask = 1<<24 - 1
)

func owedEpoch(v uint64) uint32   { return uint32(v>>40) & owedEpochMask }
func owedSettles(v uint64) uint16 { return uint16(v >> 24) }
func owedCount(v uint64) int32    { return int32(uint32(v)<<8) >> 8 }

func owedWord(epoch uint32, settles uint16, count int32) uint64 {
	return uint64(epoch&owedEpochMask)<<40 | uint64(settles)<<24 | uint64(uint32(count)&owedCountMask)
}

// n is the number of marks that count now.
func (o *owedMarks) n() int32 { return owedCount(o.v.Load()) }

// owe sets m (its call was handed an item), unless it is set.
func (o *owedMarks) owe(m *owedMark) {
	e := owedEpoch(o.v.Load())
	if m.v.CompareAndSwap(0, e+1) {
		o.add(e, 1)
	}
}

// settle clears m (its call sends, waits or ends).
func (o *owedMarks) settle(m *owedMark) {
	if x := m.v.Load(); x != 0 && m.v.CompareAndSwap(x, 0) {
		o.add(x-1, -1)
	}
}

// add changes the count of epoch e by d (a settle when d < 0); nothing once
// e has ended: its marks no longer count. (An epoch number comes back after
// 2^24 ended epochs: a mark kept that long and then settled takes one off
// the count of a later epoch, until that epoch ends.)
func (o *owedMarks) add(e uint32, d int32) {
	for {
		v := o.v.Load()
		if owedEpoch(v) != e {
			return
		}
		settles := owedSettles(v)
		if d < 0 {
			settles++
		}
		if o.v.CompareAndSwap(v, owedWord(e, settles, owedCount(v)+d)) {
			return
		}
	}
}

// gather writes a small item frame of a bidi or stream call whose own mark
// is settled: with GatherFrame while another call is marked, else with
// WriteFrame. A yield during which no mark was settled ends the epoch: the
// marks it waited for are stale.
func (o *owedMarks) gather(w *frame.Writer, h *frame.Header, payload []byte) error {
	before := o.v.Load()
	if owedCount(before) <= 0 {
		return w.WriteFrame(h, nil, payload)
	}
	yielded, err := w.GatherFrameYield(h, nil, payload)
	if yielded {
		o.expireIfIdle(before)
	}
	return err
}

// expireIfIdle ends the epoch of before when none of its marks was settled
// since: the calls that made a sender yield did not answer while it let
// them run.
func (o *owedMarks) expireIfIdle(before uint64) {
	now := o.v.Load()
	if owedEpoch(now) != owedEpoch(before) || owedSettles(now) != owedSettles(before) {
		return
	}
	o.v.CompareAndSwap(now, owedWord(owedEpoch(now)+1, 0, 0))
}
