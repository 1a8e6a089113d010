package rpc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// Call slots (protocol/spec.md 10.8, ClientOptions.ShmCalls): on a
// connection whose hellos both set shm_calls, a unary call is published in
// a call slot of the region's control blocks instead of on the socket, and
// its answer comes back the same way. Each side says when it sleeps, so a
// side that is awake costs its peer no syscall; a side that sleeps waits
// with FUTEX_WAIT on the word it expects, at most shmCallNap at a time.
// Everything else (streams, cancel, goaway, shm_release) stays on the socket.

const (
	// slotIDBit marks the ids of slot calls: id = slotIDBit | k<<24 | seq
	// (24 bits). Socket calls' ids stay under it (register), so the two
	// never meet, and a late cancel for a slot's previous call names an id
	// no longer in flight.
	slotIDBit = 1 << 31
	// callerSpins is how often a caller looks for its answer (yielding in
	// between) before it sleeps (tools/shmprobe: 0 was 2.7x slower).
	callerSpins = 4
	// shmCallNap bounds one FUTEX_WAIT, so a sleeper notices the
	// connection's end and its ctx even if a wake is lost or withheld.
	shmCallNap = 10 * time.Millisecond
	// A poller (the server's on bell, the client's on cbell) whose last
	// idleNaps sleeps all ran out with nothing published sleeps up to
	// shmIdleNap at a time until something is (spec 10.8): an idle
	// connection, or one whose only calls are stream calls waiting for
	// items, then wakes 5 times a second, not 100. Each nap's return costs
	// more than its syscall: Go's sysmon, finding a P held in a syscall
	// past 10 ms, goes back to 20 µs ticks (about 2,000 nanosleeps a second
	// with a bidi call idle in a stream slot). Measured in one process,
	// client and server: an idle bidi call 6.4–10.5 % of a core → 0.8 %,
	// an idle connection 1.1–1.2 % → 0.1–0.2 %. Numbered sleeps lose no
	// honest wake, so only a peer that withholds wakes waits the longer nap.
	idleNaps   = 20
	shmIdleNap = 200 * time.Millisecond
	// slotRelBytes: each side pushes its queued shm_release frames once
	// they name this many bytes. Slot calls write nothing else on the
	// socket, so without it releases would wait for the timer (1 ms), the
	// allocator would spread over megabytes, and every copy would miss the
	// cache (64 KiB copies into the region ran 2.4x slower). 8 × 64 KiB:
	// one write per 8 such calls.
	slotRelBytes = 512 << 10
	// serverSpin is how long the server's poller keeps looking before it sleeps.
	serverSpin = 2 * time.Microsecond
	// pollerSpin is how long the client's poller (shm_calls_bell) keeps
	// looking, yielding to the callers it woke, before it sleeps on cbell.
	pollerSpin = 2 * time.Microsecond
	// loneSpin is how long a caller that is the connection's only slot
	// caller waiting keeps looking (yielding) before it sleeps: a lone
	// caller's answer often comes within it, saving the wake's syscall and
	// latency; with others waiting, a spinning caller would take the CPU
	// the server needs, so those look callerSpins times only.
	loneSpin = 20 * time.Microsecond
)

func slotID(k int, seq uint32) uint32 { return slotIDBit | uint32(k)<<24 | seq&0xFFFFFF }

// enableCalls moves the allocator and the tracker past each half's control
// block and the slots' payload areas (10.8): payload slots start at half +
// shm.CallsReserved, and a descriptor on the socket into an area fails the
// tracker's half check.
func (s *connShm) enableCalls(server bool, maxFrame uint32) {
	cl, sv := shm.Halves(s.region.Size())
	mine, theirs := cl, sv
	if server {
		mine, theirs = sv, cl
	}
	s.alloc = shm.NewAlloc(uint32(mine[0]+shm.CallsReserved), uint32(mine[1]-mine[0]-shm.CallsReserved))
	s.track = shm.NewTracker(theirs[0]+shm.CallsReserved, theirs[1], maxFrame)
}

func callViolation(format string, args ...any) *Error {
	return shmViolation(&shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf(format, args...)})
}

// ---- client ----

// clientCalls is a client connection's call slots.
type clientCalls struct {
	cc     *clientConn
	cs     *connShm
	calls  *shm.Calls
	closed atomic.Bool
	n      atomic.Uint64 // calls answered through a slot
	wait   atomic.Int32  // callers waiting for their answer
	naps   atomic.Uint64 // FUTEX_WAITs that slept their whole nap
	missed atomic.Uint64 // of which the answer was in: a wake that did not come
	spin   loneSpinner   // whether a lone caller spins (shmcalls_stats.go)

	avail atomic.Int32 // len(free), read without mu (keeps)
	// flight counts the slot calls between take and their caller's return:
	// they are not in cc.calls, and a draining connection closes only once
	// it is 0 too (clientConn.slotsIdle, land).
	flight atomic.Int32

	mu   sync.Mutex
	free []int // (mu) free slots, the last freed first
	gone []int // (mu) slots whose caller left before the answer: free once it is in (reapLocked)

	// Per slot, owned by whoever holds the slot: the req_seq last
	// published, the copy of the answer frame, the release buffer.
	seq  [shm.CallSlots]uint32
	fbuf [shm.CallSlots][shm.CallAreaSize]byte
	rel  [shm.CallSlots][shm.DescSize]byte

	// The client's bell (shm_calls_bell, spec 10.8), when bell: callers
	// park on their slot's channel and one poller goroutine per
	// connection sleeps on cbell and hands them their answers
	// (shmcalls_poller.go).
	bell   bool
	waits  [shm.CallSlots]slotWait
	pstate atomic.Int32  // pollNone, pollRun or pollIdle
	kick   chan struct{} // wakes an idle poller (buffered 1)
	sleeps uint32        // the poller's: its sleeps, the number it stores in csleeping
	handed atomic.Uint64 // answers the poller handed to parked callers
	// srvWoke is the server's sleep number (its sleeping word) a caller
	// last woke: with bell, callers wake each server sleep once.
	srvWoke atomic.Uint32
	// streams is the stream slots (shm_streams, spec 10.9;
	// shmstreams.go), nil when not in use.
	streams *clientStreams
}

