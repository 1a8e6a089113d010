package rpc

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
)

// clientConn is one connection of a Client.
type clientConn struct {
	cl       *Client
	nc       net.Conn
	r        *frame.Reader
	w        *frame.Writer
	maxFrame uint32
	credit   bool          // server streams use stream credit (both hellos offered it)
	sem      chan struct{} // in-flight slots, sized by the server's limit

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
	looks   atomic.Uint32 // the background reader's ticks, for tests
}

// Reading. A caller waiting for its response reads the socket itself when
// nobody else does: it is the leader, reads whatever frames come, hands
// other calls their results, and returns as soon as its own response is in,
// passing the role to another waiting call, or to the connection's
// background reader when only streams are left, or to nobody when nothing is
// in flight. So a lone caller's response wakes that caller directly, with no
// hand-off between goroutines. When nobody has held the role for a tick the
// background reader takes it, so goaway, pings and a lost connection are
// seen on an idle connection too; while it holds it (parked in the socket
// read, no timer), calls wait for it to deliver their results, and it lets
// the role go again after a response when nothing is left in flight.
//
// A leader only ever waits in frame.Reader.PeekFrame, which consumes nothing,
// so a leader whose ctx ends is interrupted with a read deadline (armed and
// cleared under mu, only while that leader holds the role) and steps aside
// without losing the frame boundary. A frame larger than the read buffer is
// read in place without interruption (a cancel takes effect once it is in);
// stream items are left to the background reader (Recv may be slow).
const (
	roleBackground uint8 = iota
	roleNone
	roleCaller
)

// idleTick is how often, at first, the background reader looks for a
// connection nobody reads; it takes the role after a full tick with no caller
// taking it. It ticks only while it does not hold the role, and every tick
// that finds callers reading doubles the interval, up to maxIdleTick: a
// connection whose calls keep flowing is looked at a few times a second, not
// a thousand. That matters beyond the wake-ups themselves: measured on a
// 2-core box, a 1 ms ticker in each process doubled the CPU cost and the p50
// of a lone caller's 64 B round trip (docs/performance.md). An idle
// connection is therefore taken over within 2*maxIdleTick of its last call.
const (
	idleTick    = time.Millisecond
	maxIdleTick = 64 * time.Millisecond
)

// aLongTimeAgo is a read deadline that has passed: it interrupts a read.
var aLongTimeAgo = time.Unix(1, 0)

// call is the pooled state of one call in flight.
type call struct {
	id   uint32
	resp []byte
	head []byte
	done chan struct{} // one signal per call (buffered 1)
	lead chan struct{} // (buffered 1) this call was given the read role
	// leading is the conn this call leads, while its ctx can end; onCancel
	// (made once per pooled call) interrupts its read then.
	leading  atomic.Pointer[clientConn]
	onCancel func()
	code     Code
	msg      string
	details  []byte
	refused  bool
	stream   *ClientStream
	waiting  bool // (cc.mu) the call is in await, ready to take the read role
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
	select { // a promotion that raced with the end of the call
	case <-cl.lead:
	default:
	}
	cl.resp, cl.details, cl.stream, cl.msg = nil, nil, nil, ""
	cl.code, cl.refused, cl.waiting = OK, false, false
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
	idle := len(cc.calls) == 0
	cc.mu.Unlock()
	if idle {
		cc.close(errConnLost)
	}
}

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
		if cc.nextID == 0 {
			continue
		}
		if _, busy := cc.calls[cc.nextID]; !busy {
			break
		}
	}
	cl.id = cc.nextID
	cc.calls[cl.id] = cl
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
	if cc.calls[cl.id] != cl {
		return false
	}
	delete(cc.calls, cl.id)
	// cl may have been given the read role (passRoleLocked picks any call
	// in the map, even one still sending): pass it on, or nobody would read.
	if cc.role == roleCaller && cc.leader == cl {
		cc.passRoleLocked()
	}
	cc.closeIfDrainedLocked()
	return true
}

func (cc *clientConn) closeIfDrainedLocked() {
	if cc.draining && len(cc.calls) == 0 && !cc.closed {
		go cc.close(errConnLost)
	}
}

func (cc *clientConn) acquire(ctx context.Context) *Error {
	select {
	case cc.sem <- struct{}{}:
		return nil
	default:
	}
	select {
	case cc.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctxError(ctx)
	case <-cc.done:
		return cc.lostErr()
	}
}

