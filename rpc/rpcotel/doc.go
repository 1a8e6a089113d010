// Package rpcotel is the OpenTelemetry adapter for udskit rpc
// (go.opentelemetry.io/otel): client and server spans for every call, with
// the method, the result code and the peer, and W3C trace context
// (traceparent, tracestate) carried in the call's metadata, so a trace
// crosses from a Node or Python app (which send the same two metadata keys
// without any dependency) through a Go sidecar and on. Opt-in: package rpc
// does not import it.
//
//	tr := rpcotel.New(rpcotel.Options{}) // the global TracerProvider by default
//	s := rpc.NewServer(tr.ServerOptions(rpc.ServerOptions{}))
//	c, _ := rpc.Dial(ctx, addr, tr.ClientOptions(rpc.ClientOptions{}))
//
// Spans: name = the method; kind server or client; attributes rpc.system
// "udskit", rpc.method, rpc.udskit.code (ok, not_found, ...) and, on the
// server over a unix socket, the caller's udskit.peer.pid, udskit.peer.uid
// and udskit.peer.gid from the kernel. A call that fails gets status Error
// with the code and message. NDJSON calls carry no metadata: their server
// spans start new traces.
package rpcotel
