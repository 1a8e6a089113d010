package rpc

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
	"google.golang.org/protobuf/proto"
)

// Client-streaming and bidirectional calls on the server (protocol/spec.md,
// section 4.3). A call opened with the client_stream request flag gets a
// reqInbox: the connection's reader queues the call's request_data items in
// it, and the handler takes them with recv. The client may send 1 MiB (plus
// one item) of items beyond what the handler has taken; recv grants what it
// takes back with request_credit frames, so a handler that stops reading
// stalls only its own call, and its queue stays within that bound.

// RawBidiHandler serves a bidirectional call. recv returns the next request
// item (the handler owns it), io.EOF once the client has sent request_end
// (or shut down its side of the connection), or the call's *Error when it was
// canceled or its deadline passed. send sends one response item (it copies
// the item out before returning) and waits for stream credit like a server
// stream's. Returning nil ends the call with stream_end, an error with an
// error frame; the handler may return before it has read every item.
// recv and send may be called from different goroutines, but neither from two
// at once.
type RawBidiHandler func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error

// RawClientStreamHandler serves a client-streaming call: it reads the items
// with recv (as RawBidiHandler's) and then appends its one response to dst
// and returns it.
type RawClientStreamHandler func(ctx context.Context, recv func() ([]byte, error), dst []byte) ([]byte, error)

// HandleRawBidi registers a bidirectional raw handler for method.
func (s *Server) HandleRawBidi(method string, h RawBidiHandler) {
	s.register(&handler{name: method, bidi: h, codec: "raw"})
}

// HandleRawBidiView registers a bidirectional raw handler for method whose
// recv lends its items: an item is valid only until the next recv, which
// reads the next item into its buffer (no allocation per item). A handler
// that keeps an item longer copies it; one that sends it back before its
// next recv (send copies it out) need not. HandleRawBidi's recv gives the
// handler each item to keep.
func (s *Server) HandleRawBidiView(method string, h RawBidiHandler) {
	s.register(&handler{name: method, bidi: h, lends: true, codec: "raw"})
}

// HandleRawClientStreamView registers a client-streaming raw handler for
// method whose recv lends its items, as HandleRawBidiView's.
func (s *Server) HandleRawClientStreamView(method string, h RawClientStreamHandler) {
	s.register(&handler{name: method, cstream: h, lends: true, codec: "raw"})
}

// HandleRawClientStream registers a client-streaming raw handler for method.
func (s *Server) HandleRawClientStream(method string, h RawClientStreamHandler) {
	s.register(&handler{name: method, cstream: h, codec: "raw"})
}

// HandleJSONBidi registers a bidirectional handler whose request and response
// items are JSON. recv returns io.EOF after the client's last item; an item
// that does not decode as Req fails recv with InvalidArgument.
func HandleJSONBidi[Req, Resp any](s *Server, method string, h func(ctx context.Context, recv func() (Req, error), send func(Resp) error) error) {
	s.register(&handler{name: method, lends: true, codec: "json", bidi: func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		var buf []byte
		return h(ctx, typedRecv[Req](method, JSON, recv), func(it Resp) error {
			b, err := JSON.Marshal(buf[:0], it)
			if err != nil {
				return err
			}
			buf = b
			return send(b)
		})
	}})
}

// HandleJSONClientStream registers a client-streaming handler with JSON
// request items and a JSON response.
func HandleJSONClientStream[Req, Resp any](s *Server, method string, h func(ctx context.Context, recv func() (Req, error)) (Resp, error)) {
	s.register(&handler{name: method, lends: true, codec: "json", cstream: func(ctx context.Context, recv func() ([]byte, error), dst []byte) ([]byte, error) {
		resp, err := h(ctx, typedRecv[Req](method, JSON, recv))
		if err != nil {
			return nil, err
		}
		return JSON.Marshal(dst, resp)
	}})
}

// HandleProtoBidi registers a bidirectional handler for protobuf messages.
// PReq is the pointer type of Req (inferred from h).
func HandleProtoBidi[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](s *Server, method string, h func(ctx context.Context, recv func() (PReq, error), send func(Resp) error) error) {
	s.register(&handler{name: method, lends: true, codec: "proto", bidi: func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		var buf []byte
		return h(ctx, protoRecv[Req, PReq](method, recv), func(it Resp) error {
			b, err := proto.MarshalOptions{}.MarshalAppend(buf[:0], it)
			if err != nil {
				return err
			}
			buf = b
			return send(b)
		})
	}})
}

