// The udskit client: calls and server streams multiplexed over one connection,
// with waiting at start, reconnects, deadlines, cancel, goaway and backpressure.
//
// States (Client):
//   conn      the connection new calls go to, or null (connecting, lost, draining)
//   dialing   true while a connect loop runs (at most one)
//   closed    set once by close(); nothing dials after it
// A call is pending (in `waiting`, no id) until a usable connection exists
// (ready, not draining, under the server's in-flight limit, socket not
// blocked), then in flight (in conn.calls under its id), then done. Its one
// timer and abort listener cover both phases; whichever of response, error,
// timeout, abort or connection loss comes first settles it, exactly once.
import type net from 'node:net';
import { type Addr, parseAddr, formatAddr } from './address.js';
import { UdskitError, ProtocolError, Code, codeNumber } from './codes.js';
import {
  T, HEADER_SIZE, DEFAULT_MAX_FRAME, MIN_MAX_FRAME, DEFAULT_MAX_IN_FLIGHT, FLAG_STREAM, FLAG_REFUSED, INITIAL_CREDIT,
  type Header, type Metadata, writeHeader, encodeRequestHead, encodeFrame, parseMetadata,
} from './frame.js';
import { FrameReader } from './reader.js';
import { Writer } from './writer.js';
import { abstractUnsupported, dialOnce, dialError, transient, backoff, sleep, type Dialed } from './dial.js';

export interface ReconnectOptions {
  /** First delay after a lost connection, ms (default 25). */
  initialDelay?: number;
  /** Cap of the exponential backoff, ms (default 1000). */
  maxDelay?: number;
}

export interface ConnectOptions {
  /** Wait for the server's socket to appear and accept (backoff + jitter), within `timeout`. Default false: one attempt. */
  wait?: boolean;
  /** Bound on connecting at start, including `wait`, ms. Default 10000. */
  timeout?: number;
  /** Aborts connecting at start. */
  signal?: AbortSignal;
  /** Reconnect after the connection is lost (default true), with capped backoff. */
  reconnect?: boolean | ReconnectOptions;
  /** 'udskit' (default, framed) or 'ndjson' (newline JSON: unary JSON calls only). */
  protocol?: 'udskit' | 'ndjson';
  /** Timeout of a unary call without its own, ms; 0 = none. Default 30000. Streams have none by default. */
  callTimeout?: number;
  /** Largest payload this client accepts (the connection uses the smaller of this and the server's). Default 16 MiB. */
  maxFrame?: number;
  /** The most calls that may wait for a connection or a free in-flight slot; more fail at once with resource_exhausted. Default 65536. */
  maxWaiting?: number;
  /** A connection whose peer leaves a frame (or line) half sent for this long is closed, ms. Default 10000. */
  stallTimeout?: number;
}

export type Codec = 'json' | 'raw';

export interface CallOptions {
  /** ms; covers waiting for a connection and the call. Default: the client's callTimeout (unary) or none (stream). */
  timeout?: number;
  signal?: AbortSignal;
  /** Request metadata (keys SHOULD be lowercase ASCII). */
  metadata?: Metadata;
  /** 'json' (default unless the payload is bytes) or 'raw' (Buffer in and out). */
  codec?: Codec;
}

const EMPTY = Buffer.alloc(0);
const PENDING = 0;
const INFLIGHT = 1;
const DONE = 2;
const MAX_REFUSED_RETRIES = 3;

/** One call, unary or stream. */
class Call {
  id = 0;
  state = PENDING;
  conn: Conn | null = null;
  timer: NodeJS.Timeout | undefined = undefined;
  onAbort: (() => void) | undefined = undefined;
  retries = 0;
  constructor(
    readonly method: string,
    readonly head: Buffer,
    readonly body: Buffer | string,
    readonly raw: boolean,
    readonly deadline: number, // performance.now() ms, 0 = none
    readonly signal: AbortSignal | undefined,
    readonly resolve: (v: unknown) => void,
    readonly reject: (e: Error) => void,
    readonly st: StreamState | null,
  ) {}
}

/** Receiving side of a server stream: items held until the application reads them. */
class StreamState {
  items: Buffer[] = [];
  head = 0;
  ended = false;
  err: Error | null = null;
  wake: (() => void) | null = null;
  consumed = 0; // payload+16 bytes read by the application since the last grant
  outstanding = INITIAL_CREDIT; // credit the server still has (may go below 0 by one item)
}