func newClientCalls(cc *clientConn, bell, streams bool) *clientCalls {
	cc.shm.enableCalls(false, cc.maxFrame)
	x := &clientCalls{cc: cc, cs: cc.shm, calls: shm.NewCalls(cc.shm.region), bell: bell}
	if streams && bell {
		x.streams = newClientStreams(x)
	}
	for k := shm.CallSlots - 1; k >= 0; k-- {
		x.free = append(x.free, k)
	}
	x.avail.Store(shm.CallSlots)
	if bell {
		x.kick = make(chan struct{}, 1)
		for k := range x.waits {
			x.waits[k].ch = make(chan struct{}, 1)
		}
	}
	return x
}

// close wakes every caller sleeping on a slot: they see closed and fail.
// It runs before the region is closed (clientConn.close).
func (x *clientCalls) close() {
	x.closed.Store(true)
	if !x.cs.region.Acquire() {
		return
	}
	for k := range shm.CallSlots {
		shm.FutexWake(x.calls.AnsSeq(k), 1<<20)
	}
	shm.FutexWake(x.calls.CBell(), 1<<20) // the poller (it also sees cc.done when idle)
	x.cs.region.Release()
	if x.streams != nil {
		x.streams.close()
	}
}

// violate ends the connection for a server that broke 10.8.
func (x *clientCalls) violate(e *Error) *Error {
	x.cc.close(e)
	return e
}

// take returns a free slot; false when none is (the call goes on the socket).
func (x *clientCalls) take() (int, bool) {
	x.mu.Lock()
	if len(x.gone) > 0 {
		x.reapLocked()
	}
	n := len(x.free)
	if n == 0 {
		x.mu.Unlock()
		return -1, false
	}
	k := x.free[n-1]
	x.free = x.free[:n-1]
	x.avail.Store(int32(n - 1))
	x.mu.Unlock()
	return k, true
}

func (x *clientCalls) put(k int) {
	x.mu.Lock()
	x.free = append(x.free, k)
	x.avail.Store(int32(len(x.free)))
	x.mu.Unlock()
}

// keeps reports whether a unary call of n bytes should go to this
// connection (the pool's first) rather than be spread over the pool: its
// payload fits a slot's payload area and a slot is free. The connection's
// 32 slots and one server poller then serve every such caller: with 16
// callers × 64 KiB spread over 2 connections, each side ran 2 pollers'
// worth of sleeps and wakes for half the calls each (tools/benchshm
// rpc-shm-calls-inplace-view against its /sc1 row: 18.3 against 11.9 µs
// of CPU per call). x may be nil (no call slots).
func (x *clientCalls) keeps(n int) bool {
	return x != nil && n <= shm.PayloadAreaSize && x.avail.Load() > 0 && !x.closed.Load()
}

// reapLocked frees the slots of callers that left once their answers are
// in, releasing a descriptor an answer carries unread.
func (x *clientCalls) reapLocked() {
	if !x.cs.region.Acquire() {
		return
	}
	defer x.cs.region.Release()
	kept := x.gone[:0]
	for _, k := range x.gone {
		if x.calls.AnsSeq(k).Load() != x.seq[k] {
			kept = append(kept, k)
			continue
		}
		if _, _, e := x.answer(k, x.seq[k], nil, nil, false, false); e != nil && e.Code == ProtocolViolation {
			x.gone = kept
			x.avail.Store(int32(len(x.free)))
			return
		}
		x.free = append(x.free, k)
	}
	x.gone = kept
	x.avail.Store(int32(len(x.free)))
}

// pollerNap is how long a poller sleeps at most after quiet naps in a row
// that ran out with nothing published: shmCallNap, then shmIdleNap.
func pollerNap(quiet int) time.Duration {
	if quiet >= idleNaps {
		return shmIdleNap
	}
	return shmCallNap
}

// nap is how long a caller sleeps at most: shmCallNap, less when its ctx
// can end (so that it returns soon after).
func nap(ctx context.Context) time.Duration {
	if ctx.Done() == nil {
		return shmCallNap
	}
	d := time.Millisecond
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, max(time.Until(dl), 20*time.Microsecond))
	}
	return d
}

// unary makes a unary call through a slot. ok is false when it cannot (no
// free slot, a head too large for the area, a payload larger than the
// half): the caller uses the socket then.
func (x *clientCalls) unary(ctx context.Context, method string, req, dst []byte) (out []byte, e *Error, ok bool) {
	out, _, e, ok = x.call(ctx, method, req, dst, false)
	return out, e, ok
}

