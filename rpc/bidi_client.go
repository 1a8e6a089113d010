package rpc

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/udskit/udskit/frame"
	"google.golang.org/protobuf/proto"
)

// BidiStream is the client's side of a bidirectional or client-streaming
// call (protocol/spec.md, section 4.3): Send and CloseSend write the request
// items, the embedded *ClientStream reads the server's (Recv, RecvRaw,
// OnDone, Close).
//
// Flow control runs both ways: Send waits while the call has no request
// credit left (the server's handler has not taken 1 MiB of what was sent),
// and the server waits for stream credit when Recv falls behind. Either way
// only this call waits; the others on the connection go on. Send may run
// concurrently with Recv, but not with another Send or CloseSend.
//
// The call ends when the server ends it (Recv then returns io.EOF or its
// *Error, and Send returns the same: the unsent items are dropped), when ctx
// ends, or on Close. CloseSend is a half-close: the server may go on sending.
type BidiStream struct {
	*ClientStream
	// codec is ClientOptions.Codec; nil chooses per value.
	codec Codec
	buf   []byte // Send's encoding buffer
}

// sendSide is the request half of a client-stream call.
type sendSide struct {
	credit atomic.Int64
	wake   chan struct{} // (buffered 1) the server granted credit
	mu     sync.Mutex    // Send and CloseSend, one at a time
	closed bool          // (mu) request_end sent
	// single: a client-streaming call, answered by one response.
	single bool
}

// noClientStreamsMsg is the local refusal (code Unimplemented) of Bidi and
// ClientStreaming on a connection whose server's hello lacks the
// client_stream flag (an older server); nothing is sent.
const noClientStreamsMsg = "server does not support client or bidirectional streams (its hello lacks the client_stream flag); upgrade the server"

// errSendClosed is Send's error after CloseSend.
var errSendClosed = &Error{Code: FailedPrecondition, Message: "Send after CloseSend: the request side of this call is closed"}

// Bidi opens a bidirectional call of method: the server answers items with
// items, as a server stream (Recv), while the client sends its own (Send),
// until it ends the call. Metadata (WithMetadata) and the deadline come from
// ctx, which bounds the whole call. The call goes through the client's
// stream interceptors with a nil request.
func (c *Client) Bidi(ctx context.Context, method string) (*BidiStream, error) {
	return c.openClientStream(ctx, method, frame.FlagStream|frame.FlagClientStream)
}

// ClientStreaming opens a client-streaming call of method: the client sends
// items (Send) and then CloseAndRecv returns the server's one response.
func (c *Client) ClientStreaming(ctx context.Context, method string) (*BidiStream, error) {
	return c.openClientStream(ctx, method, frame.FlagClientStream)
}

func (c *Client) openClientStream(ctx context.Context, method string, flags uint8) (*BidiStream, error) {
	open := func(ctx context.Context, method string, _ []byte) (*ClientStream, error) {
		return c.openBidi(ctx, method, flags)
	}
	var st *ClientStream
	var err error
	if ic := c.streamIC; ic != nil {
		st, err = ic(ctx, method, nil, open)
	} else {
		st, err = open(ctx, method, nil)
	}
	if err != nil {
		return nil, err
	}
	if st.tx == nil {
		st.Close()
		return nil, Errorf(Internal, "a stream interceptor returned a stream that is not a client stream for %q", method)
	}
	return &BidiStream{ClientStream: st, codec: c.opts.Codec}, nil
}

// openBidi starts a client-stream call (the opener the interceptors get). A
// call refused unprocessed (the connection was draining) is opened again on
// another connection, as a unary call is: nothing of it was sent.
func (c *Client) openBidi(ctx context.Context, method string, flags uint8) (*ClientStream, error) {
	for attempt := 0; ; attempt++ {
		st, cc, err := c.openBidiOnce(ctx, method, flags)
		if e, ok := err.(*Error); ok && e.Refused && attempt < 10 && ctx.Err() == nil && cc != nil {
			cc.markDraining()
			continue
		}
		return st, err
	}
}

