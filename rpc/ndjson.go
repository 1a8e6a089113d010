package rpc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/udskit/udskit/frame"
)

// NDJSON compatibility: one JSON object per line (the wire format, parsing
// and encoding, is in package frame: frame.ParseNDJSONRequest,
// frame.AppendNDJSONResponse), dispatched to the same handlers as udskit
// calls (the data bytes are the request payload). Lines are capped at the
// server's MaxFrame.

func isNDJSONStart(b byte) bool { return b == frame.NDJSONStart }

func (c *serverConn) serveNDJSON() {
	c.w.LargePayload = 1 << 62 // lines are copied whole
	c.mu.Lock()
	c.ndSem = make(chan struct{}, c.s.opts.MaxInFlight) // NDJSON mode: a drain closes once quiet (serverconn.go)
	c.closeDrainedLocked()
	c.mu.Unlock()
	maxLine := int(c.s.opts.MaxFrame)
	br := c.r.BufReader()
	var long []byte
	// longHeld: bytes of a long line read so far, reserved in the server's
	// total as they arrive (budget.go: half-received lines count; 20
	// connections sending 15 MiB of a line and then dribbling grew the
	// server to 536 MiB when they did not), given back once the line is
	// handled.
	var longHeld int64
	defer func() { c.s.held.Add(-longHeld) }()
	for {
		if long == nil && longHeld != 0 {
			c.s.held.Add(-longHeld)
			longHeld = 0
		}
		if long == nil {
			c.waitServerBudget()
			c.markBoundary(br.Buffered())
			if c.growReader() {
				br = c.r.BufReader()
			}
		}
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(long)+len(line) > maxLine {
				c.w.WriteRaw(frame.AppendNDJSONResponse(nil, nil, nil, fmt.Sprintf("request line longer than %d bytes", maxLine), ResourceExhausted.String()))
				c.close(nil)
				return
			}
			c.reserve(int64(len(line)), true)
			longHeld += int64(len(line))
			long = append(long, line...)
			continue
		}
		if err == io.EOF {
			// The client sent everything (a final line without newline is
			// ignored): answer what is in flight, then close.
			c.peerDoneSending()
			return
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			// The drain's quiet deadline (armNDJSONDrainLocked): close if
			// still idle, else read on (a line came, or calls are running;
			// the last to end arms it again).
			c.raw.SetReadDeadline(time.Time{})
			if len(line) > 0 {
				c.reserve(int64(len(line)), true)
				longHeld += int64(len(line))
				long = append(long, line...)
				continue
			}
			c.mu.Lock()
			idle := c.draining && c.inFlightLocked() == 0 && long == nil && br.Buffered() == 0
			c.mu.Unlock()
			if idle {
				c.close(nil)
				return
			}
			continue
		}
		if err != nil {
			return // closed
		}
		if long != nil {
			line = append(long, line...)
			long = nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if len(line) > maxLine+1 {
			c.w.WriteRaw(frame.AppendNDJSONResponse(nil, nil, nil, fmt.Sprintf("request line longer than %d bytes", maxLine), ResourceExhausted.String()))
			c.close(nil)
			return
		}
		req, perr := frame.ParseNDJSONRequest(line)
		if perr != nil {
			c.w.WriteRaw(frame.AppendNDJSONResponse(nil, req.ID, nil, perr.Error(), InvalidArgument.String()))
			continue
		}
		select { // wait for a slot: backpressure, not an error
		case c.ndSem <- struct{}{}:
		default:
			// Our own backpressure: the sweeper must not count the wait
			// against FrameTimeout (a pipelined next line may be buffered).
			c.stalled.Store(true)
			c.ndSem <- struct{}{}
			c.stalled.Store(false)
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		// A line read while draining is served like any other (the drain
		// deadline bounds it): its client cannot retry a refusal.
		hd := c.s.lookup([]byte(req.Func))
		var refuse *Error
		switch {
		case hd == nil:
			refuse = Errorf(Unimplemented, "unknown method %q", req.Func)
		case hd.bidi != nil:
			refuse = Errorf(Unimplemented, "method %q %s; NDJSON has no streams: use a udskit client", req.Func, bidiWords)
		case hd.cstream != nil:
			refuse = Errorf(Unimplemented, "method %q %s; NDJSON has no streams: use a udskit client", req.Func, clientStreamWords)
		case hd.unary == nil:
			refuse = wrongKind(req.Func, false, true)
		}
		if refuse != nil {
			c.refused(req.Func, 0, true, refusalOf(hd, refuse), refuse.Code)
			<-c.ndSem
			c.w.WriteRaw(frame.AppendNDJSONResponse(nil, req.ID, nil, refuse.Message, refuse.Code.String()))
			continue
		}
		call := callPool.Get().(*srvCall)
		c.ndNext++
		if c.ndNext == 0 {
			c.ndNext = 1
		}
		call.id, call.h, call.ndjson = c.ndNext, hd, true
		call.ndID = append(call.ndID[:0], req.ID...)
		c.acquire(int64(len(req.Data)))
		call.held = int64(len(req.Data))
		call.cost = callCost
		c.s.held.Add(callCost)
		call.req = append(call.req[:0], req.Data...)
		hc := c.newHandlerCtx(hd.name)
		call.ctx = hc
		c.mu.Lock()
		c.calls[call.id] = hc
		c.mu.Unlock()
		c.dispatch(call)
	}
}

func (c *serverConn) ndjsonReply(call *srvCall, out []byte, err error) {
	defer func() { <-c.ndSem }()
	var line []byte
	switch {
	case err != nil:
		e := toError(err)
		line = frame.AppendNDJSONResponse(nil, call.ndID, nil, e.Message, e.Code.String())
	case len(out) > 0 && !json.Valid(out):
		line = frame.AppendNDJSONResponse(nil, call.ndID, nil,
			fmt.Sprintf("method %q returned %d bytes that are not JSON; NDJSON clients need JSON", call.h.name, len(out)), Internal.String())
	default:
		line = frame.AppendNDJSONResponse(nil, call.ndID, out, "", "")
	}
	if len(line) > 1024 { // the line is a copy of the reply: it counts too
		c.hold(int64(len(line)))
		call.held += int64(len(line))
	}
	c.w.WriteRaw(line)
}
