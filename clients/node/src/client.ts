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
import { type Addr, parseAddr, formatAddr } from './address.js';
import { UdskitError, Code } from './codes.js';
import { HEADER_SIZE, INITIAL_CREDIT, MAX_HEAD, EMPTY, type Metadata, clampMaxFrame, toBuffer, encodeRequestHead, reservedKeyOf, reservedKeyMessage } from './frame.js';
import { type TLSOptions } from './tls.js';
import { type SSHOptions } from './ssh.js';
import { abstractUnsupported, netOptions, dialOnce, dialError, deadlineIn, transient, backoff, sleep, type Dialed } from './dial.js';
import { Call, StreamState, PENDING, INFLIGHT, DONE } from './call.js';
import { type Conn, FramedConn, NdjsonConn } from './conn.js';
import { unaryClientChain, streamClientChain } from './interceptors.js';
import { type TraceContext, childOf, traceMetadata } from './trace.js';
import { UpState, BidiCall, ClientStreamCall } from './bidi.js';

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
  /** Default of CallOptions.waitForReady for this client's calls. Default false: fail fast (spec 4.2). */
  waitForReady?: boolean;
  /** For tls:HOST:PORT addresses (required there): CA bundle, client certificate, server name or SPIFFE ID. */
  tls?: TLSOptions;
  /** For ssh://[user@]host[:port]/path addresses: the ssh client and extra arguments. */
  ssh?: SSHOptions;
  /** Run around every unary call, the first outermost (see interceptors.ts). */
  unaryInterceptors?: UnaryClientInterceptor[];
  /** Run around every server-streaming call, the first outermost. */
  streamInterceptors?: StreamClientInterceptor[];
}

export type Codec = 'json' | 'raw';

/** A call as a client interceptor sees it (interceptors.ts). */
export interface ClientCall {
  readonly method: string;
  /** The request: a JSON value, or bytes for a raw call. */
  readonly payload: unknown;
  /**
   * The call's options; timeout is filled in with the client's default when the caller set none
   * (0: none), and a trace option is already the traceparent/tracestate metadata it sends.
   */
  readonly opts: CallOptions;
  /** The server's canonical address (the peer). */
  readonly address: string;
  /**
   * What kind of call this is: 'unary' (the unary interceptors), 'stream' (a server stream),
   * 'bidi' or 'clientStream' (the stream interceptors, at the open; payload is then undefined,
   * the requests are written later). Go's CallInfo.Stream/ClientStream say the same.
   */
  readonly kind: CallKind;
}
/** The kinds of call a client interceptor sees. */
export type CallKind = 'unary' | 'stream' | 'bidi' | 'clientStream';
/** Sends a unary call (the rest of the chain, then the client). */
export type UnaryInvoker = (call: ClientCall) => Promise<unknown>;
/** A unary client interceptor: pass next a changed call ({...call, opts: {...}}) to add metadata. */
export type UnaryClientInterceptor = (call: ClientCall, next: UnaryInvoker) => Promise<unknown>;
/** Opens a server stream (the rest of the chain, then the client). */
export type StreamOpener = (call: ClientCall) => AsyncIterable<unknown>;
/** A streaming client interceptor: returns the items (next's, or a generator wrapping them). */
export type StreamClientInterceptor = (call: ClientCall, next: StreamOpener) => AsyncIterable<unknown>;


export interface CallOptions {
  /** ms; covers waiting for a connection and the call. Default: the client's callTimeout (unary) or none (stream). */
  timeout?: number;
  signal?: AbortSignal;
  /** Request metadata (keys SHOULD be lowercase ASCII; keys starting with ':' are reserved for the protocol and fail the call with invalid_argument). */
  metadata?: Metadata;
  /** 'json' (default unless the payload is bytes) or 'raw' (Buffer in and out). */
  codec?: Codec;
  /**
   * Wait, within the timeout, for a lost connection to come back. Default false
   * (spec 4.2, fail fast): once a reconnect attempt has failed, a call that
   * finds no connection fails with unavailable, its cause the dial error.
   */
  waitForReady?: boolean;
  /**
   * The trace this call belongs to (a handler's ctx.trace, or one of your own): the call
   * carries a child of it as W3C traceparent (and its tracestate) metadata.
   */
  trace?: TraceContext;
}