func (c *Client) openBidiOnce(ctx context.Context, method string, flags uint8) (*ClientStream, *clientConn, error) {
	cc, err := c.connStream(ctx) // (an in-flight slot taken)
	if err != nil {
		return nil, nil, err
	}
	if !cc.clientStreams {
		cc.release()
		return nil, nil, &Error{Code: Unimplemented, Message: noClientStreamsMsg}
	}
	if x := cc.slotCalls; x != nil && x.streams != nil {
		// A stream slot (shmstreams.go) when one is free.
		if st, e, ok := x.streams.open(ctx, cc, method, flags); ok {
			if e != nil {
				cc.release()
				return nil, cc, e
			}
			return st, cc, nil
		}
	}
	tx := &sendSide{wake: make(chan struct{}, 1), single: flags&frame.FlagStream == 0}
	tx.credit.Store(frame.InitialRequestCredit)
	st := &ClientStream{cc: cc, codec: Raw, arrived: make(chan struct{}, 1),
		ended: make(chan struct{}), tx: tx}
	// One channel wakes the Recv of a bidi call for all it waits for: an
	// item, the end (finish) or the read role (awaitItem).
	cl := &call{done: make(chan struct{}, 1), lead: st.arrived, stream: st, mdSink: responseMDSink(ctx)}
	st.cl = cl
	if e := cc.send(ctx, cl, method, nil, flags); e != nil {
		st.finish(e)
		return nil, cc, e
	}
	cc.ensureReader()
	st.stop = context.AfterFunc(ctx, func() { st.abort(ctxError(ctx)) })
	return st, cc, nil
}

// addCredit is the reader's, for a request_credit frame.
func (tx *sendSide) addCredit(n uint32) {
	tx.credit.Add(int64(n))
	select {
	case tx.wake <- struct{}{}:
	default:
	}
}

// SendRaw sends one request item (copied out before it returns). It waits
// while the call has no request credit. After the call has ended it returns
// the call's outcome: io.EOF when the server ended it successfully (Recv
// tells the rest), else the *Error.
func (b *BidiStream) SendRaw(item []byte) error {
	st := b.ClientStream
	tx := st.tx
	tx.mu.Lock()
	defer tx.mu.Unlock()
	st.settle() // it sends now
	if tx.closed {
		return errSendClosed
	}
	if uint32(len(item)) > st.cc.maxFrame {
		return Errorf(ResourceExhausted, "request item of %d bytes is over the connection's max frame %d", len(item), st.cc.maxFrame)
	}
	for tx.credit.Load() <= 0 && st.slot == nil {
		st.cc.ensureReader() // somebody must read the request_credit
		select {
		case <-tx.wake:
		case <-st.ended:
			return st.endErr()
		}
	}
	select {
	case <-st.ended:
		return st.endErr()
	default:
	}
	if ss := st.slot; ss != nil { // a stream slot: its mailbox is the flow control (shmstreams.go)
		return ss.send(frame.TypeRequestData, item)
	}
	tx.credit.Add(-int64(len(item) + frame.HeaderSize))
	h := frame.Header{Type: frame.TypeRequestData, ID: st.cl.id}
	// While other calls were handed items and are about to send theirs,
	// they run first and their items join this write (clientConn.owed).
	if err := st.cc.owed.gather(st.cc.w, &h, item); err != nil {
		st.cc.fail(err)
		return &Error{Code: Unavailable, Message: "send request item: " + err.Error(), cause: err}
	}
	return nil
}

// Send encodes v with the client's codec (ClientOptions.Codec, else chosen
// from v's type: []byte raw, proto.Message protobuf, anything else JSON) and
// sends it as SendRaw does.
func (b *BidiStream) Send(v any) error {
	codec := b.codec
	if codec == nil {
		codec = codecFor(v)
	}
	out, err := codec.Marshal(b.buf[:0], v)
	if err != nil {
		return encodeError("request item", err)
	}
	b.buf = out
	return b.SendRaw(out)
}

