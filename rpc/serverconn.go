package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/uds"
)

// serverConn is one connection on a Server, in udskit or NDJSON mode.
type serverConn struct {
	s       *Server
	c       net.Conn // as accepted (closing it closes the socket)
	raw     net.Conn // the *net.UnixConn/*net.TCPConn for reads and writev
	r       *frame.Reader
	w       *frame.Writer
	cred    uds.Cred
	hasCred bool

	maxFrame    uint32
	maxInFlight uint32
	credit      bool // server streams wait for stream credit (both hellos offered it)

	mu       sync.Mutex
	calls    map[uint32]*handlerCtx
	draining bool
	closed   bool
	ready    bool // udskit hello exchanged: goaway may be sent
	closeErr error
	drained  chan struct{} // closed when draining and no call is in flight
	noCalls  chan struct{} // after the peer's EOF: closed when no call is in flight

	loopDone  chan struct{} // closed when the frame read loop ends
	inline    atomic.Uint32 // inlineIdle, inlineHandedOff, or run<<2|inlineRunning
	inlineSeq atomic.Uint32 // counts inline runs
	watchSeen uint32        // watchdog only: inlineSeq running at the last tick
	watchRun  bool          // watchdog only: it was running then
	watchLast uint32        // watchdog only: inlineSeq at the last tick

	// Memory budget (budget.go): held is under mu.
	held       int64
	budgetWake chan struct{} // (buffered 1) a release or close happened
	stalled    atomic.Bool   // the reader waits for budget

	// Timeouts (timeouts.go): rx and boundary are written by the reader,
	// the sw* fields are the sweeper's own.
	rx, boundary atomic.Uint64
	swMid        bool
	swBd         uint64
	swSince      time.Time
	swWrites     uint64
	swWriteSince time.Time
	swIdleBd     uint64
	swIdleSince  time.Time

	// The reader's own: frames read while the read buffer is still small.
	smallFrames int

	work        chan *srvCall
	workers     sync.WaitGroup
	idleWorkers atomic.Int32  // workers parked on work
	readDone    chan struct{} // closed when the read loop has ended
	ndSem       chan struct{} // NDJSON in-flight slots
	ndNext      uint32
}

// srvCall is a pooled unit of work for a handler goroutine.
type srvCall struct {
	id     uint32
	h      *handler
	ctx    *handlerCtx
	req    []byte
	ndjson bool
	ndID   []byte // NDJSON request id, as raw JSON
	held   int64  // bytes of the budget this call holds
}

var callPool = sync.Pool{New: func() any { return new(srvCall) }}

const maxPooledBuf = 1 << 20

func putSrvCall(c *srvCall) {
	if cap(c.req) > maxPooledBuf {
		c.req = nil
	}
	c.h, c.ctx, c.ndID, c.held = nil, nil, c.ndID[:0], 0
	callPool.Put(c)
}

type netConner interface{ NetConn() net.Conn }

// Read buffer sizes: smallReadBuffer for a new connection, readBuffer once it
// has carried growAfter frames or lines.
const (
	smallReadBuffer = 4 << 10
	readBuffer      = 64 << 10
	growAfter       = 8
)

// growReader counts a frame or line read while the read buffer is small and
// grows it after growAfter, at a moment nothing is buffered. It reports
// whether the buffer was replaced (BufReader must then be fetched again).
func (c *serverConn) growReader() bool {
	if c.smallFrames < 0 {
		return false
	}
	if c.smallFrames++; c.smallFrames >= growAfter && c.r.Grow() {
		c.smallFrames = -1
		return true
	}
	return false
}

func newServerConn(s *Server, c net.Conn) *serverConn {
	raw := c
	if nc, ok := c.(netConner); ok {
		raw = nc.NetConn()
	}
	sc := &serverConn{
		s: s, c: c, raw: raw,
		calls:      map[uint32]*handlerCtx{},
		drained:    make(chan struct{}),
		work:       make(chan *srvCall),
		readDone:   make(chan struct{}),
		budgetWake: make(chan struct{}, 1),
	}
	sc.cred, sc.hasCred = uds.CredOf(c)
	// A small read buffer until the connection is busy (growReader): a
	// server holding thousands of quiet connections commits little for each.
	sc.r = frame.NewSmallReader(countingReader{raw, &sc.rx}, smallReadBuffer, readBuffer)
	sc.w = frame.NewWriter(raw)
	return sc
}

