package rpc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// Stream slots (protocol/spec.md 10.9, hello flag bit 5 shm_streams): on a
// connection whose call slots and client's bell are in use and whose
// hellos both set shm_streams, a client-streaming or bidirectional call
// may live in a call slot instead of on the socket. Each direction is a
// one-frame mailbox in its own half: the client publishes its frames with
// req_seq (and bell), the server its stream_data with str_seq (and cbell);
// each side stores its "taken" word (req_taken, str_taken) once it has
// copied the peer's frame out, and a sender publishes its next frame only
// after the peer took the last one. The call's final frame (stream_end,
// response or error) is the slot's answer as in 10.8 (ans_seq), published
// only once the client took the last stream_data.
//
// Who writes what (besides 10.8's words):
//
//   - the client's Send (one at a time, sendSide.mu) writes slot k's client
//     area, req_len, req_seq and cwant; the client's poller (one per
//     connection) writes str_taken and hands items to Recv;
//   - the server's poller writes req_taken (for every frame it takes from a
//     slot, a unary request too) and hands items to the handler's recv; the
//     handler's send writes slot k's server area, str_len, str_seq and
//     swant; the answer writes the final frame and ans_seq.
//
// Lock invariants. cliStream.mu orders a Send's publication against the
// poller's reading of the final frame: once ended is set (under mu) nothing
// more is published, and the poller knows the last req_seq. srvStream.mu
// orders the server poller's take of a frame against the answer: the answer
// publishes ans_seq = last (under mu) and sets ended; a frame the poller
// takes after that (one the client published racing with the end) is
// dropped and acknowledged by ans_seq = its req_seq, so that the slot
// returns to the client with ans_seq = req_seq as in 10.8.
//
// Flow control: a receiver takes a frame only while its per-call queue
// holds under 1 MiB (the credit of 4.1 and 4.3); otherwise the frame waits
// in the mailbox (held) and so does its sender: only that call stalls.
// Recv's and recv's grants nudge the poller that held a frame.

// ---- client ----

// streamSlotCalls counts the calls opened in stream slots, lateFrames the
// client frames servers dropped because they raced with their call's end
// (tests).
var streamSlotCalls, lateFrames atomic.Uint64

// clientStreams is a client connection's stream slots (x.streams).
type clientStreams struct {
	x     *clientCalls
	ss    [shm.CallSlots]atomic.Pointer[cliStream]
	n     atomic.Int32                 // stream slots in use: the poller runs while > 0
	kick  atomic.Bool                  // a queue has room again (grant): not a spurious wake
	taken [shm.CallSlots]atomic.Uint32 // the str_seq last taken per slot (written by taking's holder)
}

// cliStream is a stream call in call slot k (the client's side).
type cliStream struct {
	y    *clientStreams
	k    int
	id   uint32
	st   *ClientStream
	ctx  context.Context
	base uint32 // ans_seq when the call opened (its request's req_seq - 1)

	mu    sync.Mutex
	ended bool   // (mu) the final frame is in: nothing more is published
	last  uint32 // (mu) the req_seq last published

	gone atomic.Bool // the caller left: the poller drops the items
	// cancel is the reason of a cancel the caller left with before the
	// server took the opening request (0: none): a cancel on the socket
	// could overtake it and be ignored, so the poller sends it once
	// req_taken moved (turn).
	cancel atomic.Uint32
	want   atomic.Uint32 // the req_seq a Send waits to see taken (0: none)
	wake   chan struct{} // (buffered 1) the poller: req_taken reached want
	held   atomic.Bool   // a stream_data frame waits for room in the queue

	// taking is the right to take the server's frames of slot k: the
	// poller and the call's own Recv (which takes its items itself while
	// it looks, saving the poller's hand-off) CompareAndSwap it 0 to 1.
	// fbuf and y.taken[k] are its holder's.
	taking  atomic.Bool
	final   atomic.Bool // the final frame was read; the slot frees once ans_seq == finLast
	finLast uint32      // the last req_seq, set before final
	fbuf    [shm.CallAreaSize]byte
	desc    [shm.DescSize]byte // Send's descriptor
}

func newClientStreams(x *clientCalls) *clientStreams { return &clientStreams{x: x} }

// ringServer adds 1 to bell and wakes the server's poller when it sleeps
// (once per numbered sleep with the bell, spec 10.8).
func (x *clientCalls) ringServer() {
	bell := x.calls.Bell()
	bell.Add(1)
	x.wakeServer()
}

// ringLooked is ringServer for a frame of stream slot k: no wake while the
// slot's handler looks at the slot itself (slook, spec 10.9), as it takes
// the frame; it stores slook = 0 before its last look, so none is lost.
func (x *clientCalls) ringLooked(k int) {
	x.calls.Bell().Add(1)
	if x.calls.SLook(k).Load() == 0 {
		x.wakeServer()
	}
}

// wakeServer wakes the server's poller when it sleeps (once per numbered
// sleep with the bell, spec 10.8).
func (x *clientCalls) wakeServer() {
	bell := x.calls.Bell()
	if v := x.calls.ServerSleeping().Load(); v != 0 && (!x.bell || x.srvWoke.Swap(v) != v) {
		shm.FutexWake(bell, 1)
	}
}

