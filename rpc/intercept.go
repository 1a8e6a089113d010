package rpc

import (
	"context"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/uds"
)

// Interceptors run around every call, on servers (ServerOptions.UnaryInterceptors,
// StreamInterceptors) and clients (ClientOptions.UnaryInterceptors,
// StreamInterceptors), the way gRPC's do: for logging, metrics (package
// rpc/rpcprom), tracing (rpc/rpcotel), authorization. The first in a list is
// the outermost. Without any, a call pays one nil check.
//
// A server interceptor sees the method and the caller (CallInfo), the
// metadata (MetadataFromContext(ctx)), the deadline (ctx.Deadline()) and
// the request bytes; it refuses the call by returning an *Error (Errorf(
// PermissionDenied, ...)) without calling next, or calls next, with a ctx
// of its own if it likes (derived from the one it got: MetadataFromContext
// and CredFromContext keep working), and sees the outcome. Standard methods
// (udskit.health) go through interceptors too. Calls refused before any
// handler (unknown method, wrong kind, server draining, too many in flight)
// do not: ServerOptions.OnRefused is told of them (RefusedCall).

// CallInfo describes a call to a server interceptor.
type CallInfo struct {
	Method string
	// Stream is set for a server-streaming call, and for a bidirectional
	// one (with ClientStream).
	Stream bool
	// ClientStream is set for a call that carries request items from the
	// client (protocol/spec.md, 4.3): a bidirectional call goes through the
	// stream interceptors (Stream set too), a client-streaming one through
	// the unary interceptors; req is nil for both (the handler reads the
	// items itself).
	ClientStream bool
	// NDJSON is set for a call from a newline-JSON client (no metadata, no
	// deadline).
	NDJSON bool
	// Cred is the caller's kernel credentials; HasCred is false for TCP.
	Cred    uds.Cred
	HasCred bool
}

// UnaryServerInterceptor wraps a unary call on a server: next runs the rest
// of the chain and the handler. dst is the buffer the response is appended to.
type UnaryServerInterceptor func(ctx context.Context, info CallInfo, req, dst []byte, next RawHandler) ([]byte, error)

// StreamServerInterceptor wraps a server-streaming call: it may pass next a
// send of its own that wraps send (to count or inspect items).
type StreamServerInterceptor func(ctx context.Context, info CallInfo, req []byte, send func([]byte) error, next RawStreamHandler) error

// UnaryInvoker sends a unary call and waits for its result (Client.CallRaw
// without the interceptors).
type UnaryInvoker func(ctx context.Context, method string, req, dst []byte) ([]byte, error)

// UnaryClientInterceptor wraps a unary call on a client (Call and CallRaw).
// It may add metadata to the call (invoke(WithMetadata(ctx, md), ...)),
// refuse it with an *Error, or retry it.
type UnaryClientInterceptor func(ctx context.Context, method string, req, dst []byte, invoke UnaryInvoker) ([]byte, error)

// StreamOpener starts a server-streaming call (Client.Stream without the
// interceptors) with the encoded request.
type StreamOpener func(ctx context.Context, method string, req []byte) (*ClientStream, error)

// StreamClientInterceptor wraps the start of a server-streaming call on a
// client; ClientStream.OnDone tells it when the stream ends.
type StreamClientInterceptor func(ctx context.Context, method string, req []byte, open StreamOpener) (*ClientStream, error)

func chainUnaryServer(ics []UnaryServerInterceptor) UnaryServerInterceptor {
	switch len(ics) {
	case 0:
		return nil
	case 1:
		return ics[0]
	}
	first, rest := ics[0], chainUnaryServer(ics[1:])
	return func(ctx context.Context, info CallInfo, req, dst []byte, next RawHandler) ([]byte, error) {
		return first(ctx, info, req, dst, func(ctx context.Context, req, dst []byte) ([]byte, error) {
			return rest(ctx, info, req, dst, next)
		})
	}
}

