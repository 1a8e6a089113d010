// The udskit server: serves handlers to udskit clients (framed) and NDJSON
// clients on one socket, told apart by the first byte (spec 1).
//
// Per connection: state 'sniff' -> 'hello' (udskit) -> 'frames', or 'ndjson'.
// calls holds the calls in flight by id; a call leaves it when answered,
// failed or canceled (a canceled call is never answered). Reading pauses
// while the socket is blocked (write() returned false), so a client that does
// not read its responses cannot make the server buffer without bound.
// Draining (shutdown): goaway is sent, new requests are refused, and each
// connection closes once nothing is in flight and the client has closed
// (or when the shutdown timeout passes).
import net from 'node:net';
import { type Addr, parseAddr, formatAddr } from './address.js';
import { UdskitError, ProtocolError, Code, codeName } from './codes.js';
import {
  T, HEADER_SIZE, HELLO_SIZE, VERSION, DEFAULT_MAX_FRAME, MIN_MAX_FRAME, DEFAULT_MAX_IN_FLIGHT, FEATURE_STREAM_CREDIT,
  FLAG_STREAM, FLAG_REFUSED, INITIAL_CREDIT, MAX_HEAD,
  type Header, type Metadata, decodeHello, encodeHello, writeHeader, parseRequestHead, metadataLen, writeMetadata, encodeFrame,
} from './frame.js';
import { FrameReader } from './reader.js';
import { Writer } from './writer.js';
import { parseRequestLine, lineId, encodeDataLine, encodeErrorLine } from './ndjson.js';
import { bind, type ListenOptions, type Bound } from './listen.js';

/** What a handler learns about its call. */
export interface HandlerContext {
  readonly method: string;
  /** The caller's metadata (empty for NDJSON). */
  readonly metadata: Metadata;
  /** The caller's deadline as a Date.now() timestamp in ms, if it sent one. */
  readonly deadline: number | undefined;
  /** Aborts when the caller cancels, its deadline passes, or the connection goes. */
  readonly signal: AbortSignal;
  /** 'udskit' or 'ndjson'. */
  readonly protocol: 'udskit' | 'ndjson';
  /** Metadata to send with the response (or stream end). */
  readonly responseMetadata: Metadata;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;
export type JsonHandler = (req: Any, ctx: HandlerContext) => unknown;
export type RawHandler = (req: Buffer, ctx: HandlerContext) => Uint8Array | undefined | Promise<Uint8Array | undefined>;
export type JsonStreamHandler = (req: Any, ctx: HandlerContext) => AsyncIterable<unknown> | Iterable<unknown>;
export type RawStreamHandler = (req: Buffer, ctx: HandlerContext) => AsyncIterable<Uint8Array> | Iterable<Uint8Array>;

interface Spec {
  kind: 'json' | 'raw' | 'stream' | 'rawStream';
  fn: (req: Any, ctx: HandlerContext) => Any;
}
const SPEC = Symbol('udskit.handler');
type Tagged = { [SPEC]: Spec };

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

export interface ServerOptions {
  handlers: Record<string, Handler>;
  /** Largest payload accepted and sent (default 16 MiB). */
  maxFrame?: number;
  /** Most calls in flight per connection (default 4096). */
  maxInFlight?: number;
  /** A connection that sends no complete hello (or first line) in this time is closed, ms (default 5000). */
  helloTimeout?: number;
  /** A connection that leaves a frame half sent for this long is closed, ms (default 10000). */
  stallTimeout?: number;
  /** Connections over this many are closed at once (default 0: no limit). */
  maxConns?: number;
  /** Called with connection-level problems (hostile or broken peers); default: ignored. */
  onError?: (err: Error) => void;
}

export interface ShutdownOptions {
  /** How long in-flight calls may take before everything is closed, ms (default 10000). */
  timeout?: number;
}

class Ctx implements HandlerContext {
  private ac: AbortController | null = null;
  reason: UdskitError | null = null;
  responseMetadata: Metadata = {};
  constructor(readonly method: string, readonly metadata: Metadata, readonly deadline: number | undefined, readonly protocol: 'udskit' | 'ndjson') {}