// open opens a client-stream call (flags 0x02 or 0x03) in a free slot; ok
// is false when it cannot (no free slot, a head too large): the socket then.
func (y *clientStreams) open(ctx context.Context, cc *clientConn, method string, flags uint8) (_ *ClientStream, _ *Error, ok bool) {
	x := y.x
	hb := getBuf()
	defer putBuf(hb)
	head := frame.AppendRequestHead((*hb)[:0], method)
	if md := outgoingMD(ctx); md != nil {
		var e *Error
		if head, e = appendMD(head, md); e != nil {
			return nil, e, true
		}
	}
	*hb = head
	if frame.HeaderSize+len(head) > shm.CallAreaSize {
		return nil, nil, false
	}
	aux, terr := timeoutMicros(ctx)
	if terr != nil {
		return nil, terr, true
	}
	k, ok := x.take()
	if !ok {
		return nil, nil, false
	}
	x.flight.Add(1)
	if cc.unusable.Load() {
		x.put(k)
		x.land()
		return nil, nil, false
	}
	if !x.cs.region.Acquire() {
		x.put(k)
		x.land()
		return nil, cc.lostErr(), true
	}
	defer x.cs.region.Release()
	calls := x.calls
	if a := calls.AnsSeq(k).Load(); a != x.seq[k] {
		return nil, x.violate(callViolation("an answer (sequence %d) in call slot %d, which has no request", a, k)), true
	}
	x.seq[k]++
	s := x.seq[k]
	id := slotID(k, s)
	st := &ClientStream{cc: cc, codec: Raw, arrived: make(chan struct{}, 1), ended: make(chan struct{}),
		tx: &sendSide{wake: make(chan struct{}, 1), single: flags&frame.FlagStream == 0}}
	st.cl = &call{id: id, done: make(chan struct{}, 1), lead: st.arrived, stream: st, mdSink: responseMDSink(ctx)}
	ss := &cliStream{y: y, k: k, id: id, st: st, ctx: ctx, base: s - 1, last: s, wake: make(chan struct{}, 1)}
	st.slot = ss
	y.ss[k].Store(ss)
	y.n.Add(1)
	streamSlotCalls.Add(1)
	h := frame.Header{Type: frame.TypeRequest, Flags: flags, ID: id, Aux: aux, HeadLen: uint16(len(head))}
	a := calls.ReqArea(k)
	h.Put(a)
	n := frame.HeaderSize + copy(a[frame.HeaderSize:], head)
	calls.ReqLen(k).Store(uint32(n))
	calls.ReqSeq(k).Store(s)
	x.ringServer()
	x.wakePoller()
	st.stop = context.AfterFunc(ctx, func() { st.abort(ctxError(ctx)) })
	return st, nil, true
}

// send publishes a request_data (item) or request_end frame once the
// server took the last one (Send and CloseSend, one at a time).
func (ss *cliStream) send(typ frame.Type, item []byte) error {
	st, x, k := ss.st, ss.y.x, ss.k
	cs, calls := x.cs, x.calls
	if !cs.region.Acquire() {
		return x.cc.lostErr()
	}
	defer cs.region.Release()
	ss.mu.Lock()
	s := ss.last
	ss.mu.Unlock()
	if err := ss.awaitTaken(s); err != nil {
		return err
	}
	h := frame.Header{Type: typ, ID: ss.id}
	payload := item
	inRegion := typ == frame.TypeRequestData && len(item) > 0 && (cs.takes(len(item)) || frame.HeaderSize+len(item) > shm.CallAreaSize)
	regionSlot := inRegion && len(item) > shm.PayloadAreaSize
	if regionSlot {
		if uint64(len(item)) > cs.alloc.Cap() {
			return Errorf(ResourceExhausted, "request item of %d bytes is larger than the shared region's half", len(item))
		}
		cs.use(len(item))
		if err := cs.put(ss.ctx, item, &ss.desc); err != nil {
			if ss.ctx.Err() != nil {
				return ctxError(ss.ctx)
			}
			return &Error{Code: Unavailable, Message: "shared memory: " + err.Error(), cause: err}
		}
		payload, h.Flags = ss.desc[:], shm.FlagShm
	}
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		if regionSlot {
			d, _ := shm.ParseDesc(ss.desc[:])
			cs.alloc.Put(d) // never handed over
		}
		<-st.ended
		return st.endErr()
	}
	if inRegion && !regionSlot {
		copy(calls.ReqPayload(k), item)
		cs.areaOut(len(item))
		shm.Desc{Off: calls.PayloadOff(false, k), Len: uint32(len(item))}.Put(ss.desc[:])
		payload, h.Flags = ss.desc[:], shm.FlagShm
	}
	h.PayloadLen = uint32(len(payload))
	a := calls.ReqArea(k)
	h.Put(a)
	n := frame.HeaderSize + copy(a[frame.HeaderSize:], payload)
	calls.ReqLen(k).Store(uint32(n))
	ss.last = s + 1
	calls.ReqSeq(k).Store(s + 1)
	ss.mu.Unlock()
	x.ringLooked(k)
	return nil
}

// awaitTaken waits until the server took the client's frame s (req_taken),
// the call ends or the connection does.
func (ss *cliStream) awaitTaken(s uint32) error {
	x := ss.y.x
	over := func() bool {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		return ss.ended
	}
	err := awaitTake(ss.k, x.calls.ReqTaken(ss.k), s, &ss.want, x.calls.CWant(ss.k), over, func() error {
		x.wakePoller()
		select {
		case <-ss.wake:
			return nil
		case <-ss.st.ended:
			return ss.st.endErr()
		case <-x.cc.done:
			return x.cc.lostErr()
		}
	})
	if se, ok := err.(*shm.Error); ok {
		return x.violate(shmViolation(se))
	}
	if err == errCallOver {
		<-ss.st.ended
		return ss.st.endErr()
	}
	return err
}