func (c *serverConn) serve() {
	defer c.finish()
	c.raw.SetReadDeadline(time.Now().Add(c.s.opts.HandshakeTimeout))
	first, err := c.r.Peek(1)
	if err != nil {
		c.s.log.Debug("rpc: connection closed before its first byte", "err", err)
		return
	}
	switch {
	case first[0] == frame.Magic[0]:
		c.serveFrames()
	case isNDJSONStart(first[0]) && !c.s.opts.DisableNDJSON:
		c.raw.SetReadDeadline(time.Time{})
		c.serveNDJSON()
	default:
		c.s.log.Info("rpc: closing connection that speaks neither udskit nor NDJSON", "first_byte", fmt.Sprintf("%#02x", first[0]))
	}
}

// finish tears the connection down after its read loop ends and waits for the
// handlers to return.
func (c *serverConn) finish() {
	if c.loopDone != nil {
		c.s.unwatchInline(c)
	}
	close(c.readDone)
	c.close(nil)
	close(c.work)
	c.workers.Wait()
}

// close fails the connection: no more writes, every in-flight handler's ctx is
// canceled, the socket is closed.
func (c *serverConn) close(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.closeErr = err
	calls := make([]*handlerCtx, 0, len(c.calls))
	for _, h := range c.calls {
		calls = append(calls, h)
	}
	c.mu.Unlock()
	c.w.Fail(net.ErrClosed)
	c.c.Close()
	for _, h := range calls {
		h.cancel(context.Canceled)
	}
	c.wakeBudget()
}

// drain starts a graceful shutdown of this connection.
func (c *serverConn) drain() {
	c.mu.Lock()
	if c.draining || c.closed {
		c.mu.Unlock()
		return
	}
	c.draining = true
	idle := len(c.calls) == 0
	ready := c.ready
	c.mu.Unlock()
	if ready {
		c.sendGoAway()
	}
	if idle {
		c.closeIfDrained()
	}
}

func (c *serverConn) sendGoAway() {
	h := frame.Header{Type: frame.TypeGoAway}
	c.w.WriteFrame(&h, []byte("server shutting down"), nil)
}

// closeIfDrained ends a draining connection with no calls in flight. A udskit
// client closes its side when it has seen goaway and has nothing in flight;
// the server closes after a grace period in case the client does not, or at
// once for NDJSON clients, which know nothing of goaway.
func (c *serverConn) closeIfDrained() {
	c.mu.Lock()
	if !c.draining || len(c.calls) > 0 || c.closed {
		c.mu.Unlock()
		return
	}
	select {
	case <-c.drained:
	default:
		close(c.drained)
	}
	c.mu.Unlock()
}

// connError sends a connection-level error (id 0) and closes.
func (c *serverConn) connError(code Code, err error) {
	c.s.log.Info("rpc: closing connection after protocol error", "err", err, "cred", c.cred)
	h := frame.Header{Type: frame.TypeError, Aux: uint32(code)}
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	c.w.WriteFrame(&h, []byte(msg), nil)
	c.close(err)
}

func (c *serverConn) serveFrames() {
	hello, err := c.r.ReadHello()
	mine := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit, MaxFrame: c.s.opts.MaxFrame, MaxInFlight: c.s.opts.MaxInFlight}
	var hb [frame.HelloSize]byte
	mine.Put(hb[:])
	if err != nil {
		var pe *frame.ProtocolError
		if errors.As(err, &pe) && pe.Name != frame.NameTruncated {
			c.w.WriteRaw(hb[:])
			c.connError(ProtocolViolation, err)
		}
		return
	}
	if err := c.w.WriteRaw(hb[:]); err != nil {
		return
	}
	_, maxFrame, maxInFlight, err := frame.Negotiate(hello, mine)
	if err != nil {
		c.connError(ProtocolViolation, err)
		return
	}
	c.maxFrame, c.maxInFlight = maxFrame, maxInFlight
	c.credit = frame.Features(hello, mine)&frame.FeatureStreamCredit != 0
	c.r.MaxFrame = maxFrame
	c.raw.SetReadDeadline(time.Time{})
	c.mu.Lock()
	c.ready = true
	draining := c.draining
	c.mu.Unlock()
	if draining {
		c.sendGoAway()
	}
	go func() {
		select {
		case <-c.drained:
		case <-c.readDone:
			return
		}
		// Give a goaway-aware client a moment to close its side first.
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.readDone:
		}
		c.close(nil)
	}()

	c.loopDone = make(chan struct{})
	c.s.watchInline(c)
	if c.frameLoop() {
		return
	}
	<-c.loopDone // another goroutine took over reading; wait for the end
}