  get signal(): AbortSignal {
    if (this.ac === null) {
      this.ac = new AbortController();
      if (this.reason !== null) this.ac.abort(this.reason);
    }
    return this.ac.signal;
  }

  abort(reason: UdskitError): void {
    if (this.reason !== null) return;
    this.reason = reason;
    if (this.ac !== null) this.ac.abort(reason);
  }
}

class SCall {
  done = false;
  timer: NodeJS.Timeout | undefined = undefined;
  credit = INITIAL_CREDIT;
  wake: (() => void) | null = null;
  constructor(readonly id: number, readonly ctx: Ctx, readonly raw: boolean) {}
}

const EMPTY = Buffer.alloc(0);
const NO_MD: Metadata = Object.freeze({}) as Metadata;

function specOf(h: Handler): Spec {
  return typeof h === 'function' ? { kind: 'json', fn: h } : h[SPEC];
}

function errorOf(e: unknown, ctx: Ctx): { code: number; message: string; details?: Buffer } {
  if (e instanceof UdskitError) return { code: e.number, message: e.message, details: e.details };
  if (ctx.reason !== null) return { code: ctx.reason.number, message: ctx.reason.message };
  return { code: Code.unknown, message: e instanceof Error ? e.message : String(e) };
}

function isThenable(v: unknown): v is PromiseLike<unknown> {
  return v !== null && (typeof v === 'object' || typeof v === 'function') && typeof (v as { then?: unknown }).then === 'function';
}

/** One accepted connection, either protocol. */
class SConn {
  private state: 'sniff' | 'hello' | 'frames' | 'ndjson' | 'closed' = 'sniff';
  private hello: Buffer[] = [];
  private helloLen = 0;
  private reader: FrameReader | null = null;
  private maxFrame: number;
  readonly calls = new Map<number | string, SCall>();
  private readonly writer: Writer;
  private readEnded = false;
  private draining = false;
  private timer: NodeJS.Timeout | undefined;
  private stall: NodeJS.Timeout | undefined;
  private lineParts: Buffer[] = [];
  private lineLen = 0;
  private readonly waiters = new Set<SCall>();

  constructor(private readonly srv: Server, readonly socket: net.Socket) {
    this.maxFrame = srv.maxFrame;
    this.writer = new Writer(socket, () => {
      socket.resume();
      for (const c of this.waiters) c.wake?.();
    });
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('end', () => {
      this.readEnded = true;
      this.maybeClose();
    });
    socket.on('error', (err) => srv.report(err));
    socket.on('close', () => this.closed());
    this.timer = setTimeout(() => this.kill(new Error('no hello within the hello timeout')), srv.helloTimeout);
  }

  private onData(chunk: Buffer): void {
    try {
      this.push(chunk);
    } catch (e) {
      if (e instanceof ProtocolError) this.connError(Code.protocol_violation, e.message);
      else this.connError(Code.internal, String(e));
      return;
    }
    if (this.writer.blocked) this.socket.pause();
    const partial = this.reader !== null ? this.reader.partial : this.lineLen > 0;
    if (partial) {
      if (this.stall === undefined) {
        this.stall = setTimeout(() => this.kill(new Error(`peer sent part of a frame and then nothing for ${this.srv.stallTimeout}ms`)), this.srv.stallTimeout);
      } else {
        this.stall.refresh();
      }
    } else if (this.stall !== undefined) {
      clearTimeout(this.stall);
      this.stall = undefined;
    }
  }

