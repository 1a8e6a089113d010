// Connections of a client: framed udskit (FramedConn) and NDJSON (NdjsonConn).
// Both own a socket, a Writer and the calls in flight on it by id.
import type net from 'node:net';
import { UdskitError, ProtocolError, Code, codeNumber } from './codes.js';
import {
  T, HEADER_SIZE, DEFAULT_MAX_IN_FLIGHT, FLAG_STREAM, FLAG_CLIENT_STREAM, FEATURE_CLIENT_STREAM, FLAG_REFUSED, EMPTY, TYPE_NAMES, type Header, encodeFrame, payloadLen, parseMetadata,
} from './frame.js';
import { FrameReader, StallTimer } from './reader.js';
import { Writer } from './writer.js';
import { LineReader } from './ndjson.js';
import type { Dialed } from './dial.js';
import { type Call, type CallConn, PENDING, INFLIGHT } from './call.js';
import { NO_CLIENT_STREAMS } from './bidi.js';

/**
 * What a connection needs from the client that owns it (the client
 * implements it; a connection never sees the rest of the client).
 */
export interface ConnHost {
  /** The canonical address, for messages. */
  readonly address: string;
  /** The frame (line) timeout, ms. */
  readonly stallTimeout: number;
  /** Calls waiting for a connection or a free slot. */
  readonly waitingCount: number;
  /** Starts waiting calls while the connection can take them. */
  wake(): void;
  /** Settles a call exactly once: err, or value. */
  settle(call: Call, err: Error | null, value?: unknown): void;
  /** A refused call goes back to the front of the line. */
  requeue(call: Call): void;
  /** The connection died. */
  connLost(c: Conn): void;
  /** The server sent goaway on the connection. */
  connDraining(c: Conn): void;
}

const MAX_REFUSED_RETRIES = 3;
/** Bytes of frames queued for one write before new calls wait (a bigger single call still goes). */
const QUEUE_LIMIT = 1 << 20;

/** A connection (framed or NDJSON). */
export abstract class Conn implements CallConn {
  readonly calls = new Map<number, Call>();
  draining = false;
  dead = false;
  protected nextId = 0;
  readonly writer: Writer;
  private readonly stall: StallTimer;
  /** The subclass's reader (frames or lines): push throws ProtocolError on bytes that break the protocol. */
  protected abstract readonly input: { push(chunk: Buffer): void; readonly partial: boolean; readonly done: number };

  constructor(readonly client: ConnHost, readonly socket: net.Socket, public maxFrame: number, readonly maxInFlight: number) {
    this.writer = new Writer(socket, { onDrain: () => { client.wake(); this.drained(); }, onFlushed: () => { if (client.waitingCount > 0) client.wake(); } });
    socket.on('error', (err) => this.lost(new UdskitError('unavailable', `connection to ${client.address} lost: ${err.message}`, { cause: err })));
    socket.on('close', () => this.lost(new UdskitError('unavailable', `connection to ${client.address} lost`)));
    this.stall = new StallTimer(client.stallTimeout, () => this.fatal(new UdskitError('unavailable',
      `server ${client.address} sent part of a frame and then nothing for ${client.stallTimeout}ms (truncated); connection closed`)));
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    // An idle connection does not keep the process alive (as an idle HTTP agent's
    // socket): a script that calls and forgets close() still exits. A call in flight refs it.
    socket.unref();
  }

  /** Refs the socket while calls are in flight, unrefs it when idle. */
  refresh(): void {
    if (this.dead) return;
    if (this.calls.size > 0) this.socket.ref();
    else this.socket.unref();
  }

  get usable(): boolean {
    // Room in the write queue too: many calls made in one tick must not queue
    // without bound before the first write() can report backpressure.
    return !this.dead && !this.draining && !this.writer.blocked && this.writer.queued < QUEUE_LIMIT && this.calls.size < this.maxInFlight;
  }

  /** Picks a free id: counts up, wraps, skips 0 and ids in flight. */
  protected allocId(): number {
    do {
      this.nextId = this.nextId >= 0xffffffff ? 1 : this.nextId + 1;
    } while (this.calls.has(this.nextId));
    return this.nextId;
  }

  /** Run once the socket drains (client-stream calls waiting to send items). */
  private drainWaiters = new Set<() => void>();

  get blocked(): boolean {
    return this.writer.blocked;
  }

  onDrain(fn: () => void): void {
    this.drainWaiters.add(fn);
  }

  private drained(): void {
    const ws = [...this.drainWaiters];
    this.drainWaiters.clear();
    for (const fn of ws) fn();
  }

  sendFrame(call: Call, type: number, payload: Buffer | string): void {
    if (!this.dead) this.writer.push(encodeFrame(type, 0, call.id, 0, EMPTY, payload));
  }

  abstract send(call: Call): void;
  abstract cancel(call: Call, reason: number): void;
  abstract credit(call: Call, bytes: number): void;

  /** Puts a call in flight under id and queues its bytes. */
  protected inFlight(call: Call, id: number, bytes: Buffer): void {
    call.id = id;
    call.state = INFLIGHT;
    call.conn = this;
    this.calls.set(id, call);
    if (this.calls.size === 1) this.socket.ref();
    this.writer.push(bytes);
  }

