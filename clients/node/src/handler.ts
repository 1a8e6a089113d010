// Handlers and their context: plain functions are JSON unary handlers;
// raw(), stream() and rawStream() tag the other kinds.
import type { UdskitError } from './codes.js';
import { type Metadata, metadataOf } from './frame.js';
import { type TraceContext, traceFromMetadata } from './trace.js';

/** What a handler learns about its call. */
export interface HandlerContext {
  readonly method: string;
  /** The caller's metadata (empty for NDJSON), without the protocol's reserved keys (those starting with ':'). */
  readonly metadata: Metadata;
  /** The caller's deadline as a Date.now() timestamp in ms, if it sent one. */
  readonly deadline: number | undefined;
  /** Aborts when the caller cancels, its deadline passes, or the connection goes. */
  readonly signal: AbortSignal;
  /** 'udskit' or 'ndjson'. */
  readonly protocol: 'udskit' | 'ndjson';
  /** Metadata to send with the response (or stream end). A key starting with ':' (reserved for the protocol) makes the call fail with internal instead. */
  readonly responseMetadata: Metadata;
  /**
   * Who called, on a tls: listener: the verified client certificate's identity (its SPIFFE ID
   * when its URI SAN is one). undefined on unix sockets (Node cannot read SO_PEERCRED) and plain tcp:.
   */
  readonly peer: Peer | undefined;
  /**
   * The W3C trace context the caller sent (its traceparent and tracestate metadata), or
   * undefined. Pass it on: client.call(method, req, { trace: ctx.trace }) sends a child of it.
   */
  readonly trace: TraceContext | undefined;
}

/** A remote peer's verified certificate identity. */
export interface Peer {
  kind: 'remote';
  subject: string;
  dnsNames: string[];
  uris: string[];
  /** The URI SAN when the certificate is an X.509-SVID (exactly one URI SAN, scheme spiffe). */
  spiffeId: string | undefined;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;
export type JsonHandler = (req: Any, ctx: HandlerContext) => unknown;
export type RawHandler = (req: Buffer, ctx: HandlerContext) => Uint8Array | undefined | Promise<Uint8Array | undefined>;
export type JsonStreamHandler = (req: Any, ctx: HandlerContext) => AsyncIterable<unknown> | Iterable<unknown>;
export type RawStreamHandler = (req: Buffer, ctx: HandlerContext) => AsyncIterable<Uint8Array> | Iterable<Uint8Array>;

export interface Spec {
  kind: 'json' | 'raw' | 'stream' | 'rawStream' | 'bidi' | 'rawBidi' | 'clientStream' | 'rawClientStream';
  fn: (req: Any, ctx: HandlerContext) => Any;
}
const SPEC = Symbol('udskit.handler');

/** The built-in health method (names starting `udskit.` are reserved for built-in methods). */
export const HEALTH = 'udskit.health';
/** The standard method listing a server's methods (spec 9.2). */
export const METHODS = 'udskit.methods';
/** The standard method answering the server's statistics (spec 9.3). */
export const STATS = 'udskit.stats';
/** The prefix of the reserved method names. */
export const RESERVED_PREFIX = 'udskit.';
export type Tagged = { [SPEC]: Spec };

/** A handler: a plain function is a JSON unary handler; wrap others with raw(), stream(), rawStream(). */
export type Handler = JsonHandler | Tagged;

/** A unary handler on raw bytes: gets a Buffer, returns bytes. */
export function raw(fn: RawHandler): Tagged {
  return { [SPEC]: { kind: 'raw', fn } };
}

/** A server-streaming handler on JSON: an (async) generator of items. */
export function stream(fn: JsonStreamHandler): Tagged {
  return { [SPEC]: { kind: 'stream', fn } };
}

/** A server-streaming handler on raw bytes. */
export function rawStream(fn: RawStreamHandler): Tagged {
  return { [SPEC]: { kind: 'rawStream', fn } };
}

/** @internal tags fn as a handler of kind (server-bidi.ts builds the client-stream kinds with it). */
export function tag(kind: Spec['kind'], fn: Spec['fn']): Tagged {
  return { [SPEC]: { kind, fn } };
}

/** @internal */
export function specOf(h: Handler): Spec {
  return typeof h === 'function' ? { kind: 'json', fn: h } : h[SPEC];
}

/** The HandlerContext a handler receives (not exported from the package; public in the .d.ts
 * because server-conn.d.ts names it: stripping it from the .d.ts breaks users with skipLibCheck false). */
export class Ctx implements HandlerContext {
  private ac: AbortController | null = null;
  reason: UdskitError | null = null;
  /** responseMetadata once looked at; null: never (nothing to send; the object is made on first use). */
  rmd: Metadata | null = null;
  /** metadata once looked at (made from the wire entries on first use). */
  private md: Metadata | null = null;
  peer: Peer | undefined = undefined;
  /**
   * entries: the request head's metadata entries in wire order (null: none); the metadata
   * object a handler sees is made from them when it first looks (most calls never do).
   */
  constructor(readonly method: string, private readonly entries: [string, string][] | null, readonly deadline: number | undefined, readonly protocol: 'udskit' | 'ndjson') {}