// call is unary, and with view CallRawView's: an answer in a payload slot
// is then held (tracked, a region reference taken) and returned in place,
// with held its slot (Len 0: none), for RawView.Release.
func (x *clientCalls) call(ctx context.Context, method string, req, dst []byte, view bool) (out []byte, held shm.Desc, e *Error, ok bool) {
	cc, cs, calls := x.cc, x.cs, x.calls
	if uint32(len(req)) > cc.maxFrame {
		return dst, shm.Desc{}, Errorf(ResourceExhausted, "request of %d bytes is over the connection's max frame %d", len(req), cc.maxFrame), true
	}
	hb := getBuf()
	defer putBuf(hb)
	head, e := slotHead(ctx, hb, method)
	if e != nil {
		return dst, shm.Desc{}, e, true
	}
	inRegion := cs.takes(len(req))
	if !inRegion && frame.HeaderSize+len(head)+len(req) > shm.CallAreaSize {
		if len(req) == 0 || uint64(len(req)) > cs.alloc.Cap() {
			return dst, shm.Desc{}, nil, false
		}
		inRegion = true
	}
	// A payload for the region that fits slot k's payload area goes there:
	// owned like the slot, it needs no allocation and no release.
	inArea := inRegion && len(req) <= shm.PayloadAreaSize
	plen := len(req)
	if inRegion {
		plen = shm.DescSize
	}
	if frame.HeaderSize+len(head)+plen > shm.CallAreaSize {
		return dst, shm.Desc{}, nil, false
	}
	aux, terr := timeoutMicros(ctx)
	if terr != nil {
		return dst, shm.Desc{}, terr, true
	}
	k, e, ok := x.claim()
	if !ok || e != nil {
		return dst, shm.Desc{}, e, ok
	}
	defer x.land()
	defer cs.region.Release()
	h := frame.Header{Type: frame.TypeRequest, Aux: aux, HeadLen: uint16(len(head)), PayloadLen: uint32(plen)}
	payload := req
	if inArea {
		copy(calls.ReqPayload(k), req)
		cs.areaOut(len(req))
		shm.Desc{Off: calls.PayloadOff(false, k), Len: uint32(len(req))}.Put(x.rel[k][:])
		payload, h.Flags = x.rel[k][:], shm.FlagShm
	} else if inRegion {
		cs.use(len(req))
		if err := cs.put(ctx, req, &x.rel[k]); err != nil {
			x.put(k)
			if ctx.Err() != nil {
				return dst, shm.Desc{}, ctxError(ctx), true
			}
			return dst, shm.Desc{}, &Error{Code: Unavailable, Message: "shared memory: " + err.Error(), cause: errors.Join(errConnLost, err)}, true
		}
		payload, h.Flags = x.rel[k][:], shm.FlagShm
	}
	x.seq[k]++
	s := x.seq[k]
	h.ID = slotID(k, s)
	a := calls.ReqArea(k)
	h.Put(a)
	n := frame.HeaderSize + copy(a[frame.HeaderSize:], head)
	n += copy(a[n:], payload)
	calls.ReqLen(k).Store(uint32(n))
	calls.ReqSeq(k).Store(s)
	x.ringServer()

	ans := calls.AnsSeq(k)
	got := false
	lone := x.wait.Add(1) == 1
	for range callerSpins {
		if ans.Load() == s {
			got = true
			break
		}
		runtime.Gosched()
	}
	if win := x.spinFor(lone, got); win > 0 {
		for t0 := time.Now(); time.Since(t0) < win && x.wait.Load() == 1; {
			if ans.Load() == s {
				got = true
				break
			}
			runtime.Gosched()
		}
		x.spun(got)
	}
	x.wait.Add(-1)
	// With the bell a caller parks for the poller, but the connection's
	// only slot call sleeps on its own ans_seq (the server wakes both,
	// spec 10.8): one wake-up instead of the poller's and then its hand-off.
	if !got && x.bell && x.flight.Load() > 1 {
		if e := x.await(ctx, k, s, h.ID); e != nil {
			return dst, shm.Desc{}, e, true
		}
		got = true
	}
	if !got {
		sleeping := calls.CallerSleeping(k)
		done := ctx.Done()
		for {
			sleeping.Store(1)
			timedOut, woken := false, false
			if v := ans.Load(); v != s {
				timedOut, woken = shm.FutexSleep(ans, v, nap(ctx))
			}
			sleeping.Store(0)
			v := ans.Load()
			if timedOut {
				x.naps.Add(1)
				if v == s {
					x.missed.Add(1)
				}
			}
			if v == s {
				break
			}
			if v != s-1 {
				return dst, shm.Desc{}, x.violate(callViolation("call slot %d's answer sequence jumped to %d (request %d)", k, v, s)), true
			}
			if x.closed.Load() {
				return dst, shm.Desc{}, cc.lostErr(), true // the slot went with the connection
			}
			if woken && x.cs.spuriousWake() { // woken with ans_seq unchanged (v == s-1)
				return dst, shm.Desc{}, x.violate(wakeFlood("a call-slot caller")), true
			}
			select {
			case <-done:
				e := ctxError(ctx)
				cc.cancelRemote(h.ID, e.Code)
				x.mu.Lock()
				x.gone = append(x.gone, k)
				x.mu.Unlock()
				return dst, shm.Desc{}, e, true
			default:
			}
		}
	}
	out, held, e = x.answer(k, s, dst[:0], responseMDSink(ctx), true, view)
	x.n.Add(1)
	x.cs.slotCalls.Add(1)
	if (e == nil || e.Code != ProtocolViolation) && x.calls.AreaSlot(true, held) < 0 {
		x.put(k) // (a view of slot k's payload area holds the slot until RawView.Release)
	}
	if e != nil {
		return dst, shm.Desc{}, e, true
	}
	return out, held, nil, true
}

