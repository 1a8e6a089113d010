package rpc

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// The server's side of stream slots (shmstreams.go says who writes what).

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
	wakeSleeper(x.calls.CBell(), x.calls.CSleeping(), &x.cliWoke, true)
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
	case h.Type == frame.TypeRequestEnd && h.PayloadLen != 0:
		return badStream("a stream slot's %s with head %d, payload %d", h.Type, h.HeadLen, h.PayloadLen)
	}
	return checkSlotItem(f, h, id, maxFrame)
}

// checkSlotItem is what both directions check of a frame copied out of a
// stream slot's mailbox, its type aside: lengths that add up, call id, an
// empty head, a descriptor of 8 bytes, the caps.
func checkSlotItem(f []byte, h frame.Header, id, maxFrame uint32) error {
	switch {
	case frame.HeaderSize+int(h.HeadLen)+int(h.PayloadLen) != len(f):
		return badStream("a stream slot's frame of %d bytes says head %d, payload %d", len(f), h.HeadLen, h.PayloadLen)
	case h.ID != id:
		return badStream("a stream slot's %s for id %#x, its call is %#x", h.Type, h.ID, id)
	case h.HeadLen != 0:
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
