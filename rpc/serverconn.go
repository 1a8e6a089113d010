package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
	"github.com/udskit/udskit/internal/spinread"
	"github.com/udskit/udskit/uds"
)

// serverConn is one connection on a Server, in udskit or NDJSON mode.
//
// Two goroutines start calls on it at once: the socket reader and, with
// call slots, the poller (shmcalls.go). A field said to be the reader's is
// never the poller's: the poller has its own (serverCalls: handler
// contexts, inline run, budget flags; docs/internals.md, "The poller runs
// calls too").
type serverConn struct {
	s       *Server
	c       net.Conn // as accepted (closing it closes the socket)
	raw     net.Conn // the *net.UnixConn/*net.TCPConn for reads and writev
	r       *frame.Reader
	w       *frame.Writer
	cred    uds.Cred
	hasCred bool
	remote  *uds.RemoteID

	maxFrame    uint32
	maxInFlight uint32
	// noDeadlines: raw refused a read deadline (a net.Conn passed to
	// ServeConn that has none); its bidi handlers never lead (passLead), as
	// only a deadline interrupts a leader's read when its ctx ends.
	noDeadlines bool

	mu        sync.Mutex
	calls     map[uint32]*handlerCtx
	answering int // (mu) calls out of calls whose answer is being written
	draining  bool
	closed    bool
	ready     bool // udskit hello exchanged: goaway may be sent
	closeErr  error
	drained   bool          // draining and no call in flight: the close is under way
	noCalls   chan struct{} // after the peer's EOF: closed when no call is in flight

	// A bidi handler's recv reading as the holder of the read role
	// (bidi_lead.go), under mu: leadIn is its inbox, leadArmed says a read
	// deadline interrupts it.
	leadIn    *reqInbox
	leadArmed bool
	// spin polls the socket for a lone bidi handler's recv that leads its
	// read (lead), and for the reader after it answered the only call in
	// flight (frameLoop); nil with ServerOptions.NoSpin or a socket it
	// cannot poll (armLoneLocked).
	spin *spinread.Reader

	// The socket reader's inline run (the poller's: serverCalls.inline).
	loopDone  chan struct{}           // closed when the frame read loop ends
	inline    atomic.Uint32           // inlineIdle, inlineHandedOff, run<<2|inlineRunning or run<<2|inlineLeading (bidi_lead.go)
	inlineSeq atomic.Uint32           // counts inline runs
	inlineH   atomic.Pointer[handler] // the handler of the latest inline run
	hcs       []handlerCtx            // reader only: fresh handler contexts (newHandlerCtx)
	watchSeen uint32                  // watchdog only: inlineSeq running at the last tick
	watchRun  bool                    // watchdog only: it was running then
	watchLast uint32                  // watchdog only: inlineSeq at the last tick

	// Memory budget (budget.go): held is under mu.
	held       int64
	budgetWake chan struct{} // (buffered 1) a release or close happened
	stalled    atomic.Bool   // the reader waits for budget (or an NDJSON slot)
	// waitingTotal: the reader waits in reserve for the server's total with
	// a frame started (FrameTimeout counts; timeouts.go).
	waitingTotal atomic.Bool
	// The call-slot poller's own, as stalled, waitingTotal and budgetWake
	// are the reader's (acquireSlot): it waits for the same budget.
	slotStalled, slotWaitingTotal atomic.Bool
	slotBudgetWake                chan struct{} // (buffered 1)

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
	// slotTurns counts the call-slot poller's turns that took a request
	// (shmcalls.go, poll): slot calls send no frame, so boundary alone would
	// call a connection busy with them idle. swIdleTurns is the sweeper's.
	slotTurns   atomic.Uint64
	swIdleTurns uint64

	// The reader's own: frames read while the read buffer is still small.
	smallFrames int

	work        chan *srvCall
	workers     sync.WaitGroup
	idleWorkers atomic.Int32  // workers parked on work
	ndSem       chan struct{} // NDJSON in-flight slots
	ndNext      uint32

	// Shared memory (shm.go): shmUC is the socket an offer may come on
	// (nil: never), shm the path once accepted. shmRel and shmIn are the
	// reader's buffers; shmQueued says the reader queued a release to push.
	shmUC     *net.UnixConn
	shm       *connShm
	shmRel    [shm.DescSize]byte
	shmIn     []byte
	shmQueued atomic.Bool
	slotCalls *serverCalls // call slots (shmcalls.go), nil when not in use; set under mu

	// owed counts the bidi calls whose handler was handed a request item
	// (queued by the reader) and has not yet sent an item, waited in recv
	// again or ended (reqInbox.owed): their handlers are about to send, so
	// a stream item sent meanwhile waits for them to run once and goes out
	// in the same write (sendItem, frame.Writer.GatherFrame). Zero for a
	// lone call: it never waits. Marks that let a send yield without one
	// of them answering stop counting (owed.go).
	owed owedMarks
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
		if _, isTLS := c.(*tls.Conn); !isTLS { // a *tls.Conn's NetConn is the ciphertext
			raw = nc.NetConn()
		}
	}
	sc := &serverConn{
		s: s, c: c, raw: raw,
		calls:      map[uint32]*handlerCtx{},
		work:       make(chan *srvCall),
		budgetWake: make(chan struct{}, 1),

		slotBudgetWake: make(chan struct{}, 1),
	}
	sc.noDeadlines = raw.SetReadDeadline(time.Time{}) != nil
	sc.cred, sc.hasCred = uds.CredOf(c)
	if !sc.hasCred {
		sc.remote = uds.PeerOf(c).Remote // a tls: peer's verified identity
	}
	// A small read buffer until the connection is busy (growReader): a
	// server holding thousands of quiet connections commits little for each.
	if !s.opts.NoShm {
		sc.shmUC = shmCapable(raw)
	}
	var rd io.Reader = raw
	if !s.opts.NoSpin {
		// The lone handler's poll (ServerOptions.NoSpin, lead): no lone
		// check while it polls, as no call can open while it reads.
		if sp := spinread.New(raw, LoneSpin, nil); sp.CanPoll() {
			sc.spin, rd = sp, sp
		}
	}
	sc.r = frame.NewSmallReader(countingReader{rd, &sc.rx}, smallReadBuffer, readBuffer)
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
	case first[0] == 0x16: // a TLS ClientHello record
		// Answer with our hello: a udskit TLS client reads it as "this
		// server speaks plaintext udskit" (uds.ExplainTLS), not a bare EOF.
		c.s.log.Info("rpc: closing a TLS client on a plaintext port (serve on tls:HOST:PORT with a certificate, or dial tcp:)")
		var hb [frame.HelloSize]byte
		(&frame.Hello{Version: frame.Version, MaxFrame: c.s.opts.MaxFrame}).Put(hb[:])
		c.raw.SetWriteDeadline(time.Now().Add(time.Second))
		c.raw.Write(hb[:])
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
	c.close(nil)
	c.mu.Lock()
	sc := c.slotCalls
	c.mu.Unlock()
	if sc != nil && sc.started.Load() {
		<-sc.done // the poller dispatches to c.work
	}
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
	cs := c.shm // set under mu by the handshake (serveFrames); read under it here
	sc := c.slotCalls
	c.mu.Unlock()
	c.w.Fail(net.ErrClosed)
	c.c.Close()
	if sc != nil {
		sc.close() // before the region closes: it wakes the poller there
	}
	if cs != nil {
		cs.close()
	}
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
	idle := c.inFlightLocked() == 0
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
	c.closeIfDrainedLocked()
	c.mu.Unlock()
}