// land ends a slot call's flight; the last one of a draining connection
// closes it, as the last answer on the socket does (closeIfDrainedLocked).
// (markDraining sets unusable, then reads flight; a caller adds to flight,
// then reads unusable: one of the two sees the other.)
func (x *clientCalls) land() {
	if x.flight.Add(-1) == 0 && x.cc.unusable.Load() {
		x.cc.mu.Lock()
		x.cc.closeIfDrainedLocked()
		x.cc.mu.Unlock()
	}
}

// answer reads slot k's answer to request s (copying the frame out first,
// checking it) and returns its payload appended to dst (read) or its error.
// A descriptor is released either way.
func (x *clientCalls) answer(k int, s uint32, dst []byte, sink *Metadata, read, view bool) ([]byte, shm.Desc, *Error) {
	n := x.calls.AnsLen(k).Load()
	f, err := shm.CopyFrame(&x.fbuf[k], x.calls.AnsArea(k), n, frame.HeaderSize)
	if err != nil {
		return dst, shm.Desc{}, x.violate(shmViolation(err))
	}
	h := frame.ParseHeader(f)
	if h.ID != slotID(k, s) || frame.HeaderSize+int(h.HeadLen)+int(h.PayloadLen) != len(f) {
		return dst, shm.Desc{}, x.violate(callViolation("call slot %d's answer frame (id %#x, head %d, payload %d) does not match its request %#x and length %d", k, h.ID, h.HeadLen, h.PayloadLen, slotID(k, s), n))
	}
	head := f[frame.HeaderSize : frame.HeaderSize+int(h.HeadLen)]
	payload := f[frame.HeaderSize+int(h.HeadLen):]
	switch h.Type {
	case frame.TypeResponse:
		sinkMD(sink, head)
		if h.Flags&shm.FlagShm == 0 {
			if read {
				dst = append(dst, payload...)
			}
			return dst, shm.Desc{}, nil
		}
		if len(payload) != shm.DescSize {
			return dst, shm.Desc{}, x.violate(callViolation("call slot %d's answer has a descriptor of %d bytes", k, len(payload)))
		}
		d, _ := shm.ParseDesc(payload)
		if inArea, err := x.calls.AreaDesc(true, k, d); err != nil {
			return dst, shm.Desc{}, x.violate(shmViolation(err))
		} else if inArea {
			x.cs.areaIn(int(d.Len))
			b := x.calls.AnsPayload(k)[:d.Len:d.Len]
			if view {
				if !x.cs.region.Acquire() {
					return dst, shm.Desc{}, x.cc.lostErr()
				}
				return b, d, nil
			}
			if read {
				dst = append(dst, b...)
			}
			return dst, shm.Desc{}, nil
		}
		if view {
			return x.hold(payload)
		}
		out, d, err := x.cs.take(payload, dst, read)
		if err != nil {
			return dst, shm.Desc{}, x.violate(shmViolation(err))
		}
		x.release(k, d)
		return out, shm.Desc{}, nil
	case frame.TypeError:
		return dst, shm.Desc{}, slotError(h, head, payload)
	}
	return dst, shm.Desc{}, x.violate(callViolation("call slot %d's answer is a %s frame", k, h.Type))
}

// claim takes a free slot for a call (a unary one, or a stream slot's),
// counted in flight (land) and with a region reference (the caller
// releases both). ok is false when there is no free slot or the
// connection is draining (the socket's way then, which refuses it as not
// sent); e is the connection's error (it is lost, or the peer published an
// answer in the free slot). Either way nothing is left taken.
func (x *clientCalls) claim() (k int, e *Error, ok bool) {
	k, ok = x.take()
	if !ok {
		return 0, nil, false
	}
	x.flight.Add(1)
	if x.cc.unusable.Load() { // draining (goaway) or closed
		x.put(k)
		x.land()
		return 0, nil, false
	}
	if !x.cs.region.Acquire() {
		x.put(k)
		x.land()
		return 0, x.cc.lostErr(), true
	}
	if a := x.calls.AnsSeq(k).Load(); a != x.seq[k] {
		e = x.violate(callViolation("an answer (sequence %d) in call slot %d, which has no request", a, k))
		x.cs.region.Release()
		x.land()
		return 0, e, true
	}
	return k, nil, true
}

// slotHead is a slot request's head: method and ctx's metadata, in *hb.
func slotHead(ctx context.Context, hb *[]byte, method string) ([]byte, *Error) {
	head := frame.AppendRequestHead((*hb)[:0], method)
	if md := outgoingMD(ctx); md != nil {
		var e *Error
		if head, e = appendMD(head, md); e != nil {
			return nil, e
		}
	}
	*hb = head
	return head, nil
}

// sinkMD hands an answer's response metadata (its head) to the caller's
// sink, if it asked for it.
func sinkMD(sink *Metadata, head []byte) {
	if sink != nil {
		var md Metadata
		if frame.HasAppMetadata(head) {
			md = parseMD(head)
		}
		*sink = md
	}
}

// slotError is the *Error of an error frame read from a slot.
func slotError(h frame.Header, head, payload []byte) *Error {
	code := Code(h.Aux)
	if code == OK {
		code = Unknown
	}
	return &Error{Code: code, Message: string(head), Details: append([]byte(nil), payload...), Refused: h.Flags&frame.FlagRefused != 0}
}

// unview ends a RawView of slot k's payload area: the slot is free again.
func (x *clientCalls) unview(k int) {
	x.cs.region.Release()
	x.put(k)
}