func (cc *clientConn) release() { <-cc.sem }

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
		cl.head = appendMD(cl.head, md)
	}
	if len(cl.head) > frame.MaxHead {
		return Errorf(InvalidArgument, "method name and metadata are %d bytes, over the limit %d", len(cl.head), frame.MaxHead)
	}
	if e := cc.register(cl); e != nil {
		return e
	}
	h := frame.Header{Type: frame.TypeRequest, Flags: flags, ID: cl.id, Aux: aux}
	if err := cc.w.WriteFrame(&h, cl.head, req); err != nil {
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
		return &Error{Code: Unavailable, Message: "send request: " + err.Error(), cause: err}
	}
	return nil
}

func (cc *clientConn) unary(ctx context.Context, method string, req, dst []byte) ([]byte, error) {
	if e := cc.acquire(ctx); e != nil {
		return dst, e
	}
	defer cc.release()
	cl := getCall()
	cl.resp = dst[:0]
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

// Outcomes of lead.
const (
	leadDone     = iota // cl's result is in
	leadCanceled        // cl's ctx ended; cl is forgotten and the server told
	leadPassed          // the role went to the background reader; wait for it
)

// await waits for cl's result, reading the socket itself whenever it holds
// the read role. It returns nil when cl's result is in, or the ctx error
// (the call forgotten, the server told to cancel it).
func (cc *clientConn) await(ctx context.Context, cl *call) *Error {
	cc.mu.Lock()
	// Not if cl's result is already in: a reader may have delivered it
	// between send and here, and then let the role go.
	lead := cc.role == roleNone && !cc.closed && cc.calls[cl.id] == cl
	if lead {
		cc.role, cc.leader = roleCaller, cl
		cc.leadSeq++
	}
	cl.waiting = true
	cc.mu.Unlock()
	for {
		if lead {
			switch cc.lead(ctx, cl) {
			case leadDone:
				return nil
			case leadCanceled:
				return ctxError(ctx)
			}
			lead = false
		}
		select {
		case <-cl.done:
			return nil
		case <-cl.lead:
			cc.mu.Lock()
			lead = cc.role == roleCaller && cc.leader == cl
			cc.mu.Unlock()
		case <-ctx.Done():
			cc.mu.Lock()
			removed := cc.forgetLocked(cl)
			if cc.role == roleCaller && cc.leader == cl {
				cc.passRoleLocked()
			}
			cc.mu.Unlock()
			if removed {
				e := ctxError(ctx)
				cc.cancelRemote(cl.id, e.Code)
				return e
			}
			<-cl.done // a reader has it: the result is moments away
			return nil
		}
	}
}

// lead reads frames as the holder of the read role until cl's own result is
// in, cl's ctx ends, or a frame needs the background reader.
func (cc *clientConn) lead(ctx context.Context, cl *call) int {
	if ctx.Done() != nil {
		if ctx.Err() != nil {
			return cc.leaderCanceled(ctx, cl)
		}
		cl.leading.Store(cc)
		stop := context.AfterFunc(ctx, cl.onCancel)
		defer func() {
			stop()
			cl.leading.Store(nil)
		}()
	}
	for {
		h, err := cc.r.PeekFrame()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				cc.mu.Lock()
				cc.disarmLocked()
				cc.mu.Unlock()
				if ctx.Err() != nil {
					return cc.leaderCanceled(ctx, cl)
				}
				continue // a stale interrupt meant for an earlier leader
			}
			if err != frame.ErrNotBuffered {
				cc.fail(err) // cl is registered: this delivers its result
				<-cl.done
				return leadDone
			}
		}
		large := err == frame.ErrNotBuffered
		if large && h.Type != frame.TypeStreamData {
			// A frame larger than the buffer is read in place, at the
			// peer's pace; an interrupt now would lose the frame boundary,
			// so a cancel waits until the frame is in (checked below).
			cc.mu.Lock()
			if cc.armed {
				cc.disarmLocked()
				cc.mu.Unlock()
				if ctx.Err() != nil {
					return cc.leaderCanceled(ctx, cl)
				}
				continue
			}
			cc.inFrame = true
			cc.mu.Unlock()
		}
		if h.Type == frame.TypeStreamData {
			cc.mu.Lock()
			cc.disarmLocked()
			cc.leader = nil
			cc.giveBackgroundLocked()
			cc.mu.Unlock()
			return leadPassed
		}
		if _, err := cc.r.ReadHeader(); err != nil {
			cc.fail(err)
			<-cl.done
			return leadDone
		}
		mine, err := cc.handleFrame(h, cl)
		if large {
			cc.mu.Lock()
			cc.inFrame = false
			cc.mu.Unlock()
		}
		if err != nil {
			cc.fail(err)
			if !mine {
				<-cl.done
			}
			return leadDone
		}
		if large && !mine && ctx.Err() != nil {
			return cc.leaderCanceled(ctx, cl)
		}
		if mine {
			cc.mu.Lock()
			cc.passRoleLocked()
			cc.mu.Unlock()
			return leadDone
		}
	}
}