// inFlightLocked counts the calls not yet finished: unanswered ones (in
// calls) and those whose answer is being written. Entered with mu held.
func (c *serverConn) inFlightLocked() int { return len(c.calls) + c.answering }

func (c *serverConn) closeIfDrainedLocked() {
	if !c.draining || c.inFlightLocked() > 0 || c.closed {
		return
	}
	if c.drained {
		if c.ndSem != nil {
			c.armNDJSONDrainLocked() // idle again after serving a line read in the drain
		}
		return
	}
	c.drained = true
	c.closeDrainedLocked()
}

// closeDrainedLocked closes a drained connection as its mode wants: a
// udskit one after a grace period; an NDJSON one once it has been quiet for
// ndjsonDrainQuiet (armNDJSONDrainLocked). Before the mode is known (the
// hello exchanged, or the first line), it does nothing: the mode's start
// calls it again. No goroutine waits for a drain meanwhile.
func (c *serverConn) closeDrainedLocked() {
	switch {
	case !c.drained:
	case c.ndSem != nil:
		c.armNDJSONDrainLocked()
	case c.ready:
		time.AfterFunc(drainGrace, func() { c.close(nil) })
	}
}

// NDJSON clients know nothing of goaway and cannot tell a refused call from
// a failed one, so a draining server serves every line it reads (within the
// drain deadline) and closes an NDJSON connection only when no line is in
// flight: no call running or being answered, no byte of a next line
// buffered or arriving for ndjsonDrainQuiet. It sets a read deadline that
// far ahead (armNDJSONDrainLocked); the reader (serveNDJSON) closes on it
// when the connection is still idle, or reads on when a line came. A line
// that arrives after the close was never read, so a client that resends on
// a lost connection does nothing twice.
const ndjsonDrainQuiet = 20 * time.Millisecond

