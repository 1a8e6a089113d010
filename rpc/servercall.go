package rpc

import (
	"context"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// Calls: a request read by the connection's reader (onRequest) runs inline or on
// a handler goroutine (dispatch, worker), and run sends its outcome.

// srvCall is a pooled unit of work for a handler goroutine.
type srvCall struct {
	id     uint32
	h      *handler
	ctx    *handlerCtx
	req    []byte
	ndjson bool
	ndID   []byte             // NDJSON request id, as raw JSON
	held   int64              // bytes of the budget this call holds
	cost   int64              // callCost, counted in the server's total while in flight
	desc   [shm.DescSize]byte // a response's or stream item's shared-memory descriptor
	inPl   shmInPlace         // ServerOptions.ShmInPlace: the slots this call reads and writes in place (shm.go)
	inline uint32             // the inline run (c.inline's value) when the reader runs it (frameLoop), else 0
	slot   int32              // call slot k+1 the request came in (shmcalls.go), 0: the socket
	sseq   uint32             // its request sequence
}

var callPool = sync.Pool{New: func() any { return new(srvCall) }}

const maxPooledBuf = 1 << 20

func putSrvCall(c *srvCall) {
	if cap(c.req) > maxPooledBuf {
		c.req = nil
	}
	c.h, c.ctx, c.ndID, c.held, c.cost, c.inline, c.slot = nil, nil, c.ndID[:0], 0, 0, 0, 0
	callPool.Put(c)
}

// onRequest reads a request and starts it on a handler goroutine, or returns
// it for the caller to run inline: a unary call with nothing buffered behind
// it, or with a handler that has been quick lately (handler.quick).
func (c *serverConn) onRequest(h *frame.Header) (*srvCall, error) {
	head, err := c.r.ReadHead(h)
	if err != nil {
		return nil, err
	}
	method, md, err := frame.ParseRequestHead(head)
	if err != nil {
		return nil, err
	}
	hd := c.s.lookup(method)
	var desc []byte // the payload's descriptor when it is in the region
	if h.Flags&shm.FlagShm != 0 {
		if desc, err = c.shmDesc(h); err != nil {
			return nil, err
		}
	}

	c.mu.Lock()
	draining, closed := c.draining, c.closed
	_, dup := c.calls[h.ID]
	n := uint32(len(c.calls))
	c.mu.Unlock()
	if closed {
		return nil, net.ErrClosed
	}
	if dup {
		c.connError(ProtocolViolation, fmt.Errorf("request id %d is already in flight", h.ID))
		return nil, net.ErrClosed
	}
	if n >= c.maxInFlight {
		c.refused(string(method), h.Flags, false, RefusedInFlight, ResourceExhausted)
		c.connError(ResourceExhausted, fmt.Errorf("more than %d calls in flight on one connection", c.maxInFlight))
		return nil, net.ErrClosed
	}
	var refuse *Error
	switch {
	case draining && (hd == nil || !hd.std):
		refuse = &Error{Code: Unavailable, Message: "server is shutting down; call not processed", Refused: true}
	case hd == nil:
		refuse = Errorf(Unimplemented, "unknown method %q", method)
	case h.Flags&frame.FlagClientStream != 0 && h.PayloadLen != 0:
		c.connError(ProtocolViolation, fmt.Errorf("client-stream request for call %d carries a %d-byte payload; it must be empty", h.ID, h.PayloadLen))
		return nil, net.ErrClosed
	case h.Flags&(frame.FlagStream|frame.FlagClientStream) != 0 || hd.unary == nil:
		refuse = kindMismatch(string(method), hd, h.Flags)
	}
	if refuse != nil {
		c.refused(string(method), h.Flags, false, refusalOf(hd, refuse), refuse.Code)
		if desc != nil {
			if _, err := c.shmTakeRequest(desc, nil, false); err != nil {
				return nil, err
			}
		} else if err := c.r.Discard(int(h.PayloadLen)); err != nil {
			return nil, err
		}
		c.writeError(h.ID, refuse)
		return nil, nil
	}
	size := int64(h.PayloadLen)
	if desc != nil {
		size = int64(shmLen(desc))
	}

	// The budget first, then a pooled call: a pooled call's buffer may be
	// as large as a payload (up to 1 MiB), so taking one before waiting for
	// the budget held that much per waiting reader, uncounted (400
	// never-reading clients: 224 MB live, mostly such buffers).
	c.acquire(size)
	call := callPool.Get().(*srvCall)
	call.id, call.h, call.ndjson = h.ID, hd, false
	hc := c.newHandlerCtx(hd.name)
	if frame.HasAppMetadata(md) { // not for a large payload's :pad alone
		hc.mdRaw = append([]byte(nil), md...)
	}
	if hd.stream != nil || hd.bidi != nil { // stream credit is part of v1 (protocol/spec.md, 4.1)
		hc.credit.Store(frame.InitialStreamCredit)
		hc.creditWake = make(chan struct{}, 1)
	}
	if hd.clientStreams() {
		hc.in = &reqInbox{c: c, id: h.ID, h: hd, wake: make(chan struct{}, 1)}
	}
	call.ctx = hc
	call.held = size
	if desc != nil && c.s.opts.ShmInPlace {
		call.req, err = c.shmRequestInPlace(desc, call)
	} else if desc != nil {
		call.req, err = c.shmTakeRequest(desc, call.req[:0], true)
	} else {
		call.req, err = c.r.ReadPayload(h, call.req[:0])
	}
	if err != nil {
		c.release(call.held)
		putSrvCall(call)
		return nil, err
	}
	c.register(h.ID, hc, call, h.Aux)
	if hd.unary != nil && (c.r.Buffered() == 0 || hd.quick()) {
		return call, nil
	}
	c.dispatch(call)
	return nil, nil
}

// dispatch hands call to an idle handler goroutine, or starts one.
func (c *serverConn) dispatch(call *srvCall) {
	select {
	case c.work <- call:
	default:
		c.workers.Add(1)
		go c.worker(call)
	}
}

// maxIdleWorkers is how many handler goroutines a connection keeps parked
// for the next call; more retire as they finish, so a burst of concurrent
// (or canceled) calls leaves no crowd of idle goroutines behind.
const maxIdleWorkers = 8

func (c *serverConn) worker(call *srvCall) {
	defer c.workers.Done()
	var dst []byte
	for {
		dst = c.run(call, dst, false, true)
		if cap(dst) > maxPooledBuf {
			dst = nil
		}
		if c.idleWorkers.Add(1) > maxIdleWorkers {
			c.idleWorkers.Add(-1)
			return
		}
		var ok bool
		call, ok = <-c.work
		c.idleWorkers.Add(-1)
		if !ok {
			return
		}
	}
}

// run executes one call and sends its outcome. With queue (the reader runs
// it inline with more requests buffered) a response is only queued on the
// writer: the reader pushes it out before it next waits (frameLoop). timed:
// the handler's run is timed for its cost estimate (handler.noteCost).
func (c *serverConn) run(call *srvCall, dst []byte, queue, timed bool) []byte {
	hc := call.ctx
	var out []byte
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				c.s.log.Error("rpc: handler panicked", "method", hc.method, "panic", p, "stack", string(debug.Stack()))
				err = Errorf(Internal, "handler for %q panicked: %v", hc.method, p)
			}
		}()
		if call.h.clientStreams() {
			out, err = c.runClientStream(call, dst)
		} else if call.h.stream != nil && !call.ndjson {
			send := func(item []byte) error { return c.sendItem(call, item) }
			if ic := c.s.streamIC; ic != nil {
				err = ic(hc, callInfo(hc, true, false), call.req, send, call.h.stream)
			} else {
				err = call.h.stream(hc, call.req, send)
			}
		} else {
			var start time.Duration
			if timed {
				start = time.Since(epoch)
			}
			hdst := dst[:0]
			if call.inPl.area {
				hdst = call.inPl.outSl[:0] // the call slot's payload area of our half (shmAreaInPlace)
			} else if call.inPl.req && !call.ndjson {
				hdst = c.shmResponseSlot(call, hdst)
			}
			if ic := c.s.unaryIC; ic != nil {
				out, err = ic(hc, callInfo(hc, false, call.ndjson), call.req, hdst, call.h.unary)
			} else {
				out, err = call.h.unary(hc, call.req, hdst)
			}
			if timed {
				call.h.noteCost(time.Since(epoch) - start)
			}
		}
	}()
	// A response made apart from the request is held until written (hold's
	// work, in the critical section below).
	var made int64
	if len(out) > 0 && !overlaps(out, call.req) {
		made = int64(len(out))
		call.held += made
	}
	// The call leaves the table of calls before its answer is written: the
	// client counts a call in flight only until its answer arrives, and may
	// then send the next one at once (up to the server's max in-flight) or
	// reuse the id (protocol/spec.md, 4), so the table, which onRequest
	// checks both against, holds unanswered calls only. answering counts
	// the answers being written: a drain waits for those too.
	c.mu.Lock()
	c.held += made
	delete(c.calls, call.id)
	c.answering++
	c.mu.Unlock()
	if made != 0 {
		c.s.held.Add(made)
	}
	if call.slot != 0 {
		c.answerSlot(call, out, err)
	} else if call.ndjson {
		c.ndjsonReply(call, out, err)
	} else if !hc.canceled() {
		switch {
		case err != nil:
			c.writeError(call.id, toError(err))
		case call.h.stream != nil || call.h.bidi != nil:
			head := hc.responseHead()
			h := frame.Header{Type: frame.TypeStreamEnd, ID: call.id, HeadLen: uint16(len(head))}
			c.w.WriteFrame(&h, head, nil)
		default:
			if uint32(len(out)) > c.maxFrame {
				c.writeError(call.id, Errorf(ResourceExhausted, "response of %d bytes is over the max frame %d", len(out), c.maxFrame))
			} else {
				head := hc.responseHead()
				h := frame.Header{Type: frame.TypeResponse, ID: call.id, HeadLen: uint16(len(head))}
				payload := out
				if call.inPl.out && c.shmOutInPlace(call, out, &h) {
					payload = call.desc[:]
				} else if c.shmDstDone(call, out) && c.shm.use(len(out)) {
					if in, err := c.shmPutAnswer(hc, out, &call.desc, call.inline); err != nil {
						break // the call ended (its ctx) or the connection did: nothing to answer
					} else if in {
						payload, h.Flags = call.desc[:], shm.FlagShm
					}
				}
				if h.Flags&shm.FlagShm != 0 || !overlaps(payload, call.inPl.reqSlot) {
					c.shmReleaseRequest(call, false) // goes out with the answer
				} // else the answer is written from the request's slot: released after (shmEndCall)
				if queue {
					c.w.QueueFrame(&h, head, payload)
				} else {
					c.w.WriteFrame(&h, head, payload)
				}
			}
		}
	}
	regionOut := c.shmEndCall(call, out, !queue)
	// One critical section ends the call: its answer is out, it gives its
	// budget back (release, budget.go) and may end a drain.
	held := call.held
	call.held = 0
	if held+call.cost != 0 {
		c.s.held.Add(-held - call.cost)
		call.cost = 0
	}
	c.mu.Lock()
	c.answering--
	if c.inFlightLocked() == 0 && c.noCalls != nil {
		close(c.noCalls)
		c.noCalls = nil
	}
	c.held -= held
	// Only a reader waiting for budget needs the wake-up: it announces
	// itself (stalled; the call-slot poller slotStalled) under mu before it
	// waits (acquire, acquireSlot, waitServerBudget),
	// so seeing it unset here means it will see the bytes given back.
	wake := held != 0 && (c.stalled.Load() || c.slotStalled.Load())
	c.closeIfDrainedLocked()
	c.mu.Unlock()
	if wake {
		c.wakeBudget()
	}
	hc.cancel(errHandlerDone)
	if hc.in != nil {
		hc.in.close()
	}
	if out != nil && !regionOut && cap(out) >= cap(dst) && !overlaps(out, call.req) {
		dst = out[:0]
	}
	putSrvCall(call)
	return dst
}

