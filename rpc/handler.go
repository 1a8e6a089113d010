package rpc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/uds"
	"google.golang.org/protobuf/proto"
)

// RawHandler serves a unary call on raw bytes: it appends its response to dst
// (an empty buffer the server owns and reuses) and returns it. req and the
// returned slice are valid until the handler returns; copy what you keep.
// The handler may also return req itself or a part of it (an echo, a
// prefix): the server writes it out before it reuses req's buffer, so an echo
// of a large payload costs no copy (`return req, nil` rather than
// `return append(dst, req...), nil`, which copies every byte once more).
type RawHandler func(ctx context.Context, req, dst []byte) ([]byte, error)

// RawStreamHandler serves a server-streaming call: it calls send once per
// item (send copies the item out before returning) and returns nil to end the
// stream or an error to fail it.
type RawStreamHandler func(ctx context.Context, req []byte, send func([]byte) error) error

type handler struct {
	name   string
	unary  RawHandler
	stream RawStreamHandler
	// bidi and cstream (bidi_server.go): a bidirectional or client-streaming
	// handler; exactly one of the four is set.
	bidi    RawBidiHandler
	cstream RawClientStreamHandler
	// lends: bidi or cstream decodes each request item before its next
	// recv (the typed registrations), so recv may read the next item into
	// the previous one's buffer (reqInbox.lent).
	lends bool
	codec string
	std   bool // a standard method (health.go): answered while draining too
	// cost is a running estimate of one unary run, in nanoseconds: the
	// first run sets it, each later one moves it an eighth of the way to
	// its own duration, and the inline watchdog raises it to at least
	// inlineTick when it finds a run that long (inline.go). The reader runs
	// a quick handler inline even with more requests buffered. Shared by
	// every connection; a lost update only delays the estimate. Starts at
	// costUnknown.
	cost atomic.Int64
}

// quickHandler is the running cost under which a unary handler runs on the
// reading goroutine even when more requests are buffered behind it: less
// than what handing the call to another goroutine costs on the receiving
// end (a wake-up, often of another thread), so the calls behind it wait less
// than they would for a hand-off, and the answers to a batch go out with one
// write (docs/internals.md, "Server").
const quickHandler = 20 * time.Microsecond

// epoch makes time.Since a monotonic clock read (one, where time.Now
// reads two clocks) for timing handler runs.
var epoch = time.Now()

// untimedRuns: of the inline runs that could not change the reader's next
// choice (nothing buffered behind them, a handler known to be quick), one
// in untimedRuns is timed, so a lone caller's round trip pays for the clock
// only now and then while a handler that turns slow is still noticed.
const untimedRuns = 16

// costUnknown is handler.cost before the first run ends: not quick.
const costUnknown = -1

// quick reports whether h's unary runs have been quick lately.
func (h *handler) quick() bool {
	c := h.cost.Load()
	return c >= 0 && c < int64(quickHandler)
}

// noteCost folds one run's duration into h.cost.
func (h *handler) noteCost(d time.Duration) {
	old, n := h.cost.Load(), int64(d)
	if old >= 0 {
		n = old + (n-old)/8
	}
	if n != old {
		h.cost.Store(n)
	}
}

// runsLong records that a run of h has been going for at least d.
func (h *handler) runsLong(d time.Duration) {
	if h.cost.Load() < int64(d) {
		h.cost.Store(int64(d))
	}
}

// HandleRaw registers h for method, replacing any handler already there.
// Registration is safe while serving.
func (s *Server) HandleRaw(method string, h RawHandler) {
	s.register(&handler{name: method, unary: h, codec: "raw"})
}

// HandleRawStream registers a server-streaming raw handler for method.
func (s *Server) HandleRawStream(method string, h RawStreamHandler) {
	s.register(&handler{name: method, stream: h, codec: "raw"})
}

// HandleJSON registers a unary handler whose request and response are JSON.
// NDJSON clients reach the same handler.
func HandleJSON[Req, Resp any](s *Server, method string, h func(ctx context.Context, req Req) (Resp, error)) {
	s.register(&handler{name: method, codec: "json", unary: func(ctx context.Context, in, dst []byte) ([]byte, error) {
		var req Req
		if err := JSON.Unmarshal(in, &req); err != nil {
			return nil, Errorf(InvalidArgument, "decode %s request as JSON: %v", method, err)
		}
		resp, err := h(ctx, req)
		if err != nil {
			return nil, err
		}
		return JSON.Marshal(dst, resp)
	}})
}