// errCallOver ends a sender's wait whose call ended meanwhile (awaitTake).
var errCallOver = errors.New("rpc: the stream slot's call is over")

// awaitTake is a sender's wait until its peer took frame want (taken,
// spec 10.9): callerSpins looks, then it stores want in its own word
// (mine, which its taker's wake-up reads) and the peer's (theirs, which
// makes the peer ring its bell when it takes), re-reads taken, and only
// then parks (park: nil to look again, else the wait's end).
//
// A taken word other than want or want-1 is the peer's violation, unless
// over says the call is over: its slot may then serve another call already
// (the client's Send that read its sequence before the final frame came),
// and the wait ends with errCallOver.
func awaitTake(slot int, taken *atomic.Uint32, want uint32, mine, theirs *atomic.Uint32, over func() bool, park func() error) error {
	for i := 0; ; i++ {
		switch v := taken.Load(); v {
		case want:
			return nil
		case want - 1:
		default: // the peer took a frame that was never published, or skipped one
			if over != nil && over() {
				mine.Store(0)
				return errCallOver
			}
			return badStream("a taken word of %d, the frame published last is %d (call slot %d)", v, want, slot)
		}
		if i < callerSpins {
			runtime.Gosched()
			continue
		}
		mine.Store(want)
		theirs.Store(want)
		if taken.Load() == want {
			mine.Store(0)
			return nil
		}
		if err := park(); err != nil {
			mine.Store(0)
			return err
		}
	}
}

// leave is the caller abandoning the call (Close, ctx): a cancel on the
// socket, unless the final frame is in; the poller drops what comes until
// the server's final frame frees the slot.
func (ss *cliStream) leave(reason Code) {
	if ss.gone.Swap(true) {
		return
	}
	ss.mu.Lock()
	ended := ss.ended
	ss.mu.Unlock()
	if ended {
		return
	}
	x := ss.y.x
	if x.cs.region.Acquire() {
		opened := x.calls.ReqTaken(ss.k).Load() != ss.base
		if !opened {
			ss.cancel.Store(uint32(reason))
			opened = x.calls.ReqTaken(ss.k).Load() != ss.base && ss.cancel.Swap(0) != 0
			if !opened {
				x.cs.region.Release()
				x.wakePoller()
				return // the poller sends it
			}
		}
		x.cs.region.Release()
	}
	x.cc.cancelRemote(ss.id, reason)
}

// awaitItem is Recv's wait for an item or the end: it looks at the slot
// itself a few times (taking what came; up to loneSpin when it is the
// connection's only call waiting, as a lone unary caller does: its item
// often comes within it, saving the poller's wake-up and hand-off), with
// clook set so that the server does not wake the poller meanwhile; then it
// clears clook, looks once more, and parks for the poller.
func (ss *cliStream) awaitItem() {
	st, x := ss.st, ss.y.x
	if !st.ready() && x.cs.region.Acquire() {
		look := x.calls.CLook(ss.k)
		look.Store(1)
		var t0 time.Time
		for i := 0; ; i++ {
			if i >= callerSpins {
				if i == callerSpins {
					t0 = time.Now()
				}
				if ss.y.n.Load() != 1 || x.wait.Load() != 0 || time.Since(t0) > loneSpin {
					break
				}
			}
			if ss.tryLook(); st.ready() {
				break
			}
			runtime.Gosched()
		}
		look.Store(0)
		ss.tryLook() // (after clook = 0: what the server published unwoken is in)
		x.cs.region.Release()
	}
	if st.ready() {
		return
	}
	x.wakePoller()
	select {
	case <-st.arrived:
	case <-st.ended:
	}
}

// tryLook takes what came in the slot unless the poller is at it (it then
// delivers). The caller holds a region reference.
func (ss *cliStream) tryLook() {
	if ss.taking.CompareAndSwap(false, true) {
		ss.look()
		ss.taking.Store(false)
	}
}

// room reports whether the call's queue may take an item of cost (its
// length + 16): when it is empty, or the item fits its 1 MiB (spec 10.9).
func (st *ClientStream) room(cost int) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.outstanding == 0 || st.outstanding+cost <= frame.InitialStreamCredit
}

// frameCost is what an item frame in a slot counts against its receiver's
// 1 MiB: its payload's length (a descriptor's length) + 16, as 4.1 counts.
func frameCost(h frame.Header, p []byte) int {
	n := int(h.PayloadLen)
	if h.Flags&shm.FlagShm != 0 && len(p) == shm.DescSize {
		d, _ := shm.ParseDesc(p)
		n = int(d.Len)
	}
	return n + frame.HeaderSize
}

// granted is grant for a stream slot: no stream_credit frame, the poller
// takes a held item now.
func (ss *cliStream) granted(n int) {
	st := ss.st
	st.mu.Lock()
	st.outstanding -= n
	st.mu.Unlock()
	if ss.held.Load() {
		ss.y.nudge()
	}
}

// nudge wakes the poller for a held item.
func (y *clientStreams) nudge() {
	y.kick.Store(true)
	x := y.x
	x.wakePoller()
	if x.cs.region.Acquire() {
		shm.FutexWake(x.calls.CBell(), 1)
		x.cs.region.Release()
	}
}