// overlaps reports whether a and b share memory: a handler that answers with
// req itself (an echo, a prefix of the request) returns a slice of the
// pooled request buffer, which must not also become the next call's dst.
func overlaps(a, b []byte) bool {
	if cap(a) == 0 || cap(b) == 0 {
		return false
	}
	a0 := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(cap(b)) && b0 < a0+uintptr(cap(a))
}

// sendItem sends one item of a stream call, within its stream credit
// (protocol/spec.md, 4.1: every stream has it, so creditWake is set).
func (c *serverConn) sendItem(call *srvCall, item []byte) error {
	id, hc := call.id, call.ctx
	if hc.in != nil {
		hc.in.settle() // it sends now
	}
	if err := hc.Err(); err != nil {
		return err
	}
	if uint32(len(item)) > c.maxFrame {
		return Errorf(ResourceExhausted, "stream item of %d bytes is over the max frame %d", len(item), c.maxFrame)
	}
	if call.slot != 0 { // a stream slot (shmstreams.go)
		return c.slotCalls.streams.send(call, item)
	}
	if hc.credit.Load() <= 0 && call.held > 0 {
		// Waiting on the client: hold no budget, so that the reader is
		// free to read the credit (budget.go).
		c.release(call.held)
		call.held = 0
	}
	if hc.credit.Load() <= 0 && hc.in != nil {
		hc.in.dropRole() // the credit must be read while this waits (bidi_lead.go)
	}
	for hc.credit.Load() <= 0 { // the client has not taken what it has
		select {
		case <-hc.creditWake:
		case <-hc.Done():
			return hc.Err()
		}
	}
	hc.credit.Add(-int64(len(item) + frame.HeaderSize)) // empty items are not free
	h := frame.Header{Type: frame.TypeStreamData, ID: id}
	if c.shm.use(len(item)) {
		if !c.shm.tryPut(item, &call.desc) {
			// Waiting for the client's releases, as for its credit: hold
			// no budget and not the read role, so that the reader is free
			// to read them (budget.go; TestShmStreamItemsWhileReaderHeld).
			if call.held > 0 {
				c.release(call.held)
				call.held = 0
			}
			if hc.in != nil {
				hc.in.dropRole()
			}
			if err := c.shm.put(hc, item, &call.desc); err != nil {
				if e := hc.Err(); e != nil {
					return e
				}
				return err
			}
		}
		item, h.Flags = call.desc[:], shm.FlagShm
	}
	// While other bidi handlers were handed items and are about to send
	// theirs, they run first and their items join this write
	// (serverConn.owed).
	return c.owed.gather(c.w, &h, item)
}