  private push(chunk: Buffer): void {
    switch (this.state) {
      case 'frames':
        this.reader!.push(chunk);
        return;
      case 'ndjson':
        this.lines(chunk);
        return;
      case 'sniff':
        if (chunk[0] === 0x7b) {
          clearTimeout(this.timer);
          this.state = 'ndjson';
          this.lines(chunk);
          return;
        }
        if (chunk[0] !== 0x55) {
          this.kill(new Error(`unknown protocol (first byte 0x${chunk[0]!.toString(16)})`));
          return;
        }
        this.state = 'hello';
        this.helloBytes(chunk);
        return;
      case 'hello':
        this.helloBytes(chunk);
        return;
      default:
        return;
    }
  }

  /** Collects the client's hello; answers with ours (also before a rejection, spec 2). */
  private helloBytes(chunk: Buffer): void {
    this.hello.push(chunk);
    this.helloLen += chunk.length;
    if (this.helloLen < HELLO_SIZE) return;
    const all = Buffer.concat(this.hello, this.helloLen);
    this.hello = [];
    clearTimeout(this.timer);
    this.writer.push(encodeHello({ version: VERSION, flags: FEATURE_STREAM_CREDIT, maxFrame: this.srv.maxFrame, maxInFlight: this.srv.maxInFlight }));
    const client = decodeHello(all); // bad_magic, bad_version (0), bad_limits: a connection error
    this.maxFrame = Math.min(client.maxFrame, this.srv.maxFrame);
    this.state = 'frames';
    this.reader = new FrameReader(this.maxFrame, (h, b, hs, ps, end) => this.frame(h, b, hs, ps, end));
    if (this.srv.draining) this.goaway();
    if (all.length > HELLO_SIZE) this.reader.push(all.subarray(HELLO_SIZE));
  }

  private frame(h: Header, b: Buffer, hs: number, ps: number, end: number): void {
    switch (h.type) {
      case T.request:
        this.request(h, b, hs, ps, end);
        return;
      case T.cancel: {
        const c = this.calls.get(h.id);
        if (c === undefined) return;
        this.calls.delete(h.id);
        c.done = true;
        this.clear(c);
        c.ctx.abort(new UdskitError(h.aux === 4 ? Code.deadline_exceeded : Code.canceled, h.aux === 4 ? 'caller deadline exceeded' : 'canceled by the caller'));
        c.wake?.();
        this.maybeClose();
        return;
      }
      case T.stream_credit: {
        const c = this.calls.get(h.id);
        if (c === undefined) return;
        c.credit += h.aux;
        c.wake?.();
        return;
      }
      case T.ping:
        this.writer.push(encodeFrame(T.pong, 0, 0, h.aux, EMPTY, b.subarray(ps, end)));
        return;
      case T.pong:
        return;
      case T.response: case T.error: case T.stream_data: case T.stream_end: case T.goaway:
        throw new ProtocolError('protocol_violation', `client sent a server-to-client frame (type ${h.type})`);
      default:
        return; // unknown types are skipped
    }
  }