// turn is the poller's look at the stream slots: Sends whose frame was
// taken, items and final frames published. It returns how many things it
// did and how many slots are in use.
func (y *clientStreams) turn() (did, active int) {
	x := y.x
	calls := x.calls
	y.kick.Store(false)
	for k := range shm.CallSlots {
		ss := y.ss[k].Load()
		if ss == nil {
			continue
		}
		active++
		if w := ss.want.Load(); w != 0 && calls.ReqTaken(k).Load() == w && ss.want.CompareAndSwap(w, 0) {
			select {
			case ss.wake <- struct{}{}:
			default:
			}
			did++
		}
		if ss.cancel.Load() != 0 && calls.ReqTaken(k).Load() != ss.base {
			if r := ss.cancel.Swap(0); r != 0 { // (leave)
				x.cc.cancelRemote(ss.id, Code(r))
			}
		}
		if !ss.taking.CompareAndSwap(false, true) {
			continue // its Recv takes
		}
		n, e := ss.look()
		ss.taking.Store(false)
		if e != nil {
			return did, active
		}
		did += n
	}
	return did, active
}

// look takes what the server published in slot k: an item, the final
// frame, and frees the slot once the final frame is in and ans_seq =
// req_seq. The caller holds taking.
func (ss *cliStream) look() (did int, _ *Error) {
	y, k := ss.y, ss.k
	x := y.x
	calls := x.calls
	if !ss.final.Load() {
		if v := calls.StrSeq(k).Load(); v != y.taken[k].Load() {
			if v != y.taken[k].Load()+1 {
				return did, x.violate(callViolation("call slot %d's stream sequence jumped from %d to %d", k, y.taken[k].Load(), v))
			}
			took, e := ss.takeItem(v)
			if e != nil {
				return did, e
			}
			if took {
				did++
			}
		}
		if a := calls.AnsSeq(k).Load(); a != ss.base {
			if calls.StrSeq(k).Load() != y.taken[k].Load() {
				return did, x.violate(callViolation("call slot %d's final frame before its last stream item was taken", k))
			}
			if e := ss.readFinal(a); e != nil {
				return did, e
			}
			did++
		}
	}
	if ss.final.Load() && calls.AnsSeq(k).Load() == ss.finLast && y.ss[k].Load() == ss {
		x.seq[k] = ss.finLast // the slot's req_seq, for its next call
		y.ss[k].Store(nil)
		y.n.Add(-1)
		x.put(k)
		x.land()
		did++
	}
	return did, nil
}

// ready reports whether turn has something to do (the poller's look
// before it sleeps, and its test of a wake-up).
func (y *clientStreams) ready() bool {
	if y.kick.Load() {
		return true
	}
	calls := y.x.calls
	for k := range shm.CallSlots {
		ss := y.ss[k].Load()
		if ss == nil {
			continue
		}
		if w := ss.want.Load(); w != 0 && calls.ReqTaken(k).Load() == w {
			return true
		}
		if ss.cancel.Load() != 0 && calls.ReqTaken(k).Load() != ss.base {
			return true
		}
		if ss.final.Load() {
			if calls.AnsSeq(k).Load() == ss.finLast {
				return true
			}
			continue
		}
		if (calls.StrSeq(k).Load() != y.taken[k].Load() && !ss.held.Load()) || calls.AnsSeq(k).Load() != ss.base {
			return true
		}
	}
	return false
}

// takeItem copies the stream_data frame v out of slot k and hands its item
// to Recv, when the call's queue has room (false: it stays in the mailbox).
func (ss *cliStream) takeItem(v uint32) (bool, *Error) {
	y, st, k := ss.y, ss.st, ss.k
	x := y.x
	calls := x.calls
	gone := ss.gone.Load()
	f, err := shm.CopyFrame(&ss.fbuf, calls.AnsArea(k), calls.StrLen(k).Load(), frame.HeaderSize)
	if err != nil {
		return false, x.violate(shmViolation(err))
	}
	h := frame.ParseHeader(f)
	if err := checkItemFrame(f, h, ss.id, st.tx.single, x.cc.maxFrame); err != nil {
		return false, x.violate(shmViolation(err))
	}
	if cost := frameCost(h, f[frame.HeaderSize:]); !gone && !st.room(cost) {
		ss.held.Store(true)
		if !st.room(cost) {
			return false, nil
		}
	}
	ss.held.Store(false)
	item, e := ss.payload(h, f[frame.HeaderSize:], !gone)
	if e != nil {
		return false, e
	}
	y.taken[k].Store(v)
	calls.StrTaken(k).Store(v)
	if calls.SWant(k).Load() == v {
		x.ringServer()
	}
	if !gone {
		if err := st.deliver(item); err != nil {
			return false, x.violate(err.(*Error))
		}
	}
	return true, nil
}

// checkItemFrame checks a server frame copied out of a stream slot's
// mailbox (str_seq): a stream_data of call id (never for a
// client-streaming call, single), lengths that add up, an empty head,
// within the caps, a descriptor of 8 bytes.
func checkItemFrame(f []byte, h frame.Header, id uint32, single bool, maxFrame uint32) error {
	switch {
	case h.Type != frame.TypeStreamData || single:
		return badStream("a %s frame in a stream slot's mailbox (client-streaming %v), want stream_data", h.Type, single)
	case frame.HeaderSize+int(h.HeadLen)+int(h.PayloadLen) != len(f):
		return badStream("a stream slot's frame of %d bytes says head %d, payload %d", len(f), h.HeadLen, h.PayloadLen)
	case h.ID != id:
		return badStream("a stream slot's stream_data for id %#x, its call is %#x", h.ID, id)
	case h.HeadLen != 0:
		return badStream("a stream slot's stream_data with a head of %d bytes", h.HeadLen)
	case h.Flags&shm.FlagShm != 0 && h.PayloadLen != shm.DescSize:
		return &shm.Error{Name: shm.NameBadDesc, Detail: fmt.Sprintf("descriptor payload of %d bytes, want %d", h.PayloadLen, shm.DescSize)}
	}
	return h.Check(maxFrame)
}