/** A connection (framed or NDJSON). */
abstract class Conn {
  readonly calls = new Map<number, Call>();
  draining = false;
  dead = false;
  protected nextId = 0;
  readonly writer: Writer;
  private stall: NodeJS.Timeout | undefined;

  constructor(readonly client: Client, readonly socket: net.Socket, public maxFrame: number, readonly maxInFlight: number) {
    this.writer = new Writer(socket, () => client.wake());
    socket.on('error', (err) => this.lost(new UdskitError('unavailable', `connection to ${client.address} lost: ${err.message}`, { cause: err })));
    socket.on('close', () => this.lost(new UdskitError('unavailable', `connection to ${client.address} lost`)));
  }

  get usable(): boolean {
    return !this.dead && !this.draining && !this.writer.blocked && this.calls.size < this.maxInFlight;
  }

  /** Picks a free id: counts up, wraps, skips 0 and ids in flight. */
  protected allocId(): number {
    do {
      this.nextId = this.nextId >= 0xffffffff ? 1 : this.nextId + 1;
    } while (this.calls.has(this.nextId));
    return this.nextId;
  }

  abstract send(call: Call): void;
  abstract cancel(call: Call, reason: number): void;
  abstract credit(call: Call, bytes: number): void;
  protected abstract push(chunk: Buffer): void;
  protected abstract get partial(): boolean;

  protected onData(chunk: Buffer): void {
    try {
      this.push(chunk);
    } catch (e) {
      const msg = e instanceof ProtocolError ? e.message : String(e);
      this.fatal(new UdskitError('protocol_violation', `server ${this.client.address} broke the protocol: ${msg}`, { cause: e }));
      return;
    }
    // A peer that stops inside a frame must not hold the connection forever.
    if (this.partial) {
      if (this.stall === undefined) {
        this.stall = setTimeout(() => this.fatal(new UdskitError('unavailable',
          `server ${this.client.address} sent part of a frame and then nothing for ${this.client.stallTimeout}ms (truncated); connection closed`)), this.client.stallTimeout);
      } else {
        this.stall.refresh();
      }
    } else if (this.stall !== undefined) {
      clearTimeout(this.stall);
      this.stall = undefined;
    }
  }

  /** Ends the connection and fails its calls with err. */
  fatal(err: UdskitError): void {
    this.lost(err);
    this.socket.destroy();
  }

  /** The connection is gone: fail every call in flight at once (retryable for loss). */
  lost(err: UdskitError): void {
    if (this.dead) return;
    this.dead = true;
    if (this.stall !== undefined) clearTimeout(this.stall);
    this.writer.close();
    const calls = [...this.calls.values()];
    this.calls.clear();
    for (const c of calls) this.client.settle(c, err);
    this.client.connLost(this);
  }

  /** A call finished: a draining connection closes once nothing is in flight. */
  afterCall(): void {
    if (this.draining && this.calls.size === 0 && !this.dead) {
      this.socket.end();
    } else if (this.client.waitingCount > 0) {
      this.client.wake(); // a slot is free: start the next waiting call
    }
  }
}

class FramedConn extends Conn {
  private readonly reader: FrameReader;

  constructor(client: Client, d: Dialed) {
    super(client, d.socket, d.neg!.maxFrame, Math.max(1, d.neg!.maxInFlight || DEFAULT_MAX_IN_FLIGHT));
    this.reader = new FrameReader(this.maxFrame, (h, b, hs, ps, end) => this.frame(h, b, hs, ps, end));
    d.socket.on('data', (chunk: Buffer) => this.onData(chunk));
    if (d.rest.length > 0) process.nextTick(() => this.onData(d.rest));
  }

  protected push(chunk: Buffer): void {
    this.reader.push(chunk);
  }

  protected get partial(): boolean {
    return this.reader.partial;
  }