  private request(h: Header, b: Buffer, hs: number, ps: number, end: number): void {
    const { method, metadata } = parseRequestHead(b, hs, ps);
    if (this.calls.has(h.id)) throw new ProtocolError('protocol_violation', `id ${h.id} reused while its call is in flight`);
    if (this.calls.size >= this.srv.maxInFlight) {
      this.connError(Code.resource_exhausted, `over ${this.srv.maxInFlight} calls in flight`);
      return;
    }
    if (this.draining) {
      this.sendError(h.id, Code.unavailable, 'server is shutting down', FLAG_REFUSED);
      return;
    }
    const handler = this.srv.handlers.get(method);
    const isStream = (h.flags & FLAG_STREAM) !== 0;
    if (handler === undefined) {
      this.sendError(h.id, Code.unimplemented, `unknown method ${JSON.stringify(method)}`);
      return;
    }
    const streamKind = handler.kind === 'stream' || handler.kind === 'rawStream';
    if (streamKind !== isStream) {
      // Same wording as Go: `udskit call` finds streaming methods by it.
      this.sendError(h.id, Code.unimplemented, streamKind
        ? `method ${JSON.stringify(method)} is server-streaming; call it with Stream`
        : `method ${JSON.stringify(method)} is unary; call it with Call`);
      return;
    }
    const md: Metadata = {};
    for (const [k, v] of metadata) md[k] = v;
    const ctx = new Ctx(method, md, h.aux === 0 ? undefined : Date.now() + h.aux / 1000, 'udskit');
    const raw = handler.kind === 'raw' || handler.kind === 'rawStream';
    const call = new SCall(h.id, ctx, raw);
    this.calls.set(h.id, call);
    if (h.aux !== 0) {
      call.timer = setTimeout(() => {
        ctx.abort(new UdskitError(Code.deadline_exceeded, 'deadline exceeded'));
        call.wake?.();
      }, Math.ceil(h.aux / 1000));
    }
    let req: unknown;
    if (raw) {
      req = Buffer.from(b.subarray(ps, end));
    } else if (ps < end) {
      try {
        req = JSON.parse(b.toString('utf8', ps, end));
      } catch (e) {
        this.fail(call, new UdskitError(Code.invalid_argument, `${method}: request is not JSON: ${(e as Error).message}`));
        return;
      }
    }
    let out: unknown;
    try {
      out = handler.fn(req, ctx);
    } catch (e) {
      this.fail(call, e);
      return;
    }
    if (streamKind) {
      void this.pump(call, out as AsyncIterable<unknown> | Iterable<unknown>);
    } else if (isThenable(out)) {
      out.then((v) => this.respond(call, v), (e) => this.fail(call, e));
    } else {
      this.respond(call, out);
    }
  }

  private clear(c: SCall): void {
    if (c.timer !== undefined) clearTimeout(c.timer);
  }

  private finish(c: SCall): boolean {
    if (c.done) return false;
    c.done = true;
    this.clear(c);
    this.calls.delete(c.id);
    return true;
  }

  private encodeValue(c: SCall, v: unknown): Buffer | string {
    if (c.raw) {
      if (v === undefined || v === null) return EMPTY;
      if (!(v instanceof Uint8Array)) throw new UdskitError(Code.internal, `${c.ctx.method}: raw handler returned ${typeof v}, want a Buffer`);
      return Buffer.isBuffer(v) ? v : Buffer.from(v.buffer, v.byteOffset, v.length);
    }
    return v === undefined ? '' : JSON.stringify(v);
  }

  private frameOf(type: number, id: number, md: Metadata, body: Buffer | string): Buffer | null {
    const plen = typeof body === 'string' ? Buffer.byteLength(body) : body.length;
    if (plen > this.maxFrame) return null;
    const hl = md === NO_MD ? 0 : metadataLen(md);
    if (hl > MAX_HEAD) return null;
    const b = Buffer.allocUnsafe(HEADER_SIZE + hl + plen);
    writeHeader(b, 0, type, 0, hl, id, plen, 0);
    if (hl > 0) writeMetadata(b, HEADER_SIZE, md);
    if (typeof body === 'string') b.write(body, HEADER_SIZE + hl, 'utf8');
    else b.set(body, HEADER_SIZE + hl);
    return b;
  }

  private respond(c: SCall, v: unknown): void {
    if (c.done || this.state === 'closed') return;
    let body: Buffer | string;
    try {
      body = this.encodeValue(c, v);
    } catch (e) {
      this.fail(c, e);
      return;
    }
    if (this.state === 'ndjson') {
      if (!this.finish(c)) return;
      this.sendLine(encodeDataLine(c.id as unknown as string, typeof body === 'string' ? body : body.toString('utf8')));
      this.maybeClose();
      return;
    }
    const f = this.frameOf(T.response, c.id, c.ctx.responseMetadata, body);
    if (f === null) {
      this.fail(c, new UdskitError(Code.resource_exhausted, `${c.ctx.method}: response over the connection's max frame of ${this.maxFrame} bytes`));
      return;
    }
    if (!this.finish(c)) return;
    this.writer.push(f);
    this.maybeClose();
  }