// payload reads a server frame's payload of slot k (inline, in slot k's
// payload area, or a payload slot, released) into a buffer of its own
// when read.
func (ss *cliStream) payload(h frame.Header, p []byte, read bool) ([]byte, *Error) {
	x, st, k := ss.y.x, ss.st, ss.k
	if h.Flags&shm.FlagShm == 0 {
		if !read {
			return nil, nil
		}
		return append(st.itemBuf(uint32(len(p))), p...), nil
	}
	if len(p) != shm.DescSize {
		return nil, x.violate(callViolation("call slot %d's frame has a descriptor of %d bytes", k, len(p)))
	}
	d, _ := shm.ParseDesc(p)
	if in, err := x.calls.AreaDesc(true, k, d); err != nil {
		return nil, x.violate(shmViolation(err))
	} else if in {
		x.cs.areaIn(int(d.Len))
		if !read {
			return nil, nil
		}
		return append(st.itemBuf(d.Len), x.calls.AnsPayload(k)[:d.Len]...), nil
	}
	var buf []byte
	if read {
		buf = st.itemBuf(d.Len)
	}
	out, d, err := x.cs.take(p, buf, read)
	if err != nil {
		return nil, x.violate(shmViolation(err))
	}
	x.release(k, d)
	return out, nil
}

// readFinal reads the call's final frame (ans_seq a) and ends the call.
func (ss *cliStream) readFinal(a uint32) *Error {
	x, st, k := ss.y.x, ss.st, ss.k
	calls := x.calls
	ss.mu.Lock()
	ss.ended = true
	last := ss.last
	ss.mu.Unlock()
	// Read again now that nothing more is published: frames the client
	// published after the final frame are dropped, each moving ans_seq
	// (after req_taken, so it may lag a moment): it is in (base, last],
	// and the slot frees once it is last.
	a = calls.AnsSeq(k).Load()
	if a-ss.base-1 > last-ss.base-1 { // (not base < a <= last, in sequence arithmetic)
		return x.violate(callViolation("call slot %d's answer sequence %d, its last request %d", k, a, last))
	}
	f, err := shm.CopyFrame(&ss.fbuf, calls.AnsArea(k), calls.AnsLen(k).Load(), frame.HeaderSize)
	if err != nil {
		return x.violate(shmViolation(err))
	}
	h := frame.ParseHeader(f)
	if h.ID != ss.id || frame.HeaderSize+int(h.HeadLen)+int(h.PayloadLen) != len(f) {
		return x.violate(callViolation("call slot %d's final frame (id %#x, head %d, payload %d) does not match its call %#x and length %d", k, h.ID, h.HeadLen, h.PayloadLen, ss.id, len(f)))
	}
	head := f[frame.HeaderSize : frame.HeaderSize+int(h.HeadLen)]
	p := f[frame.HeaderSize+int(h.HeadLen):]
	gone := ss.gone.Load()
	var end error
	var item []byte
	switch {
	case h.Type == frame.TypeStreamEnd && !st.tx.single && h.PayloadLen == 0,
		h.Type == frame.TypeResponse && st.tx.single:
		if h.Type == frame.TypeResponse {
			var e *Error
			if item, e = ss.payload(h, p, !gone); e != nil {
				return e
			}
			if item == nil {
				item = []byte{}
			}
		}
		if sink := st.cl.mdSink; sink != nil && !gone {
			var md Metadata
			if frame.HasAppMetadata(head) {
				md = parseMD(head)
			}
			*sink = md
		}
	case h.Type == frame.TypeError:
		code := Code(h.Aux)
		if code == OK {
			code = Unknown
		}
		end = &Error{Code: code, Message: string(head), Details: append([]byte(nil), p...), Refused: h.Flags&frame.FlagRefused != 0}
	default:
		return x.violate(callViolation("call slot %d's final frame is a %s (flags %#x, payload %d)", k, h.Type, h.Flags, h.PayloadLen))
	}
	ss.finLast = last
	ss.final.Store(true)
	x.n.Add(1)
	if !gone {
		if item != nil {
			st.deliverResponse(item)
		}
		st.finish(end)
	}
	return nil
}

// close ends every stream slot's call with the connection (clientCalls.close).
func (y *clientStreams) close() {
	for k := range shm.CallSlots {
		if ss := y.ss[k].Load(); ss != nil {
			ss.st.finish(y.x.cc.lostErr())
		}
	}
}

// ---- server ----

// serverStreams is a server connection's stream slots.
type serverStreams struct {
	x      *serverCalls
	ss     [shm.CallSlots]atomic.Pointer[srvStream]
	n      atomic.Int32          // stream calls whose handler runs (srvStream.look's lone spin)
	strSeq [shm.CallSlots]uint32 // the str_seq last published per slot (the slot's current call's)
	kicked atomic.Bool           // a handler's inbox has room again: not a spurious wake
	quit   chan struct{}         // closed with the connection
	once   sync.Once
}