// hold checks an answer's descriptor for CallRawView and holds its slot
// (tracked, a region reference taken) until RawView.Release.
func (x *clientCalls) hold(desc []byte) ([]byte, shm.Desc, *Error) {
	d, err := shm.ParseDesc(desc)
	if err == nil {
		err = x.cs.track.Accept(d)
	}
	if err != nil {
		return nil, shm.Desc{}, x.violate(shmViolation(err))
	}
	if !x.cs.region.Acquire() {
		x.cs.track.Drop(d)
		return nil, shm.Desc{}, x.cc.lostErr()
	}
	x.cs.recv.Add(1)
	return x.cs.region.Bytes(d), d, nil
}

// release queues the release of an answer's slot of the server's half: it
// goes out with the connection's next write, at the latest releaseDelay
// later, or at once when slotRelBytes wait.
func (x *clientCalls) release(k int, d shm.Desc) {
	cs := x.cs
	queueRelease(x.cc.w, d, &x.rel[k])
	if cs.relBytes.Add(uint64(d.Len)) >= slotRelBytes {
		cs.relBytes.Store(0)
		x.cc.w.Push()
		return
	}
	if !cs.relArmed.Swap(true) {
		cs.relTimer.Reset(releaseDelay)
	}
}

// slotCallCount is how many calls of c went through call slots (tests).
func (c *Client) slotCallCount() uint64 {
	var n uint64
	c.mu.Lock()
	defer c.mu.Unlock()
	for cc := range c.live {
		if cc.slotCalls != nil {
			n += cc.slotCalls.n.Load()
		}
	}
	return n
}

// slotNaps is how many FUTEX_WAITs of c's slot callers slept their whole
// nap, and of those how many found their answer in (benchmarks).
func (c *Client) slotNaps() (naps, missed uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cc := range c.live {
		if x := cc.slotCalls; x != nil {
			naps += x.naps.Load()
			missed += x.missed.Load()
		}
	}
	return naps, missed
}

// ---- server ----

// serverCalls is a server connection's call slots: one poller goroutine
// takes the requests, handlers answer into the slots.
type serverCalls struct {
	c       *serverConn
	cs      *connShm
	calls   *shm.Calls
	closed  atomic.Bool
	done    chan struct{} // closed when the poller has ended
	started atomic.Bool   // the poller was started (done will close)

	busy [shm.CallSlots]atomic.Bool // a request taken, its answer not yet published
	bell bool                       // shm_calls_bell: answers bump cbell and wake each client poller's sleep once
	// cliWoke is the client poller's sleep number (csleeping) an answer
	// last woke (bell).
	cliWoke atomic.Uint32

	// The poller's own: the req_seq last taken per slot, the copy of a
	// request frame, the release buffer, releases queued since the last push.
	last     [shm.CallSlots]uint32
	fbuf     [shm.CallAreaSize]byte
	rel      [shm.DescSize]byte
	relN     int
	relBytes int
	relSince time.Time
	dst      []byte
	hcs      []handlerCtx // the poller's batch of handler contexts (handlerCtxFrom)
	sleeps   uint32       // with bell: the number of the poller's last sleep (its sleeping word), never 0 once it slept

	// The poller's inline run, watched by the server's inline watchdog as
	// serverConn.inline is (inline.go: runInline, handOffPolling).
	inline    atomic.Uint32           // inlineIdle, inlineHandedOff or run<<2|inlineRunning
	inlineSeq atomic.Uint32           // counts inline runs on the poller
	inlineH   atomic.Pointer[handler] // the handler of the latest one
	watchSeen uint32                  // watchdog only: inlineSeq running at the last tick
	watchRun  bool                    // watchdog only: it was running then
	watchLast uint32                  // watchdog only: inlineSeq at the last tick

	// streams is the stream slots (shm_streams, spec 10.9;
	// shmstreams.go), nil when not in use.
	streams *serverStreams
}

func newServerCalls(c *serverConn, cs *connShm, bell, streams bool) *serverCalls {
	cs.enableCalls(true, c.maxFrame)
	x := &serverCalls{c: c, cs: cs, calls: shm.NewCalls(cs.region), done: make(chan struct{}), bell: bell}
	if streams && bell {
		x.streams = newServerStreams(x)
	}
	return x
}

// close stops the poller (waking it); it runs before the region is closed.
func (x *serverCalls) close() {
	x.closed.Store(true)
	if x.streams != nil {
		x.streams.close()
	}
	if x.cs.region.Acquire() {
		shm.FutexWake(x.calls.Bell(), 1)
		x.cs.region.Release()
	}
}

// pending reports whether a slot has a request not yet taken.
func (x *serverCalls) pending() bool {
	y := x.streams
	for k := range shm.CallSlots {
		if y != nil {
			if y.senders(k, false) {
				return true
			}
			if ss := y.ss[k].Load(); ss != nil { // (x.last[k] is taking's holder's)
				if x.calls.ReqSeq(k).Load() != ss.seen() && !ss.held.Load() {
					return true
				}
				continue
			}
		}
		if x.calls.ReqSeq(k).Load() != x.last[k] {
			return true
		}
	}
	return y != nil && y.kicked.Load()
}