  send(call: Call): void {
    const id = this.allocId();
    const head = call.head;
    const raw = call.raw;
    const body = call.body;
    const plen = raw ? (body as Buffer).length : Buffer.byteLength(body as string);
    if (plen > this.maxFrame) {
      this.client.settle(call, new UdskitError('resource_exhausted', `request of ${plen} bytes is over the connection's max frame of ${this.maxFrame}`));
      return;
    }
    let aux = 0;
    if (call.deadline !== 0) {
      const us = Math.ceil((call.deadline - performance.now()) * 1000);
      aux = us <= 0 ? 1 : us > 0xffffffff ? 0 : us;
    }
    const b = Buffer.allocUnsafe(HEADER_SIZE + head.length + plen);
    writeHeader(b, 0, T.request, call.st !== null ? FLAG_STREAM : 0, head.length, id, plen, aux);
    head.copy(b, HEADER_SIZE);
    if (raw) b.set(body as Buffer, HEADER_SIZE + head.length);
    else b.write(body as string, HEADER_SIZE + head.length, 'utf8');
    call.id = id;
    call.state = INFLIGHT;
    call.conn = this;
    this.calls.set(id, call);
    this.writer.push(b);
  }

  cancel(call: Call, reason: number): void {
    if (this.dead) return;
    const b = Buffer.allocUnsafe(HEADER_SIZE);
    writeHeader(b, 0, T.cancel, 0, 0, call.id, 0, reason);
    this.writer.push(b);
  }

  credit(call: Call, bytes: number): void {
    if (this.dead) return;
    const b = Buffer.allocUnsafe(HEADER_SIZE);
    writeHeader(b, 0, T.stream_credit, 0, 0, call.id, 0, bytes);
    this.writer.push(b);
  }

  private frame(h: Header, b: Buffer, hs: number, ps: number, end: number): void {
    switch (h.type) {
      case T.response: {
        const call = this.calls.get(h.id);
        if (call === undefined || call.st !== null) return; // discarded: we no longer know it
        this.calls.delete(h.id);
        let v: unknown;
        if (call.raw) {
          v = Buffer.from(b.subarray(ps, end)); // a copy: never pin the read buffer
        } else if (ps === end) {
          v = undefined;
        } else {
          try {
            v = JSON.parse(b.toString('utf8', ps, end));
          } catch (e) {
            this.client.settle(call, new UdskitError('unknown', `${call.method}: response is not JSON (${(e as Error).message}); use {codec: 'raw'} for bytes`));
            this.afterCall();
            return;
          }
        }
        this.client.settle(call, null, v);
        this.afterCall();
        return;
      }
      case T.error: {
        const msg = b.toString('utf8', hs, ps);
        if (h.id === 0) {
          this.fatal(new UdskitError(h.aux, `server ${this.client.address} closed the connection: ${msg}`));
          return;
        }
        const call = this.calls.get(h.id);
        if (call === undefined) return;
        this.calls.delete(h.id);
        const refused = (h.flags & FLAG_REFUSED) !== 0;
        const details = ps < end ? Buffer.from(b.subarray(ps, end)) : undefined;
        const err = new UdskitError(h.aux, msg, { refused, details });
        if (refused && h.aux === Code.unavailable && call.retries < MAX_REFUSED_RETRIES) {
          // Not processed at all: send it again on another connection.
          call.retries++;
          call.state = PENDING;
          call.conn = null;
          this.client.requeue(call);
        } else {
          this.client.settle(call, err);
        }
        this.afterCall();
        return;
      }
      case T.stream_data: {
        const call = this.calls.get(h.id);
        if (call === undefined || call.st === null) return;
        const st = call.st;
        st.outstanding -= end - ps + HEADER_SIZE;
        if (st.outstanding < -(this.maxFrame + HEADER_SIZE)) {
          throw new ProtocolError('protocol_violation', `stream ${h.id} sent ${-st.outstanding} bytes beyond its credit`);
        }
        st.items.push(Buffer.from(b.subarray(ps, end)));
        if (st.wake !== null) st.wake();
        return;
      }
      case T.stream_end: {
        const call = this.calls.get(h.id);
        if (call === undefined || call.st === null) return;
        this.calls.delete(h.id);
        parseMetadata(b, hs, ps); // validates the head
        this.client.settle(call, null, undefined);
        this.afterCall();
        return;
      }
      case T.ping: {
        // A peer that pings without reading our pongs must not grow our queue.
        if (!this.writer.blocked) this.writer.push(encodeFrame(T.pong, 0, 0, h.aux, EMPTY, b.subarray(ps, end)));
        return;
      }
      case T.pong:
        return;
      case T.goaway:
        this.draining = true;
        this.client.connDraining(this);
        if (this.calls.size === 0) this.socket.end();
        return;
      case T.request: case T.cancel: case T.stream_credit:
        throw new ProtocolError('protocol_violation', `server sent a ${h.type === T.request ? 'request' : h.type === T.cancel ? 'cancel' : 'stream_credit'} frame (client-to-server only)`);
      default:
        return; // unknown types are skipped (spec 3)
    }
  }
}

