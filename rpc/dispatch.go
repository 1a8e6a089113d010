package rpc

import (
	"errors"
	"sync"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// handleFrame handles one frame whose header h has been read. self is the
// leading call, if any: when the frame is self's own result, it is filled in
// without a signal and mine is true.
func (cc *clientConn) handleFrame(h frame.Header, self *call) (mine bool, err error) {
	mine, err = cc.handleFrame1(h, self)
	if cc.shmPending && !cc.r.FrameBuffered() { // shm releases go out before the reader waits
		cc.shmPending = false
		cc.w.Push()
	}
	return mine, err
}

func (cc *clientConn) handleFrame1(h frame.Header, self *call) (mine bool, err error) {
	switch h.Type {
	case frame.TypeResponse, frame.TypeStreamEnd:
		// The head is response metadata (spec 3.1): read only when the
		// server sent some, which costs nothing otherwise.
		var md Metadata
		if h.HeadLen != 0 {
			head, err := cc.r.ReadHead(&h)
			if err != nil {
				return false, err
			}
			if frame.HasAppMetadata(head) { // not for a large payload's :pad alone
				md = parseMD(head)
			}
		}
		if h.Type == frame.TypeResponse && h.Flags&shm.FlagShm != 0 {
			return cc.shmResponse(h, self, md)
		}
		if h.Type == frame.TypeResponse && int(h.PayloadLen) > cc.r.Buffered() && cc.cancelableCall(h.ID) {
			return cc.largeResponse(h, self, md)
		}
		cl := cc.take(h.ID)
		if cl == nil {
			return false, cc.r.Discard(int(h.PayloadLen))
		}
		if cl.mdSink != nil {
			*cl.mdSink = md
		}
		// cl is ours alone now (the connection's close will not see it):
		// whatever happens next, it gets a result here.
		if cl.stream != nil {
			if tx := cl.stream.tx; tx != nil && tx.single && h.Type == frame.TypeResponse {
				// A client-streaming call's one response (bidi_client.go).
				item, err := cc.r.ReadPayload(&h, make([]byte, 0, h.PayloadLen))
				if err != nil {
					cl.stream.finish(lostReading(err))
					return false, err
				}
				cl.stream.deliverResponse(item)
				cl.stream.finish(nil)
				return false, nil
			}
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
		var item []byte
		if h.Flags&shm.FlagShm != 0 {
			var err error
			if item, err = cc.shmTake(h, cl != nil && cl.stream != nil); err != nil {
				return false, err
			}
			if cl == nil || cl.stream == nil {
				return false, nil // released unread
			}
		}
		if cl == nil || cl.stream == nil {
			return false, cc.r.Discard(int(h.PayloadLen))
		}
		if h.Flags&shm.FlagShm == 0 {
			var err error
			if item, err = cc.r.ReadPayload(&h, cl.stream.itemBuf(h.PayloadLen)); err != nil {
				return false, err
			}
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
	case frame.Type(shm.TypeRelease):
		return false, cc.shmRelease(h)
	case frame.Type(shm.TypeOffer):
		return false, shmViolation(&shm.Error{Name: shm.NameBadOffer, Detail: "a shm_offer after the handshake"})
	case frame.TypeRequestCredit:
		if err := cc.r.Discard(int(h.HeadLen) + int(h.PayloadLen)); err != nil {
			return false, err
		}
		cc.mu.Lock()
		cl := cc.calls[h.ID]
		cc.mu.Unlock()
		if cl != nil && cl.stream != nil && cl.stream.tx != nil {
			cl.stream.tx.addCredit(h.Aux)
		}
	case frame.TypeRequest, frame.TypeCancel, frame.TypeStreamCredit, frame.TypeRequestData, frame.TypeRequestEnd:
		return false, &Error{Code: ProtocolViolation, Message: "server sent a " + h.Type.String() + " frame, which only clients send"}
	default:
		return false, cc.r.Discard(int(h.HeadLen) + int(h.PayloadLen))
	}
	return false, nil
}

// cancelableCall reports whether call id is in flight with a ctx that can
// end.
func (cc *clientConn) cancelableCall(id uint32) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cl := cc.calls[id]
	return cl != nil && cl.cancelable
}

// largeResponse reads a response payload that is not buffered yet aside,
// before its call is taken: until then the caller may still leave at its
// deadline (taken, it waits for its result), so a server that dribbles a
// 16 MiB response holds no caller past its ctx. The payload is then copied
// into the call's buffer (one copy, for cancelable calls with responses
// over the read buffer only).
func (cc *clientConn) largeResponse(h frame.Header, self *call, md Metadata) (mine bool, err error) {
	bp := asidePool.Get().(*[]byte)
	defer func() {
		if cap(*bp) > maxAside {
			*bp = nil
		}
		asidePool.Put(bp)
	}()
	*bp, err = cc.r.ReadPayload(&h, (*bp)[:0])
	if err != nil {
		return false, err // the connection fails; the call gets its error from close
	}
	cl := cc.take(h.ID)
	if cl == nil {
		return false, nil // its caller left meanwhile
	}
	if cl.mdSink != nil {
		*cl.mdSink = md
	}
	cl.resp = append(cl.resp, *bp...)
	if cl == self {
		return true, nil
	}
	cl.done <- struct{}{}
	return false, nil
}

// asidePool holds largeResponse's buffers, up to maxAside bytes each.
var asidePool = sync.Pool{New: func() any { return new([]byte) }}

const maxAside = 1 << 20

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
		cl.inCalls = false
		cc.removedLocked(cl)
		cc.closeIfDrainedLocked()
	}
	return cl
}