/** Options of bidi() and clientStream(): CallOptions without codec, and timeoutMs as another name of timeout. */
export interface BidiOptions extends Omit<CallOptions, 'codec'> {
  /** The same as timeout (ms, covering the whole call, both directions; default none). */
  timeoutMs?: number;
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
  /** Why the last reconnect attempt failed (null once connected): fail-fast calls fail with it. */
  private dialFailure: UdskitError | null = null;
  /** The interceptor chains (null without interceptors: calls take the direct path). */
  private readonly unaryChain: UnaryInvoker | null;
  private readonly streamChain: StreamOpener | null;

  constructor(address: string, private readonly opts: ConnectOptions = {}) {
    this.addr = parseAddr(address);
    if (this.addr.kind === 'abstract') throw abstractUnsupported(this.addr);
    if (this.addr.kind === 'passed') netOptions(this.addr); // throws: listen only
    this.address = formatAddr(this.addr);
    this.ndjson = opts.protocol === 'ndjson';
    if (opts.protocol !== undefined && opts.protocol !== 'ndjson' && opts.protocol !== 'udskit') {
      throw new TypeError(`protocol ${JSON.stringify(opts.protocol)}: want 'udskit' or 'ndjson'`);
    }
    this.maxFrame = clampMaxFrame(opts.maxFrame);
    this.callTimeout = opts.callTimeout ?? 30_000;
    this.maxWaiting = opts.maxWaiting ?? 65536;
    this.stallTimeout = opts.stallTimeout ?? 10_000;
    const r = opts.reconnect ?? true;
    this.reconnect = r === false ? false : { initialDelay: 25, maxDelay: 1000, ...(r === true ? {} : r) };
    this.unaryChain = unaryClientChain(opts.unaryInterceptors, (c) => this.direct(c.method, c.payload, c.opts));
    this.streamChain = streamClientChain(opts.streamInterceptors, (c) => new ClientStream(this, c.method, c.payload, c.opts));
  }

  /** @internal Connects for the first time (waiting if asked); use connect(). */
  async start(): Promise<void> {
    // One deadline for every attempt and every phase of each (dialOnce's timers get what is left).
    const deadline = deadlineIn(this.opts.timeout ?? 10_000);
    const signal = this.opts.signal;
    for (let attempt = 0; ; attempt++) {
      if (signal?.aborted) throw new UdskitError('canceled', `connect ${this.address}: aborted`, { cause: signal.reason });
      try {
        this.adopt(await dialOnce(this.addr, this.ndjson, this.maxFrame, deadline, this.opts.tls, this.opts.ssh));
        return;
      } catch (e) {
        const wait = this.opts.wait === true && transient(e);
        // Never sleep past half of what is left: the server may come meanwhile and the next attempt
        // needs time too (a whole 500 ms backoff that would cross the deadline gave up that early).
        const delay = Math.min(backoff(attempt, 10, 500), (deadline.at - performance.now()) / 2);
        if (!wait || delay < 5) throw dialError(this.address, e, this.opts.wait === true);
        if (!(await sleep(delay, signal))) throw new UdskitError('canceled', `connect ${this.address}: aborted`, { cause: signal?.reason });
        // A sleep that ended late (a loaded machine) starts no attempt past the deadline.
        if (performance.now() >= deadline.at) throw dialError(this.address, e, true);
      }
    }
  }