class NdjsonConn extends Conn {
  private parts: Buffer[] = [];
  private partLen = 0;

  constructor(client: Client, d: Dialed, maxFrame: number) {
    super(client, d.socket, maxFrame, DEFAULT_MAX_IN_FLIGHT);
    d.socket.on('data', (chunk: Buffer) => this.onData(chunk));
  }

  protected get partial(): boolean {
    return this.partLen > 0;
  }

  send(call: Call): void {
    const id = this.allocId();
    const body = call.body as string;
    const line = `{"id":${id},"func":${JSON.stringify(call.method)},"data":${body === '' ? 'null' : body}}\n`;
    if (line.length > this.maxFrame && Buffer.byteLength(line) > this.maxFrame) {
      this.client.settle(call, new UdskitError('resource_exhausted', `request line over the max of ${this.maxFrame} bytes`));
      return;
    }
    call.id = id;
    call.state = INFLIGHT;
    call.conn = this;
    this.calls.set(id, call);
    this.writer.push(Buffer.from(line));
  }

  cancel(): void {
    // NDJSON has no cancel: the reply is discarded when it comes.
  }

  credit(): void {}

  protected push(chunk: Buffer): void {
    let start = 0;
    let nl = chunk.indexOf(10);
    while (nl >= 0) {
      let line: Buffer = chunk.subarray(start, nl);
      if (this.partLen > 0) {
        this.parts.push(line);
        line = Buffer.concat(this.parts, this.partLen + line.length);
        this.parts = [];
        this.partLen = 0;
      }
      if (line.length > this.maxFrame) throw new ProtocolError('frame_too_large', `line of ${line.length} bytes over ${this.maxFrame}`);
      this.line(line);
      start = nl + 1;
      nl = chunk.indexOf(10, start);
    }
    if (start < chunk.length) {
      this.parts.push(chunk.subarray(start));
      this.partLen += chunk.length - start;
      if (this.partLen > this.maxFrame) throw new ProtocolError('frame_too_large', `line over ${this.maxFrame} bytes`);
    }
  }

  private line(line: Buffer): void {
    let o: { id?: unknown; data?: unknown; error?: unknown; code?: unknown };
    try {
      o = JSON.parse(line.toString('utf8'));
    } catch {
      throw new ProtocolError('bad_request', `server sent a line that is not JSON: ${line.toString('utf8', 0, 80)}`);
    }
    if (o === null || typeof o !== 'object') throw new ProtocolError('bad_request', 'server sent a line that is not an object');
    const call = typeof o.id === 'number' ? this.calls.get(o.id) : undefined;
    if (call === undefined) {
      if (o.id === null && typeof o.error === 'string') {
        this.fatal(new UdskitError(codeNumber(String(o.code)) ?? Code.unknown, `server ${this.client.address}: ${o.error}`));
      }
      return;
    }
    this.calls.delete(call.id);
    if (typeof o.error === 'string') {
      const code = codeNumber(String(o.code)) ?? Code.unknown;
      this.client.settle(call, new UdskitError(code, o.error));
    } else {
      this.client.settle(call, null, o.data === null ? undefined : o.data);
    }
    this.afterCall();
  }
}

/** A udskit client. Create with connect(). */
export class Client {
  /** The canonical address. */
  readonly address: string;
  readonly stallTimeout: number;
  private readonly addr: Addr;
  private readonly ndjson: boolean;
  private readonly maxFrame: number;
  private readonly callTimeout: number;
  private readonly maxWaiting: number;
  private readonly reconnect: false | Required<ReconnectOptions>;
  private conn: Conn | null = null;
  private readonly conns = new Set<Conn>();
  private readonly waiting = new Set<Call>();
  private dialing = false;
  private closed = false;
  private readonly closer = new AbortController();
  private readonly heads = new Map<string, Buffer>();

