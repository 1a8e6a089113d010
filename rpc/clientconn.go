package rpc

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
	"github.com/udskit/udskit/internal/spinread"
)

// clientConn is one connection of a Client.
type clientConn struct {
	// onExit runs once, when the connection's background reader ends (after
	// the connection closed): its owner forgets it there.
	onExit   func(*clientConn)
	nc       net.Conn
	r        *frame.Reader
	w        *frame.Writer
	maxFrame uint32
	// clientStreams: the server's hello set the client_stream flag
	// (protocol/spec.md, 4.3): Bidi and ClientStreaming may open calls.
	clientStreams bool

	// In-flight slots, as many as the server's limit (maxInFlight): a call
	// takes one with a CAS on inflight and gives it back with an add. A
	// caller that finds none counts itself in semWaiters before it looks
	// again and then waits for semFree (buffered 1), which release signals
	// while anyone waits. Both sides touch the counters in the opposite
	// order (waiter: semWaiters then inflight; release: inflight then
	// semWaiters), so a release either sees the waiter or the waiter sees
	// the slot. One signal wakes one waiter; a waiter that gets a slot
	// passes the signal on if slots and waiters remain.
	inflight    atomic.Int32
	maxInFlight int32
	semWaiters  atomic.Int32
	semFree     chan struct{}

	// unusable is set with draining or closed: no new calls (read without mu).
	unusable atomic.Bool

	mu       sync.Mutex
	calls    map[uint32]*call
	nextID   uint32
	draining bool // goaway seen: no new calls
	closed   bool
	err      *Error // why it closed
	done     chan struct{}

	// The read role: who reads the socket (see "Reading" below).
	role    uint8         // roleBackground, roleNone or roleCaller
	leader  *call         // with roleCaller: the caller that reads
	leadSeq uint32        // counts callers taking the role from roleNone
	armed   bool          // a read deadline is set to interrupt the leader
	inFrame bool          // the leader reads a frame larger than the buffer: no interrupt
	bgWake  chan struct{} // (buffered 1) tells the background reader it has the role
	// The background reader watches one ctx for leaders while it waits
	// (watchLocked): watchWant is the Done channel it should watch next,
	// watching the one its wait selects on now (nil while it reads).
	watchWant, watching <-chan struct{}
	looks               atomic.Uint32 // the background reader's ticks, for tests
	// sets and serverStreams (mu) index cc.calls for passRoleLocked
	// (rolesets.go): unary, waiting unary and Recv-waiting bidi calls, and
	// how many server streams are in flight.
	sets          [numSets]callSet
	serverStreams int
	// bidiItems counts the stream items the background reader delivered to
	// bidi calls, for tests (a Recv that leads reads its own).
	bidiItems atomic.Uint32
	// owed counts the bidi calls on this connection that were handed a
	// response item and have not yet sent their next request item, called
	// Recv again or ended (ClientStream.owed): their callers are about to
	// send, so a request item sent meanwhile waits for them to run once
	// and goes out in the same write (SendRaw, frame.Writer.GatherFrame).
	// Zero for a lone call: it never waits. Marks that let a send yield
	// without one of them answering stop counting (owed.go).
	owed owedMarks
	// spin polls the socket for a lone unary caller or bidi Recv that
	// leads its read (lead, leadRecv; armLone); nil with
	// ClientOptions.NoSpin.
	spin *spinread.Reader

	// wdMu guards the write deadline of large requests (writeRequest):
	// wdN writes in progress with a deadline, the earliest of them wd.
	wdMu sync.Mutex
	wdN  int
	wd   time.Time

	// shm is the shared-memory path, nil when not in use (shm.go);
	// shmRel and shmIn are the reader's buffers for it.
	shm        *connShm
	shmRel     [shm.DescSize]byte
	shmIn      []byte
	shmPending bool // (reader) a release is queued, not yet pushed
	// slotCalls is the call-slot path (shmcalls.go), nil when not in use.
	slotCalls *clientCalls
}

