package rpc

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// The client's side of stream slots (shmstreams.go says who writes what).

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
	wakeSleeper(x.calls.Bell(), x.calls.ServerSleeping(), &x.srvWoke, x.bell)
}

// open opens a client-stream call (flags 0x02 or 0x03) in a free slot; ok
// is false when it cannot (no free slot, a head too large): the socket then.
func (y *clientStreams) open(ctx context.Context, cc *clientConn, method string, flags uint8) (_ *ClientStream, _ *Error, ok bool) {
	x := y.x
	hb := getBuf()
	defer putBuf(hb)
	head, e := slotHead(ctx, hb, method)
	if e != nil {
		return nil, e, true
	}
	if frame.HeaderSize+len(head) > shm.CallAreaSize {
		return nil, nil, false
	}
	aux, terr := timeoutMicros(ctx)
	if terr != nil {
		return nil, terr, true
	}
	k, e, ok := x.claim() // (in flight until the slot frees: look)
	if !ok || e != nil {
		return nil, e, ok
	}
	defer x.cs.region.Release()
	calls := x.calls
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
	if h.Type != frame.TypeStreamData || single {
		return badStream("a %s frame in a stream slot's mailbox (client-streaming %v), want stream_data", h.Type, single)
	}
	return checkSlotItem(f, h, id, maxFrame)
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
		if !gone {
			sinkMD(st.cl.mdSink, head)
		}
	case h.Type == frame.TypeError:
		end = slotError(h, head, p)
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
