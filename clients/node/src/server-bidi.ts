// Client-streaming and bidirectional handlers on the server (protocol/spec.md
// section 4.3): the tags that register them, and the Inbox that holds a
// call's request items between the connection's reader and the handler.
//
// Flow control mirrors server streams: the client starts with 1 MiB of
// request credit; the Inbox grants what the handler has read (payload + 16
// per item) once half of that has been read since the last grant. So a
// handler that stops reading holds at most 1 MiB + one item of its call's
// items, and stalls only its own call: the connection keeps reading the
// other calls' frames. A client that sends beyond its credit by more than one
// item breaks the protocol (connection error).
import { UdskitError, ProtocolError, Code } from './codes.js';
import { HEADER_SIZE, INITIAL_CREDIT } from './frame.js';
import { type HandlerContext, type Tagged, type Spec, tag } from './handler.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;

/** A bidirectional handler on JSON: reads request items (JSON values), yields response items. */
export type JsonBidiHandler = (requests: AsyncIterableIterator<Any>, ctx: HandlerContext) => AsyncIterable<unknown> | Iterable<unknown>;
/** A bidirectional handler on raw bytes. */
export type RawBidiHandler = (requests: AsyncIterableIterator<Buffer>, ctx: HandlerContext) => AsyncIterable<Uint8Array> | Iterable<Uint8Array>;
/** A client-streaming handler on JSON: reads request items, returns (or resolves to) the one response. */
export type JsonClientStreamHandler = (requests: AsyncIterableIterator<Any>, ctx: HandlerContext) => unknown;
/** A client-streaming handler on raw bytes. */
export type RawClientStreamHandler = (requests: AsyncIterableIterator<Buffer>, ctx: HandlerContext) => Uint8Array | undefined | Promise<Uint8Array | undefined>;

/**
 * A bidirectional handler on JSON: `requests` is an async iterator of the
 * client's items (it ends at the client's end(), throws the call's
 * UdskitError on cancel or deadline); the handler is an async generator
 * (or returns an async iterable) of the response items.
 */
export function bidi(fn: JsonBidiHandler): Tagged {
  return tag('bidi', fn);
}

/** A bidirectional handler on raw bytes (Buffers in, Uint8Arrays out). */
export function rawBidi(fn: RawBidiHandler): Tagged {
  return tag('rawBidi', fn);
}

/** A client-streaming handler on JSON: reads `requests`, returns the one response (or a promise of it). */
export function clientStream(fn: JsonClientStreamHandler): Tagged {
  return tag('clientStream', fn);
}

/** A client-streaming handler on raw bytes. */
export function rawClientStream(fn: RawClientStreamHandler): Tagged {
  return tag('rawClientStream', fn);
}

/** Whether a handler kind reads request items (the call must be opened with the client_stream flag). */
export function readsItems(kind: Spec['kind']): boolean {
  return kind === 'bidi' || kind === 'rawBidi' || kind === 'clientStream' || kind === 'rawClientStream';
}

/** Whether a handler kind answers with stream items (flag stream). */
export function sendsItems(kind: Spec['kind']): boolean {
  return kind === 'stream' || kind === 'rawStream' || kind === 'bidi' || kind === 'rawBidi';
}

/** The kind as udskit.methods lists it. */
export function kindName(kind: Spec['kind']): 'unary' | 'stream' | 'client_stream' | 'bidi' {
  if (kind === 'bidi' || kind === 'rawBidi') return 'bidi';
  if (kind === 'clientStream' || kind === 'rawClientStream') return 'client_stream';
  return kind === 'stream' || kind === 'rawStream' ? 'stream' : 'unary';
}

/**
 * The refusal of a request whose flags do not fit the method's kind, or
 * null when they do (spec 4 and 4.3; the words are Go's: `udskit call` finds
 * a method's kind by them).
 */
export function kindMismatch(method: string, kind: Spec['kind'], stream: boolean, cs: boolean): string | null {
  const want = sendsItems(kind);
  const reads = readsItems(kind);
  if (want === stream && reads === cs) return null;
  const m = JSON.stringify(method);
  if (!reads && cs) {
    return want
      ? `method ${m} is server-streaming; call it with Stream, not as a client or bidirectional stream`
      : `method ${m} is unary; call it with Call, not as a client or bidirectional stream`;
  }
  if (!reads) return want ? `method ${m} is server-streaming; call it with Stream` : `method ${m} is unary; call it with Call`;
  return want ? `method ${m} is a bidirectional stream; open it with bidi()` : `method ${m} is a client stream; open it with clientStream()`;
}

/** The NDJSON answer to a line calling a client-stream method (spec 7). */
export function ndjsonRefusal(method: string, kind: Spec['kind']): string {
  const what = sendsItems(kind) ? 'a bidirectional stream' : 'a client stream';
  return `method ${JSON.stringify(method)} is ${what}; NDJSON has no streams: use a udskit client`;
}