// leaderCanceled ends the lead of a call whose ctx ended.
func (cc *clientConn) leaderCanceled(ctx context.Context, cl *call) int {
	cc.mu.Lock()
	removed := cc.forgetLocked(cl)
	cc.passRoleLocked()
	cc.mu.Unlock()
	if !removed { // the connection failed and delivered a result
		<-cl.done
		return leadDone
	}
	cc.cancelRemote(cl.id, ctxError(ctx).Code)
	return leadCanceled
}

// interrupt ends the wait of leader cl (its ctx ended) with a read deadline.
func (cc *clientConn) interrupt(cl *call) {
	cc.mu.Lock()
	if cc.role == roleCaller && cc.leader == cl && !cc.armed && !cc.inFrame && !cc.closed {
		cc.armed = true
		cc.nc.SetReadDeadline(aLongTimeAgo)
	}
	cc.mu.Unlock()
}

func (cc *clientConn) disarmLocked() {
	if cc.armed {
		cc.armed = false
		cc.nc.SetReadDeadline(time.Time{})
	}
}

// passRoleLocked gives the read role away when the leading caller is done
// with it: to another waiting call, else to the background reader if streams
// are in flight, else to nobody (the background reader takes it when the
// connection stays unread for a tick).
func (cc *clientConn) passRoleLocked() {
	cc.disarmLocked()
	cc.leader = nil
	if cc.closed {
		cc.role = roleNone
		return
	}
	// Prefer a call already waiting in await: one still writing its
	// request would not read until its write is done.
	var next *call
	for _, c := range cc.calls {
		if c.stream == nil && (next == nil || c.waiting && !next.waiting) {
			if next = c; c.waiting {
				break
			}
		}
	}
	if next != nil {
		cc.role, cc.leader = roleCaller, next
		select {
		case next.lead <- struct{}{}:
		default:
		}
		return
	}
	if len(cc.calls) > 0 {
		cc.giveBackgroundLocked()
		return
	}
	cc.role = roleNone
}

func (cc *clientConn) giveBackgroundLocked() {
	cc.role = roleBackground
	select {
	case cc.bgWake <- struct{}{}:
	default:
	}
}

// ensureReader makes sure somebody reads for a call that will not read
// itself (a stream).
func (cc *clientConn) ensureReader() {
	cc.mu.Lock()
	if cc.role == roleNone && !cc.closed {
		cc.giveBackgroundLocked()
	}
	cc.mu.Unlock()
}

// fail closes the connection after a read error.
func (cc *clientConn) fail(err error) {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		cc.close(errConnLost)
	} else {
		cc.close(err)
	}
}

// readLoop is the connection's background reader: it reads whenever it holds
// the read role, and otherwise waits for the role to be given to it or for
// the connection to stay unread for a tick.
func (cc *clientConn) readLoop() {
	defer func() {
		cc.cl.mu.Lock()
		delete(cc.cl.live, cc)
		cc.cl.mu.Unlock()
		cc.cl.conns.Done()
	}()
	t := time.NewTicker(idleTick)
	t.Stop()
	for cc.awaitRole(t) {
		if err := cc.readFrames(); err != nil {
			cc.fail(err)
			return
		}
	}
}

// awaitRole returns true once the background reader holds the read role, or
// false when the connection has closed.
func (cc *clientConn) awaitRole(t *time.Ticker) bool {
	var seen uint32
	var quiet, ticking bool
	tick := idleTick
	defer func() {
		if ticking {
			t.Stop()
		}
	}()
	for {
		cc.mu.Lock()
		if cc.closed {
			cc.mu.Unlock()
			return false
		}
		switch {
		case cc.role == roleBackground:
		case cc.role == roleNone && quiet && cc.leadSeq == seen:
			cc.role = roleBackground
		default:
			next := tick
			if ticking && (cc.role == roleCaller || cc.leadSeq != seen) {
				next = min(2*tick, maxIdleTick) // callers read: back off
			}
			seen, quiet = cc.leadSeq, cc.role == roleNone
			cc.mu.Unlock()
			if !ticking || next != tick {
				tick, ticking = next, true
				t.Reset(tick)
			}
			select {
			case <-t.C:
				cc.looks.Add(1)
			case <-cc.bgWake:
			case <-cc.done:
			}
			continue
		}
		cc.mu.Unlock()
		return true
	}
}

// readFrames reads frames while the background reader holds the read role.
// It returns nil when it lets the role go: after a result, with nothing left
// in flight.
func (cc *clientConn) readFrames() error {
	for {
		h, err := cc.r.ReadHeader()
		if err != nil {
			return err
		}
		if _, err := cc.handleFrame(h, nil); err != nil {
			return err
		}
		switch h.Type {
		case frame.TypeResponse, frame.TypeError, frame.TypeStreamEnd:
			cc.mu.Lock()
			idle := len(cc.calls) == 0 && cc.r.Buffered() == 0
			if idle {
				cc.role = roleNone
			}
			cc.mu.Unlock()
			if idle {
				return nil
			}
		}
	}
}