  private fail(c: SCall, e: unknown): void {
    if (c.done || this.state === 'closed') return;
    this.finish(c);
    const err = errorOf(e, c.ctx);
    if (this.state === 'ndjson') {
      this.sendLine(encodeErrorLine(c.id as unknown as string, err.message, codeName(err.code)));
    } else {
      this.sendError(c.id as number, err.code, err.message, 0, err.details);
    }
    this.maybeClose();
  }

  private sendError(id: number, code: number, message: string, flags = 0, details?: Buffer): void {
    const head = Buffer.from(message.length > MAX_HEAD / 4 ? message.slice(0, MAX_HEAD / 4) : message);
    this.writer.push(encodeFrame(T.error, flags, id, code, head, details ?? EMPTY));
  }

  /** Streams items with credit and socket backpressure. */
  private async pump(c: SCall, src: AsyncIterable<unknown> | Iterable<unknown>): Promise<void> {
    let it: AsyncIterator<unknown> | Iterator<unknown>;
    try {
      const a = (src as AsyncIterable<unknown>)[Symbol.asyncIterator];
      it = a !== undefined ? a.call(src) : (src as Iterable<unknown>)[Symbol.iterator]();
    } catch (e) {
      this.fail(c, new UdskitError(Code.internal, `${c.ctx.method}: stream handler did not return an iterable: ${String(e)}`));
      return;
    }
    try {
      while (true) {
        while (!c.done && c.ctx.reason === null && (c.credit <= 0 || this.writer.blocked)) {
          await new Promise<void>((resolve) => {
            c.wake = resolve;
            this.waiters.add(c);
          });
          c.wake = null;
          this.waiters.delete(c);
        }
        if (c.done || c.ctx.reason !== null) {
          await it.return?.();
          if (!c.done) this.fail(c, c.ctx.reason);
          return;
        }
        const r = await it.next();
        if (c.done) {
          await it.return?.();
          return;
        }
        if (r.done) break;
        const body = this.encodeValue(c, r.value);
        const f = this.frameOf(T.stream_data, c.id as number, NO_MD, body);
        if (f === null) throw new UdskitError(Code.resource_exhausted, `${c.ctx.method}: stream item over the connection's max frame of ${this.maxFrame} bytes`);
        c.credit -= f.length; // payload + 16 (stream_data has no head)
        this.writer.push(f);
      }
      if (!this.finish(c)) return;
      this.writer.push(this.frameOf(T.stream_end, c.id as number, c.ctx.responseMetadata, EMPTY) ?? encodeFrame(T.stream_end, 0, c.id as number, 0, EMPTY, EMPTY));
      this.maybeClose();
    } catch (e) {
      this.fail(c, e);
    }
  }

  // NDJSON: one request per line; at most maxFrame bytes per line.
  private lines(chunk: Buffer): void {
    let start = 0;
    let nl = chunk.indexOf(10);
    while (nl >= 0) {
      let line = chunk.subarray(start, nl);
      if (this.lineLen > 0) {
        this.lineParts.push(line);
        line = Buffer.concat(this.lineParts, this.lineLen + line.length);
        this.lineParts = [];
        this.lineLen = 0;
      }
      if (line.length > this.srv.maxFrame) {
        this.lineTooLong();
        return;
      }
      this.line(line.toString('utf8'));
      start = nl + 1;
      nl = chunk.indexOf(10, start);
    }
    if (start < chunk.length) {
      this.lineParts.push(chunk.subarray(start));
      this.lineLen += chunk.length - start;
      if (this.lineLen > this.srv.maxFrame) this.lineTooLong();
    }
  }

  private lineTooLong(): void {
    this.lineParts = [];
    this.lineLen = 0;
    this.sendLine(encodeErrorLine('null', `line over the limit of ${this.srv.maxFrame} bytes`, 'resource_exhausted'));
    this.state = 'closed';
    this.writer.flush();
    this.socket.end();
    this.srv.report(new Error('NDJSON line over the limit; connection closed'));
  }

  private sendLine(s: string): void {
    this.writer.push(Buffer.from(s));
  }

