package rpc

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
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
	sem      chan struct{} // in-flight slots, sized by the server's limit

	mu       sync.Mutex
	calls    map[uint32]*call
	nextID   uint32
	draining bool // goaway seen: no new calls
	closed   bool
	err      *Error // why it closed
	done     chan struct{}
}

// call is the pooled state of one call in flight.
type call struct {
	id      uint32
	resp    []byte
	head    []byte
	done    chan struct{} // one signal per call (buffered 1)
	code    Code
	msg     string
	details []byte
	refused bool
	stream  *ClientStream
}

var clientCallPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func getCall() *call { return clientCallPool.Get().(*call) }

func putCall(cl *call) {
	cl.resp, cl.details, cl.stream, cl.msg = nil, nil, nil, ""
	cl.code, cl.refused = OK, false
	if cap(cl.head) > 4096 {
		cl.head = nil
	}
	clientCallPool.Put(cl)
}

func (cc *clientConn) usable() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return !cc.closed && !cc.draining
}

func (cc *clientConn) markDraining() {
	cc.mu.Lock()
	cc.draining = true
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
		return cc.lostErr()
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
	if cc.calls[cl.id] == cl {
		delete(cc.calls, cl.id)
		cc.closeIfDrainedLocked()
		return true
	}
	return false
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
		cc.forget(cl)
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
	select {
	case <-cl.done:
	case <-ctx.Done():
		if cc.forget(cl) {
			e := ctxError(ctx)
			cc.cancelRemote(cl.id, e.Code)
			putCall(cl)
			return dst, e
		}
		<-cl.done // the reader has it: the result is moments away
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

// readLoop reads the server's frames until the connection fails.
func (cc *clientConn) readLoop() {
	defer cc.cl.conns.Done()
	err := cc.readFrames()
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		cc.close(errConnLost)
	} else {
		cc.close(err)
	}
}

func (cc *clientConn) readFrames() error {
	for {
		h, err := cc.r.ReadHeader()
		if err != nil {
			return err
		}
		switch h.Type {
		case frame.TypeResponse, frame.TypeStreamEnd:
			if err := cc.r.Discard(int(h.HeadLen)); err != nil {
				return err
			}
			cl := cc.take(h.ID)
			if cl == nil {
				if err := cc.r.Discard(int(h.PayloadLen)); err != nil {
					return err
				}
				continue
			}
			if cl.stream != nil {
				if err := cc.r.Discard(int(h.PayloadLen)); err != nil {
					return err
				}
				cl.stream.finish(nil)
				continue
			}
			cl.resp, err = cc.r.ReadPayload(&h, cl.resp)
			cl.done <- struct{}{}
			if err != nil {
				return err
			}
		case frame.TypeError:
			head, err := cc.r.ReadHead(&h)
			if err != nil {
				return err
			}
			msg := string(head)
			details, err := cc.r.ReadPayload(&h, nil)
			if err != nil {
				return err
			}
			if h.ID == 0 {
				return &Error{Code: Code(h.Aux), Message: "server closed the connection: " + msg, Details: details}
			}
			cl := cc.take(h.ID)
			if cl == nil {
				continue
			}
			cl.code, cl.msg, cl.details, cl.refused = Code(h.Aux), msg, details, h.Flags&frame.FlagRefused != 0
			if cl.stream != nil {
				cl.stream.finish(&Error{Code: cl.code, Message: msg, Details: details, Refused: cl.refused})
				continue
			}
			cl.done <- struct{}{}
		case frame.TypeStreamData:
			if err := cc.r.Discard(int(h.HeadLen)); err != nil {
				return err
			}
			cc.mu.Lock()
			cl := cc.calls[h.ID]
			cc.mu.Unlock()
			if cl == nil || cl.stream == nil {
				if err := cc.r.Discard(int(h.PayloadLen)); err != nil {
					return err
				}
				continue
			}
			item, err := cc.r.ReadPayload(&h, make([]byte, 0, h.PayloadLen))
			if err != nil {
				return err
			}
			cl.stream.deliver(item)
		case frame.TypeGoAway:
			if err := cc.r.Discard(int(h.HeadLen) + int(h.PayloadLen)); err != nil {
				return err
			}
			cc.markDraining()
		case frame.TypePing:
			if err := cc.r.Discard(int(h.HeadLen)); err != nil {
				return err
			}
			p, err := cc.r.ReadPayload(&h, nil)
			if err != nil {
				return err
			}
			pong := frame.Header{Type: frame.TypePong, Aux: h.Aux}
			cc.w.WriteFrame(&pong, nil, p)
		case frame.TypeRequest, frame.TypeCancel:
			return &Error{Code: ProtocolViolation, Message: "server sent a " + h.Type.String() + " frame, which only clients send"}
		default:
			if err := cc.r.Discard(int(h.HeadLen) + int(h.PayloadLen)); err != nil {
				return err
			}
		}
	}
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