// handleFrame handles one frame whose header h has been read. self is the
// leading call, if any: when the frame is self's own result, it is filled in
// without a signal and mine is true.
func (cc *clientConn) handleFrame(h frame.Header, self *call) (mine bool, err error) {
	switch h.Type {
	case frame.TypeResponse, frame.TypeStreamEnd:
		if err := cc.r.Discard(int(h.HeadLen)); err != nil {
			return false, err
		}
		cl := cc.take(h.ID)
		if cl == nil {
			return false, cc.r.Discard(int(h.PayloadLen))
		}
		// cl is ours alone now (the connection's close will not see it):
		// whatever happens next, it gets a result here.
		if cl.stream != nil {
			if err := cc.r.Discard(int(h.PayloadLen)); err != nil {
				cl.stream.finish(lostReading(err))
				return false, err
			}
			cl.stream.finish(nil)
			return false, nil
		}
		cl.resp, err = cc.r.ReadPayload(&h, cl.resp)
		if err != nil { // never a cut-off response passed off as the answer
			e := lostReading(err)
			cl.code, cl.msg = e.Code, e.Message
		}
		if cl == self {
			return true, err
		}
		cl.done <- struct{}{}
		return false, err
	case frame.TypeError:
		head, err := cc.r.ReadHead(&h)
		if err != nil {
			return false, err
		}
		msg := string(head)
		details, err := cc.r.ReadPayload(&h, nil)
		if err != nil {
			return false, err
		}
		if h.ID == 0 {
			return false, &Error{Code: Code(h.Aux), Message: "server closed the connection: " + msg, Details: details}
		}
		cl := cc.take(h.ID)
		if cl == nil {
			return false, nil
		}
		cl.code, cl.msg, cl.details, cl.refused = Code(h.Aux), msg, details, h.Flags&frame.FlagRefused != 0
		if cl.stream != nil {
			cl.stream.finish(&Error{Code: cl.code, Message: msg, Details: details, Refused: cl.refused})
			return false, nil
		}
		if cl == self {
			return true, nil
		}
		cl.done <- struct{}{}
	case frame.TypeStreamData:
		if err := cc.r.Discard(int(h.HeadLen)); err != nil {
			return false, err
		}
		cc.mu.Lock()
		cl := cc.calls[h.ID]
		cc.mu.Unlock()
		if cl == nil || cl.stream == nil {
			return false, cc.r.Discard(int(h.PayloadLen))
		}
		item, err := cc.r.ReadPayload(&h, make([]byte, 0, h.PayloadLen))
		if err != nil {
			return false, err
		}
		if err := cl.stream.deliver(item); err != nil {
			return false, err
		}
	case frame.TypeGoAway:
		if err := cc.r.Discard(int(h.HeadLen) + int(h.PayloadLen)); err != nil {
			return false, err
		}
		cc.markDraining()
	case frame.TypePing:
		if err := cc.r.Discard(int(h.HeadLen)); err != nil {
			return false, err
		}
		p, err := cc.r.ReadPayload(&h, nil)
		if err != nil {
			return false, err
		}
		pong := frame.Header{Type: frame.TypePong, Aux: h.Aux}
		cc.w.WriteFrame(&pong, nil, p)
	case frame.TypeRequest, frame.TypeCancel, frame.TypeStreamCredit:
		return false, &Error{Code: ProtocolViolation, Message: "server sent a " + h.Type.String() + " frame, which only clients send"}
	default:
		return false, cc.r.Discard(int(h.HeadLen) + int(h.PayloadLen))
	}
	return false, nil
}

// lostReading is the error of a call whose result could not be read to its
// end: the connection failed in the middle of it.
func lostReading(err error) *Error {
	return &Error{Code: Unavailable, Message: "connection lost while reading the result: " + err.Error(),
		cause: errors.Join(errConnLost, err)}
}

// take removes and returns the call with id, if it is still wanted.
func (cc *clientConn) take(id uint32) *call {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cl := cc.calls[id]
	if cl != nil {
		delete(cc.calls, id)
		cc.closeIfDrainedLocked()
	}
	return cl
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
	cc.mu.Unlock()
	close(cc.done)
	cc.w.Fail(net.ErrClosed)
	cc.nc.Close()
	for _, cl := range calls {
		if cl.stream != nil {
			cl.stream.finish(cc.lostErr())
			continue
		}
		cl.code, cl.msg = e.Code, e.Message
		cl.done <- struct{}{}
	}
}