  private adopt(d: Dialed): void {
    if (this.closed) {
      d.socket.destroy();
      return;
    }
    const c = this.ndjson ? new NdjsonConn(this, d, this.maxFrame) : new FramedConn(this, d);
    this.dialFailure = null;
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
          const d = await dialOnce(this.addr, this.ndjson, this.maxFrame, deadlineIn(5000), this.opts.tls, this.opts.ssh);
          this.dialing = false;
          this.adopt(d);
          return;
        } catch (e) {
          // Keep trying (the server may be restarting), but calls that do not
          // wait for ready fail now, with what the dial found (spec 4.2).
          this.dialFailed(dialError(this.address, e, false));
        }
        // unref: a background redial alone does not keep the process alive (waiting calls' timers do).
        if (!(await sleep(backoff(attempt, r.initialDelay, r.maxDelay), this.closer.signal, true))) break;
      }
      this.dialing = false;
    })();
  }

  /** A reconnect attempt failed: fail the calls waiting for it unless they wait for ready. */
  private dialFailed(err: UdskitError): void {
    this.dialFailure = failFast(this.address, err);
    for (const call of this.waiting) {
      if (call.waitForReady && err.retryable) continue;
      this.waiting.delete(call);
      this.settle(call, this.dialFailure);
    }
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

  /**
   * @internal the server sent goaway: new calls go to a new connection,
   * dialed when a call needs it (a server closing idle connections must not
   * see each one replaced at once).
   */
  connDraining(c: Conn): void {
    if (this.conn === c) {
      this.conn = null;
      if (this.waiting.size > 0) this.redial();
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
    call.up?.close(); // unsent request items are dropped (spec 4.3)
    if (call.conn !== null) call.conn.refresh();
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
    let h = md === undefined ? this.heads.get(method) : undefined;
    if (h === undefined) {
      if (method === '') throw new TypeError('method must not be empty');
      h = encodeRequestHead(method, md);
      if (md === undefined && h.length <= MAX_HEAD && this.heads.size < 1024) this.heads.set(method, h);
    }
    return h;
  }

  private begin(method: string, payload: unknown, opts: CallOptions | undefined, st: StreamState | null,
    resolve: (v: unknown) => void, reject: (e: Error) => void, up: UpState | null = null): Call {
    const raw = opts?.codec === 'raw' || (opts?.codec === undefined && payload instanceof Uint8Array);
    let body: Buffer | string;
    let head: Buffer;
    try {
      if (payload instanceof Uint8Array) {
        body = toBuffer(payload);
        if (this.ndjson) body = body.toString('utf8');
      } else if (opts?.codec === 'raw') {
        throw new TypeError('codec raw needs a Buffer or Uint8Array payload');
      } else {
        body = payload === undefined ? '' : JSON.stringify(payload);
      }
      head = this.ndjson ? EMPTY : this.head(method, opts?.trace === undefined ? opts?.metadata : { ...opts.metadata, ...traceMetadata(childOf(opts.trace)) });
    } catch (e) {
      // Every failure is a UdskitError (README): a payload JSON cannot encode
      // (a BigInt, a cycle), an empty method name, a wrong codec.
      const call = new Call(method, EMPTY, EMPTY, raw, 0, undefined, resolve, reject, st);
      call.up = up;
      this.settle(call, new UdskitError('invalid_argument', `${method}: ${(e as Error).message}`, { cause: e }));
      return call;
    }
    const timeout = opts?.timeout ?? (st === null ? this.callTimeout : 0);
    const deadline = timeout > 0 ? performance.now() + timeout : 0;
    const signal = opts?.signal;
    const call = new Call(method, head, body, raw, deadline, signal, resolve, reject, st);
    call.up = up;
    if (up !== null) up.call = call;
    call.waitForReady = opts?.waitForReady ?? this.opts.waitForReady ?? false;
    if (this.closed) {
      this.settle(call, new UdskitError('canceled', `client for ${this.address} is closed`));
      return call;
    }
    const reserved = reservedKeyOf(opts?.metadata);
    if (reserved !== undefined) {
      // Spec 3.1: an application may not send a reserved key (NDJSON carries no metadata, but the call is as wrong).
      this.settle(call, new UdskitError('invalid_argument', `${method}: ${reservedKeyMessage(reserved)}`));
      return call;
    }
    if (call.head.length > MAX_HEAD) {
      // As Go's client: the server would close the whole connection (head_too_large).
      this.settle(call, new UdskitError('invalid_argument', `${method}: method name and metadata are ${call.head.length} bytes, over the limit of ${MAX_HEAD}`));
      return call;
    }
    if (signal !== undefined) {
      if (signal.aborted) {
        this.settle(call, abortError(method, signal));
        return call;
      }
      call.onAbort = () => this.giveUp(call, abortError(method, signal).number, abortError(method, signal).message, signal.reason);
      signal.addEventListener('abort', call.onAbort, { once: true });
    }
    if (deadline !== 0) {
      call.timer = setTimeout(() => this.giveUp(call, Code.deadline_exceeded, `${method}: deadline exceeded after ${timeout}ms`), timeout);
    }
    if (this.ndjson && (st !== null || up !== null)) {
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
    } else if (c === null && this.dialFailure !== null && !(call.waitForReady && this.dialFailure.retryable)) {
      // Fail fast, but in a later turn of the event loop: a caller that retries
      // at once in a loop must not starve timers and I/O (the reconnect's too).
      const err = this.dialFailure;
      setImmediate(() => this.settle(call, err));
      this.redial();
    } else {
      this.waiting.add(call);
      if (c === null) this.redial();
    }
    return call;
  }

  /** The caller gave up (deadline or abort): cancel on the wire if it was sent. */
  private giveUp(call: Call, code: number, msg: string, cause?: unknown): void {
    if (call.state === DONE) return;
    if (call.state === PENDING) {
      this.waiting.delete(call);
    } else if (call.conn !== null) {
      const c = call.conn;
      c.calls.delete(call.id);
      c.cancel(call, code); // the reason is the code: canceled or deadline_exceeded
      c.afterCall();
    }
    this.settle(call, new UdskitError(code, msg, cause === undefined ? {} : { cause }));
  }

  /**
   * Calls method with payload: JSON values are sent as JSON and the response
   * decoded from JSON; a Buffer/Uint8Array is sent as is and the response is
   * a Buffer (or force either with opts.codec).
   */
  call<R = unknown>(method: string, payload?: unknown, opts?: CallOptions): Promise<R> {
    if (this.unaryChain !== null) return this.unaryChain(this.clientCall(method, payload, opts, this.callTimeout, 'unary')) as Promise<R>;
    return this.direct(method, payload, opts);
  }

  private direct<R>(method: string, payload: unknown, opts: CallOptions | undefined): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      this.begin(method, payload, opts, null, resolve as (v: unknown) => void, reject);
    });
  }

  /** The call as interceptors see it: the effective timeout filled in, a trace option as the metadata it sends. */
  private clientCall(method: string, payload: unknown, opts: CallOptions | undefined, timeout: number, kind: CallKind): ClientCall {
    const o: CallOptions = { ...opts, timeout: opts?.timeout ?? timeout };
    if (o.trace !== undefined) {
      o.metadata = { ...o.metadata, ...traceMetadata(childOf(o.trace)) };
      o.trace = undefined;
    }
    return { method, payload, opts: o, address: this.address, kind };
  }

  /**
   * Calls a server-streaming method; iterate the result with for await. Items
   * the application has not read yet are bounded by the stream credit (1 MiB
   * plus one item): a slow reader slows only its own stream. Breaking out of
   * the loop cancels the call.
   */
  stream<R = unknown>(method: string, payload?: unknown, opts?: CallOptions): ClientStream<R> {
    if (this.streamChain !== null) {
      const chain = this.streamChain;
      const call = this.clientCall(method, payload, opts, 0, 'stream');
      return new InterceptedStream<R>(this, method, payload, opts, () => chain(call) as AsyncIterable<R>);
    }
    return new ClientStream<R>(this, method, payload, opts);
  }

  /**
   * Opens a bidirectional call on raw bytes: write() Uint8Arrays (each
   * resolves once the server's request credit lets the item go), end() to
   * half-close, iterate the responses (Buffers) with for await. Cancel with
   * cancel(), opts.signal or opts.timeout; breaking out of the loop cancels
   * too. No default timeout (as streams).
   */
  bidi(method: string, opts?: BidiOptions): BidiCall<Uint8Array, Buffer> {
    return this.openBidi(method, 'raw', opts);
  }

  /** As bidi(), with JSON values both ways. */
  bidiJSON<Req = unknown, Res = unknown>(method: string, opts?: BidiOptions): BidiCall<Req, Res> {
    return this.openBidi(method, 'json', opts);
  }

  /** Opens a client-streaming call on raw bytes: write() items, then end() resolves to the one response (a Buffer). */
  clientStream(method: string, opts?: BidiOptions): ClientStreamCall<Uint8Array, Buffer> {
    return this.openClientStream(method, 'raw', opts);
  }

  /** As clientStream(), with JSON values both ways. */
  clientStreamJSON<Req = unknown, Res = unknown>(method: string, opts?: BidiOptions): ClientStreamCall<Req, Res> {
    return this.openClientStream(method, 'json', opts);
  }

  private upOptions(codec: Codec, opts: BidiOptions | undefined): CallOptions {
    return { ...opts, codec, timeout: opts?.timeout ?? opts?.timeoutMs ?? 0 };
  }

  private openBidi<Req, Res>(method: string, codec: Codec, opts: BidiOptions | undefined): BidiCall<Req, Res> {
    const up = new UpState(codec === 'raw');
    const o = this.upOptions(codec, opts);
    const payload = codec === 'raw' ? EMPTY : undefined;
    const open = (m: string, co: CallOptions): ClientStream<Res> => {
      const s = new ClientStream<Res>(this, m, payload, co, (st) => this.begin(m, payload, co, st, () => {}, () => {}, up));
      s.started();
      return s;
    };
    if (this.streamChain === null) return new BidiCall<Req, Res>(this, up, open(method, o));
    // Through the stream interceptors, now (the call starts when opened, as without them).
    let s: ClientStream<Res> | null = null;
    let items: AsyncIterable<unknown>;
    try {
      const chain = streamClientChain(this.opts.streamInterceptors, (c) => (s = open(c.method, { ...c.opts, codec })))!;
      items = chain(this.clientCall(method, undefined, o, 0, 'bidi'));
    } catch (e) {
      if (s !== null) void (s as ClientStream<Res>).return();
      up.close(); // refused: writes resolve false, the responses fail with the error
      const err = e as Error;
      items = { [Symbol.asyncIterator]: () => ({ next: () => Promise.reject(err) }) };
    }
    if (items === s) return new BidiCall<Req, Res>(this, up, s);
    const opened = s as ClientStream<Res> | null;
    const r = new InterceptedStream<Res>(this, method, undefined, o, () => items as AsyncIterable<Res>, () => s);
    // An async generator interceptor runs (and opens the call) only when read: read its first
    // response now, so that writes go out before the application reads (one item held).
    if (opened === null && !up.done) r.prime(() => up.close());
    return new BidiCall<Req, Res>(this, up, r);
  }

  private openClientStream<Req, Res>(method: string, codec: Codec, opts: BidiOptions | undefined): ClientStreamCall<Req, Res> {
    const up = new UpState(codec === 'raw');
    const o = this.upOptions(codec, opts);
    const open = (m: string, co: CallOptions): Promise<Res> => {
      let resolve!: (v: unknown) => void;
      let reject!: (e: Error) => void;
      const response = new Promise<Res>((res, rej) => { resolve = res as (v: unknown) => void; reject = rej; });
      response.catch(() => {}); // surfaced by end(); never an unhandled rejection
      this.begin(m, codec === 'raw' ? EMPTY : undefined, co, null, resolve, reject, up);
      return response;
    };
    if (this.streamChain === null) return new ClientStreamCall<Req, Res>(this, up, open(method, o));
    // Through the stream interceptors, now: next() opens the call and gives an iterable of its
    // one response; what the chain yields first is the response end() resolves to.
    let response: Promise<Res>;
    try {
      const chain = streamClientChain(this.opts.streamInterceptors, (c) => oneItem(open(c.method, { ...c.opts, codec })))!;
      const items = chain(this.clientCall(method, undefined, o, 0, 'clientStream'));
      response = firstItem(method, items) as Promise<Res>;
    } catch (e) {
      response = Promise.reject(e as Error);
    }
    response.catch(() => {
      up.close(); // refused before the call went (or it failed): writes resolve false
      const call = up.call;
      if (call !== null && call.state !== DONE) this.cancelStream(call);
    });
    return new ClientStreamCall<Req, Res>(this, up, response);
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

/** A call's signal aborted: AbortSignal.timeout() (a TimeoutError) is deadline_exceeded, anything else canceled; the reason is the cause. */
function abortError(method: string, signal: AbortSignal): UdskitError {
  const r: unknown = signal.reason;
  if (r instanceof Error && r.name === 'TimeoutError') {
    return new UdskitError('deadline_exceeded', `${method}: deadline exceeded (the signal timed out: ${r.message})`, { cause: r });
  }
  return new UdskitError('canceled', `${method}: aborted`, { cause: r });
}

/** The error of a call that found no connection after a reconnect attempt failed (spec 4.2). */
function failFast(address: string, err: UdskitError): UdskitError {
  if (!err.retryable) return err; // a refusal (permission_denied) stays what it is: permanent
  return new UdskitError('unavailable', `no connection to ${address}: reconnecting failed: ${err.message} (calls fail fast; pass waitForReady: true to wait for the server)`, { cause: err.cause ?? err });
}

/** A server stream as an async iterator (see Client.stream). */
export class ClientStream<R> implements AsyncIterableIterator<R> {
  /** @internal */
  call: Call | null = null;
  private readonly st = new StreamState();

  /** @internal start: how a bidi call starts (default: a server stream). */
  constructor(private readonly client: Client, private readonly method: string, private readonly payload: unknown, private readonly opts: CallOptions | undefined,
    private readonly start?: (st: StreamState) => Call) {}

  [Symbol.asyncIterator](): this {
    return this;
  }

  private ensure(): Call {
    if (this.call === null) this.call = this.start !== undefined ? this.start(this.st) : this.client.startStream(this.st, this.method, this.payload, this.opts);
    return this.call;
  }

  /** @internal starts the call now (a bidi call starts when opened). */
  started(): Call {
    return this.ensure();
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

/** The one response of a client stream as an iterable (what next() gives its stream interceptors). */
async function* oneItem(response: Promise<unknown>): AsyncGenerator<unknown> {
  yield await response;
}

/** Reads the chain's items to the end; the first is the response (none: the chain dropped it). */
async function firstItem(method: string, items: AsyncIterable<unknown>): Promise<unknown> {
  let got = false;
  let first: unknown;
  for await (const v of items) {
    if (!got) {
      got = true;
      first = v;
    }
  }
  if (!got) throw new UdskitError('internal', `${method}: a stream interceptor ended the client stream without its response`);
  return first;
}

/**
 * A server stream (or a bidi call's responses) through the client's stream interceptors: the
 * chain runs at the first next() (a bidi call's ran at the open: open returns its items).
 */
class InterceptedStream<R> extends ClientStream<R> {
  private it: AsyncIterator<R> | null = null;
  private stopped = false;

  /** @param inner the stream next() opened (a bidi call's, if it has), stopped too when this one is. */
  constructor(client: Client, method: string, payload: unknown, opts: CallOptions | undefined, private readonly open: () => AsyncIterable<R>,
    private readonly inner: () => ClientStream<R> | null = () => null) {
    super(client, method, payload, opts);
  }

  /** Starts the chain and reads its first item now; failed runs if that fails. */
  prime(failed: () => void): void {
    try {
      this.it = this.open()[Symbol.asyncIterator]();
      this.first = this.it.next();
    } catch (e) {
      this.first = Promise.reject(e as Error);
    }
    this.first.catch(failed);
  }

  private first: Promise<IteratorResult<R>> | null = null;

  override next(): Promise<IteratorResult<R>> {
    const first = this.first;
    if (first !== null) {
      this.first = null;
      return first;
    }
    if (this.stopped) return Promise.resolve({ value: undefined, done: true });
    try {
      if (this.it === null) this.it = this.open()[Symbol.asyncIterator]();
      return this.it.next();
    } catch (e) {
      return Promise.reject(e as Error);
    }
  }

  override async return(): Promise<IteratorResult<R>> {
    const it = this.it;
    this.stopped = true;
    // The inner call first: a generator interceptor awaiting its next item returns only after.
    const inner = this.inner();
    if (inner !== null) await inner.return();
    if (it !== null && it.return !== undefined) await it.return().catch(() => undefined);
    return { value: undefined, done: true };
  }
}