  protected onData(chunk: Buffer): void {
    try {
      this.input.push(chunk);
    } catch (e) {
      const msg = e instanceof ProtocolError ? e.message : String(e);
      this.fatal(new UdskitError('protocol_violation', `server ${this.client.address} broke the protocol: ${msg}`, { cause: e }));
      return;
    }
    // A peer that stops inside a frame must not hold the connection forever.
    this.stall.update(this.input.partial, this.input.done);
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
    this.stall.stop();
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

export class FramedConn extends Conn {
  protected readonly input: FrameReader;

  constructor(client: ConnHost, d: Dialed) {
    super(client, d.socket, d.neg!.maxFrame, Math.max(1, d.neg!.maxInFlight || DEFAULT_MAX_IN_FLIGHT));
    this.features = d.neg!.features;
    this.input = new FrameReader(this.maxFrame, (h, b, hs, ps, end) => this.frame(h, b, hs, ps, end));
    if (d.rest.length > 0) process.nextTick(() => this.onData(d.rest));
  }

  /** The features both hellos set. */
  private readonly features: number;

  send(call: Call): void {
    if (call.up !== null && (this.features & FEATURE_CLIENT_STREAM) === 0) {
      this.client.settle(call, new UdskitError('unimplemented', NO_CLIENT_STREAMS));
      return;
    }
    const id = this.allocId();
    const plen = payloadLen(call.body);
    if (plen > this.maxFrame) {
      this.client.settle(call, new UdskitError('resource_exhausted', `request of ${plen} bytes is over the connection's max frame of ${this.maxFrame}`));
      return;
    }
    let aux = 0;
    if (call.deadline !== 0) {
      const us = Math.ceil((call.deadline - performance.now()) * 1000);
      aux = us <= 0 ? 1 : us > 0xffffffff ? 0 : us;
    }
    this.inFlight(call, id, encodeFrame(T.request, (call.st !== null ? FLAG_STREAM : 0) | (call.up !== null ? FLAG_CLIENT_STREAM : 0), id, aux, call.head, call.body, plen));
    call.up?.pump(); // items written before the call went out
  }

  cancel(call: Call, reason: number): void {
    this.control(T.cancel, call.id, reason);
  }

  credit(call: Call, bytes: number): void {
    this.control(T.stream_credit, call.id, bytes);
  }

  /** Sends a frame that is only a header (cancel, stream_credit). */
  private control(type: number, id: number, aux: number): void {
    if (!this.dead) this.writer.push(encodeFrame(type, 0, id, aux, EMPTY, EMPTY));
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
        if (refused && h.aux === Code.unavailable && call.retries < MAX_REFUSED_RETRIES && (call.up === null || call.up.sent === 0)) {
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
      case T.request_credit: {
        const call = this.calls.get(h.id);
        call?.up?.grant(h.aux);
        return;
      }
      case T.request: case T.cancel: case T.stream_credit: case T.request_data: case T.request_end:
        throw new ProtocolError('protocol_violation', `server sent a ${TYPE_NAMES[h.type]} frame (client-to-server only)`);
      default:
        return; // unknown types are skipped (spec 3)
    }
  }
}

export class NdjsonConn extends Conn {
  protected readonly input: LineReader;

  constructor(client: ConnHost, d: Dialed, maxFrame: number) {
    super(client, d.socket, maxFrame, DEFAULT_MAX_IN_FLIGHT);
    this.input = new LineReader(maxFrame, (line) => this.line(line), (n) => {
      throw new ProtocolError('frame_too_large', `line of ${n} bytes over ${maxFrame}`);
    });
  }

  send(call: Call): void {
    const id = this.allocId();
    const body = call.body as string;
    const line = `{"id":${id},"func":${JSON.stringify(call.method)},"data":${body === '' ? 'null' : body}}\n`;
    if (line.length > this.maxFrame && Buffer.byteLength(line) > this.maxFrame) {
      this.client.settle(call, new UdskitError('resource_exhausted', `request line over the max of ${this.maxFrame} bytes`));
      return;
    }
    this.inFlight(call, id, Buffer.from(line));
  }

  cancel(): void {
    // NDJSON has no cancel: the reply is discarded when it comes.
  }

  credit(): void {}

  private line(line: Buffer): void {
    let o: { id?: unknown; data?: unknown; error?: unknown; code?: unknown };
    try {
      o = JSON.parse(line.toString('utf8'));
    } catch {
      throw new ProtocolError('bad_request', `server sent a line that is not JSON: ${line.toString('utf8', 0, 80)}`);
    }
    if (o === null || typeof o !== 'object') throw new ProtocolError('bad_request', 'server sent a line that is not an object');
    const call = typeof o.id === 'number' ? this.calls.get(o.id) : undefined;
    // An error line's code; codes it does not name are unknown. undefined: a data line.
    const code = typeof o.error === 'string' ? codeNumber(String(o.code)) ?? Code.unknown : undefined;
    if (call === undefined) {
      if (o.id === null && code !== undefined) this.fatal(new UdskitError(code, `server ${this.client.address}: ${o.error}`));
      return;
    }
    this.calls.delete(call.id);
    if (code !== undefined) {
      this.client.settle(call, new UdskitError(code, o.error as string));
    } else {
      this.client.settle(call, null, o.data === null ? undefined : o.data);
    }
    this.afterCall();
  }
}