// poll is the poller: it scans the slots for new requests, keeps looking
// for serverSpin when there are none, then says it sleeps and waits on the
// bell (at most shmCallNap).
//
// Several goroutines may run poll in turn, never two at once on the
// poller's state: the watchdog starts a new one when a handler run inline
// blocks (handOffPolling); the old one ends when that run returns, without
// touching the poller's state again, and counts in c.workers until then.
// done closes when the last one ends.
func (x *serverCalls) poll() {
	handedOff := false
	defer func() {
		if handedOff {
			x.c.w.Push() // releases its run queued, should the new poller be asleep
			x.c.workers.Done()
		} else {
			close(x.done)
		}
	}()
	if !x.cs.region.Acquire() {
		return
	}
	defer x.cs.region.Release()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	bell, sleeping := x.calls.Bell(), x.calls.ServerSleeping()
	var idleSince time.Time
	quiet := 0 // naps in a row that ran out with nothing published (pollerNap)
	for !x.closed.Load() {
		did := false
		y := x.streams
		if y != nil {
			y.kicked.Store(false)
		}
		for k := range shm.CallSlots {
			if y != nil {
				if y.senders(k, true) {
					did = true
				}
				if ss := y.ss[k].Load(); ss != nil {
					// The slot's last call was a stream (shmstreams.go);
					// x.last[k] is taking's holder's.
					if !ss.taking.CompareAndSwap(false, true) {
						continue // its handler's recv takes
					}
					s, handled := x.calls.ReqSeq(k).Load(), true
					var err error
					if s != x.last[k] {
						handled, err = y.take(k, s, ss)
						did = did || x.last[k] == s
					}
					ss.taking.Store(false)
					if err != nil {
						x.c.connError(ProtocolViolation, err)
						return
					}
					if handled {
						continue
					}
				}
			}
			s := x.calls.ReqSeq(k).Load()
			if s == x.last[k] {
				continue
			}
			if err := x.take(k, s); err == errHandedOff {
				handedOff = true
				return
			} else if err != nil {
				x.c.connError(ProtocolViolation, err)
				return
			}
			did = true
		}
		if x.c.shmQueued.Load() { // in-place releases queued by run (shmEndCall)
			x.c.shmQueued.Store(false)
			if x.relN == 0 {
				x.relSince = time.Now()
			}
			x.relN++
		}
		if x.relN > 0 && (!did || x.relBytes >= slotRelBytes || x.relN >= 8 || time.Since(x.relSince) > releaseDelay) {
			x.relN, x.relBytes = 0, 0
			x.c.w.Push()
		}
		if did {
			x.c.slotTurns.Add(1) // activity for IdleTimeout (timeouts.go)
			idleSince = time.Time{}
			quiet = 0
			continue
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
			continue
		}
		if time.Since(idleSince) < serverSpin {
			continue
		}
		b := bell.Load()
		n := uint32(1)
		if x.bell {
			n = nextSleep(&x.sleeps)
		}
		sleeping.Store(n)
		woken := false
		if !x.pending() && !x.closed.Load() {
			_, woken = shm.FutexSleep(bell, b, pollerNap(quiet))
		}
		sleeping.Store(0)
		if woken { // (a timeout or an interrupted sleep counts as quiet; what it finds resets it above)
			quiet = 0
		} else {
			quiet++
		}
		if x.pollerWoke(woken, b) {
			return
		}
		idleSince = time.Time{}
	}
}

// take reads the request published in slot k (sequence s) and starts its
// call; an error is the connection's protocol violation.
func (x *serverCalls) take(k int, s uint32) error {
	c := x.c
	if s != x.last[k]+1 {
		return &shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf("call slot %d's request sequence jumped from %d to %d", k, x.last[k], s)}
	}
	if x.busy[k].Load() {
		return &shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf("a request in call slot %d before the answer to the last one", k)}
	}
	x.last[k] = s
	f, err := shm.CopyFrame(&x.fbuf, x.calls.ReqArea(k), x.calls.ReqLen(k).Load(), frame.HeaderSize)
	if err != nil {
		return err
	}
	h, head, payload, err := parseSlotRequest(f, c.maxFrame, x.streams != nil)
	if err != nil {
		return err
	}
	var area []byte // the request's payload in slot k's payload area
	if h.Flags&shm.FlagShm != 0 {
		d, _ := shm.ParseDesc(payload)
		in, err := x.calls.AreaDesc(false, k, d)
		if err != nil {
			return err
		}
		if in {
			x.cs.areaIn(int(d.Len))
			area = x.calls.ReqPayload(k)[:d.Len:d.Len]
		}
	}
	method, md, err := frame.ParseRequestHead(head)
	if err != nil {
		return err
	}
	hd := c.s.lookup(method)
	c.mu.Lock()
	draining, closed := c.draining, c.closed
	_, dup := c.calls[h.ID]
	n := uint32(len(c.calls))
	c.mu.Unlock()
	if closed {
		return nil
	}
	if dup {
		return &shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf("request id %#x is already in flight", h.ID)}
	}
	x.busy[k].Store(true)
	call := callPool.Get().(*srvCall)
	call.id, call.h, call.ndjson, call.slot, call.sseq = h.ID, hd, false, int32(k+1), s
	var refuse *Error
	switch {
	case n >= c.maxInFlight:
		refuse = Errorf(ResourceExhausted, "more than %d calls in flight on one connection", c.maxInFlight)
	case draining && (hd == nil || !hd.std):
		refuse = &Error{Code: Unavailable, Message: "server is shutting down; call not processed", Refused: true}
	case hd == nil:
		refuse = Errorf(Unimplemented, "unknown method %q", method)
	case hd.unary == nil || h.Flags&frame.FlagClientStream != 0:
		refuse = kindMismatch(string(method), hd, h.Flags)
	}
	if h.Flags&frame.FlagClientStream != 0 {
		return x.openStream(k, s, call, h, method, md, refuse)
	}
	if x.streams != nil {
		x.calls.ReqTaken(k).Store(s) // (spec 10.9: for every frame taken)
	}
	if refuse != nil {
		c.refused(string(method), h.Flags, false, refusalOf(hd, refuse), refuse.Code)
		if h.Flags&shm.FlagShm != 0 && area == nil {
			if _, err := x.takePayload(payload, nil, false); err != nil {
				putSrvCall(call)
				return err
			}
		}
		x.answer(call, nil, nil, refuse)
		putSrvCall(call)
		return nil
	}
	size := int64(len(payload))
	if h.Flags&shm.FlagShm != 0 {
		size = int64(shmLen(payload))
	}
	c.acquireSlot(size)                     // (not acquire: its flags say the reader waits)
	hc := c.handlerCtxFrom(&x.hcs, hd.name) // (not c.hcs: the socket reader takes from that at the same time)
	if frame.HasAppMetadata(md) {
		hc.mdRaw = append([]byte(nil), md...)
	}
	call.ctx, call.held = hc, size
	switch {
	case area != nil && c.s.opts.ShmInPlace:
		// The handler reads slot k's area in place (the slot is ours until
		// we answer) and may build its answer in our area (dst).
		call.req, err = c.shmAreaInPlace(call, area, x.calls.AnsPayload(k))
	case area != nil:
		call.req = append(call.req[:0], area...)
	case h.Flags&shm.FlagShm != 0 && c.s.opts.ShmInPlace:
		// The handler reads the client's slot in place; run releases it
		// when the handler returns (shmEndCall), queued for the poller to push.
		call.req, err = c.shmRequestInPlace(payload, call)
	case h.Flags&shm.FlagShm != 0:
		call.req, err = x.takePayload(payload, call.req[:0], true)
	default:
		call.req = append(call.req[:0], payload...)
	}
	if err != nil {
		c.release(call.held)
		putSrvCall(call)
		return err
	}
	c.register(h.ID, hc, call, h.Aux)
	if hd.quick() {
		if !x.runInline(call) {
			return errHandedOff // a new poller took over while the handler ran
		}
	} else {
		c.dispatch(call)
	}
	return nil
}