  constructor(address: string, private readonly opts: ConnectOptions = {}) {
    this.addr = parseAddr(address);
    if (this.addr.kind === 'abstract') throw abstractUnsupported(this.addr);
    this.address = formatAddr(this.addr);
    this.ndjson = opts.protocol === 'ndjson';
    if (opts.protocol !== undefined && opts.protocol !== 'ndjson' && opts.protocol !== 'udskit') {
      throw new TypeError(`protocol ${JSON.stringify(opts.protocol)}: want 'udskit' or 'ndjson'`);
    }
    this.maxFrame = Math.max(MIN_MAX_FRAME, Math.min(opts.maxFrame ?? DEFAULT_MAX_FRAME, 0xffffffff));
    this.callTimeout = opts.callTimeout ?? 30_000;
    this.maxWaiting = opts.maxWaiting ?? 65536;
    this.stallTimeout = opts.stallTimeout ?? 10_000;
    const r = opts.reconnect ?? true;
    this.reconnect = r === false ? false : { initialDelay: 25, maxDelay: 1000, ...(r === true ? {} : r) };
  }

  /** @internal Connects for the first time (waiting if asked); use connect(). */
  async start(): Promise<void> {
    const timeout = this.opts.timeout ?? 10_000;
    const deadline = performance.now() + timeout;
    const signal = this.opts.signal;
    for (let attempt = 0; ; attempt++) {
      if (signal?.aborted) throw new UdskitError('canceled', `connect ${this.address}: aborted`, { cause: signal.reason });
      const left = deadline - performance.now();
      try {
        this.adopt(await dialOnce(this.addr, this.ndjson, this.maxFrame, left));
        return;
      } catch (e) {
        const wait = this.opts.wait === true && transient(e);
        const delay = backoff(attempt, 10, 500);
        if (!wait || performance.now() + delay >= deadline) throw dialError(this.address, e, this.opts.wait === true);
        if (!(await sleep(delay, signal))) throw new UdskitError('canceled', `connect ${this.address}: aborted`, { cause: signal?.reason });
      }
    }
  }

  private adopt(d: Dialed): void {
    if (this.closed) {
      d.socket.destroy();
      return;
    }
    const c = this.ndjson ? new NdjsonConn(this, d, this.maxFrame) : new FramedConn(this, d);
    this.conns.add(c);
    this.conn = c;
    this.wake();
  }

  /** Redials in the background with capped backoff until it works or close(). */
  private redial(): void {
    if (this.dialing || this.closed || this.reconnect === false) return;
    this.dialing = true;
    const r = this.reconnect;
    void (async () => {
      for (let attempt = 0; !this.closed; attempt++) {
        try {
          const d = await dialOnce(this.addr, this.ndjson, this.maxFrame, 5000);
          this.dialing = false;
          this.adopt(d);
          return;
        } catch {
          // keep trying: the server may be restarting
        }
        // unref: a background redial alone does not keep the process alive (waiting calls' timers do).
        if (!(await sleep(backoff(attempt, r.initialDelay, r.maxDelay), this.closer.signal, true))) break;
      }
      this.dialing = false;
    })();
  }

  /** @internal a connection died. */
  connLost(c: Conn): void {
    this.conns.delete(c);
    if (this.conn === c) {
      this.conn = null;
      if (this.reconnect === false) {
        this.failWaiting(new UdskitError('unavailable', `connection to ${this.address} lost (reconnect is off)`));
      } else {
        this.redial();
      }
    }
  }

  /** @internal the server sent goaway: new calls go to a new connection. */
  connDraining(c: Conn): void {
    if (this.conn === c) {
      this.conn = null;
      this.redial();
    }
  }

  /** @internal calls waiting for a connection or a free slot. */
  get waitingCount(): number {
    return this.waiting.size;
  }

  /** @internal starts waiting calls while the connection can take them. */
  wake(): void {
    const c = this.conn;
    if (c === null) return;
    for (const call of this.waiting) {
      if (!c.usable) return;
      this.waiting.delete(call);
      c.send(call);
    }
  }

  /** @internal a refused call goes back to the front of the line. */
  requeue(call: Call): void {
    if (this.closed) {
      this.settle(call, new UdskitError('canceled', 'client closed'));
      return;
    }
    this.waiting.add(call);
    this.wake();
  }

  private failWaiting(err: UdskitError): void {
    for (const call of this.waiting) this.settle(call, err);
    this.waiting.clear();
  }