// Inline handlers. A unary request with nothing else buffered behind it runs
// on the goroutine that read it: no hand-off to a handler goroutine (which
// across processes often means waking another OS thread), so a lone caller's
// round trip costs close to what a plain socket echo does. The server's
// watchdog (watchInline) checks every inlineTick; a handler it finds running
// inline on two ticks in a row gets the reading role taken from it: a new
// goroutine carries on reading, so a slow or blocking handler holds up other
// calls on its connection (and the cancel meant for itself) for at most about
// two ticks. The old reader finishes its call and exits. No timer is armed
// per call: resetting one would interrupt the runtime's netpoller each time.
// The watchdog parks after watchParkAfter quiet ticks and the next inline run
// wakes it, so idle connections cost no wake-ups.
//
// While calls flow and every look finds the handlers already done, the
// watchdog doubles its interval up to maxInlineTick; a look that finds one
// running brings the next look back to inlineTick. So a handler that blocks
// right after a long run of quick ones holds its connection up for at most
// about maxInlineTick+inlineTick, and one that blocks while the watchdog is
// just awake or already watching a running handler, about two inlineTicks.
// The back-off is what makes inline handlers pay: on a 2-core box, a 1 ms
// ticker in the server process (another in the client's) doubled the CPU cost
// and the p50 of a lone caller's 64 B round trip (docs/performance.md).
const (
	inlineTick    = time.Millisecond
	maxInlineTick = 16 * time.Millisecond
)

const (
	inlineIdle uint32 = iota
	inlineRunning
	inlineHandedOff
)

// handOffReading is called by the watchdog: if the inline run it saw (v) is
// still running, a new goroutine takes over the read loop. The state of a run
// carries its number, so the reader that started it cannot mistake a later
// inline run (by the new reader) for its own and go on reading too.
func (c *serverConn) handOffReading(v uint32) {
	if c.inline.CompareAndSwap(v, inlineHandedOff) {
		c.workers.Add(1)
		go func() {
			defer c.workers.Done()
			c.frameLoop()
		}()
	}
}

// frameLoop reads and serves frames. It returns true when it ended the
// connection's read loop (EOF, an error), false when it handed reading over
// to another goroutine while running a handler inline.
func (c *serverConn) frameLoop() (ended bool) {
	defer func() {
		if ended {
			close(c.loopDone)
		}
	}()
	var dst []byte
	for {
		c.markBoundary(c.r.Buffered())
		c.growReader()
		h, err := c.r.ReadHeader()
		if err == io.EOF {
			c.peerDoneSending()
			return true
		}
		if err != nil {
			c.readFailed(err)
			return true
		}
		switch h.Type {
		case frame.TypeRequest:
			call, err := c.onRequest(&h)
			if err != nil {
				c.readFailed(err)
				return true
			}
			if call != nil {
				running := c.inlineSeq.Add(1)<<2 | inlineRunning
				c.inline.Store(running)
				if c.s.watchAsleep.Load() {
					c.s.wakeWatchdog()
				}
				dst = c.run(call, dst)
				if cap(dst) > maxPooledBuf {
					dst = nil
				}
				if !c.inline.CompareAndSwap(running, inlineIdle) {
					return false // the reading role moved on
				}
			}
		case frame.TypeCancel:
			hc, ok := c.skipToCall(&h)
			if !ok {
				return true
			}
			if hc != nil {
				if Code(h.Aux) == DeadlineExceeded {
					hc.cancel(context.DeadlineExceeded)
				} else {
					hc.cancel(context.Canceled)
				}
			}
		case frame.TypeStreamCredit:
			hc, ok := c.skipToCall(&h)
			if !ok {
				return true
			}
			if hc != nil && hc.creditWake != nil {
				hc.credit.Add(int64(h.Aux))
				select {
				case hc.creditWake <- struct{}{}:
				default:
				}
			}
		case frame.TypePing:
			if err := c.r.Discard(int(h.HeadLen)); err != nil {
				c.readFailed(err)
				return true
			}
			c.acquire(int64(h.PayloadLen))
			p, err := c.r.ReadPayload(&h, make([]byte, 0, min(h.PayloadLen, 4096)))
			if err != nil {
				c.release(int64(h.PayloadLen))
				c.readFailed(err)
				return true
			}
			pong := frame.Header{Type: frame.TypePong, Aux: h.Aux}
			c.w.WriteFrame(&pong, nil, p)
			c.release(int64(h.PayloadLen))
		case frame.TypeResponse, frame.TypeError, frame.TypeStreamData, frame.TypeStreamEnd:
			c.connError(ProtocolViolation, fmt.Errorf("client sent a %s frame, which only servers send", h.Type))
			return true
		default: // pong, goaway, unknown types: skip
			if err := c.r.Discard(int(h.HeadLen) + int(h.PayloadLen)); err != nil {
				c.readFailed(err)
				return true
			}
		}
	}
}