// RecvRawView is RecvRaw without handing the item over: it is valid only
// until the next Recv, RecvRaw or RecvRawView on this call, whose item may
// be read into the same buffer. A ping-pong that takes its items so (and
// uses or copies them before the next) allocates nothing per item. RecvRaw
// returns an item the caller owns.
func (b *BidiStream) RecvRawView() ([]byte, error) {
	it, err := b.RecvRaw()
	b.lent = it
	return it, err
}

// Recv decodes the next response item into v (the codec as Send's, chosen
// from v: *[]byte raw, proto.Message protobuf, else JSON); io.EOF ends a
// successful call. The item's buffer is reused for the next one when the
// codec is one of this package's (they copy what they keep).
func (b *BidiStream) Recv(v any) error {
	codec := b.codec
	if codec == nil {
		codec = codecFor(v)
	}
	recv := b.RecvRaw
	if codec == Raw || codec == JSON || codec == Proto {
		recv = b.RecvRawView
	}
	it, err := recv()
	if err != nil {
		return err
	}
	return b.decode(it, v, "stream item")
}

// decode unmarshals it into v with the stream's codec (chosen from v when
// none was fixed); what names the bytes in the error.
func (b *BidiStream) decode(it []byte, v any, what string) error {
	codec := b.codec
	if codec == nil {
		codec = codecFor(v)
	}
	if err := codec.Unmarshal(it, v); err != nil {
		return decodeError(what, err)
	}
	return nil
}

// CloseSend tells the server that no more items come (request_end). The
// call goes on until the server ends it. Safe to call more than once and
// after the call has ended.
func (b *BidiStream) CloseSend() error {
	st := b.ClientStream
	tx := st.tx
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.closed {
		return nil
	}
	tx.closed = true
	st.settle()
	select {
	case <-st.ended:
		return nil
	default:
	}
	if ss := st.slot; ss != nil {
		if err := ss.send(frame.TypeRequestEnd, nil); err != nil && err != io.EOF {
			return err
		}
		return nil
	}
	h := frame.Header{Type: frame.TypeRequestEnd, ID: st.cl.id}
	if err := st.cc.w.WriteFrame(&h, nil, nil); err != nil {
		st.cc.fail(err)
		return &Error{Code: Unavailable, Message: "send request end: " + err.Error(), cause: err}
	}
	return nil
}

// CloseAndRecvRaw ends a client-streaming call's items (CloseSend) and
// returns the server's response.
func (b *BidiStream) CloseAndRecvRaw() ([]byte, error) {
	if err := b.CloseSend(); err != nil {
		return nil, err
	}
	it, err := b.RecvRaw()
	if errors.Is(err, io.EOF) {
		return nil, Errorf(Internal, "the server ended the call without a response (is the method bidirectional? open it with Bidi)")
	}
	return it, err
}

// CloseAndRecv is CloseAndRecvRaw decoding the response into v.
func (b *BidiStream) CloseAndRecv(v any) error {
	it, err := b.CloseAndRecvRaw()
	if err != nil {
		return err
	}
	return b.decode(it, v, "response")
}

