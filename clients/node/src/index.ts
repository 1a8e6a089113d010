// udskit for Node.js: client and server for the udskit wire protocol
// (protocol/spec.md), byte-compatible with the Go implementation. Zero dependencies.
export { connect, Client, ClientStream } from './client.js';
export type { ConnectOptions, CallOptions, ReconnectOptions, Codec } from './client.js';
export { createServer, Server, raw, stream, rawStream, bidi, rawBidi, clientStream, rawClientStream } from './server.js';
export type { JsonBidiHandler, RawBidiHandler, JsonClientStreamHandler, RawClientStreamHandler } from './server.js';
export { BidiCall, ClientStreamCall } from './bidi.js';
export type { BidiOptions } from './client.js';
export type { ServerOptions, ShutdownOptions, HealthStatus, HandlerContext, Handler, JsonHandler, RawHandler, JsonStreamHandler, RawStreamHandler } from './server.js';
export type { ListenOptions } from './listen.js';
export { NotSocketError, InUseError, BadLockFileError } from './listen.js';
export { UdskitError, ProtocolError, Code, codeName, codeNumber, isRetryable } from './codes.js';
export { fetchStats, parseStats } from './stats.js';
export type { ServerStats, ShmServerStats } from './stats.js';
export type { CodeName } from './codes.js';
export { parseAddr, formatAddr, AddrError, splitSSH } from './address.js';
export type { TLSOptions, ServerTLSOptions, PeerPolicy } from './tls.js';
export { allowSpiffeIds, allowDnsNames, allowAnyVerified, anyPeer, allPeers } from './tls.js';
export type { SSHOptions } from './ssh.js';
export type { Peer } from './handler.js';
export type { SSHTarget } from './address.js';
export type { Addr, AddrKind } from './address.js';
export type { Metadata } from './frame.js';
export { parseTraceparent, formatTraceparent, newTrace, childOf, traceMetadata, traceFromMetadata } from './trace.js';
export type { TraceContext } from './trace.js';
export type { UnaryServerInterceptor, StreamServerInterceptor, UnaryNext, StreamNext } from './interceptors.js';
export type { UnaryClientInterceptor, StreamClientInterceptor, UnaryInvoker, StreamOpener, ClientCall, CallKind } from './client.js';
