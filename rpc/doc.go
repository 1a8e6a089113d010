// Package rpc is udskit's multiplexed RPC over unix sockets (and TCP): a
// Server that dispatches calls by method name to raw-bytes, JSON or protobuf
// handlers (unary, server-streaming, client-streaming or bidirectional), and a Client that runs any number of
// concurrent calls over one connection, or a small pool of them
// (ClientOptions.Conns), matched by id and answered out of order. The wire format is package frame, specified in protocol/spec.md.
//
// Server:
//
//	s := rpc.NewServer(rpc.ServerOptions{})
//	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
//		return append(dst, req...), nil
//	})
//	rpc.HandleJSON(s, "getService", func(ctx context.Context, req Query) (Service, error) { ... })
//	l, _ := uds.Listen(ctx, "unix:/run/app.sock", uds.ListenOptions{})
//	go s.Serve(l)
//	defer s.Shutdown(ctx) // goaway, finish in-flight calls, close
//
// Handlers find the caller's kernel credentials with CredFromContext and the
// call's metadata with MetadataFromContext; the handler ctx ends when the
// caller's deadline passes, the caller cancels, or the connection goes.
//
// Client:
//
//	c, _ := rpc.Dial(ctx, "unix:/run/app.sock", rpc.ClientOptions{})
//	var svc Service
//	err := c.Call(ctx, "getService", Query{Name: "db"}, &svc)
//	out, err := c.CallRaw(ctx, "echo", payload, buf[:0]) // no allocation per call
//
// Client-streaming and bidirectional calls (protocol/spec.md 4.3): a server
// registers them with HandleRawBidi, HandleJSONBidi, HandleProtoBidi and
// HandleRawClientStream, HandleJSONClientStream, HandleProtoClientStream
// (the handler reads request items with recv); a client opens them with
// Client.Bidi and Client.ClientStreaming, or typed with OpenJSONBidi and the
// like, and gets a *BidiStream: Send, CloseSend (a half-close), Recv,
// CloseAndRecv. Items are flow-controlled both ways, so a side that stops
// reading stalls only its own call.
//
// Errors from the server are *Error with a Code. A call in flight when the
// connection drops fails at once with Code Unavailable (Retryable reports
// true); the client reconnects with backoff. New calls fail fast (spec 4.2):
// they wait for the reconnect only until one attempt has failed, then fail
// with Unavailable saying what the dial found (ClientOptions.WaitForReady
// makes them wait within their deadline instead). A server whose peer policy
// refuses this client says so before its hello (spec 5.4): Dial fails with a
// *RefusedError, Code PermissionDenied, not retryable. CodeOf and IsRetryable
// also classify Dial's errors (protocol/errors.json).
//
// Shared memory (Linux, local unix sockets; protocol/spec.md section 10):
// a Go client offers the server a sealed memfd region in the handshake, and
// payloads of 16 KiB or more then travel in it, the socket carrying only a
// descriptor; the API is the same. Each side copies what it receives out
// of the region at once (a handler's request bytes are private), a full
// region makes senders wait within their deadline, and Client.ShmStats /
// Server.ShmStats show the fill level. ClientOptions.NoShm and
// ServerOptions.NoShm turn it off; TCP, TLS, ssh:// and peers that do not
// negotiate it keep the socket path (docs/internals.md, "Shared memory").
// Two opt-ins skip copies where the peer is trusted or bytes are read once:
// ServerOptions.ShmInPlace (handlers read the request and build the answer
// in the region) and Client.CallRawView (the answer is read in place until
// RawView.Release); the peer can then change bytes while they are read.
//
// The same listener also serves newline-delimited JSON clients
// ({"id":1,"func":"getService","data":{...}}\n), told apart by their first
// byte and dispatched to the same handlers; see docs/rpc.md.
package rpc
