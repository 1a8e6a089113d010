package rpc

import (
	"context"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/uds"
)

// Metadata is a call's small key/value pairs (at most frame.MaxHead bytes
// together with the method name).
type Metadata map[string]string

type mdKey struct{}

// WithMetadata returns a ctx whose calls carry md (merged over any metadata
// already in ctx).
func WithMetadata(ctx context.Context, md Metadata) context.Context {
	if old, ok := ctx.Value(mdKey{}).(Metadata); ok {
		m := make(Metadata, len(old)+len(md))
		for k, v := range old {
			m[k] = v
		}
		for k, v := range md {
			m[k] = v
		}
		md = m
	}
	return context.WithValue(ctx, mdKey{}, md)
}

func outgoingMD(ctx context.Context) Metadata {
	md, _ := ctx.Value(mdKey{}).(Metadata)
	return md
}

// MetadataFromContext returns the metadata the caller sent, in a handler.
func MetadataFromContext(ctx context.Context) Metadata {
	if hc, ok := ctx.(*handlerCtx); ok {
		return hc.metadata()
	}
	if v, ok := ctx.Value(inKey{}).(*handlerCtx); ok {
		return v.metadata()
	}
	return nil
}

// CredFromContext returns the caller's kernel credentials, in a handler.
// ok is false for TCP callers.
func CredFromContext(ctx context.Context) (cred uds.Cred, ok bool) {
	if v, _ := ctx.Value(inKey{}).(*handlerCtx); v != nil {
		return v.cred, v.hasCred
	}
	return uds.Cred{}, false
}

// PeerFromContext returns, in a handler, who called: a local process
// (Peer.HasCred, its kernel credentials, as CredFromContext gives) or a
// remote workload on a tls: connection (Peer.Remote, its verified
// certificate identity and SPIFFE ID). ok is false outside a handler.
func PeerFromContext(ctx context.Context) (peer uds.Peer, ok bool) {
	if v, _ := ctx.Value(inKey{}).(*handlerCtx); v != nil {
		return uds.Peer{Cred: v.cred, HasCred: v.hasCred, Remote: v.remote}, true
	}
	return uds.Peer{}, false
}

// MethodFromContext returns the method being served, in a handler.
func MethodFromContext(ctx context.Context) string {
	if v, _ := ctx.Value(inKey{}).(*handlerCtx); v != nil {
		return v.method
	}
	return ""
}

type inKey struct{}

// appendMD appends an application's metadata, refusing the keys reserved
// for the protocol (spec 3.1).
func appendMD(b []byte, md Metadata) ([]byte, *Error) {
	for k, v := range md {
		if frame.Reserved(k) {
			return b, Errorf(InvalidArgument, "metadata key %q: keys starting with %q are reserved for the protocol", k, string(frame.ReservedPrefix))
		}
		b = frame.AppendMD(b, k, v)
	}
	return b, nil
}

func parseMD(raw []byte) Metadata {
	if len(raw) == 0 {
		return nil
	}
	md := Metadata{}
	_ = frame.RangeAppMetadata(raw, func(k, v []byte) bool {
		md[string(k)] = string(v)
		return true
	})
	return md
}
