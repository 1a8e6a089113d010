package rpc

import (
	"context"

	"github.com/udskit/udskit/frame"
)

// Response metadata (protocol/spec.md, 3.1): the head of a response or
// stream_end frame carries metadata entries, like a request's. A handler
// sets them with SetResponseMetadata; a caller receives them through a ctx
// made by WithResponseMetadata. Neither costs anything when unused.

type respMDKey struct{}

// SetResponseMetadata adds md to the metadata the server sends with the
// answer of the call being handled (the response of a unary call, the
// stream_end of a stream), merged over what earlier calls set. Call it in a
// handler (or an interceptor) before it returns; an error answer carries
// none. It refuses keys starting with ':' (reserved for the protocol) and
// metadata over the head limit of frame.MaxHead bytes (16 KiB), with an
// *Error of code InvalidArgument, and returns an error outside a handler.
func SetResponseMetadata(ctx context.Context, md Metadata) error {
	hc, _ := ctx.Value(inKey{}).(*handlerCtx)
	if hc == nil {
		return Errorf(FailedPrecondition, "rpc.SetResponseMetadata called outside a handler: use it with the ctx a handler was given")
	}
	for k := range md {
		if frame.Reserved(k) {
			return Errorf(InvalidArgument, "response metadata key %q: keys starting with %q are reserved for the protocol", k, string(frame.ReservedPrefix))
		}
		if len(k) > 0xffff || len(md[k]) > 0xffff {
			return Errorf(InvalidArgument, "response metadata key %q: key and value must be under 64 KiB each", k)
		}
	}
	hc.mu.Lock()
	defer hc.mu.Unlock()
	merged := make(Metadata, len(hc.respMD)+len(md))
	size := 0
	for k, v := range hc.respMD {
		merged[k] = v
	}
	for k, v := range md {
		merged[k] = v
	}
	for k, v := range merged {
		size += 4 + len(k) + len(v)
	}
	if size > frame.MaxHead {
		return Errorf(InvalidArgument, "response metadata is %d bytes encoded, over the head limit of %d bytes: send large values in the response body", size, frame.MaxHead)
	}
	hc.respMD = merged
	return nil
}

// responseHead is the head to send with hc's answer: nil when the handler
// set no metadata.
func (hc *handlerCtx) responseHead() []byte {
	hc.mu.Lock()
	md := hc.respMD
	hc.mu.Unlock()
	if len(md) == 0 {
		return nil
	}
	head, _ := appendMD(make([]byte, 0, 256), md) // keys checked and size bounded by SetResponseMetadata
	return head
}

// WithResponseMetadata returns a ctx whose unary calls and streams store
// the metadata the server sent with its answer in *dst (set to nil first
// when the answer carried none; left alone when the call fails). For a
// stream, *dst is set when Recv returns io.EOF. Reserved ':' keys are not
// shown.
func WithResponseMetadata(ctx context.Context, dst *Metadata) context.Context {
	return context.WithValue(ctx, respMDKey{}, dst)
}

func responseMDSink(ctx context.Context) *Metadata {
	dst, _ := ctx.Value(respMDKey{}).(*Metadata)
	return dst
}