// takePayload copies a request's payload out of the region (appending to
// dst when read) and queues its release, pushed by the poller.
func (x *serverCalls) takePayload(desc, dst []byte, read bool) ([]byte, error) {
	out, d, err := x.cs.take(desc, dst, read)
	if err != nil {
		return dst, err
	}
	queueRelease(x.c.w, d, &x.rel)
	if x.relN == 0 {
		x.relSince = time.Now()
	}
	x.relN++
	x.relBytes += int(d.Len)
	return out, nil
}

// parseSlotRequest checks a request frame copied out of a call slot: a
// request (flags: only shm), lengths that add up to the frame, within the
// caps, a descriptor of exactly 8 bytes.
func parseSlotRequest(f []byte, maxFrame uint32, streams bool) (h frame.Header, head, payload []byte, err error) {
	h = frame.ParseHeader(f)
	cstream := streams && (h.Flags == frame.FlagClientStream || h.Flags == frame.FlagClientStream|frame.FlagStream)
	if h.Type != frame.TypeRequest || h.Flags&^shm.FlagShm != 0 && !cstream {
		return h, nil, nil, &shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf("a %s frame with flags %#x in a call slot, want a unary request", h.Type, h.Flags)}
	}
	if cstream && h.PayloadLen != 0 {
		return h, nil, nil, &shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf("a client-stream request in a call slot carries a %d-byte payload; it must be empty", h.PayloadLen)}
	}
	if frame.HeaderSize+int(h.HeadLen)+int(h.PayloadLen) != len(f) {
		return h, nil, nil, &shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf("a call slot's frame of %d bytes says head %d, payload %d", len(f), h.HeadLen, h.PayloadLen)}
	}
	if err := h.Check(maxFrame); err != nil {
		return h, nil, nil, err
	}
	if h.Flags&shm.FlagShm != 0 && h.PayloadLen != shm.DescSize {
		return h, nil, nil, &shm.Error{Name: shm.NameBadDesc, Detail: fmt.Sprintf("descriptor payload of %d bytes, want %d", h.PayloadLen, shm.DescSize)}
	}
	head = f[frame.HeaderSize : frame.HeaderSize+int(h.HeadLen)]
	return h, head, f[frame.HeaderSize+int(h.HeadLen):], nil
}

// answerSlot is run's answer for a call taken from a slot: every such call
// is answered (an error if canceled) so that the slot frees.
func (c *serverConn) answerSlot(call *srvCall, out []byte, err error) {
	hc := call.ctx
	if err == nil && hc.canceled() {
		err = hc.Err()
	}
	var e *Error
	if err != nil {
		e = toError(err)
	}
	c.slotCalls.answer(call, hc, out, e)
}

