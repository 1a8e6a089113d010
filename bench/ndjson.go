package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// maxNDJSONLine caps one NDJSON response line: the largest payload plus room
// for the envelope.
const maxNDJSONLine = MaxFrame + 4<<10

func init() {
	Register(&Transport{
		Name:    "ndjson-unix",
		Network: "unix",
		Family:  "ndjson",
		PerRequest: "client writes {\"id\":N,\"func\":\"echo\",\"data\":\"<payload as a JSON string>\"}\\n on its own " +
			"connection and reads the {\"id\":N,\"data\":\"...\"}\\n line back; served by the same udskit rpc server",
		Serve: rpcEchoServer,
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			return dialConns(ctx, network, address, conc, func(c net.Conn) Caller {
				return &ndjsonCaller{c: c, r: bufio.NewReaderSize(c, 64<<10)}
			})
		},
	})
}

type ndjsonCaller struct {
	c    net.Conn
	r    *bufio.Reader
	id   uint64
	req  []byte
	line []byte
}

func (n *ndjsonCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	n.id++
	n.req = append(n.req[:0], `{"id":`...)
	n.req = strconv.AppendUint(n.req, n.id, 10)
	n.req = append(n.req, `,"func":"echo","data":"`...)
	n.req = append(n.req, payload...) // printable ASCII without '"' or '\': no escaping needed
	n.req = append(n.req, "\"}\n"...)
	if _, err := n.c.Write(n.req); err != nil {
		return nil, err
	}
	line, err := readLineBytes(n.r, n.line[:0], maxNDJSONLine)
	n.line = line
	if err != nil {
		return nil, err
	}
	return parseNDJSONEcho(line, n.id)
}

// readLineBytes appends one '\n'-terminated line (without it) to dst, failing
// past max bytes.
func readLineBytes(r *bufio.Reader, dst []byte, max int) ([]byte, error) {
	for {
		frag, err := r.ReadSlice('\n')
		if len(dst)+len(frag) > max+1 {
			return dst, fmt.Errorf("ndjson: response line over %d bytes", max)
		}
		dst = append(dst, frag...)
		if err == nil {
			return dst[:len(dst)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return dst, err
		}
	}
}

// parseNDJSONEcho checks a response line for request id and returns the
// echoed string's bytes. The fast path reads {"id":N,"data":"..."} in place;
// anything else (an error reply, escapes) goes through encoding/json.
func parseNDJSONEcho(line []byte, id uint64) ([]byte, error) {
	if len(line) > maxNDJSONLine {
		return nil, fmt.Errorf("ndjson: response line over %d bytes", maxNDJSONLine)
	}
	prefix := strconv.AppendUint([]byte(`{"id":`), id, 10)
	prefix = append(prefix, `,"data":"`...)
	if bytes.HasPrefix(line, prefix) && bytes.HasSuffix(line, []byte(`"}`)) && len(line) >= len(prefix)+2 {
		body := line[len(prefix) : len(line)-2]
		if bytes.IndexByte(body, '\\') < 0 && bytes.IndexByte(body, '"') < 0 {
			return body, nil
		}
	}
	var m struct {
		ID    json.RawMessage `json:"id"`
		Data  json.RawMessage `json:"data"`
		Error string          `json:"error"`
		Code  string          `json:"code"`
	}
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, fmt.Errorf("ndjson: bad response line: %w", err)
	}
	if string(m.ID) != strconv.FormatUint(id, 10) {
		return nil, fmt.Errorf("ndjson: response id %s, want %d", m.ID, id)
	}
	if m.Error != "" || m.Code != "" {
		return nil, fmt.Errorf("ndjson: server error %s: %s", m.Code, m.Error)
	}
	var s string
	if err := json.Unmarshal(m.Data, &s); err != nil {
		return nil, fmt.Errorf("ndjson: data is not a string: %w", err)
	}
	return []byte(s), nil
}