// srvStream is a stream call in call slot k (the server's side).
type srvStream struct {
	y      *serverStreams
	k      int
	id     uint32
	in     *reqInbox // nil for a refused call
	single bool

	mu    sync.Mutex
	last  uint32 // (mu) the req_seq last taken
	ended bool   // (mu) the final frame is published

	// taking is the right to take the client's frames of slot k: the
	// poller and the handler's own recv CompareAndSwap it 0 to 1 (as
	// cliStream.taking); x.last[k] and fbuf are its holder's.
	taking atomic.Bool
	held   atomic.Bool   // a frame waits for room in the inbox
	endSeq uint32        // the taker's: request_end's req_seq (for the message)
	want   atomic.Uint32 // the str_seq the handler's send waits to see taken
	wake   chan struct{} // (buffered 1) the poller: str_taken reached want
	fbuf   [shm.CallAreaSize]byte
	rel    [shm.DescSize]byte // the taker's release buffer
	desc   [shm.DescSize]byte // send's descriptor
}

func newServerStreams(x *serverCalls) *serverStreams {
	return &serverStreams{x: x, quit: make(chan struct{})}
}

func (y *serverStreams) close() { y.once.Do(func() { close(y.quit) }) }

// ringClient adds 1 to cbell and wakes the client's poller when it sleeps,
// once per numbered sleep (spec 10.8; the client's poller sleeps on its
// number in csleeping).
func (x *serverCalls) ringClient() {
	x.calls.CBell().Add(1)
	x.wakeClient()
}

// ringLooked is ringClient for a frame of stream slot k: no wake while the
// call's Recv looks at the slot itself (clook, spec 10.9).
func (x *serverCalls) ringLooked(k int) {
	x.calls.CBell().Add(1)
	if x.calls.CLook(k).Load() == 0 {
		x.wakeClient()
	}
}

func (x *serverCalls) wakeClient() {
	cb := x.calls.CBell()
	if v := x.calls.CSleeping().Load(); v != 0 && x.cliWoke.Swap(v) != v {
		shm.FutexWake(cb, 1)
	}
}

func badStream(format string, args ...any) error {
	return &shm.Error{Name: shm.NameBadCall, Detail: fmt.Sprintf(format, args...)}
}

// begin makes slot k's stream call for the request s the poller took (in
// is nil when it is refused); req_taken follows.
func (y *serverStreams) begin(k int, s, id uint32, in *reqInbox, single bool) *srvStream {
	ss := &srvStream{y: y, k: k, id: id, in: in, single: single, last: s, wake: make(chan struct{}, 1)}
	if in != nil {
		in.slot = ss
	}
	y.ss[k].Store(ss)
	return ss
}

// take handles the frame s published in slot k, whose last call was a
// stream: its request_data or request_end (or one racing with its end,
// dropped). handled is false for a request, which opens the next call
// (the poller's take).
func (y *serverStreams) take(k int, s uint32, ss *srvStream) (handled bool, err error) {
	x := y.x
	calls := x.calls
	if s != x.last[k]+1 {
		return true, badStream("call slot %d's request sequence jumped from %d to %d", k, x.last[k], s)
	}
	f, err := shm.CopyFrame(&ss.fbuf, calls.ReqArea(k), calls.ReqLen(k).Load(), frame.HeaderSize)
	if err != nil {
		return true, err
	}
	h := frame.ParseHeader(f)
	ss.mu.Lock()
	ended := ss.ended
	ss.mu.Unlock()
	if h.Type == frame.TypeRequest {
		if !ended {
			return true, badStream("a request in call slot %d before the answer to its stream call", k)
		}
		y.ss[k].Store(nil)
		return false, nil
	}
	if err := checkStreamFrame(f, h, ss.id, x.c.maxFrame); err != nil {
		return true, err
	}
	p := f[frame.HeaderSize:]
	if cost := int64(frameCost(h, p)); !ended && h.Type == frame.TypeRequestData && !ss.in.room(cost) {
		ss.held.Store(true)
		if !ss.in.room(cost) {
			return true, nil // it waits in the mailbox; recv's grant nudges the poller
		}
	}
	ss.held.Store(false)
	ss.mu.Lock()
	if ss.ended {
		// It raced with the call's end: dropped, and ans_seq follows so
		// that the slot returns to the client with ans_seq = req_seq.
		if h.Flags&shm.FlagShm != 0 {
			if _, err := y.dropPayload(k, p); err != nil {
				ss.mu.Unlock()
				return true, err
			}
		}
		x.last[k], ss.last = s, s
		lateFrames.Add(1)
		calls.ReqTaken(k).Store(s) // (first: a client that sees ans_seq = s frees the slot, and its next call waits on req_taken)
		calls.AnsSeq(k).Store(s)
		ss.mu.Unlock()
		x.ringClient()
		return true, nil
	}
	in := ss.in
	in.mu.Lock()
	inEnded := in.ended
	in.mu.Unlock()
	if inEnded {
		ss.mu.Unlock()
		return true, badStream("a %s (request %d) in call slot %d after its request_end (request %d)", h.Type, s, k, ss.endSeq)
	}
	if h.Type == frame.TypeRequestEnd {
		ss.endSeq = s
		in.end()
	} else {
		item, err := y.payload(k, h, p, in)
		if err != nil {
			ss.mu.Unlock()
			return true, err
		}
		if err := in.put(item); err != nil {
			ss.mu.Unlock()
			return true, err
		}
	}
	x.last[k], ss.last = s, s
	// req_taken under mu: the answer publishes ans_seq = s under it, so a
	// client that sees ans_seq = s (and frees the slot for its next call)
	// sees req_taken = s too; stored after mu, a taker preempted between
	// the two let the next call's first Send find req_taken two behind.
	calls.ReqTaken(k).Store(s)
	ss.mu.Unlock()
	if calls.CWant(k).Load() == s {
		x.ringClient()
	}
	return true, nil
}