// call is the pooled state of one call in flight.
type call struct {
	id   uint32
	resp []byte
	head []byte
	done chan struct{} // one signal per call (buffered 1)
	lead chan struct{} // (buffered 1) this call was given the read role
	// leading is the conn this call leads, while its ctx can end and the
	// background reader does not watch that ctx; onCancel (made once per
	// pooled call) interrupts its read then.
	leading  atomic.Pointer[clientConn]
	onCancel func()
	// watched (cc.mu) is the Done channel of the ctx the connection's
	// background reader watches for this call while it leads (see watchLocked).
	watched <-chan struct{}
	code    Code
	msg     string
	details []byte
	refused bool
	stream  *ClientStream
	waiting bool // (cc.mu) the call is in await, ready to take the read role
	// recvWaiting (cc.mu): a bidi call's Recv waits for its next item and
	// takes the read role when given it; recvLeading (cc.mu): that Recv is
	// reading the socket now (bidi_client.go, awaitItem).
	recvWaiting, recvLeading bool
	inCalls                  bool           // (cc.mu) cl is in cc.calls
	setPos                   [numSets]int32 // (cc.mu) cl's place in cc.sets (rolesets.go)
	// cancelable: the caller's ctx can end (set before send, read by
	// readers): a large response is then read aside before the call is
	// taken (dispatch.go), so that the caller can still leave at its deadline.
	cancelable bool
	// mdSink is where the answer's metadata goes (WithResponseMetadata).
	mdSink *Metadata
	// desc is the request's shared-memory descriptor, when it has one.
	desc [shm.DescSize]byte
	// view: the caller takes a response in the region in place (CallRawView).
	view shmViewCall
}

var clientCallPool = sync.Pool{New: func() any {
	cl := &call{done: make(chan struct{}, 1), lead: make(chan struct{}, 1)}
	cl.onCancel = func() {
		if cc := cl.leading.Load(); cc != nil {
			cc.interrupt(cl)
		}
	}
	return cl
}}

func getCall() *call { return clientCallPool.Get().(*call) }

func putCall(cl *call) {
	// A promotion that raced with the end of the call. Promotions are sent
	// under cc.mu to calls still in cc.calls, and cl has left it under
	// cc.mu since: none can come now, so the buffered length is exact.
	if len(cl.lead) > 0 {
		<-cl.lead
	}
	cl.resp, cl.details, cl.stream, cl.msg, cl.mdSink = nil, nil, nil, "", nil
	cl.code, cl.refused, cl.waiting, cl.watched, cl.inCalls, cl.cancelable = OK, false, false, nil, false, false
	cl.setPos = [numSets]int32{}
	if cap(cl.head) > 4096 {
		cl.head = nil
	}
	clientCallPool.Put(cl)
}

func (cc *clientConn) usable() bool { return !cc.unusable.Load() }

func (cc *clientConn) markDraining() {
	cc.mu.Lock()
	cc.draining = true
	cc.unusable.Store(true)
	idle := len(cc.calls) == 0 && cc.slotsIdle()
	cc.mu.Unlock()
	if idle {
		cc.close(errConnLost)
	}
}

// slotsIdle reports whether no slot call is in flight (shmcalls.go: they
// are not in calls).
func (cc *clientConn) slotsIdle() bool { return cc.slotCalls == nil || cc.slotCalls.flight.Load() == 0 }

// register assigns an id to cl and records it; it fails if the conn is gone.
func (cc *clientConn) register(cl *call) *Error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.closed {
		// Lost before this call was sent (e.g. closed on goaway between the
		// pick and here): it was not processed, so it may be sent again.
		e := cc.lostErr()
		e.Refused = true
		return e
	}
	if cc.draining {
		return &Error{Code: Unavailable, Message: "connection draining (server sent goaway); call not sent", Refused: true}
	}
	for {
		cc.nextID++
		if cc.nextID == 0 || cc.nextID >= slotIDBit { // ids from slotIDBit up are slot calls' (shmcalls.go)
			cc.nextID = 0
			continue
		}
		if _, busy := cc.calls[cc.nextID]; !busy {
			break
		}
	}
	cl.id = cc.nextID
	cc.calls[cl.id] = cl
	cl.inCalls = true
	cc.addedLocked(cl)
	return nil
}

func (cc *clientConn) lostErr() *Error {
	if cc.err != nil {
		return &Error{Code: cc.err.Code, Message: cc.err.Message, cause: cc.err.cause}
	}
	return &Error{Code: Unavailable, Message: "connection lost", cause: errConnLost}
}

// forget removes cl if it is still registered and reports whether it was.
func (cc *clientConn) forget(cl *call) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.forgetLocked(cl)
}