  /** @internal settles a call exactly once: err, or value. */
  settle(call: Call, err: Error | null, value?: unknown): void {
    if (call.state === DONE) return;
    call.state = DONE;
    if (call.timer !== undefined) clearTimeout(call.timer);
    if (call.onAbort !== undefined) call.signal!.removeEventListener('abort', call.onAbort);
    const st = call.st;
    if (st !== null) {
      if (err !== null) st.err = err;
      else st.ended = true;
      if (st.wake !== null) st.wake();
      return;
    }
    if (err !== null) call.reject(err);
    else call.resolve(value);
  }

  private head(method: string, md: Metadata | undefined): Buffer {
    if (md !== undefined) return encodeRequestHead(method, md);
    let h = this.heads.get(method);
    if (h === undefined) {
      if (method === '') throw new TypeError('method must not be empty');
      h = encodeRequestHead(method);
      if (this.heads.size < 1024) this.heads.set(method, h);
    }
    return h;
  }

  private begin(method: string, payload: unknown, opts: CallOptions | undefined, st: StreamState | null,
    resolve: (v: unknown) => void, reject: (e: Error) => void): Call {
    const raw = opts?.codec === 'raw' || (opts?.codec === undefined && payload instanceof Uint8Array);
    let body: Buffer | string;
    if (payload instanceof Uint8Array) {
      body = Buffer.isBuffer(payload) ? payload : Buffer.from(payload.buffer, payload.byteOffset, payload.length);
      if (this.ndjson) body = body.toString('utf8');
    } else if (opts?.codec === 'raw') {
      throw new TypeError('codec raw needs a Buffer or Uint8Array payload');
    } else {
      body = payload === undefined ? '' : JSON.stringify(payload);
    }
    const timeout = opts?.timeout ?? (st === null ? this.callTimeout : 0);
    const deadline = timeout > 0 ? performance.now() + timeout : 0;
    const signal = opts?.signal;
    const call = new Call(method, this.ndjson ? EMPTY : this.head(method, opts?.metadata), body, raw, deadline, signal, resolve, reject, st);
    if (this.closed) {
      this.settle(call, new UdskitError('canceled', `client for ${this.address} is closed`));
      return call;
    }
    if (signal !== undefined) {
      if (signal.aborted) {
        this.settle(call, new UdskitError('canceled', `${method}: aborted`, { cause: signal.reason }));
        return call;
      }
      call.onAbort = () => this.giveUp(call, Code.canceled, `${method}: aborted`);
      signal.addEventListener('abort', call.onAbort, { once: true });
    }
    if (deadline !== 0) {
      call.timer = setTimeout(() => this.giveUp(call, Code.deadline_exceeded, `${method}: deadline exceeded after ${timeout}ms`), timeout);
    }
    if (this.ndjson && st !== null) {
      this.settle(call, new UdskitError('unimplemented', 'NDJSON has no streams; use the udskit protocol'));
      return call;
    }
    const c = this.conn;
    if (c !== null && this.waiting.size === 0 && c.usable) {
      c.send(call);
    } else if (this.waiting.size >= this.maxWaiting) {
      this.settle(call, new UdskitError('resource_exhausted', `${this.waiting.size} calls already wait for a connection to ${this.address}`));
    } else if (c === null && !this.dialing && this.reconnect === false) {
      this.settle(call, new UdskitError('unavailable', `not connected to ${this.address} (reconnect is off)`));
    } else {
      this.waiting.add(call);
      if (c === null) this.redial();
    }
    return call;
  }

  /** The caller gave up (deadline or abort): cancel on the wire if it was sent. */
  private giveUp(call: Call, code: number, msg: string): void {
    if (call.state === DONE) return;
    if (call.state === PENDING) {
      this.waiting.delete(call);
    } else if (call.conn !== null) {
      const c = call.conn;
      c.calls.delete(call.id);
      c.cancel(call, code === Code.deadline_exceeded ? 4 : 1);
      c.afterCall();
    }
    this.settle(call, new UdskitError(code, msg));
  }