  private line(text: string): void {
    let r;
    try {
      r = parseRequestLine(text);
    } catch (e) {
      this.sendLine(encodeErrorLine(lineId(text), `bad_request: ${(e as ProtocolError).message.replace(/^bad_request: /, '')}`, 'invalid_argument'));
      return;
    }
    if (this.draining) {
      this.sendLine(encodeErrorLine(r.id, 'server is shutting down', 'unavailable'));
      return;
    }
    const handler = this.srv.handlers.get(r.func);
    if (handler === undefined) {
      this.sendLine(encodeErrorLine(r.id, `unknown method ${JSON.stringify(r.func)}`, 'unimplemented'));
      return;
    }
    if (handler.kind === 'stream' || handler.kind === 'rawStream') {
      this.sendLine(encodeErrorLine(r.id, `${r.func} is a streaming method; NDJSON has no streams`, 'unimplemented'));
      return;
    }
    if (this.calls.has(r.id)) {
      this.sendLine(encodeErrorLine(r.id, `id ${r.id} is already in flight`, 'invalid_argument'));
      return;
    }
    if (this.calls.size >= this.srv.maxInFlight) {
      this.sendLine(encodeErrorLine(r.id, `over ${this.srv.maxInFlight} calls in flight`, 'resource_exhausted'));
      return;
    }
    const ctx = new Ctx(r.func, {}, undefined, 'ndjson');
    const raw = handler.kind === 'raw';
    const call = new SCall(0, ctx, raw);
    (call as { id: number | string }).id = r.id;
    this.calls.set(r.id, call);
    let out: unknown;
    try {
      out = handler.fn(raw ? Buffer.from(r.data) : r.value, ctx);
    } catch (e) {
      this.fail(call, e);
      return;
    }
    if (isThenable(out)) out.then((v) => this.respond(call, v), (e) => this.fail(call, e));
    else this.respond(call, out);
  }

  goaway(): void {
    this.draining = true;
    if (this.state === 'frames') {
      const reason = Buffer.from('server is shutting down');
      this.writer.push(encodeFrame(T.goaway, 0, 0, 0, reason, EMPTY));
    } else if (this.state === 'sniff' || this.state === 'hello') {
      this.socket.destroy();
      return;
    }
    this.maybeClose();
  }

  /** Closes when done: half-closed client or draining, and nothing in flight. */
  private maybeClose(): void {
    if (this.calls.size !== 0 || this.state === 'closed') return;
    const drainedNd = this.draining && this.state === 'ndjson';
    if (this.readEnded || drainedNd) {
      this.state = 'closed';
      this.writer.flush();
      this.socket.end();
    }
  }

  /** A connection error: tell the peer (error frame, id 0), then close. */
  private connError(code: number, message: string): void {
    if (this.state === 'closed') return;
    this.srv.report(new Error(`closing connection: ${codeName(code)}: ${message}`));
    if (this.state === 'frames' || this.state === 'hello') this.sendError(0, code, message);
    this.abortAll(new UdskitError(Code.canceled, 'connection closed'));
    this.state = 'closed';
    this.writer.flush();
    this.socket.end();
    setTimeout(() => this.socket.destroy(), 1000).unref();
  }

  kill(err: Error): void {
    if (this.state !== 'closed') this.srv.report(new Error(`closing connection: ${err.message}`));
    this.state = 'closed';
    this.socket.destroy();
  }

  private abortAll(reason: UdskitError): void {
    for (const c of this.calls.values()) {
      c.done = true;
      this.clear(c);
      c.ctx.abort(reason);
      c.wake?.();
    }
    this.calls.clear();
  }