// HandleProtoClientStream registers a client-streaming handler for protobuf
// messages.
func HandleProtoClientStream[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](s *Server, method string, h func(ctx context.Context, recv func() (PReq, error)) (Resp, error)) {
	s.register(&handler{name: method, lends: true, codec: "proto", cstream: func(ctx context.Context, recv func() ([]byte, error), dst []byte) ([]byte, error) {
		resp, err := h(ctx, protoRecv[Req, PReq](method, recv))
		if err != nil {
			return nil, err
		}
		return proto.MarshalOptions{}.MarshalAppend(dst, resp)
	}})
}

func typedRecv[Req any](method string, codec Codec, recv func() ([]byte, error)) func() (Req, error) {
	return func() (Req, error) {
		var req Req
		b, err := recv()
		if err != nil {
			return req, err
		}
		if err := codec.Unmarshal(b, &req); err != nil {
			return req, Errorf(InvalidArgument, "decode %s request item as %s: %v", method, codec.Name(), err)
		}
		return req, nil
	}
}

func protoRecv[Req any, PReq interface {
	*Req
	proto.Message
}](method string, recv func() ([]byte, error)) func() (PReq, error) {
	return func() (PReq, error) {
		b, err := recv()
		if err != nil {
			return nil, err
		}
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return nil, Errorf(InvalidArgument, "decode %s request item as protobuf: %v", method, err)
		}
		return req, nil
	}
}

// kind names a handler's call kind as udskit.methods lists it.
func (h *handler) kind() string {
	switch {
	case h.stream != nil:
		return "stream"
	case h.bidi != nil:
		return "bidi"
	case h.cstream != nil:
		return "client_stream"
	}
	return "unary"
}

// clientStreams reports whether h reads request items (a bidi or
// client-streaming handler).
func (h *handler) clientStreams() bool { return h.bidi != nil || h.cstream != nil }

// kindMismatch returns the refusal of a request with flags for h, nil when
// they match (protocol/spec.md, 4 and 4.3).
func kindMismatch(method string, h *handler, flags uint8) *Error {
	stream, cs := flags&frame.FlagStream != 0, flags&frame.FlagClientStream != 0
	var ok bool
	switch {
	case h.unary != nil:
		ok = !stream && !cs
	case h.stream != nil:
		ok = stream && !cs
	case h.bidi != nil:
		ok = stream && cs
	case h.cstream != nil:
		ok = !stream && cs
	}
	if ok {
		return nil
	}
	switch {
	case h.unary != nil && cs:
		return Errorf(Unimplemented, "method %q %s; call it with Call, not as a client or bidirectional stream", method, unaryWords)
	case h.stream != nil && cs:
		return Errorf(Unimplemented, "method %q %s; call it with Stream, not as a client or bidirectional stream", method, streamingWords)
	case h.unary != nil || h.stream != nil:
		return wrongKind(method, stream, false)
	case h.bidi != nil:
		return Errorf(Unimplemented, "method %q %s; open it with Bidi", method, bidiWords)
	}
	return Errorf(Unimplemented, "method %q %s; open it with ClientStreaming", method, clientStreamWords)
}

// reqInbox holds a client-stream call's request items between the
// connection's reader and the handler.
type reqInbox struct {
	c  *serverConn
	id uint32
	h  *handler

	mu     sync.Mutex
	q      [][]byte
	head   int   // q[head:] are waiting
	queued int64 // bytes in q (counted in the server's total budget)
	// outstanding is the cost of the items received and not yet granted
	// back: the bound a client must keep to.
	outstanding int64
	ended       bool          // request_end (or EOF) seen
	done        bool          // the call is over: items are dropped
	wake        chan struct{} // (buffered 1) an item or the end arrived, or the ctx ended

	// The read role (bidi_lead.go), under mu: waiting says recv is parked
	// for an item; role is the inline state (serverConn.inline) of the
	// read role the reader passed to this call's handler, 0 if it holds
	// none; leading (atomic) says recv reads the socket now.
	waiting bool
	role    uint32
	leading atomic.Bool
	// owed: a bidi handler was handed an item (put) and has not yet sent,
	// waited in recv or ended (counted in c.owed; owe and settle).
	owed owedMark

	// recv's own, for the handler's cost estimate (bidi_lead.go): busy is
	// when recv returned a timed item (since epoch; 0: not timing), n
	// counts the items it returned.
	busy time.Duration
	n    uint32

	toGrant int64 // recv's own: cost taken since the last grant
	// lent (recv's own) is the item recv lent a handler that decodes it
	// before its next recv (handler.lends); the next recv gives it back as
	// spare (mu), the buffer the reader reads the call's next item into.
	lent  []byte
	spare []byte
	// slot is the call's stream slot (shmstreams.go), nil on the socket.
	slot *srvStream
}