// answer writes call's answer (out, or e) into its slot and publishes it,
// waking the caller only if it sleeps. A payload that does not fit the
// area goes in the region (waiting for space within hc); a head that does
// not fit becomes an error that does.
func (x *serverCalls) answer(call *srvCall, hc *handlerCtx, out []byte, e *Error) {
	k := int(call.slot - 1)
	cs := x.cs
	if !cs.region.Acquire() {
		return // the connection ended
	}
	defer cs.region.Release()
	var ss *srvStream // a stream slot's call (shmstreams.go)
	if y := x.streams; y != nil {
		if ss = y.ss[k].Load(); ss != nil && ss.id != call.id {
			ss = nil
		}
		if ss != nil && ss.awaitTaken(call, nil) != nil {
			return // the connection ended
		}
	}
	a := x.calls.AnsArea(k)
	var n int
	if e == nil && ss != nil && !ss.single { // a bidi call ends with stream_end
		var head []byte
		if hc != nil {
			head = hc.responseHead()
		}
		if frame.HeaderSize+len(head) > shm.CallAreaSize {
			e = Errorf(Internal, "response metadata of %d bytes does not fit a call slot (%d bytes)", len(head), shm.CallAreaSize)
		} else {
			h := frame.Header{Type: frame.TypeStreamEnd, ID: call.id, HeadLen: uint16(len(head))}
			h.Put(a)
			n = frame.HeaderSize + copy(a[frame.HeaderSize:], head)
		}
	} else if e == nil {
		var head []byte
		if hc != nil {
			head = hc.responseHead()
		}
		h := frame.Header{Type: frame.TypeResponse, ID: call.id, HeadLen: uint16(len(head))}
		payload := out
		fits := frame.HeaderSize+len(head)+len(out) <= shm.CallAreaSize
		switch {
		case uint32(len(out)) > x.c.maxFrame:
			e = Errorf(ResourceExhausted, "response of %d bytes is over the max frame %d", len(out), x.c.maxFrame)
		case frame.HeaderSize+len(head)+shm.DescSize > shm.CallAreaSize:
			e = Errorf(Internal, "response metadata of %d bytes does not fit a call slot (%d bytes)", len(head), shm.CallAreaSize)
		case call.inPl.out && x.c.shmOutInPlace(call, out, &h):
			payload = call.desc[:] // the handler wrote its answer in its dst slot: no copy
		case len(out) > 0 && len(out) <= shm.PayloadAreaSize && (!fits || cs.takes(len(out))):
			// Slot k's payload area: ours until ans_seq, no release.
			x.c.shmDstDone(call, out)
			if ap := x.calls.AnsPayload(k); unsafe.SliceData(out) != unsafe.SliceData(ap) {
				copy(ap, out)
			}
			shm.Desc{Off: x.calls.PayloadOff(true, k), Len: uint32(len(out))}.Put(call.desc[:])
			cs.areaOut(len(out))
			payload, h.Flags = call.desc[:], shm.FlagShm
		case len(out) > 0 && (!fits || cs.takes(len(out))):
			// (A dst slot the answer does not use is freed first; one the
			// answer lies in, not at its start, is copied from and freed by
			// shmEndCall after.)
			x.c.shmDstDone(call, out)
			if uint64(len(out)) > cs.alloc.Cap() {
				e = Errorf(ResourceExhausted, "response of %d bytes is larger than the shared region's half", len(out))
				break
			}
			cs.use(len(out))
			ctx := context.Context(hc)
			if hc == nil {
				ctx = context.Background()
			}
			if err := cs.put(ctx, out, &call.desc); err != nil {
				e = toError(err)
				if hc != nil && hc.Err() != nil {
					e = &Error{Code: CodeOf(hc.Err()), Message: hc.Err().Error()}
				}
				break
			}
			payload, h.Flags = call.desc[:], shm.FlagShm
		}
		if e == nil {
			h.PayloadLen = uint32(len(payload))
			h.Put(a)
			n = frame.HeaderSize + copy(a[frame.HeaderSize:], head)
			n += copy(a[n:], payload)
		}
	}
	if e != nil {
		h := frame.Header{Type: frame.TypeError, ID: call.id, Aux: uint32(e.Code)}
		if e.Code == OK {
			h.Aux = uint32(Unknown)
		}
		if e.Refused {
			h.Flags |= frame.FlagRefused
		}
		room := shm.CallAreaSize - frame.HeaderSize
		msg := e.Message[:min(len(e.Message), room)]
		details := e.Details
		if len(msg)+len(details) > room {
			details = nil
		}
		h.HeadLen, h.PayloadLen = uint16(len(msg)), uint32(len(details))
		h.Put(a)
		n = frame.HeaderSize + copy(a[frame.HeaderSize:], msg)
		n += copy(a[n:], details)
	}
	x.busy[k].Store(false)
	if ss == nil {
		cs.slotCalls.Add(1) // (SlotCalls counts unary calls, spec 9.3)
	}
	ans := x.calls.AnsSeq(k)
	if ss != nil {
		// ans_seq = the req_seq last taken, under mu: a frame the poller
		// takes after this is dropped and moves ans_seq on (shmstreams.go).
		ss.mu.Lock()
		x.calls.AnsLen(k).Store(uint32(n))
		ans.Store(ss.last)
		ss.ended = true
		ss.mu.Unlock()
		if ss.in != nil {
			x.streams.n.Add(-1)
		}
	} else {
		x.calls.AnsLen(k).Store(uint32(n))
		ans.Store(call.sseq)
	}
	if x.bell { // the client's poller waits for every slot's answer on cbell
		if x.c.s.opts.withholdCBell {
			return
		}
		x.ringClient()
	}
	if x.calls.CallerSleeping(k).Load() != 0 {
		shm.FutexWake(ans, 1)
	}
}

// nextSleep advances *n, a sleeper's count of its sleeps (shm_calls_bell),
// to the number its next sleep stores in its sleeping word: never 0, which
// means "awake" (spec 10.8).
func nextSleep(n *uint32) uint32 {
	if *n++; *n == 0 {
		*n = 1
	}
	return *n
}