// armNDJSONDrainLocked sets the quiet deadline on an idle draining NDJSON
// connection. Entered with mu held.
func (c *serverConn) armNDJSONDrainLocked() {
	c.raw.SetReadDeadline(time.Now().Add(ndjsonDrainQuiet))
}

// drainGrace is how long a drained udskit connection stays open for its
// client to close its side first (it does so when it has seen goaway and
// has nothing in flight).
const drainGrace = 2 * time.Second

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
	mine := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit | frame.FeatureClientStream, MaxFrame: c.s.opts.MaxFrame, MaxInFlight: c.s.opts.MaxInFlight}
	if err == nil && c.shmUC != nil && hello.Flags&shm.FeatureShm != 0 {
		mine.Flags |= shm.FeatureShm | shm.FeatureShmCalls
		if !c.s.opts.noCallsBell {
			mine.Flags |= shm.FeatureShmCallsBell
			if !c.s.opts.noShmStreams {
				mine.Flags |= shm.FeatureShmStreams
			}
		}
	}
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
	c.r.MaxFrame = maxFrame
	if mine.Flags&shm.FeatureShm != 0 {
		cs, err := c.serverAcceptShm(c.shmUC)
		var se *shm.Error
		switch {
		case errors.As(err, &se):
			c.connError(ProtocolViolation, err)
			return
		case err != nil:
			c.close(err)
			return
		}
		var sc *serverCalls
		if cs != nil && hello.Flags&shm.FeatureShmCalls != 0 && shm.CheckCalls(cs.region.Size()) {
			sc = newServerCalls(c, cs, mine.Flags&hello.Flags&shm.FeatureShmCallsBell != 0, shm.StreamsInUse(hello.Flags, mine.Flags))
		}
		c.mu.Lock()
		closed := c.closed
		c.shm = cs
		c.slotCalls = sc
		c.mu.Unlock()
		if closed && cs != nil {
			cs.close()
		} else if sc != nil {
			sc.started.Store(true)
			go sc.poll()
		}
	}
	c.raw.SetReadDeadline(time.Time{})
	c.mu.Lock()
	c.ready = true
	draining := c.draining
	c.closeDrainedLocked()
	c.mu.Unlock()
	if draining {
		c.sendGoAway()
	}

	c.loopDone = make(chan struct{})
	c.s.watchInline(c)
	if c.frameLoop() {
		return
	}
	<-c.loopDone // another goroutine took over reading; wait for the end
}

// maxQueued bounds how many inline answers the reader queues before it
// writes them (frame.Writer.QueueFrame also writes at 64 KiB): a client
// pipelining many tiny calls gets its first answers without waiting for the
// whole batch.
const maxQueued = 16