// itemBuf returns the buffer the reader reads a request item of n bytes
// into: the spare one when it is large enough, else a new one.
func (in *reqInbox) itemBuf(n uint32) []byte {
	in.mu.Lock()
	b := in.spare
	if cap(b) >= int(n) {
		in.spare = nil
		in.mu.Unlock()
		return b[:0]
	}
	in.mu.Unlock()
	return make([]byte, 0, n)
}

// requestGrantEvery is how much credit recv takes before it grants it back.
const requestGrantEvery = frame.InitialRequestCredit / 2

// put queues an item the reader read; it fails (a connection error) when the
// client overran its credit.
func (in *reqInbox) put(item []byte) error {
	cost := int64(len(item) + frame.HeaderSize)
	in.mu.Lock()
	if in.done {
		in.mu.Unlock()
		return nil
	}
	in.outstanding += cost
	if limit := int64(frame.InitialRequestCredit) + int64(in.c.maxFrame) + frame.HeaderSize; in.outstanding > limit {
		over := in.outstanding - limit
		in.mu.Unlock()
		return fmt.Errorf("client sent %d bytes of request items on call %d beyond the credit it was given", over, in.id)
	}
	in.q = append(in.q, item)
	in.queued += int64(len(item))
	if in.h.bidi != nil && in.slot == nil {
		in.owe() // under mu, not once done: close settles after it set done
	}
	in.mu.Unlock()
	in.c.s.held.Add(int64(len(item)))
	in.signal()
	return nil
}

// owe marks a bidi call whose handler was just handed an item: it is
// likely about to send one (the reader's, in put).
func (in *reqInbox) owe() {
	in.c.owed.owe(&in.owed)
}

// settle ends in's owed mark: its handler sends now, waits in recv, or the
// call has ended.
func (in *reqInbox) settle() {
	in.c.owed.settle(&in.owed)
}