func (cc *clientConn) forgetLocked(cl *call) bool {
	if !cl.inCalls {
		return false
	}
	delete(cc.calls, cl.id)
	cl.inCalls = false
	cc.removedLocked(cl)
	// cl may have been given the read role (passRoleLocked picks any call
	// in the map, even one still sending): pass it on, or nobody would read.
	if cc.role == roleCaller && cc.leader == cl {
		if cl.recvLeading {
			// A bidi Recv is in the socket read: interrupt it; it passes
			// the role on itself when it steps aside.
			cc.interruptLocked(cl)
		} else {
			cc.passRoleLocked()
		}
	}
	cc.closeIfDrainedLocked()
	return true
}

func (cc *clientConn) closeIfDrainedLocked() {
	if cc.draining && len(cc.calls) == 0 && !cc.closed && cc.slotsIdle() {
		go cc.close(errConnLost)
	}
}

func (cc *clientConn) acquire(ctx context.Context) *Error {
	if cc.tryAcquire() {
		return nil
	}
	cc.semWaiters.Add(1)
	defer cc.semWaiters.Add(-1)
	for {
		if cc.tryAcquire() {
			if cc.semWaiters.Load() > 1 && cc.inflight.Load() < cc.maxInFlight {
				cc.signalFree() // another waiter may take the next slot
			}
			return nil
		}
		select {
		case <-cc.semFree:
		case <-ctx.Done():
			return ctxError(ctx)
		case <-cc.done:
			return cc.lostErr()
		}
	}
}