// look is the handler's recv taking its next frame itself, with slook set
// (the client then does not wake the poller): callerSpins looks, up to
// loneSpin when it is the connection's only stream call; then it clears
// slook and looks once more. False: nothing came, it parks for the poller.
func (ss *srvStream) look() bool {
	y, k := ss.y, ss.k
	x := y.x
	if !x.cs.region.Acquire() {
		return false // the connection ended
	}
	defer x.cs.region.Release()
	sl := x.calls.SLook(k)
	sl.Store(1)
	var t0 time.Time
	for i := 0; ; i++ {
		if i >= callerSpins {
			if i == callerSpins {
				t0 = time.Now()
			}
			if y.n.Load() != 1 || time.Since(t0) > loneSpin {
				break
			}
		}
		if ss.tryTake() {
			sl.Store(0)
			return true
		}
		runtime.Gosched()
	}
	sl.Store(0)
	return ss.tryTake() // (after slook = 0: a frame published unwoken is in)
}

// tryTake takes the client's next frame unless the poller is at it; true
// when it took one. The caller holds a region reference.
func (ss *srvStream) tryTake() bool {
	y, k := ss.y, ss.k
	x := y.x
	if x.calls.ReqSeq(k).Load() == ss.seen() || !ss.taking.CompareAndSwap(false, true) {
		return false
	}
	took := false
	if s := x.calls.ReqSeq(k).Load(); s != x.last[k] {
		before := x.last[k]
		if _, err := y.take(k, s, ss); err != nil {
			x.c.connError(ProtocolViolation, err)
		}
		took = x.last[k] != before
	}
	ss.taking.Store(false)
	return took
}

// seen is the req_seq last taken (under mu: the handler reads it outside taking).
func (ss *srvStream) seen() uint32 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.last
}

// checkStreamFrame checks a client frame copied out of a stream slot: a
// request_data or request_end of call id, lengths that add up, within the
// caps, an empty head, a request_end empty, a descriptor of 8 bytes.
func checkStreamFrame(f []byte, h frame.Header, id, maxFrame uint32) error {
	switch {
	case h.Type != frame.TypeRequestData && h.Type != frame.TypeRequestEnd:
		return badStream("a %s frame in a stream slot, want request_data or request_end", h.Type)
	case frame.HeaderSize+int(h.HeadLen)+int(h.PayloadLen) != len(f):
		return badStream("a stream slot's frame of %d bytes says head %d, payload %d", len(f), h.HeadLen, h.PayloadLen)
	case h.ID != id:
		return badStream("a stream slot's %s for id %#x, its call is %#x", h.Type, h.ID, id)
	case h.HeadLen != 0 || h.Type == frame.TypeRequestEnd && h.PayloadLen != 0:
		return badStream("a stream slot's %s with head %d, payload %d", h.Type, h.HeadLen, h.PayloadLen)
	case h.Flags&shm.FlagShm != 0 && h.PayloadLen != shm.DescSize:
		return &shm.Error{Name: shm.NameBadDesc, Detail: fmt.Sprintf("descriptor payload of %d bytes, want %d", h.PayloadLen, shm.DescSize)}
	}
	return h.Check(maxFrame)
}

// payload reads a request item (inline, in slot k's payload area, or a
// payload slot, released) into a buffer of in's.
func (y *serverStreams) payload(k int, h frame.Header, p []byte, in *reqInbox) ([]byte, error) {
	x := y.x
	if h.Flags&shm.FlagShm == 0 {
		return append(in.itemBuf(uint32(len(p))), p...), nil
	}
	d, _ := shm.ParseDesc(p)
	if area, err := x.calls.AreaDesc(false, k, d); err != nil {
		return nil, err
	} else if area {
		x.cs.areaIn(int(d.Len))
		return append(in.itemBuf(d.Len), x.calls.ReqPayload(k)[:d.Len]...), nil
	}
	return y.takeSlot(k, p, in.itemBuf(d.Len), true)
}

// takeSlot copies a request item out of a payload slot (appending to dst
// when read) and sends its release at once: the taker may be the
// handler's recv, so the poller's queued releases (takePayload) are not
// its to touch. Items of a payload slot are large (over 64 KiB): a write
// each is little.
func (y *serverStreams) takeSlot(k int, desc, dst []byte, read bool) ([]byte, error) {
	x := y.x
	out, d, err := x.cs.take(desc, dst, read)
	if err != nil {
		return dst, err
	}
	ss := y.ss[k].Load()
	queueRelease(x.c.w, d, &ss.rel)
	x.c.w.Push()
	return out, nil
}

// dropPayload releases a dropped frame's payload slot (its area needs none).
func (y *serverStreams) dropPayload(k int, p []byte) ([]byte, error) {
	d, _ := shm.ParseDesc(p)
	if area, err := y.x.calls.AreaDesc(false, k, d); area || err != nil {
		return nil, err
	}
	return y.takeSlot(k, p, nil, false)
}

// room reports whether the inbox may take an item of cost, as ClientStream.room.
func (in *reqInbox) room(cost int64) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.outstanding == 0 || in.outstanding+cost <= frame.InitialRequestCredit
}