// loneRuns is how many inline calls in a row, each alone in the read buffer,
// make the reader poll for the next request (frameLoop). At 4, 16 callers
// on two connections still made it poll between their requests, and
// rpc-unix lost about 12 % of its req/s (docs/performance.md).
const loneRuns = 32

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
	queued := 0 // responses this loop queued and has not pushed
	// spun: the lone waiter's poll is armed for the next read (armLoneLocked):
	// the last frame was a call run inline and answered, and none is left in
	// flight, so a sequential client sends its next request at once. Only
	// after loneRuns such calls in a row that each came alone (nothing
	// buffered behind it): many callers' requests come in batches, and a
	// poll between them would take the CPU their callers need.
	spun := false
	alone := 0
	for {
		// Answers to inline calls are queued while the next request is
		// already buffered, and go out with one write before the reader
		// could wait: for the rest of a frame, budget or a busy writer.
		if (queued > 0 || c.shmQueued.Load()) && (queued >= maxQueued || !c.r.FrameBuffered()) {
			c.shmQueued.Store(false)
			c.w.Push()
			queued = 0
		}
		c.waitServerBudget()
		c.markBoundary(c.r.Buffered())
		c.growReader()
		h, err := c.r.ReadHeader()
		if spun {
			c.spin.Disarm()
			spun = false
		}
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
				c.shmFailed(err)
				return true
			}
			if call != nil {
				queue := c.r.Buffered() > 0 // (before the watchdog may hand reading off)
				running := c.inlineSeq.Add(1)<<2 | inlineRunning
				if c.inlineH.Load() != call.h {
					c.inlineH.Store(call.h)
				}
				c.inline.Store(running)
				if c.s.watchAsleep.Load() {
					c.s.wakeWatchdog()
				}
				timed := queue || !call.h.quick() || (running>>2)%untimedRuns == 0
				call.inline = running
				dst = c.run(call, dst, queue, timed)
				if cap(dst) > maxPooledBuf {
					dst = nil
				}
				if !c.inline.CompareAndSwap(running, inlineIdle) {
					c.w.Push()   // the new reader may not know of it
					return false // the reading role moved on
				}
				queued++
				if alone = alone + 1; queue {
					alone = 0
				}
				if c.spin != nil && alone >= loneRuns {
					c.mu.Lock()
					spun = c.armLoneLocked(0)
					c.mu.Unlock()
				}
			}
		case frame.TypeCancel:
			if !c.onCancel(&h) {
				return true
			}
		case frame.TypeStreamCredit:
			if !c.onStreamCredit(&h) {
				return true
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
		case frame.TypeRequestData, frame.TypeRequestEnd:
			in, ok := c.onRequestItem(&h)
			if !ok {
				return true
			}
			// A bidi handler waiting for this item reads the next one
			// itself (bidi_lead.go): the role moves to it when nothing
			// else is buffered.
			if in != nil && h.Type == frame.TypeRequestData && c.r.Buffered() == 0 {
				if queued > 0 || c.shmQueued.Load() {
					c.shmQueued.Store(false)
					c.w.Push()
					queued = 0
				}
				if c.passLead(in) {
					return false // the reading role moved on
				}
			}
		case frame.TypeResponse, frame.TypeError, frame.TypeStreamData, frame.TypeStreamEnd, frame.TypeRequestCredit:
			c.connError(ProtocolViolation, fmt.Errorf("client sent a %s frame, which only servers send", h.Type))
			return true
		case frame.Type(shm.TypeRelease):
			if err := c.onShmRelease(&h); err != nil {
				c.shmFailed(err)
				return true
			}
		case frame.Type(shm.TypeOffer):
			c.connError(ProtocolViolation, &shm.Error{Name: shm.NameBadOffer, Detail: "a shm_offer after the first frame"})
			return true
		default: // pong, goaway, unknown types: skip
			if err := c.r.Discard(int(h.HeadLen) + int(h.PayloadLen)); err != nil {
				c.readFailed(err)
				return true
			}
		}
	}
}

// onCancel handles a cancel frame (the reader's). It returns false when the
// read failed (handled: the read loop ends).
func (c *serverConn) onCancel(h *frame.Header) bool {
	hc, ok := c.skipToCall(h)
	if hc != nil {
		if Code(h.Aux) == DeadlineExceeded {
			hc.cancel(context.DeadlineExceeded)
		} else {
			hc.cancel(context.Canceled)
		}
	}
	return ok
}

// onStreamCredit handles a stream_credit frame (the reader's), as onCancel.
func (c *serverConn) onStreamCredit(h *frame.Header) bool {
	hc, ok := c.skipToCall(h)
	if hc != nil && hc.creditWake != nil {
		hc.credit.Add(int64(h.Aux))
		select {
		case hc.creditWake <- struct{}{}:
		default:
		}
	}
	return ok
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
	c.endRequestItems() // EOF is request_end for every client-stream call (spec 4.3)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	var done chan struct{}
	if c.inFlightLocked() > 0 {
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

// hcBatch is how many handler contexts newHandlerCtx allocates at once.
const hcBatch = 32

// newHandlerCtx returns a fresh handler context for one call of method on c,
// taken from an array of hcBatch allocated together: one allocation per hcBatch calls
// instead of one per call (the bytes are the same). A context is never
// reused, so a handler may keep its ctx after it returns (a goroutine it
// started); the cost is that the array, about 5 KiB, stays alive while any
// of its contexts is referenced. Called by the reading goroutine only; the
// call-slot poller takes its own from handlerCtxFrom with a batch of its own.
func (c *serverConn) newHandlerCtx(method string) *handlerCtx {
	return c.handlerCtxFrom(&c.hcs, method)
}

// handlerCtxFrom is newHandlerCtx from the batch *hcs, owned by the one
// goroutine that calls it.
func (c *serverConn) handlerCtxFrom(hcs *[]handlerCtx, method string) *handlerCtx {
	if len(*hcs) == 0 {
		*hcs = make([]handlerCtx, hcBatch)
	}
	hc := &(*hcs)[0]
	*hcs = (*hcs)[1:]
	hc.parent, hc.method, hc.cred, hc.hasCred, hc.remote = c.s.opts.BaseContext, method, c.cred, c.hasCred, c.remote
	return hc
}