// tryAcquire takes an in-flight slot if one is free.
func (cc *clientConn) tryAcquire() bool {
	for {
		n := cc.inflight.Load()
		if n >= cc.maxInFlight {
			return false
		}
		if cc.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (cc *clientConn) release() {
	cc.inflight.Add(-1)
	if cc.semWaiters.Load() > 0 {
		cc.signalFree()
	}
}

func (cc *clientConn) signalFree() {
	select {
	case cc.semFree <- struct{}{}:
	default:
	}
}

func timeoutMicros(ctx context.Context) (uint32, *Error) {
	d, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	left := time.Until(d)
	if left <= 0 {
		return 0, &Error{Code: DeadlineExceeded, Message: "deadline exceeded before the call was sent", cause: context.DeadlineExceeded}
	}
	us := (left + time.Microsecond - 1) / time.Microsecond
	if us > 0xFFFFFFFF {
		return 0, nil // too far away to matter: sent as no deadline
	}
	return uint32(us), nil
}

func (cc *clientConn) send(ctx context.Context, cl *call, method string, req []byte, flags uint8) *Error {
	if uint32(len(req)) > cc.maxFrame {
		return Errorf(ResourceExhausted, "request of %d bytes is over the connection's max frame %d", len(req), cc.maxFrame)
	}
	aux, terr := timeoutMicros(ctx)
	if terr != nil {
		return terr
	}
	cl.head = frame.AppendRequestHead(cl.head[:0], method)
	if md := outgoingMD(ctx); md != nil {
		var e *Error
		if cl.head, e = appendMD(cl.head, md); e != nil {
			return e
		}
	}
	if len(cl.head) > frame.MaxHead {
		return Errorf(InvalidArgument, "method name and metadata are %d bytes, over the limit %d", len(cl.head), frame.MaxHead)
	}
	if cc.shm.use(len(req)) {
		if err := cc.shm.put(ctx, req, &cl.desc); err != nil {
			if ctx.Err() != nil {
				return ctxError(ctx)
			}
			return &Error{Code: Unavailable, Message: "shared memory: " + err.Error(), cause: errors.Join(errConnLost, err)}
		}
		req = cl.desc[:]
		flags |= shm.FlagShm
	}
	if e := cc.register(cl); e != nil {
		if flags&shm.FlagShm != 0 { // never handed over: the slot is ours again
			d, _ := shm.ParseDesc(cl.desc[:])
			cc.shm.alloc.Put(d)
		}
		return e
	}
	h := frame.Header{Type: frame.TypeRequest, Flags: flags, ID: cl.id, Aux: aux}
	if err := cc.writeRequest(ctx, &h, cl.head, req); err != nil {
		removed := cc.forget(cl)
		// A failed write leaves the writer failed for good: close the
		// connection so that calls move to a working one (or a reconnect)
		// instead of failing here one after another.
		cc.fail(err)
		if !removed && cl.stream == nil {
			// The connection's close took cl and will signal it: wait, so
			// that a pooled cl is not reused while close still writes to
			// it (a later call would take that signal for its own result).
			<-cl.done
		}
		if ctx.Err() != nil {
			return ctxError(ctx) // the caller's deadline cut the write
		}
		return &Error{Code: Unavailable, Message: "send request: " + err.Error(), cause: err}
	}
	return nil
}

// largeWrite is the request size from which a write that may block (a
// server that stops reading) is bounded by the caller's deadline.
const largeWrite = 64 << 10

// writeRequest writes a request frame. A large one, with a ctx deadline,
// gets the connection's write deadline for the time of the write: a server
// that stops reading must not hold the caller past its deadline. Concurrent
// large writers share the earliest of their deadlines (wdMu); a cut write
// leaves half a frame, and the connection then fails (send's caller), so the
// other calls on it move elsewhere. Small requests skip this: they block
// only behind socket buffers already full, and the call's wait honours the
// ctx. No allocation either way.
func (cc *clientConn) writeRequest(ctx context.Context, h *frame.Header, head, req []byte) error {
	d, ok := ctx.Deadline()
	if len(req) < largeWrite || !ok {
		return cc.w.WriteFrame(h, head, req)
	}
	cc.wdMu.Lock()
	cc.wdN++
	if cc.wdN == 1 || d.Before(cc.wd) {
		cc.wd = d
		cc.nc.SetWriteDeadline(d)
	}
	cc.wdMu.Unlock()
	err := cc.w.WriteFrame(h, head, req)
	cc.wdMu.Lock()
	if cc.wdN--; cc.wdN == 0 {
		cc.wd = time.Time{}
		cc.nc.SetWriteDeadline(time.Time{})
	}
	cc.wdMu.Unlock()
	return err
}

func (cc *clientConn) unary(ctx context.Context, method string, req, dst []byte) ([]byte, error) {
	if e := cc.acquire(ctx); e != nil {
		return dst, e
	}
	defer cc.release()
	if x := cc.slotCalls; x != nil {
		if out, e, ok := x.unary(ctx, method, req, dst); ok {
			if e != nil {
				return dst, e
			}
			return out, nil
		}
	}
	cl := getCall()
	cl.resp = dst[:0]
	cl.cancelable = ctx.Done() != nil
	cl.mdSink = responseMDSink(ctx)
	if e := cc.send(ctx, cl, method, req, 0); e != nil {
		putCall(cl)
		return dst, e
	}
	if e := cc.await(ctx, cl); e != nil {
		putCall(cl)
		return dst, e
	}
	out := cl.resp
	if cl.code != OK {
		e := &Error{Code: cl.code, Message: cl.msg, Details: cl.details, Refused: cl.refused}
		if cl.code == Unavailable && cl.msg == "" {
			e = cc.lostErr()
		}
		putCall(cl)
		return dst, e
	}
	putCall(cl)
	return out, nil
}

// cancelRemote tells the server to abandon call id; reason (Canceled or
// DeadlineExceeded) goes in aux so the handler's ctx ends with the same error.
func (cc *clientConn) cancelRemote(id uint32, reason Code) {
	h := frame.Header{Type: frame.TypeCancel, ID: id, Aux: uint32(reason)}
	cc.w.WriteFrame(&h, nil, nil)
}

// fail closes the connection after a read error.
func (cc *clientConn) fail(err error) {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		cc.close(errConnLost)
	} else {
		cc.close(err)
	}
}

// close fails the connection and every call in flight on it.
func (cc *clientConn) close(cause error) {
	cc.mu.Lock()
	if cc.closed {
		cc.mu.Unlock()
		return
	}
	cc.closed = true
	cc.unusable.Store(true)
	var e *Error
	switch {
	case errors.As(cause, &e):
	case errors.Is(cause, ErrClientClosed):
		e = &Error{Code: Canceled, Message: "client closed", cause: cause}
	default:
		msg := "connection lost"
		if cause != errConnLost {
			msg += ": " + cause.Error()
		}
		e = &Error{Code: Unavailable, Message: msg, cause: errors.Join(errConnLost, cause)}
	}
	cc.err = e
	calls := cc.calls
	cc.calls = map[uint32]*call{}
	cc.clearSetsLocked(calls)
	for _, cl := range calls {
		cl.inCalls = false
	}
	cc.mu.Unlock()
	close(cc.done)
	cc.w.Fail(net.ErrClosed)
	cc.nc.Close()
	if cc.slotCalls != nil {
		cc.slotCalls.close() // before the region closes: it wakes the slots' sleepers there
	}
	if cc.shm != nil {
		cc.shm.close()
	}
	for _, cl := range calls {
		if cl.stream != nil {
			cl.stream.finish(cc.lostErr())
			continue
		}
		cl.code, cl.msg = e.Code, e.Message
		cl.done <- struct{}{}
	}
}