// skipToCall skips the body of a frame that only names a call (cancel,
// stream_credit) and returns that call, nil if it is not in flight. ok is
// false when the read failed (already handled: the read loop ends).
func (c *serverConn) skipToCall(h *frame.Header) (hc *handlerCtx, ok bool) {
	if err := c.r.Discard(int(h.HeadLen) + int(h.PayloadLen)); err != nil {
		c.readFailed(err)
		return nil, false
	}
	c.mu.Lock()
	hc = c.calls[h.ID]
	c.mu.Unlock()
	return hc, true
}

// errPeerGone closes a connection whose client vanished while its calls ran.
var errPeerGone = errors.New("client closed the connection")

// peerDoneSending runs when the client has sent everything (a clean EOF
// between frames or lines, as after shutdown(SHUT_WR)). EOF means "no more
// requests": the calls in flight finish, their replies are flushed, and only
// then does the connection close. If the client turns out to be gone
// entirely (it closed or reset the socket, or a reply could not be written),
// the calls' contexts are canceled instead, as before.
func (c *serverConn) peerDoneSending() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	var done chan struct{}
	if len(c.calls) > 0 {
		done = make(chan struct{})
		c.noCalls = done
	}
	c.mu.Unlock()
	for done != nil {
		select {
		case <-done:
			done = nil
			continue
		default:
		}
		if c.w.Err() != nil || peerHungUp(c.raw, 20*time.Millisecond) {
			c.close(errPeerGone)
			return
		}
	}
	c.w.Flush()
}

// readFailed ends the connection after a failed read, at once: the read
// loop may have been handed off from a handler still running inline, and
// every call of the connection (that one included) must see its ctx end now,
// not when that handler returns by itself.
func (c *serverConn) readFailed(err error) {
	var pe *frame.ProtocolError
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
	case errors.As(err, &pe) && pe.Name != frame.NameTruncated:
		c.connError(ProtocolViolation, err)
		return
	case errors.As(err, &pe):
		// the peer went away mid-frame; nobody to tell
	default:
		c.s.log.Debug("rpc: read failed", "err", err)
	}
	c.close(errPeerGone)
}

