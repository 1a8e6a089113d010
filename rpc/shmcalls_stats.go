package rpc

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/internal/shm"
)

// Counters of the call slots (protocol/spec.md 10.8), per connection, in
// ShmStats and udskit.stats: calls through a slot, the bytes of payloads
// carried in the slots' payload areas each way, and spurious wake-ups.

const (
	// spuriousRate and spuriousBurst bound the wake-ups, on one
	// connection, of sleepers on the region that found their word
	// unchanged (a cell-rate limit: a burst of spuriousBurst, then
	// spuriousRate per second). Each costs a thread a wake-up, a look and
	// a sleep, and a peer can cause them at will with FUTEX_WAKE on the
	// shared words. Honest ones come of a wake that lands after its
	// sleeper already woke for another reason and slept again: a single
	// one in 60 -race runs of TestSpuriousWakesAreRare (the TestShmCalls*
	// load), so a connection past the bound ends with protocol_violation; a flood under it costs
	// at most spuriousRate wake-ups a second.
	spuriousRate  = 500
	spuriousBurst = 5000
	// spuriousT is the time one spurious wake-up "costs" the bucket.
	spuriousT = int64(time.Second) / spuriousRate
)

// slotStats is a connection's call-slot counters (embedded in connShm).
type slotStats struct {
	slotCalls atomic.Uint64 // calls through a slot (client: made; server: answered)
	areaSentB atomic.Uint64 // bytes of payloads this side wrote into its payload areas
	areaRecvB atomic.Uint64 // bytes of payloads the peer wrote into its payload areas
	spurious  atomic.Uint64 // wake-ups that found the word unchanged, since the start
	wakeTAT   atomic.Int64  // the limit's theoretical arrival time (since wakeEpoch)
}

// wakeEpoch is the origin of slotStats.wakeTAT (monotonic).
var wakeEpoch = time.Now()

// areaOut counts a payload of n bytes written into one of this side's
// payload areas: a payload through the region (Sent).
func (s *connShm) areaOut(n int) {
	s.sent.Add(1)
	s.areaSentB.Add(uint64(n))
}

// areaIn counts a payload of n bytes read from one of the peer's payload
// areas (Received).
func (s *connShm) areaIn(n int) {
	s.recv.Add(1)
	s.areaRecvB.Add(uint64(n))
}

// spuriousWake counts one wake-up that found its word unchanged and
// reports whether the connection is past the bound (spuriousBurst, then
// spuriousRate a second): then it must end with protocol_violation.
func (s *slotStats) spuriousWake() bool {
	s.spurious.Add(1)
	now := int64(time.Since(wakeEpoch))
	for {
		tat := s.wakeTAT.Load()
		next := max(tat, now) + spuriousT
		if next-now > spuriousBurst*spuriousT {
			return true
		}
		if s.wakeTAT.CompareAndSwap(tat, next) {
			return false
		}
	}
}

// wakeFlood is the protocol violation of a connection past the bound.
func wakeFlood(who string) *Error {
	return callViolation("wake-ups of %s that found nothing changed past %d, then %d a second: the peer floods FUTEX_WAKE on the region", who, spuriousBurst, spuriousRate)
}

// addSlots adds a connection's call-slot counters.
func (st *ShmStats) addSlots(s *slotStats) {
	st.SlotCalls += s.slotCalls.Load()
	st.AreaSentBytes += s.areaSentB.Load()
	st.AreaReceivedBytes += s.areaRecvB.Load()
	st.SpuriousWakes += s.spurious.Load()
}

// pollerWoke is the poller's check after a sleep on the bell that held b:
// a wake-up with the bell unchanged, no request pending and the connection
// open is spurious. It reports whether the connection must end (and ends
// it).
func (x *serverCalls) pollerWoke(woken bool, b uint32) bool {
	if !woken || x.calls.Bell().Load() != b || x.pending() || x.closed.Load() || x.streams != nil && x.streams.kicked.Load() {
		return false
	}
	if !x.cs.spuriousWake() {
		return false
	}
	x.c.connError(ProtocolViolation, &shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf("wake-ups of the call-slot poller with the bell unchanged past %d, then %d a second: the client floods FUTEX_WAKE on the region", spuriousBurst, spuriousRate)})
	return true
}

const (
	// loneSpinMisses: a lone caller stops spinning after this many spins
	// in a row that did not find the answer within loneSpin (a handler
	// slower than the spin: spinning would only burn loneSpin per call;
	// 4, so that a few late answers on a loaded machine do not stop a fast
	// connection's spinning)...
	loneSpinMisses = 4
	// loneSpinProbe: ...and then spins on one lone call in this many only,
	// to notice when answers come fast again...
	loneSpinProbe = 32
	// loneProbeSpin: ...for this long: the server's poller, idle since
	// the last call, is likely asleep, so the probe's answer comes a wake-up
	// later than the same answer to a caller that spins on every call.
	loneProbeSpin = 4 * loneSpin
)

// loneSpinner makes the lone caller's spin (clientCalls.call, loneSpin)
// adaptive: a lone caller spins only while recent answers on this
// connection came within the spin.
type loneSpinner struct {
	miss  atomic.Uint32 // lone calls since an answer last came within the spin
	spins atomic.Uint64 // spins started (tests)
	skips atomic.Uint64 // lone calls that did not spin (tests)
}

// spinFor returns how long a caller that has not found its answer in its
// first looks spins for it (got: it has; 0: it does not spin): a lone one
// loneSpin while the last answers came within the spin, and on every
// loneSpinProbe-th lone call after, loneProbeSpin, to notice when they come
// fast again.
func (x *clientCalls) spinFor(lone, got bool) time.Duration {
	switch {
	case !lone:
		return 0
	case got:
		if x.spin.miss.Load() != 0 {
			x.spin.miss.Store(0)
		}
		return 0
	}
	m := x.spin.miss.Load()
	if m < loneSpinMisses {
		x.spin.spins.Add(1)
		return loneSpin
	}
	if m%loneSpinProbe == 0 {
		x.spin.spins.Add(1)
		return loneProbeSpin
	}
	x.spin.miss.Add(1)
	x.spin.skips.Add(1)
	return 0
}

// spun records a lone spin's outcome: found the answer, or spun the whole
// of its time (a spin cut short by another caller says nothing).
func (x *clientCalls) spun(got bool) {
	if got {
		x.spin.miss.Store(0)
	} else if x.wait.Load() == 1 {
		x.spin.miss.Add(1)
	}
}