func (in *reqInbox) signal() {
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// end marks the client's request_end.
func (in *reqInbox) end() {
	in.mu.Lock()
	in.ended = true
	in.mu.Unlock()
	in.signal()
}

// close drops what is left when the call is over and gives its bytes back.
func (in *reqInbox) close() {
	in.mu.Lock()
	in.done = true
	n := in.queued
	in.q, in.head, in.queued = nil, 0, 0
	in.mu.Unlock()
	in.settle()
	if n != 0 {
		in.c.s.held.Add(-n)
	}
}

// recv is the handler's: the next item, io.EOF after request_end, or the
// call's end as an *Error. When the handler holds the connection's read role
// (bidi_lead.go) recv reads the socket itself until its item comes; every
// other way out of recv gives the role back.
func (in *reqInbox) recv(hc *handlerCtx, lend bool) ([]byte, error) {
	if in.busy != 0 { // the handler's time with its last item
		in.h.noteCost(time.Since(epoch) - in.busy)
		in.busy = 0
	}
	if b := in.lent; b != nil {
		in.lent = nil
		if cap(b) <= maxSpare {
			in.mu.Lock()
			in.spare = b[:0]
			in.mu.Unlock()
		}
	}
	for {
		if hc.Err() != nil { // canceled, deadline, or the call is over
			in.dropRole()
			return nil, ctxError(hc)
		}
		in.mu.Lock()
		if in.head < len(in.q) {
			it := in.q[in.head]
			in.q[in.head] = nil
			in.head++
			if in.head == len(in.q) {
				in.q, in.head = in.q[:0], 0
			}
			in.queued -= int64(len(it))
			in.mu.Unlock()
			in.c.s.held.Add(-int64(len(it)))
			if in.toGrant += int64(len(it) + frame.HeaderSize); in.toGrant >= requestGrantEvery {
				in.grant()
			}
			if lend && cap(it) > 0 {
				in.lent = it
			}
			if in.n++; !in.h.leadable() || in.n%untimedRuns == 0 {
				in.busy = time.Since(epoch)
			}
			return it, nil // (a role it holds stays: the handler is busy with it)
		}
		ended, done := in.ended, in.done
		role := in.role
		in.role = 0
		in.waiting = role == 0 && !ended && !done
		in.settle() // it waits (or ends): not about to send; under mu, as put marks
		in.mu.Unlock()
		if ended || done {
			in.c.releaseRole(role)
			return nil, io.EOF
		}
		if role != 0 {
			in.c.lead(in, hc, role) // reads until its item, its end, or it steps aside
			continue
		}
		if ss := in.slot; ss != nil && ss.look() { // a stream slot: it takes its next item itself (shmstreams.go)
			in.mu.Lock()
			in.waiting = false
			in.mu.Unlock()
			continue
		}
		<-in.wake // an item, the end, or hc's end (handlerCtx.cancel)
		in.mu.Lock()
		in.waiting = false
		in.mu.Unlock()
	}
}

// grant gives the credit recv has taken back to the client.
func (in *reqInbox) grant() {
	n := in.toGrant
	in.toGrant = 0
	if ss := in.slot; ss != nil {
		ss.granted(in, n)
		return
	}
	in.mu.Lock()
	in.outstanding -= n
	done := in.done
	in.mu.Unlock()
	if done {
		return
	}
	h := frame.Header{Type: frame.TypeRequestCredit, ID: in.id, Aux: uint32(n)}
	in.c.w.WriteFrame(&h, nil, nil)
}

// onRequestItem handles a request_data or request_end frame (the reader's).
// It returns the inbox of the call the frame was for (nil: a call no longer
// in flight), and ok false when the read loop must end (the error is
// handled).
func (c *serverConn) onRequestItem(h *frame.Header) (_ *reqInbox, ok bool) {
	if err := c.r.Discard(int(h.HeadLen)); err != nil {
		c.readFailed(err)
		return nil, false
	}
	c.mu.Lock()
	hc := c.calls[h.ID]
	c.mu.Unlock()
	var in *reqInbox
	if hc != nil {
		in = hc.in
		if in == nil {
			c.connError(ProtocolViolation, fmt.Errorf("client sent %s for call %d, which was not opened with the client_stream flag", h.Type, h.ID))
			return nil, false
		}
		in.mu.Lock()
		ended := in.ended
		in.mu.Unlock()
		if ended {
			c.connError(ProtocolViolation, fmt.Errorf("client sent %s for call %d after its request_end", h.Type, h.ID))
			return nil, false
		}
	}
	if h.Type == frame.TypeRequestEnd || in == nil {
		// A call that already ended (or never was) ignores what races
		// with its end.
		if err := c.r.Discard(int(h.PayloadLen)); err != nil {
			c.readFailed(err)
			return nil, false
		}
		if in != nil {
			in.end()
		}
		return in, true
	}
	item, err := c.r.ReadPayload(h, in.itemBuf(h.PayloadLen))
	if err != nil {
		c.readFailed(err)
		return nil, false
	}
	if err := in.put(item); err != nil {
		c.connError(ProtocolViolation, err)
		return nil, false
	}
	return in, true
}

// endRequestItems treats the client's end of stream as request_end for every
// open client-stream call (protocol/spec.md, 4.3).
func (c *serverConn) endRequestItems() {
	c.mu.Lock()
	var ins []*reqInbox
	for _, hc := range c.calls {
		// (Not a stream-slot call: its items and request_end come in its
		// slot, unordered with the socket, spec 10.9.)
		if hc.in != nil && hc.in.slot == nil {
			ins = append(ins, hc.in)
		}
	}
	c.mu.Unlock()
	for _, in := range ins {
		in.end()
	}
}

// runClientStream runs a bidi or client-streaming handler (run's work for
// those kinds).
func (c *serverConn) runClientStream(call *srvCall, dst []byte) ([]byte, error) {
	hc := call.ctx
	in := hc.in
	defer in.dropRole() // a handler that returns holding the read role gives it back
	lend := call.h.lends
	recv := func() ([]byte, error) { return in.recv(hc, lend) }
	if h := call.h.bidi; h != nil {
		send := func(item []byte) error { return c.sendItem(call, item) }
		if ic := c.s.streamIC; ic != nil {
			return nil, ic(hc, CallInfo{Method: hc.method, Stream: true, ClientStream: true, Cred: hc.cred, HasCred: hc.hasCred}, nil, send,
				func(ctx context.Context, _ []byte, send func([]byte) error) error { return h(ctx, recv, send) })
		}
		return nil, h(hc, recv, send)
	}
	h := call.h.cstream
	if ic := c.s.unaryIC; ic != nil {
		return ic(hc, CallInfo{Method: hc.method, ClientStream: true, Cred: hc.cred, HasCred: hc.hasCred}, nil, dst[:0],
			func(ctx context.Context, _, dst []byte) ([]byte, error) { return h(ctx, recv, dst) })
	}
	return h(hc, recv, dst[:0])
}