interface Waiter {
  resolve: (r: IteratorResult<unknown>) => void;
  reject: (e: Error) => void;
}

/**
 * A call's request items as the handler reads them (an async iterator).
 * The connection calls data() / end() / eof() / close(); the handler next().
 */
export class Inbox implements AsyncIterableIterator<unknown> {
  private items: Buffer[] = [];
  private head = 0;
  /** Bytes of the items held (for tests and accounting). */
  bytes = 0;
  /** request_end came (or the client's EOF). */
  private ended = false;
  /** The handler stopped reading (return()) or the call is over: items are dropped. */
  private closed = false;
  /** Credit the client still has: may go below 0 by one item. */
  private outstanding = INITIAL_CREDIT;
  /** Bytes read by the handler since the last grant. */
  private consumed = 0;
  private waiters: Waiter[] = [];
  private onAbort: (() => void) | null = null;

  /**
   * grant sends request_credit for n bytes; maxFrame is the connection's (a
   * client may overshoot its credit by one item of up to that); held (optional)
   * learns each change of the bytes held, for the server's memory budget.
   */
  constructor(private readonly ctx: HandlerContext & { reason: UdskitError | null }, private readonly raw: boolean,
    private readonly maxFrame: number, private readonly grant: (n: number) => void, private readonly held?: (delta: number) => void) {}

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** A request_data frame's payload (the Inbox keeps it: pass a copy). Throws ProtocolError for a violation. */
  data(payload: Buffer): void {
    if (this.ended) throw new ProtocolError('protocol_violation', `client sent request_data for call of ${this.ctx.method} after its request_end`);
    this.outstanding -= payload.length + HEADER_SIZE;
    if (this.outstanding < -(this.maxFrame + HEADER_SIZE)) {
      throw new ProtocolError('protocol_violation', `client sent ${-this.outstanding} bytes of request items on a call of ${this.ctx.method} beyond the credit it was given`);
    }
    if (this.closed) return;
    this.items.push(payload);
    this.bytes += payload.length;
    this.held?.(payload.length);
    this.wake();
  }

  /** request_end. Throws ProtocolError for a second one. */
  end(): void {
    if (this.ended) throw new ProtocolError('protocol_violation', `client sent a second request_end for a call of ${this.ctx.method}`);
    this.ended = true;
    this.wake();
  }

  /** The client's EOF between frames: request_end for a call that has not had it. */
  eof(): void {
    this.ended = true;
    this.wake();
  }

  /** The call is over (answered, canceled, connection gone): drop the items; the handler's reads end. */
  close(): void {
    this.closed = true;
    this.items = [];
    this.head = 0;
    if (this.bytes !== 0) this.held?.(-this.bytes);
    this.bytes = 0;
    this.wake();
  }

  next(): Promise<IteratorResult<unknown>> {
    return new Promise((resolve, reject) => {
      this.waiters.push({ resolve, reject });
      this.wake();
    });
  }

  /** The handler stopped reading (break out of for await): the items left and later ones are dropped. */
  async return(): Promise<IteratorResult<unknown>> {
    this.close();
    return { value: undefined, done: true };
  }

  /** Answers waiting reads while it can. */
  private wake(): void {
    while (this.waiters.length > 0) {
      const w = this.waiters[0]!;
      const reason = this.ctx.reason;
      if (reason !== null) {
        this.waiters.shift();
        w.reject(reason);
        continue;
      }
      if (this.head < this.items.length) {
        this.waiters.shift();
        const item = this.items[this.head]!;
        this.items[this.head++] = item.subarray(0, 0);
        if (this.head === this.items.length) {
          this.items = [];
          this.head = 0;
        }
        this.bytes -= item.length;
        if (item.length !== 0) this.held?.(-item.length);
        this.took(item.length);
        if (this.raw) {
          w.resolve({ value: item, done: false });
          continue;
        }
        try {
          w.resolve({ value: item.length === 0 ? undefined : JSON.parse(item.toString('utf8')), done: false });
        } catch (e) {
          w.reject(new UdskitError(Code.invalid_argument, `${this.ctx.method}: request item is not JSON: ${(e as Error).message}`));
        }
        continue;
      }
      if (this.ended || this.closed) {
        this.waiters.shift();
        w.resolve({ value: undefined, done: true });
        continue;
      }
      // Nothing yet: wait for an item, the end, or the call's cancel/deadline.
      if (this.onAbort === null) {
        const sig = this.ctx.signal;
        this.onAbort = (): void => {
          this.onAbort = null;
          this.wake();
        };
        sig.addEventListener('abort', this.onAbort, { once: true });
      }
      return;
    }
  }

  /** The handler read an item of n bytes: grant credit once half the initial credit was read. */
  private took(n: number): void {
    this.consumed += n + HEADER_SIZE;
    if (this.consumed >= INITIAL_CREDIT / 2 && !this.closed) {
      this.outstanding += this.consumed;
      this.grant(this.consumed);
      this.consumed = 0;
    }
  }
}
