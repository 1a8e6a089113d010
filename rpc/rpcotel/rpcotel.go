package rpcotel

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/udskit/udskit/rpc"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/udskit/udskit/rpc/rpcotel"

// Attribute keys set on spans.
const (
	AttrSystem  = attribute.Key("rpc.system")        // "udskit"
	AttrMethod  = attribute.Key("rpc.method")        // the method name
	AttrCode    = attribute.Key("rpc.udskit.code")   // ok, not_found, ...
	AttrStream  = attribute.Key("rpc.udskit.stream") // true for server-streaming calls
	AttrPeerPID = attribute.Key("udskit.peer.pid")   // server side, unix sockets
	AttrPeerUID = attribute.Key("udskit.peer.uid")
	AttrPeerGID = attribute.Key("udskit.peer.gid")
	AttrServer  = attribute.Key("server.address") // client side, with ClientOptionsAt
)

// Options configures New. The zero value uses OpenTelemetry's global
// TracerProvider and W3C trace context.
type Options struct {
	// TracerProvider makes the tracer. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads and writes the trace context in call metadata.
	// Default propagation.TraceContext{} (traceparent and tracestate).
	Propagator propagation.TextMapPropagator
}

// Tracing makes spans around calls. Create it with New.
type Tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// New returns a Tracing.
func New(opts Options) *Tracing {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := opts.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	return &Tracing{tracer: tp.Tracer(ScopeName), prop: prop}
}

// carrier is call metadata as a propagation.TextMapCarrier.
type carrier rpc.Metadata

func (c carrier) Get(key string) string { return c[key] }
func (c carrier) Set(key, value string) { c[key] = value }
func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// serverSpan starts a server span for info, continuing the trace in the
// call's metadata.
func (t *Tracing) serverSpan(ctx context.Context, info rpc.CallInfo) (context.Context, trace.Span) {
	parent := ctx
	if md := rpc.MetadataFromContext(ctx); len(md) > 0 {
		parent = t.prop.Extract(ctx, carrier(md))
	}
	attrs := []attribute.KeyValue{AttrSystem.String("udskit"), AttrMethod.String(info.Method)}
	if info.Stream {
		attrs = append(attrs, AttrStream.Bool(true))
	}
	if info.HasCred {
		attrs = append(attrs, AttrPeerPID.Int(int(info.Cred.PID)), AttrPeerUID.Int64(int64(info.Cred.UID)), AttrPeerGID.Int64(int64(info.Cred.GID)))
	}
	return t.tracer.Start(parent, info.Method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// end records err's code on span and ends it.
func end(span trace.Span, err error) {
	code := rpc.CodeOf(err)
	span.SetAttributes(AttrCode.String(code.String()))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// UnaryServerInterceptor makes a server span around each unary call.
func (t *Tracing) UnaryServerInterceptor() rpc.UnaryServerInterceptor {
	return func(ctx context.Context, info rpc.CallInfo, req, dst []byte, next rpc.RawHandler) ([]byte, error) {
		ctx, span := t.serverSpan(ctx, info)
		out, err := next(ctx, req, dst)
		end(span, err)
		return out, err
	}
}

// StreamServerInterceptor makes a server span around each streaming call.
func (t *Tracing) StreamServerInterceptor() rpc.StreamServerInterceptor {
	return func(ctx context.Context, info rpc.CallInfo, req []byte, send func([]byte) error, next rpc.RawStreamHandler) error {
		ctx, span := t.serverSpan(ctx, info)
		err := next(ctx, req, send)
		end(span, err)
		return err
	}
}

// ServerOptions returns opts with the tracing interceptors added
// (outermost, so a span covers any other interceptor).
func (t *Tracing) ServerOptions(opts rpc.ServerOptions) rpc.ServerOptions {
	opts.UnaryInterceptors = append([]rpc.UnaryServerInterceptor{t.UnaryServerInterceptor()}, opts.UnaryInterceptors...)
	opts.StreamInterceptors = append([]rpc.StreamServerInterceptor{t.StreamServerInterceptor()}, opts.StreamInterceptors...)
	return opts
}

// clientSpan starts a client span and returns a ctx whose call carries its
// trace context.
func (t *Tracing) clientSpan(ctx context.Context, method string, stream bool, server string) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{AttrSystem.String("udskit"), AttrMethod.String(method)}
	if server != "" {
		attrs = append(attrs, AttrServer.String(server))
	}
	if stream {
		attrs = append(attrs, AttrStream.Bool(true))
	}
	ctx, span := t.tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	md := rpc.Metadata{}
	t.prop.Inject(ctx, carrier(md))
	if len(md) > 0 {
		ctx = rpc.WithMetadata(ctx, md)
	}
	return ctx, span
}

// UnaryClientInterceptor makes a client span around each unary call and
// sends its trace context.
func (t *Tracing) UnaryClientInterceptor() rpc.UnaryClientInterceptor { return t.unaryClient("") }

func (t *Tracing) unaryClient(server string) rpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, dst []byte, invoke rpc.UnaryInvoker) ([]byte, error) {
		ctx, span := t.clientSpan(ctx, method, false, server)
		out, err := invoke(ctx, method, req, dst)
		end(span, err)
		return out, err
	}
}

// StreamClientInterceptor makes a client span for each stream, ended when
// the stream ends.
func (t *Tracing) StreamClientInterceptor() rpc.StreamClientInterceptor { return t.streamClient("") }

func (t *Tracing) streamClient(server string) rpc.StreamClientInterceptor {
	return func(ctx context.Context, method string, req []byte, open rpc.StreamOpener) (*rpc.ClientStream, error) {
		ctx, span := t.clientSpan(ctx, method, true, server)
		st, err := open(ctx, method, req)
		if err != nil {
			end(span, err)
			return nil, err
		}
		st.OnDone(func(err error) { end(span, err) })
		return st, nil
	}
}

// ClientOptions returns opts with the tracing interceptors added (outermost).
func (t *Tracing) ClientOptions(opts rpc.ClientOptions) rpc.ClientOptions {
	return t.ClientOptionsAt("", opts)
}

// ClientOptionsAt is ClientOptions for a client of the server at addr,
// which its spans carry as server.address (the peer, seen from the client).
func (t *Tracing) ClientOptionsAt(addr string, opts rpc.ClientOptions) rpc.ClientOptions {
	opts.UnaryInterceptors = append([]rpc.UnaryClientInterceptor{t.unaryClient(addr)}, opts.UnaryInterceptors...)
	opts.StreamInterceptors = append([]rpc.StreamClientInterceptor{t.streamClient(addr)}, opts.StreamInterceptors...)
	return opts
}