// HandleJSONStream registers a server-streaming handler with JSON items.
func HandleJSONStream[Req, Item any](s *Server, method string, h func(ctx context.Context, req Req, send func(Item) error) error) {
	s.register(&handler{name: method, codec: "json", stream: func(ctx context.Context, in []byte, send func([]byte) error) error {
		var req Req
		if err := JSON.Unmarshal(in, &req); err != nil {
			return Errorf(InvalidArgument, "decode %s request as JSON: %v", method, err)
		}
		var buf []byte
		return h(ctx, req, func(it Item) error {
			b, err := JSON.Marshal(buf[:0], it)
			if err != nil {
				return err
			}
			buf = b
			return send(b)
		})
	}})
}

// HandleProto registers a unary handler for protobuf messages. PReq is the
// pointer type of Req (inferred from h).
func HandleProto[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](s *Server, method string, h func(ctx context.Context, req PReq) (Resp, error)) {
	s.register(&handler{name: method, codec: "proto", unary: func(ctx context.Context, in, dst []byte) ([]byte, error) {
		req := PReq(new(Req))
		if err := proto.Unmarshal(in, req); err != nil {
			return nil, Errorf(InvalidArgument, "decode %s request as protobuf: %v", method, err)
		}
		resp, err := h(ctx, req)
		if err != nil {
			return nil, err
		}
		return proto.MarshalOptions{}.MarshalAppend(dst, resp)
	}})
}

// HandleProtoStream registers a server-streaming handler for protobuf messages.
func HandleProtoStream[Req any, PReq interface {
	*Req
	proto.Message
}, Item proto.Message](s *Server, method string, h func(ctx context.Context, req PReq, send func(Item) error) error) {
	s.register(&handler{name: method, codec: "proto", stream: func(ctx context.Context, in []byte, send func([]byte) error) error {
		req := PReq(new(Req))
		if err := proto.Unmarshal(in, req); err != nil {
			return Errorf(InvalidArgument, "decode %s request as protobuf: %v", method, err)
		}
		var buf []byte
		return h(ctx, req, func(it Item) error {
			b, err := proto.MarshalOptions{}.MarshalAppend(buf[:0], it)
			if err != nil {
				return err
			}
			buf = b
			return send(b)
		})
	}})
}

// handlerCtx is the context a handler runs in: one small allocation per
// call. Its Done channel is made only if the handler asks for it; it ends when
// the caller's deadline passes, the caller cancels, the connection goes, or
// the handler returns.
type handlerCtx struct {
	parent   context.Context
	method   string
	cred     uds.Cred
	hasCred  bool
	remote   *uds.RemoteID
	mdRaw    []byte
	deadline time.Time

	mu    sync.Mutex
	done  chan struct{}
	err   error
	timer *time.Timer
	md    Metadata
	mdOK  bool
	// respMD (mu) is the metadata SetResponseMetadata set for the answer.
	respMD Metadata

	// Stream credit (protocol/spec.md, section 4.1; every v1 peer uses it),
	// for a stream: bytes of items the handler may still send, and a wake-up
	// (buffered 1) when the client grants more. creditWake is nil for unary
	// calls.
	credit     atomic.Int64
	creditWake chan struct{}
	// in holds the request items of a client-stream call (bidi_server.go);
	// nil for other calls.
	in *reqInbox
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (h *handlerCtx) Deadline() (time.Time, bool) { return h.deadline, !h.deadline.IsZero() }

func (h *handlerCtx) Done() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done == nil {
		if h.err != nil {
			return closedChan
		}
		h.done = make(chan struct{})
	}
	return h.done
}

func (h *handlerCtx) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *handlerCtx) Value(key any) any {
	if key == (inKey{}) {
		return h
	}
	return h.parent.Value(key)
}

func (h *handlerCtx) String() string { return fmt.Sprintf("rpc.handlerCtx(%s)", h.method) }

// cancel ends the context with err (first error wins).
func (h *handlerCtx) cancel(err error) {
	h.mu.Lock()
	if h.err == nil {
		h.err = err
		if h.done != nil {
			close(h.done)
		}
		if h.timer != nil {
			h.timer.Stop()
		}
	}
	h.mu.Unlock()
	if in := h.in; in != nil {
		in.signal() // its recv waits on in.wake alone
		if in.leading.Load() {
			in.c.interruptLead(in) // its recv waits in the socket read (bidi_lead.go)
		}
	}
}

func (h *handlerCtx) canceled() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err != nil
}

func (h *handlerCtx) metadata() Metadata {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.mdOK {
		h.md, h.mdOK = parseMD(h.mdRaw), true
	}
	return h.md
}

// errHandlerDone ends a handler's ctx when the handler returns.
var errHandlerDone = context.Canceled