func (c *serverConn) writeError(id uint32, e *Error) {
	h := frame.Header{Type: frame.TypeError, ID: id, Aux: uint32(e.Code)}
	if e.Code == OK {
		h.Aux = uint32(Unknown)
	}
	if e.Refused {
		h.Flags |= frame.FlagRefused
	}
	msg := e.Message
	if len(msg) > frame.MaxHead {
		msg = msg[:frame.MaxHead]
	}
	details := e.Details
	if uint32(len(details)) > c.maxFrame {
		details = nil
	}
	c.w.WriteFrame(&h, []byte(msg), details)
}

// register counts call in the server's total, arms its deadline (auxUS
// microseconds from now, none if 0) and makes it findable by id for cancel
// frames; the socket and the call-slot paths take a call in the same way.
func (c *serverConn) register(id uint32, hc *handlerCtx, call *srvCall, auxUS uint32) {
	call.cost = callCost
	c.s.held.Add(callCost)
	if auxUS != 0 {
		d := time.Duration(auxUS) * time.Microsecond
		hc.deadline = time.Now().Add(d)
		hc.mu.Lock()
		hc.timer = time.AfterFunc(d, func() { hc.cancel(context.DeadlineExceeded) })
		hc.mu.Unlock()
	}
	c.mu.Lock()
	c.calls[id] = hc
	c.mu.Unlock()
}
