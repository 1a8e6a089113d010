// Client-streaming and bidirectional calls on the client (protocol/spec.md
// section 4.3). A call's request direction is an UpState: items written by
// the application wait in order until the call is in flight, the call has
// request credit (1 MiB to start, more as the server's handler reads) and
// the socket takes more; then each goes out as a request_data frame and its
// write() resolves. end() queues request_end after them. When the call ends
// (the server's final frame, cancel, deadline, connection lost) unsent items
// are dropped and their write() resolves false: the call's outcome is on its
// reading side (the responses, or clientStream's end()).
import { UdskitError, Code } from './codes.js';
import { T, HEADER_SIZE, INITIAL_CREDIT, EMPTY, toBuffer, payloadLen } from './frame.js';
import { type Call, type CallUp, INFLIGHT, DONE } from './call.js';

/** The spec's message for a server whose hello lacks the client_stream flag (spec 4.3). */
export const NO_CLIENT_STREAMS = 'server does not support client or bidirectional streams (its hello lacks the client_stream flag); upgrade the server';

/** What a call object needs of its client. */
export interface CallCanceler {
  /** Cancels call (canceled, on the wire if it was sent). */
  cancelStream(call: Call): void;
}

/** The responses of a bidi call (the client's server-stream iterator). */
export type Responses<Res> = AsyncIterableIterator<Res> & { toArray(): Promise<Res[]> };

interface Item {
  /** A request_data payload (bytes, or JSON text written as UTF-8), or null for request_end. */
  data: Buffer | string | null;
  /** The payload's length in bytes. */
  len: number;
  resolve: (sent: boolean) => void;
  reject: (e: Error) => void;
}

/** The request direction of a client-stream call. */
export class UpState implements CallUp {
  call: Call | null = null;
  private queue: Item[] = [];
  private head = 0;
  /** Bytes of request items the server lets us send (may go below 0 by one item). */
  credit = INITIAL_CREDIT;
  /** Frames sent (items and end): a refused call is sent again only if none went. */
  sent = 0;
  /** end() was called. */
  ending = false;
  /** The call is over: nothing more is sent. */
  done = false;
  private readonly pumpFn = (): void => this.pump();

  constructor(readonly raw: boolean) {}

  /** Bytes of items waiting to be sent. */
  get queuedBytes(): number {
    let n = 0;
    for (let i = this.head; i < this.queue.length; i++) n += this.queue[i]!.len;
    return n;
  }

  /** A request_credit frame came. */
  grant(bytes: number): void {
    this.credit += bytes;
    this.pump();
  }

  /** Queues an item (or the end) and sends what may go now. */
  add(data: Buffer | string | null): Promise<boolean> {
    if (this.done) return Promise.resolve(false);
    return new Promise<boolean>((resolve, reject) => {
      this.queue.push({ data, len: data === null ? 0 : payloadLen(data), resolve, reject });
      this.pump();
    });
  }

  /** Sends queued items while the call is in flight, has credit and the socket takes them. */
  pump(): void {
    const call = this.call;
    if (call === null || call.state !== INFLIGHT || call.conn === null || this.done) return;
    const conn = call.conn;
    while (this.head < this.queue.length) {
      const it = this.queue[this.head]!;
      if (it.data !== null) {
        if (this.credit <= 0) return; // request_credit pumps again
        if (conn.blocked) {
          conn.onDrain(this.pumpFn);
          return;
        }
        const max = conn.maxFrame;
        if (it.len > max) {
          this.shift();
          it.reject(new UdskitError(Code.resource_exhausted, `${call.method}: request item of ${it.len} bytes is over the connection's max frame of ${max}`));
          continue;
        }
        this.credit -= it.len + HEADER_SIZE;
        conn.sendFrame(call, T.request_data, it.data);
      } else {
        conn.sendFrame(call, T.request_end, EMPTY);
      }
      this.sent++;
      this.shift();
      it.resolve(true);
    }
  }

  private shift(): void {
    this.queue[this.head++] = undefined as unknown as Item;
    if (this.head === this.queue.length) {
      this.queue = [];
      this.head = 0;
    }
  }

  /** The call is over: drop what was not sent (those write()s resolve false). */
  close(): void {
    if (this.done) return;
    this.done = true;
    const q = this.queue.slice(this.head);
    this.queue = [];
    this.head = 0;
    for (const it of q) it.resolve(false);
  }

  /** Encodes an application item (JSON value or bytes) as a payload; throws invalid_argument. */
  encode(method: string, item: unknown): Buffer | string {
    if (this.raw) {
      if (!(item instanceof Uint8Array)) throw new UdskitError(Code.invalid_argument, `${method}: a raw call writes Buffers or Uint8Arrays, not ${typeof item}`);
      return toBuffer(item);
    }
    let s: string | undefined;
    try {
      s = JSON.stringify(item);
    } catch (e) {
      throw new UdskitError(Code.invalid_argument, `${method}: the item cannot be encoded as JSON: ${(e as Error).message}`, { cause: e });
    }
    return s === undefined ? EMPTY : s;
  }
}


/** The write side shared by both kinds. */
abstract class Writer<Req> {
  constructor(protected readonly client: CallCanceler, protected readonly up: UpState) {}

  /**
   * Sends one request item. Resolves true once it is handed to the
   * connection (it waits while the call has no request credit or the socket
   * is full: await it for backpressure), false when the call is already over
   * (the item is dropped; the outcome is on the reading side). Rejects for a
   * write after end() or an item that cannot be encoded.
   */
  write(item: Req): Promise<boolean> {
    const method = this.up.call?.method ?? '';
    if (this.up.ending) return Promise.reject(new UdskitError(Code.failed_precondition, `${method}: write after end()`));
    let b: Buffer | string;
    try {
      b = this.up.encode(method, item);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.up.add(b);
  }

  protected sendEnd(): Promise<boolean> {
    if (this.up.ending) return Promise.resolve(!this.up.done);
    this.up.ending = true;
    return this.up.add(null);
  }

  /** Cancels the call in both directions (the reading side fails with canceled). */
  cancel(): void {
    const call = this.up.call;
    if (call !== null && call.state !== DONE) this.client.cancelStream(call);
  }
}

/**
 * A bidirectional call (Client.bidi / bidiJSON): write() and end() the
 * requests, for await over the responses. Breaking out of the loop cancels
 * the call.
 */
export class BidiCall<Req, Res> extends Writer<Req> implements AsyncIterable<Res> {
  /** @internal */
  constructor(client: CallCanceler, up: UpState, private readonly responses: Responses<Res>) {
    super(client, up);
  }

  /** Half-closes: no more items (request_end after those written). The server keeps sending until it ends the call. */
  end(): Promise<boolean> {
    return this.sendEnd();
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<Res> {
    return this.responses;
  }

  /** The next response (as the iterator's next()). */
  next(): Promise<IteratorResult<Res>> {
    return this.responses.next();
  }

  /** Collects the responses until the stream ends. */
  toArray(): Promise<Res[]> {
    return this.responses.toArray();
  }
}

/** A client-streaming call (Client.clientStream / clientStreamJSON): write() items, end() resolves to the response. */
export class ClientStreamCall<Req, Res> extends Writer<Req> {
  /** @internal */
  constructor(client: CallCanceler, up: UpState, private readonly response: Promise<Res>) {
    super(client, up);
  }

  /** Half-closes and resolves to the server's one response (or rejects with the call's error). */
  async end(): Promise<Res> {
    void this.sendEnd();
    return this.response;
  }

  /** The response, without ending (a server may answer before the client's end). */
  get result(): Promise<Res> {
    return this.response;
  }
}
