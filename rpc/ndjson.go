package rpc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// NDJSON compatibility: one JSON object per line,
//
//	request:  {"id":1,"func":"getService","data":{...}}
//	response: {"id":1,"data":...}   or   {"id":1,"error":"...","code":"not_found"}
//
// dispatched to the same handlers as udskit calls (the data bytes are the
// request payload). Lines are capped at the server's MaxFrame.

func isNDJSONStart(b byte) bool { return b == '{' }

// NDJSONRequest is a decoded NDJSON request line.
type NDJSONRequest struct {
	ID   json.RawMessage // a JSON number or string, echoed back verbatim
	Func string
	Data json.RawMessage // may be empty
}

// ErrNDJSON is wrapped by every NDJSON parse failure.
var ErrNDJSON = errors.New("bad_request")

// ParseNDJSONRequest decodes one request line (without its newline). On a
// bad line the error wraps ErrNDJSON and the returned request's ID is the
// line's id whenever it can be recovered (see RecoverNDJSONID), for the
// error reply; it is empty otherwise.
func ParseNDJSONRequest(line []byte) (NDJSONRequest, error) {
	var m struct {
		ID   json.RawMessage `json:"id"`
		Func *string         `json:"func"`
		Data json.RawMessage `json:"data"`
	}
	line = bytes.TrimSpace(line)
	if err := json.Unmarshal(line, &m); err != nil {
		return NDJSONRequest{ID: RecoverNDJSONID(line)}, fmt.Errorf("%w: %v", ErrNDJSON, err)
	}
	req := NDJSONRequest{ID: m.ID, Data: m.Data}
	switch {
	case len(m.ID) == 0 || string(m.ID) == "null":
		return NDJSONRequest{}, fmt.Errorf("%w: missing \"id\"", ErrNDJSON)
	case !isNDJSONID(m.ID):
		return NDJSONRequest{}, fmt.Errorf("%w: \"id\" must be a number or a string", ErrNDJSON)
	case m.Func == nil || *m.Func == "":
		return req, fmt.Errorf("%w: missing \"func\"", ErrNDJSON)
	}
	req.Func = *m.Func
	if string(req.Data) == "null" {
		req.Data = nil
	}
	return req, nil
}

func isNDJSONID(id []byte) bool {
	return len(id) > 0 && (id[0] == '"' || id[0] == '-' || id[0] >= '0' && id[0] <= '9')
}

// RecoverNDJSONID returns the "id" of a line that is not a valid request,
// when it can be told: a number or string member of the top-level object
// read before the first syntax error (protocol/spec.md, section 7). It
// returns nil otherwise. It reads at most up to the id.
func RecoverNDJSONID(line []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		if key, _ := k.(string); key == "id" {
			if !isNDJSONID(v) {
				return nil
			}
			return v
		}
	}
	return nil
}

// AppendNDJSONResponse appends a response line (with its newline): data when
// errMsg is empty, otherwise the error. id must be valid JSON (nil: null).
func AppendNDJSONResponse(b, id, data []byte, errMsg, code string) []byte {
	if len(id) == 0 {
		id = []byte("null")
	}
	b = append(b, `{"id":`...)
	b = append(b, id...)
	if errMsg != "" {
		b = append(b, `,"error":`...)
		b = strconv.AppendQuote(b, errMsg)
		if code != "" {
			b = append(b, `,"code":`...)
			b = strconv.AppendQuote(b, code)
		}
	} else {
		b = append(b, `,"data":`...)
		if len(data) == 0 {
			b = append(b, "null"...)
		} else {
			b = append(b, data...)
		}
	}
	return append(b, "}\n"...)
}

func (c *serverConn) serveNDJSON() {
	c.w.LargePayload = 1 << 62 // lines are copied whole
	c.ndSem = make(chan struct{}, c.s.opts.MaxInFlight)
	maxLine := int(c.s.opts.MaxFrame)
	br := c.r.BufReader()
	var long []byte
	go func() {
		select {
		case <-c.drained:
			c.close(nil) // NDJSON clients know nothing of goaway
		case <-c.readDone:
		}
	}()
	for {
		if long == nil {
			c.markBoundary(br.Buffered())
			if c.growReader() {
				br = c.r.BufReader()
			}
		}
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(long)+len(line) > maxLine {
				c.w.WriteRaw(AppendNDJSONResponse(nil, nil, nil, fmt.Sprintf("request line longer than %d bytes", maxLine), ResourceExhausted.String()))
				c.close(nil)
				return
			}
			long = append(long, line...)
			continue
		}
		if err == io.EOF {
			// The client sent everything (a final line without newline is
			// ignored): answer what is in flight, then close.
			c.peerDoneSending()
			return
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
			c.w.WriteRaw(AppendNDJSONResponse(nil, nil, nil, fmt.Sprintf("request line longer than %d bytes", maxLine), ResourceExhausted.String()))
			c.close(nil)
			return
		}
		req, perr := ParseNDJSONRequest(line)
		if perr != nil {
			c.w.WriteRaw(AppendNDJSONResponse(nil, req.ID, nil, perr.Error(), InvalidArgument.String()))
			continue
		}
		c.ndSem <- struct{}{} // wait for a slot: backpressure, not an error
		c.mu.Lock()
		draining, closed := c.draining, c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		hd := c.s.lookup([]byte(req.Func))
		var refuse *Error
		switch {
		case draining:
			refuse = Errorf(Unavailable, "server is shutting down; call not processed")
		case hd == nil:
			refuse = Errorf(Unimplemented, "unknown method %q", req.Func)
		case hd.unary == nil:
			refuse = Errorf(Unimplemented, "method %q is server-streaming; NDJSON clients can make unary calls only", req.Func)
		}
		if refuse != nil {
			<-c.ndSem
			c.w.WriteRaw(AppendNDJSONResponse(nil, req.ID, nil, refuse.Message, refuse.Code.String()))
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
		call.req = append(call.req[:0], req.Data...)
		hc := &handlerCtx{parent: c.s.opts.BaseContext, method: hd.name, cred: c.cred, hasCred: c.hasCred}
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
		line = AppendNDJSONResponse(nil, call.ndID, nil, e.Message, e.Code.String())
	case len(out) > 0 && !json.Valid(out):
		line = AppendNDJSONResponse(nil, call.ndID, nil,
			fmt.Sprintf("method %q returned %d bytes that are not JSON; NDJSON clients need JSON", call.h.name, len(out)), Internal.String())
	default:
		line = AppendNDJSONResponse(nil, call.ndID, out, "", "")
	}
	c.w.WriteRaw(line)
}