// onRequest reads a request and starts it on a handler goroutine, or returns
// it for the caller to run inline (a unary call with nothing buffered behind
// it).
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
		c.connError(ResourceExhausted, fmt.Errorf("more than %d calls in flight on one connection", c.maxInFlight))
		return nil, net.ErrClosed
	}
	var refuse *Error
	switch {
	case draining:
		refuse = &Error{Code: Unavailable, Message: "server is shutting down; call not processed", Refused: true}
	case hd == nil:
		refuse = Errorf(Unimplemented, "unknown method %q", method)
	case h.Flags&frame.FlagStream != 0 && hd.stream == nil:
		refuse = Errorf(Unimplemented, "method %q is unary; call it with Call, not Stream", method)
	case h.Flags&frame.FlagStream == 0 && hd.unary == nil:
		refuse = Errorf(Unimplemented, "method %q is server-streaming; call it with Stream", method)
	}
	if refuse != nil {
		if err := c.r.Discard(int(h.PayloadLen)); err != nil {
			return nil, err
		}
		c.writeError(h.ID, refuse)
		return nil, nil
	}

	call := callPool.Get().(*srvCall)
	call.id, call.h, call.ndjson = h.ID, hd, false
	hc := &handlerCtx{parent: c.s.opts.BaseContext, method: hd.name, cred: c.cred, hasCred: c.hasCred}
	if len(md) > 0 {
		hc.mdRaw = append([]byte(nil), md...)
	}
	if c.credit && hd.stream != nil {
		hc.credit.Store(frame.InitialStreamCredit)
		hc.creditWake = make(chan struct{}, 1)
	}
	call.ctx = hc
	c.acquire(int64(h.PayloadLen))
	call.held = int64(h.PayloadLen)
	call.req, err = c.r.ReadPayload(h, call.req[:0])
	if err != nil {
		c.release(call.held)
		putSrvCall(call)
		return nil, err
	}
	if h.Aux != 0 {
		d := time.Duration(h.Aux) * time.Microsecond
		hc.deadline = time.Now().Add(d)
		hc.mu.Lock()
		hc.timer = time.AfterFunc(d, func() { hc.cancel(context.DeadlineExceeded) })
		hc.mu.Unlock()
	}
	c.mu.Lock()
	c.calls[h.ID] = hc
	c.mu.Unlock()
	if hd.unary != nil && c.r.Buffered() == 0 {
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
		dst = c.run(call, dst)
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

// run executes one call and sends its outcome.
func (c *serverConn) run(call *srvCall, dst []byte) []byte {
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
		if call.h.stream != nil && !call.ndjson {
			err = call.h.stream(hc, call.req, func(item []byte) error { return c.sendItem(call, item) })
		} else {
			out, err = call.h.unary(hc, call.req, dst[:0])
		}
	}()
	if len(out) > 0 && !overlaps(out, call.req) {
		c.hold(int64(len(out)))
		call.held += int64(len(out))
	}
	if call.ndjson {
		c.ndjsonReply(call, out, err)
	} else if !hc.canceled() {
		switch {
		case err != nil:
			c.writeError(call.id, toError(err))
		case call.h.stream != nil:
			h := frame.Header{Type: frame.TypeStreamEnd, ID: call.id}
			c.w.WriteFrame(&h, nil, nil)
		default:
			if uint32(len(out)) > c.maxFrame {
				c.writeError(call.id, Errorf(ResourceExhausted, "response of %d bytes is over the max frame %d", len(out), c.maxFrame))
			} else {
				h := frame.Header{Type: frame.TypeResponse, ID: call.id}
				c.w.WriteFrame(&h, nil, out)
			}
		}
	}
	c.mu.Lock()
	delete(c.calls, call.id)
	if len(c.calls) == 0 && c.noCalls != nil {
		close(c.noCalls)
		c.noCalls = nil
	}
	c.mu.Unlock()
	hc.cancel(errHandlerDone)
	c.release(call.held)
	call.held = 0
	c.closeIfDrained()
	if out != nil && cap(out) >= cap(dst) && !overlaps(out, call.req) {
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

func (c *serverConn) sendItem(call *srvCall, item []byte) error {
	id, hc := call.id, call.ctx
	if err := hc.Err(); err != nil {
		return err
	}
	if uint32(len(item)) > c.maxFrame {
		return Errorf(ResourceExhausted, "stream item of %d bytes is over the max frame %d", len(item), c.maxFrame)
	}
	if hc.creditWake != nil {
		if hc.credit.Load() <= 0 && call.held > 0 {
			// Waiting on the client: hold no budget, so that the reader
			// is free to read the credit (budget.go).
			c.release(call.held)
			call.held = 0
		}
		for hc.credit.Load() <= 0 { // the client has not taken what it has
			select {
			case <-hc.creditWake:
			case <-hc.Done():
				return hc.Err()
			}
		}
		hc.credit.Add(-int64(len(item) + frame.HeaderSize)) // empty items are not free
	}
	h := frame.Header{Type: frame.TypeStreamData, ID: id}
	return c.w.WriteFrame(&h, nil, item)
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