  private closed(): void {
    clearTimeout(this.timer);
    if (this.stall !== undefined) clearTimeout(this.stall);
    this.state = 'closed';
    this.writer.close();
    this.abortAll(new UdskitError(Code.canceled, 'the client went away'));
    this.srv.conns.delete(this);
    this.srv.connClosed();
  }
}

/** A udskit server. Create with createServer(). */
export class Server {
  readonly handlers = new Map<string, Spec>();
  readonly maxFrame: number;
  readonly maxInFlight: number;
  readonly helloTimeout: number;
  readonly stallTimeout: number;
  readonly conns = new Set<SConn>();
  draining = false;
  /** Connections accepted so far. */
  accepted = 0;
  private readonly net: net.Server;
  private bound: Bound | null = null;
  private addr: Addr | null = null;
  private idle: (() => void) | null = null;

  constructor(private readonly opts: ServerOptions) {
    for (const [name, h] of Object.entries(opts.handlers)) {
      if (name === '') throw new TypeError('a method name must not be empty');
      this.handlers.set(name, specOf(h));
    }
    this.maxFrame = Math.max(MIN_MAX_FRAME, Math.min(opts.maxFrame ?? DEFAULT_MAX_FRAME, 0xffffffff));
    this.maxInFlight = Math.max(1, opts.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT);
    this.helloTimeout = opts.helloTimeout ?? 5000;
    this.stallTimeout = opts.stallTimeout ?? 10_000;
    this.net = net.createServer({ allowHalfOpen: true }, (s) => this.accept(s));
    this.net.on('error', (err) => this.report(err));
  }

  private accept(s: net.Socket): void {
    if (this.draining || (this.opts.maxConns !== undefined && this.opts.maxConns > 0 && this.conns.size >= this.opts.maxConns)) {
      s.destroy();
      return;
    }
    this.accepted++;
    this.conns.add(new SConn(this, s));
  }

  /** @internal */
  report(err: Error): void {
    this.opts.onError?.(err);
  }

  /**
   * Listens on addr (any udskit address). A socket path gets mode `opts.mode`
   * (default 0o600) with no window of looser permissions; a stale socket there
   * is removed only after a connect to it is refused. Resolves to the
   * canonical address (for tcp port 0, with the real port).
   */
  async listen(address: string, opts: ListenOptions = {}): Promise<string> {
    const a = parseAddr(address);
    this.bound = await bind(this.net, a, opts);
    if (a.kind === 'tcp') {
      const ai = this.net.address() as net.AddressInfo;
      const host = a.name.slice(0, a.name.lastIndexOf(':'));
      this.addr = { kind: 'tcp', name: `${host}:${ai.port}` };
    } else {
      this.addr = a;
    }
    return formatAddr(this.addr);
  }

  /** The canonical address listened on. */
  get address(): string {
    return this.addr === null ? '' : formatAddr(this.addr);
  }

  private stopListening(): Promise<void> {
    return new Promise((resolve) => {
      if (!this.net.listening) return resolve();
      this.net.close(() => resolve());
      this.bound?.cleanup();
    });
  }

  /** @internal */
  connClosed(): void {
    if (this.conns.size === 0 && this.idle !== null) this.idle();
  }

  /**
   * Graceful shutdown: stop accepting (the socket file is removed), send
   * goaway so clients move new calls elsewhere (requests that still arrive
   * are refused unprocessed), let calls in flight finish and send their
   * answers, and resolve once every client has gone; after `timeout` ms the
   * rest is closed (their handlers' signals abort).
   */
  async shutdown(opts: ShutdownOptions = {}): Promise<void> {
    this.draining = true;
    const stopped = this.stopListening();
    for (const c of this.conns) c.goaway();
    if (this.conns.size > 0) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          for (const c of this.conns) c.kill(new Error('shutdown timeout'));
          resolve();
        }, opts.timeout ?? 10_000);
        this.idle = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
    await stopped;
  }

  /** Closes at once: every connection and the listener. */
  async close(): Promise<void> {
    this.draining = true;
    const stopped = this.stopListening();
    for (const c of [...this.conns]) c.socket.destroy();
    await stopped;
  }
}

/** Creates a server; call listen() on it. */
export function createServer(opts: ServerOptions): Server {
  return new Server(opts);
}