  get metadata(): Metadata {
    if (this.md === null) this.md = this.entries === null ? {} : metadataOf(this.entries);
    return this.md;
  }

  get responseMetadata(): Metadata {
    if (this.rmd === null) this.rmd = {};
    return this.rmd;
  }

  get trace(): TraceContext | undefined {
    return traceFromMetadata(this.metadata);
  }

  get signal(): AbortSignal {
    if (this.ac === null) {
      this.ac = new AbortController();
      if (this.reason !== null) this.ac.abort(this.reason);
    } else if (this.reason !== null && !this.ac.signal.aborted) {
      this.ac.abort(this.reason); // cancelled with abortLater, its batch not yet run: aborted for whoever looks
    }
    return this.ac.signal;
  }

  abort(reason: UdskitError): void {
    if (this.reason !== null) return;
    this.reason = reason;
    if (this.ac !== null) this.ac.abort(reason);
  }

  /**
   * abort() for one of many calls cancelled at once (a connection that went or
   * broke a limit): the call is cancelled now (reason set; signal aborted for
   * whoever reads ctx.signal), and the signal's listeners run in batches of
   * ABORT_BATCH per event-loop turn. Dispatching 4,096 abort events took 70 ms
   * in one callback (16,000 calls of four connections: 300 ms), during which
   * the connection's close and every other client waited.
   */
  abortLater(reason: UdskitError): void {
    if (this.reason !== null) return;
    this.reason = reason;
    if (this.ac === null) return; // a signal made later is born aborted
    laterQueue.push(this);
    if (!laterScheduled) {
      laterScheduled = true;
      setImmediate(abortBatch);
    }
  }

  /** @internal dispatches an abortLater'd signal (no-op if done already). */
  dispatchAbort(): void {
    if (this.ac !== null && !this.ac.signal.aborted) this.ac.abort(this.reason);
  }
}

/** Signal aborts dispatched per event-loop turn (see Ctx.abortLater). */
export const ABORT_BATCH = 256;
let laterQueue: (Ctx | undefined)[] = [];
let laterHead = 0;
let laterScheduled = false;

function abortBatch(): void {
  const end = Math.min(laterQueue.length, laterHead + ABORT_BATCH);
  while (laterHead < end) {
    const c = laterQueue[laterHead];
    laterQueue[laterHead++] = undefined;
    c!.dispatchAbort(); // (a listener that throws is reported by Node, not here)
  }
  if (laterHead < laterQueue.length) {
    setImmediate(abortBatch); // the rest (and any a listener queued) next turn
    return;
  }
  laterQueue = [];
  laterHead = 0;
  laterScheduled = false;
}
