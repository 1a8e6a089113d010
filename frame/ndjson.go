package frame

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// NDJSON is the compatibility protocol of protocol/spec.md, section 7: one
// JSON object per line,
//
//	request:  {"id":1,"func":"getService","data":{...}}
//	response: {"id":1,"data":...}   or   {"id":1,"error":"...","code":"not_found"}
//
// A connection whose first byte is NDJSONStart speaks it. Vectors:
// protocol/vectors/ndjson.json.

// NDJSONStart is the first byte of an NDJSON connection ('{'), where a
// udskit one starts with Magic[0] ('U').
const NDJSONStart = '{'

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
		b = appendJSONString(b, errMsg)
		if code != "" {
			b = append(b, `,"code":`...)
			b = appendJSONString(b, code)
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

// appendJSONString appends s as a JSON string. Not strconv.AppendQuote: its
// Go escapes (\a, \x00, \xff) are not JSON, and a handler's error message
// may hold any byte.
func appendJSONString(b []byte, s string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "<" stays "<", as it always has
	enc.Encode(s)            // a string always encodes
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}