func chainStreamServer(ics []StreamServerInterceptor) StreamServerInterceptor {
	switch len(ics) {
	case 0:
		return nil
	case 1:
		return ics[0]
	}
	first, rest := ics[0], chainStreamServer(ics[1:])
	return func(ctx context.Context, info CallInfo, req []byte, send func([]byte) error, next RawStreamHandler) error {
		return first(ctx, info, req, send, func(ctx context.Context, req []byte, send func([]byte) error) error {
			return rest(ctx, info, req, send, next)
		})
	}
}

func chainUnaryClient(ics []UnaryClientInterceptor) UnaryClientInterceptor {
	switch len(ics) {
	case 0:
		return nil
	case 1:
		return ics[0]
	}
	first, rest := ics[0], chainUnaryClient(ics[1:])
	return func(ctx context.Context, method string, req, dst []byte, invoke UnaryInvoker) ([]byte, error) {
		return first(ctx, method, req, dst, func(ctx context.Context, method string, req, dst []byte) ([]byte, error) {
			return rest(ctx, method, req, dst, invoke)
		})
	}
}

func chainStreamClient(ics []StreamClientInterceptor) StreamClientInterceptor {
	switch len(ics) {
	case 0:
		return nil
	case 1:
		return ics[0]
	}
	first, rest := ics[0], chainStreamClient(ics[1:])
	return func(ctx context.Context, method string, req []byte, open StreamOpener) (*ClientStream, error) {
		return first(ctx, method, req, func(ctx context.Context, method string, req []byte) (*ClientStream, error) {
			return rest(ctx, method, req, open)
		})
	}
}

// callInfo describes the call hc serves.
func callInfo(hc *handlerCtx, stream, ndjson bool) CallInfo {
	return CallInfo{Method: hc.method, Stream: stream, NDJSON: ndjson, Cred: hc.cred, HasCred: hc.hasCred}
}

// RefusalReason says why a call was refused before any handler ran.
type RefusalReason string

// The reasons of RefusedCall.
const (
	// RefusedUnknownMethod: no handler has the method's name (Unimplemented).
	RefusedUnknownMethod RefusalReason = "unknown_method"
	// RefusedWrongKind: the method exists but is of another kind (a unary
	// method called as a stream, or the other way round; Unimplemented).
	RefusedWrongKind RefusalReason = "wrong_kind"
	// RefusedDraining: the server drains and refused the call unprocessed
	// (Unavailable, marked refused: the client may resend it elsewhere).
	RefusedDraining RefusalReason = "draining"
	// RefusedInFlight: the connection already had MaxInFlight calls; the
	// server closed it (ResourceExhausted).
	RefusedInFlight RefusalReason = "in_flight"
)

// RefusedCall is a call the server answered with an error before any
// interceptor or handler ran (ServerOptions.OnRefused). Method is the name
// the caller sent: for RefusedUnknownMethod any text a client chose, so do
// not use it as a metric label unless the method is known.
type RefusedCall struct {
	CallInfo
	Code   Code
	Reason RefusalReason
}

// refusalOf names why refuse was sent for a method whose handler is hd.
func refusalOf(hd *handler, refuse *Error) RefusalReason {
	switch {
	case refuse.Refused:
		return RefusedDraining
	case hd == nil:
		return RefusedUnknownMethod
	}
	return RefusedWrongKind
}

// refused tells ServerOptions.OnRefused of a refused call (flags: its
// request's), if it is set.
func (c *serverConn) refused(method string, flags uint8, ndjson bool, reason RefusalReason, code Code) {
	if f := c.s.opts.OnRefused; f != nil {
		f(RefusedCall{CallInfo: CallInfo{Method: method, Stream: flags&frame.FlagStream != 0, ClientStream: flags&frame.FlagClientStream != 0,
			NDJSON: ndjson, Cred: c.cred, HasCred: c.hasCred}, Code: code, Reason: reason})
	}
}