// awaitItem waits until an item or the end may have arrived for a bidi
// call's Recv, reading the socket itself while it holds the read role (as a
// unary caller does in await, readrole.go): it takes the role when nobody
// holds it, or when it is given it (passRoleLocked, handToRecv), reads
// frames until its own item or end is in, and passes the role on. The
// caller (RecvRaw) looks at the queue again after it returns.
func (st *ClientStream) awaitItem() {
	cc, cl := st.cc, st.cl
	cc.mu.Lock()
	if cc.role == roleNone && !cc.closed && cl.inCalls {
		cc.role, cc.leader = roleCaller, cl
		cc.leadSeq++
	}
	if cc.role == roleCaller && cc.leader == cl {
		cl.recvLeading = true
		cc.mu.Unlock()
		cc.leadRecv(st)
		return
	}
	cc.setRecvWaitingLocked(cl, true)
	cc.mu.Unlock()
	// An item, the end or the role (cl.lead is st.arrived: openBidiOnce).
	// A wake-up left over from an earlier wait only makes RecvRaw look
	// at the queue once more.
	<-st.arrived
	cc.mu.Lock()
	cc.setRecvWaitingLocked(cl, false)
	if cc.role == roleCaller && cc.leader == cl {
		// Given the role: lead, unless what it waits for is in already.
		if st.ready() || cc.closed || !cl.inCalls {
			cc.passRoleLocked()
			cc.mu.Unlock()
			return
		}
		cl.recvLeading = true
		cc.mu.Unlock()
		cc.leadRecv(st)
		return
	}
	cc.mu.Unlock()
}

// ready reports whether Recv has an item or the end waiting.
func (st *ClientStream) ready() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.queue) > 0 {
		return true
	}
	select {
	case <-st.ended:
		return true
	default:
		return false
	}
}

// leadRecv reads frames as the holder of the read role (cl.recvLeading set)
// until st's own next item or end is in, st's call is forgotten (Close or
// its ctx ended: forgetLocked interrupts the read with a read deadline), or a
// frame needs the background reader (one larger than the read buffer). It
// passes the role on when it returns.
func (cc *clientConn) leadRecv(st *ClientStream) {
	cl := st.cl
	defer func() {
		cc.mu.Lock()
		cl.recvLeading = false
		if cc.role == roleCaller && cc.leader == cl {
			cc.passRoleLocked()
		}
		cc.mu.Unlock()
	}()
	if cc.armLone() {
		// Disarmed before the role passes.
		defer cc.spin.Disarm()
	}
	for {
		if st.ready() {
			return
		}
		h, err := cc.r.PeekFrame()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				cc.mu.Lock()
				cc.disarmLocked()
				gone := !cl.inCalls || cc.closed
				cc.mu.Unlock()
				if gone {
					return
				}
				continue // a stale interrupt meant for an earlier leader
			}
			if err != frame.ErrNotBuffered {
				cc.fail(err) // finishes st
				return
			}
			// A frame larger than the read buffer is read in place at the
			// peer's pace, which a Close must not wait for: the background
			// reader reads it.
			cc.mu.Lock()
			cc.disarmLocked()
			cc.leader = nil
			cc.giveBackgroundLocked()
			cc.mu.Unlock()
			return
		}
		if _, err := cc.r.ReadHeader(); err != nil {
			cc.fail(err)
			return
		}
		if _, err := cc.handleFrame(h, nil); err != nil {
			cc.fail(err)
			return
		}
		if h.ID == cl.id && h.Type != frame.TypeRequestCredit {
			return
		}
	}
}

// endErr is what Send reports once the call has ended.
func (st *ClientStream) endErr() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err
}

// deliverResponse is the reader's, for the response frame that ends a
// client-streaming call: the one item CloseAndRecv returns (not subject to
// stream credit).
func (st *ClientStream) deliverResponse(item []byte) {
	st.mu.Lock()
	st.queue = append(st.queue, item)
	st.mu.Unlock()
	select {
	case st.arrived <- struct{}{}:
	default:
	}
}

// TypedBidi is a BidiStream with typed items, from OpenJSONBidi,
// OpenJSONClientStream, OpenProtoBidi or OpenProtoClientStream.
type TypedBidi[Req, Resp any] struct {
	s      *BidiStream
	encode func(dst []byte, v Req) ([]byte, error)
	decode func([]byte) (Resp, error)
	buf    []byte
}

// Stream returns the underlying BidiStream (for OnDone, raw items).
func (t *TypedBidi[Req, Resp]) Stream() *BidiStream { return t.s }