  /**
   * Calls method with payload: JSON values are sent as JSON and the response
   * decoded from JSON; a Buffer/Uint8Array is sent as is and the response is
   * a Buffer (or force either with opts.codec).
   */
  call<R = unknown>(method: string, payload?: unknown, opts?: CallOptions): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      this.begin(method, payload, opts, null, resolve as (v: unknown) => void, reject);
    });
  }

  /**
   * Calls a server-streaming method; iterate the result with for await. Items
   * the application has not read yet are bounded by the stream credit (1 MiB
   * plus one item): a slow reader slows only its own stream. Breaking out of
   * the loop cancels the call.
   */
  stream<R = unknown>(method: string, payload?: unknown, opts?: CallOptions): ClientStream<R> {
    return new ClientStream<R>(this, method, payload, opts);
  }

  /** @internal */
  startStream(s: StreamState, method: string, payload: unknown, opts: CallOptions | undefined): Call {
    return this.begin(method, payload, opts, s, () => {}, () => {});
  }

  /** @internal the application read one item of a stream. */
  consumed(call: Call, st: StreamState, n: number): void {
    st.consumed += n + HEADER_SIZE;
    if (st.consumed >= INITIAL_CREDIT / 2 && call.state === INFLIGHT && call.conn !== null) {
      call.conn.credit(call, st.consumed);
      st.outstanding += st.consumed;
      st.consumed = 0;
    }
  }

  /** @internal */
  cancelStream(call: Call): void {
    this.giveUp(call, Code.canceled, `${call.method}: stream canceled`);
  }

  /** Whether a connection is up and taking calls. */
  get connected(): boolean {
    return this.conn !== null && this.conn.usable;
  }

  /** Closes the client: calls not finished fail with canceled; nothing reconnects. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.closer.abort();
    this.failWaiting(new UdskitError('canceled', `client for ${this.address} closed`));
    const conns = [...this.conns];
    this.conn = null;
    await Promise.all(conns.map((c) => new Promise<void>((resolve) => {
      c.lost(new UdskitError('canceled', `client for ${this.address} closed`));
      if (c.socket.destroyed) return resolve();
      c.socket.once('close', () => resolve());
      c.socket.destroy();
    })));
  }
}

/** A server stream as an async iterator (see Client.stream). */
export class ClientStream<R> implements AsyncIterableIterator<R> {
  private call: Call | null = null;
  private readonly st = new StreamState();

  constructor(private readonly client: Client, private readonly method: string, private readonly payload: unknown, private readonly opts: CallOptions | undefined) {}

  [Symbol.asyncIterator](): this {
    return this;
  }

  private ensure(): Call {
    if (this.call === null) this.call = this.client.startStream(this.st, this.method, this.payload, this.opts);
    return this.call;
  }

  next(): Promise<IteratorResult<R>> {
    const call = this.ensure();
    const st = this.st;
    return new Promise((resolve, reject) => {
      const take = (): boolean => {
        if (st.head < st.items.length) {
          const item = st.items[st.head]!;
          st.items[st.head++] = EMPTY;
          if (st.head === st.items.length) {
            st.items = [];
            st.head = 0;
          }
          this.client.consumed(call, st, item.length);
          if (call.raw) {
            resolve({ value: item as R, done: false });
            return true;
          }
          try {
            resolve({ value: (item.length === 0 ? undefined : JSON.parse(item.toString('utf8'))) as R, done: false });
          } catch (e) {
            reject(new UdskitError('unknown', `${this.method}: stream item is not JSON (${(e as Error).message}); use {codec: 'raw'}`));
          }
          return true;
        }
        if (st.err !== null) {
          reject(st.err);
          return true;
        }
        if (st.ended) {
          resolve({ value: undefined, done: true });
          return true;
        }
        return false;
      };
      if (!take()) {
        st.wake = () => {
          if (take()) st.wake = null;
        };
      }
    });
  }

  /** Stops the stream (cancels the call if still running). */
  async return(): Promise<IteratorResult<R>> {
    if (this.call !== null && this.call.state !== DONE) this.client.cancelStream(this.call);
    this.st.items = [];
    this.st.head = 0;
    this.st.ended = true;
    this.st.err = null;
    return { value: undefined, done: true };
  }

  /** Collects all items (for short streams). */
  async toArray(): Promise<R[]> {
    const out: R[] = [];
    for await (const v of this) out.push(v);
    return out;
  }
}

/**
 * Connects to a udskit server (or, with protocol 'ndjson', a newline-JSON
 * one). With wait: true it waits for the socket to appear, within timeout.
 */
export async function connect(address: string, opts: ConnectOptions = {}): Promise<Client> {
  const c = new Client(address, opts);
  await c.start();
  return c;
}
