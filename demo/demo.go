package demo

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/udskit/udskit/rpc"
)

// Options bound what callers can ask of the demo methods. Zero values are the
// documented defaults.
type Options struct {
	// MaxSleep caps sleep's ms. Default 60s.
	MaxSleep time.Duration
	// MaxStream caps stream's n. Default 100000.
	MaxStream int
	// MaxInterval caps stream's interval_ms. Default 10s.
	MaxInterval time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxSleep <= 0 {
		o.MaxSleep = time.Minute
	}
	if o.MaxStream <= 0 {
		o.MaxStream = 100000
	}
	if o.MaxInterval <= 0 {
		o.MaxInterval = 10 * time.Second
	}
	return o
}

// Methods lists the demo methods in the order of the package doc.
var Methods = []string{"echo", "sleep", "fail", "stream", "whoami", "sum", "total"}

// SleepRequest is sleep's request.
type SleepRequest struct {
	MS int64 `json:"ms"`
}

// SleepReply is sleep's response.
type SleepReply struct {
	SleptMS int64 `json:"slept_ms"`
}

// FailRequest is fail's request; both fields are optional.
type FailRequest struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// StreamRequest is stream's request.
type StreamRequest struct {
	N          int   `json:"n"`
	IntervalMS int64 `json:"interval_ms"`
}

// StreamItem is one item of stream.
type StreamItem struct {
	I int `json:"i"`
	N int `json:"n"`
}

// WhoAmI is whoami's response.
type WhoAmI struct {
	PID int32  `json:"pid"`
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// RemoteWhoAmI is whoami's response to a caller on a tls: connection: its
// verified certificate identity.
type RemoteWhoAmI struct {
	SPIFFEID string   `json:"spiffe_id,omitempty"`
	Subject  string   `json:"subject"`
	DNSNames []string `json:"dns_names,omitempty"`
	URIs     []string `json:"uris,omitempty"`
}

// Sum is the demo's bidirectional method "sum" (protocol/spec.md, 4.3):
// each request item is a JSON number; after each it sends the running total;
// after the client's last item it ends the call. An item that is not a
// number fails the call with invalid_argument.
func Sum(ctx context.Context, recv func() (float64, error), send func(float64) error) error {
	total := 0.0
	for {
		n, err := recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		total += n
		if err := send(total); err != nil {
			return err
		}
	}
}

// Total is the demo's client-streaming method "total": the sum of the JSON
// numbers the client sends, answered once after its last item.
func Total(ctx context.Context, recv func() (float64, error)) (float64, error) {
	total := 0.0
	for {
		n, err := recv()
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return 0, err
		}
		total += n
	}
}

// decode reads an optional JSON request: empty or null means the zero value.
func decode(method string, in []byte, v any) error {
	if len(in) == 0 || string(in) == "null" {
		return nil
	}
	if err := json.Unmarshal(in, v); err != nil {
		return rpc.Errorf(rpc.InvalidArgument, "%s: request is not the expected JSON object: %v", method, err)
	}
	return nil
}

func encode(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(dst, b...), nil
}

// Register adds echo, sleep, fail, stream, whoami, sum and total to s.
func Register(s *rpc.Server, opts Options) {
	opts = opts.withDefaults()
	s.HandleRaw("echo", func(_ context.Context, req, _ []byte) ([]byte, error) {
		return req, nil // a RawHandler may return req: no copy
	})
	s.HandleRaw("sleep", func(ctx context.Context, in, dst []byte) ([]byte, error) {
		var req SleepRequest
		if err := decode("sleep", in, &req); err != nil {
			return nil, err
		}
		d := time.Duration(req.MS) * time.Millisecond
		if req.MS < 0 || d > opts.MaxSleep {
			return nil, rpc.Errorf(rpc.InvalidArgument, "sleep: ms %d out of range 0..%d", req.MS, opts.MaxSleep.Milliseconds())
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return encode(dst, SleepReply{SleptMS: req.MS})
	})
	s.HandleRaw("fail", func(_ context.Context, in, _ []byte) ([]byte, error) {
		var req FailRequest
		if err := decode("fail", in, &req); err != nil {
			return nil, err
		}
		code := rpc.FailedPrecondition
		if req.Code != "" {
			c, ok := rpc.ParseCode(req.Code)
			if !ok || c == rpc.OK {
				return nil, rpc.Errorf(rpc.InvalidArgument, "fail: unknown or ok code %q", req.Code)
			}
			code = c
		}
		msg := req.Message
		if msg == "" {
			msg = "fail always fails (that is its job)"
		}
		return nil, rpc.Errorf(code, "%s", msg)
	})
	s.HandleRawStream("stream", func(ctx context.Context, in []byte, send func([]byte) error) error {
		var req StreamRequest
		if err := decode("stream", in, &req); err != nil {
			return err
		}
		iv := time.Duration(req.IntervalMS) * time.Millisecond
		if req.N < 0 || req.N > opts.MaxStream {
			return rpc.Errorf(rpc.InvalidArgument, "stream: n %d out of range 0..%d", req.N, opts.MaxStream)
		}
		if req.IntervalMS < 0 || iv > opts.MaxInterval {
			return rpc.Errorf(rpc.InvalidArgument, "stream: interval_ms %d out of range 0..%d", req.IntervalMS, opts.MaxInterval.Milliseconds())
		}
		var buf []byte
		for i := 0; i < req.N; i++ {
			if i > 0 && iv > 0 {
				t := time.NewTimer(iv)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				}
			}
			b, err := encode(buf[:0], StreamItem{I: i, N: req.N})
			if err != nil {
				return err
			}
			buf = b
			if err := send(b); err != nil {
				return err
			}
		}
		return nil
	})
	rpc.HandleJSONBidi(s, "sum", Sum)
	rpc.HandleJSONClientStream(s, "total", Total)
	s.HandleRaw("whoami", func(ctx context.Context, _, dst []byte) ([]byte, error) {
		cr, ok := rpc.CredFromContext(ctx)
		if p, _ := rpc.PeerFromContext(ctx); !ok && p.Remote != nil {
			r := p.Remote
			return encode(dst, RemoteWhoAmI{SPIFFEID: r.SPIFFEID, Subject: r.Subject, DNSNames: r.DNSNames, URIs: r.URIs})
		}
		if !ok {
			return nil, rpc.Errorf(rpc.FailedPrecondition, "whoami: no kernel credentials nor client certificate; the caller is on plain tcp:")
		}
		return encode(dst, WhoAmI{PID: cr.PID, UID: cr.UID, GID: cr.GID})
	})
}