// Send sends one request item.
func (t *TypedBidi[Req, Resp]) Send(v Req) error {
	b, err := t.encode(t.buf[:0], v)
	if err != nil {
		return encodeError("request item", err)
	}
	t.buf = b
	return t.s.SendRaw(b)
}

// CloseSend half-closes the call (BidiStream.CloseSend).
func (t *TypedBidi[Req, Resp]) CloseSend() error { return t.s.CloseSend() }

// Recv returns the next response item; io.EOF ends a successful call.
func (t *TypedBidi[Req, Resp]) Recv() (Resp, error) {
	b, err := t.s.RecvRawView() // decoded (copied) before the next
	if err != nil {
		var zero Resp
		return zero, err
	}
	return t.decode(b)
}

// CloseAndRecv ends a client-streaming call's items and returns its response.
func (t *TypedBidi[Req, Resp]) CloseAndRecv() (Resp, error) {
	b, err := t.s.CloseAndRecvRaw()
	if err != nil {
		var zero Resp
		return zero, err
	}
	return t.decode(b)
}

// Close abandons the call (the server's handler sees its ctx canceled).
func (t *TypedBidi[Req, Resp]) Close() error { return t.s.Close() }

// OpenJSONBidi opens a bidirectional call with JSON items.
func OpenJSONBidi[Req, Resp any](ctx context.Context, c *Client, method string) (*TypedBidi[Req, Resp], error) {
	s, err := c.Bidi(ctx, method)
	if err != nil {
		return nil, err
	}
	return jsonTyped[Req, Resp](s), nil
}

// OpenJSONClientStream opens a client-streaming call with JSON items and a
// JSON response (TypedBidi.CloseAndRecv).
func OpenJSONClientStream[Req, Resp any](ctx context.Context, c *Client, method string) (*TypedBidi[Req, Resp], error) {
	s, err := c.ClientStreaming(ctx, method)
	if err != nil {
		return nil, err
	}
	return jsonTyped[Req, Resp](s), nil
}

func jsonTyped[Req, Resp any](s *BidiStream) *TypedBidi[Req, Resp] {
	return &TypedBidi[Req, Resp]{s: s,
		encode: func(dst []byte, v Req) ([]byte, error) { return JSON.Marshal(dst, v) },
		decode: func(b []byte) (Resp, error) {
			var r Resp
			if err := JSON.Unmarshal(b, &r); err != nil {
				return r, decodeError("stream item", err)
			}
			return r, nil
		}}
}

// OpenProtoBidi opens a bidirectional call with protobuf items. Resp is the
// response message's struct type and PResp its pointer (Recv returns PResp).
func OpenProtoBidi[Req proto.Message, Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, c *Client, method string) (*TypedBidi[Req, PResp], error) {
	s, err := c.Bidi(ctx, method)
	if err != nil {
		return nil, err
	}
	return protoTyped[Req, Resp, PResp](s), nil
}

// OpenProtoClientStream opens a client-streaming call with protobuf items and
// response.
func OpenProtoClientStream[Req proto.Message, Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, c *Client, method string) (*TypedBidi[Req, PResp], error) {
	s, err := c.ClientStreaming(ctx, method)
	if err != nil {
		return nil, err
	}
	return protoTyped[Req, Resp, PResp](s), nil
}

func protoTyped[Req proto.Message, Resp any, PResp interface {
	*Resp
	proto.Message
}](s *BidiStream) *TypedBidi[Req, PResp] {
	return &TypedBidi[Req, PResp]{s: s,
		encode: func(dst []byte, v Req) ([]byte, error) { return proto.MarshalOptions{}.MarshalAppend(dst, v) },
		decode: func(b []byte) (PResp, error) {
			r := PResp(new(Resp))
			if err := proto.Unmarshal(b, r); err != nil {
				return nil, decodeError("stream item", err)
			}
			return r, nil
		}}
}