// granted is grant for a stream slot: no request_credit frame, the poller
// takes a held frame now.
func (ss *srvStream) granted(in *reqInbox, n int64) {
	in.mu.Lock()
	in.outstanding -= n
	in.mu.Unlock()
	if ss.held.Load() {
		y := ss.y
		y.kicked.Store(true)
		if y.x.cs.region.Acquire() {
			shm.FutexWake(y.x.calls.Bell(), 1)
			y.x.cs.region.Release()
		}
	}
}

// senders wakes slot k's handler when the client took the item its send
// waits on; pending reports whether it would.
func (y *serverStreams) senders(k int, wake bool) bool {
	ss := y.ss[k].Load()
	if ss == nil {
		return false
	}
	w := ss.want.Load()
	if w == 0 || y.x.calls.StrTaken(k).Load() != w {
		return false
	}
	if wake && ss.want.CompareAndSwap(w, 0) {
		select {
		case ss.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// heldSlot reports whether slot k's frame waits for room (pending skips it).
func (y *serverStreams) heldSlot(k int) bool {
	ss := y.ss[k].Load()
	return ss != nil && ss.held.Load()
}

// awaitTaken waits until the client took the last stream_data of slot k
// (str_taken), done closes (the handler's ctx; nil for the final frame)
// or the connection ends.
func (ss *srvStream) awaitTaken(call *srvCall, done <-chan struct{}) error {
	y := ss.y
	x := y.x
	if call.held > 0 && x.calls.StrTaken(ss.k).Load() != y.strSeq[ss.k] { // waiting on the client: hold no budget (budget.go)
		x.c.release(call.held)
		call.held = 0
	}
	err := awaitTake(ss.k, x.calls.StrTaken(ss.k), y.strSeq[ss.k], &ss.want, x.calls.SWant(ss.k), nil, func() error {
		select {
		case <-ss.wake:
			return nil
		case <-done:
			return call.ctx.Err()
		case <-y.quit:
			return errConnLost
		}
	})
	if se, ok := err.(*shm.Error); ok {
		x.c.connError(ProtocolViolation, se)
	}
	return err
}

// send is the handler's send for a call in a stream slot: it publishes one
// stream_data once the client took the last one.
func (y *serverStreams) send(call *srvCall, item []byte) error {
	x := y.x
	k := int(call.slot - 1)
	ss := y.ss[k].Load()
	hc := call.ctx
	if ss == nil || ss.id != call.id {
		return Errorf(Internal, "call slot %d's stream is gone", k)
	}
	cs := x.cs
	if !cs.region.Acquire() {
		return errConnLost
	}
	defer cs.region.Release()
	if err := ss.awaitTaken(call, hc.Done()); err != nil {
		return err
	}
	h := frame.Header{Type: frame.TypeStreamData, ID: call.id}
	payload := item
	if len(item) > 0 && (cs.takes(len(item)) || frame.HeaderSize+len(item) > shm.CallAreaSize) {
		if len(item) <= shm.PayloadAreaSize {
			copy(x.calls.AnsPayload(k), item)
			cs.areaOut(len(item))
			shm.Desc{Off: x.calls.PayloadOff(true, k), Len: uint32(len(item))}.Put(ss.desc[:])
		} else {
			if uint64(len(item)) > cs.alloc.Cap() {
				return Errorf(ResourceExhausted, "stream item of %d bytes is larger than the shared region's half", len(item))
			}
			cs.use(len(item))
			if err := cs.put(hc, item, &ss.desc); err != nil {
				if e := hc.Err(); e != nil {
					return e
				}
				return err
			}
		}
		payload, h.Flags = ss.desc[:], shm.FlagShm
	}
	h.PayloadLen = uint32(len(payload))
	a := x.calls.AnsArea(k)
	h.Put(a)
	n := frame.HeaderSize + copy(a[frame.HeaderSize:], payload)
	x.calls.StrLen(k).Store(uint32(n))
	y.strSeq[k]++
	x.calls.StrSeq(k).Store(y.strSeq[k])
	x.ringLooked(k)
	return nil
}

// openStream starts a client-stream call the poller took from slot k
// (request s), or refuses it (refuse) with the slot's final frame.
func (x *serverCalls) openStream(k int, s uint32, call *srvCall, h frame.Header, method, md []byte, refuse *Error) error {
	c, y := x.c, x.streams
	hd := call.h
	single := h.Flags&frame.FlagStream == 0
	if refuse != nil {
		c.refused(string(method), h.Flags, false, refusalOf(hd, refuse), refuse.Code)
		y.begin(k, s, h.ID, nil, single)
		x.calls.ReqTaken(k).Store(s)
		x.answer(call, nil, nil, refuse)
		putSrvCall(call)
		return nil
	}
	c.acquireSlot(0)
	hc := c.handlerCtxFrom(&x.hcs, hd.name)
	if frame.HasAppMetadata(md) {
		hc.mdRaw = append([]byte(nil), md...)
	}
	hc.in = &reqInbox{c: c, id: h.ID, h: hd, wake: make(chan struct{}, 1)}
	call.ctx, call.held, call.req = hc, 0, call.req[:0]
	y.begin(k, s, h.ID, hc.in, single)
	y.n.Add(1) // (until its answer)
	x.calls.ReqTaken(k).Store(s)
	c.register(h.ID, hc, call, h.Aux)
	c.mu.Lock()
	closed := c.closed // (close cancels the calls registered before it)
	c.mu.Unlock()
	if closed {
		hc.cancel(context.Canceled)
	}
	c.dispatch(call) // (never inline: a stream handler waits for items)
	return nil
}
