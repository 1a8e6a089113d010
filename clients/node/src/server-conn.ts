// One accepted server connection, either protocol (see server.ts for the states).
import type net from 'node:net';
import { UdskitError, ProtocolError, Code, codeName } from './codes.js';
import {
  T, HELLO_SIZE, VERSION, FEATURE_STREAM_CREDIT, FEATURE_CLIENT_STREAM, FLAG_STREAM, FLAG_CLIENT_STREAM, FLAG_REFUSED, TYPE_NAMES, INITIAL_CREDIT, MAX_HEAD, EMPTY,
  type Header, type Metadata, decodeHello, encodeHello, requestMethodEnd, parseMetadataList, metadataLen, encodeMetadata, encodeFrame, payloadLen, toBuffer,
  reservedKeyOf, reservedKeyMessage,
} from './frame.js';
import { FrameReader, StallTimer } from './reader.js';
import { Writer } from './writer.js';
import { jsonTooDeep, MAX_JSON_DEPTH } from './jsondepth.js';
import { parseRequestLine, lineId, encodeDataLine, encodeErrorLine, LineReader } from './ndjson.js';
import { Ctx, HEALTH, type Spec, type Peer } from './handler.js';
import { Inbox, readsItems, sendsItems, kindMismatch, ndjsonRefusal } from './server-bidi.js';

class SCall {
  done = false;
  timer: NodeJS.Timeout | undefined = undefined;
  credit = INITIAL_CREDIT;
  wake: (() => void) | null = null;
  /** Request bytes this call holds (counted against the connection's budget). */
  size = 0;
  /** A server stream (not counted as a call in flight for the budget: it waits on its client's credit). */
  stream = false;
  /** A client-streaming or bidirectional call's request items (server-bidi.ts). */
  inbox: Inbox | null = null;
  /** The caller's timeout (ms; 0: none): its timer is set only if the call outlives its handler's first return (armDeadline). */
  ms = 0;
  /** id: the frame id (udskit) or the id's JSON text (NDJSON). */
  constructor(readonly id: number | string, readonly ctx: Ctx, readonly raw: boolean) {}
}

const NO_MD: Metadata = Object.freeze({}) as Metadata;


function errorOf(e: unknown, ctx: Ctx): { code: number; message: string; details?: Buffer } {
  if (e instanceof UdskitError) return { code: e.number, message: e.message, details: e.details };
  if (ctx.reason !== null) return { code: ctx.reason.number, message: ctx.reason.message };
  return { code: Code.unknown, message: e instanceof Error ? e.message : String(e) };
}

function isThenable(v: unknown): v is PromiseLike<unknown> {
  return v !== null && (typeof v === 'object' || typeof v === 'function') && typeof (v as { then?: unknown }).then === 'function';
}

/** The limits a connection applies (the server's options, defaults filled in). */
export interface ConnLimits {
  maxFrame: number;
  maxInFlight: number;
  /** ms; 0 = none. */
  handshakeTimeout: number;
  frameTimeout: number;
  writeTimeout: number;
  idleTimeout: number;
  maxConnBytes: number;
}

/**
 * What a connection needs from the server that accepted it (the server
 * implements it; a connection sees nothing else of the server).
 */
export interface ConnHost {
  readonly limits: ConnLimits;
  /** A goaway drain runs: framed requests are refused unprocessed (FLAG_REFUSED). */
  readonly refusing: boolean;
  /** The handler of a method (built-in ones included), or undefined. */
  handler(method: string): Spec | undefined;
  /** A connection-level problem, for the server's onError. */
  report(err: Error): void;
  /** Adds delta to the bytes all connections hold. */
  account(delta: number): void;
  /** Whether the bytes all connections hold are over the server's budget. */
  overBudget(): boolean;
  /** Whether connections other than one that holds mine bytes hold anything. */
  heldByOthers(mine: number): boolean;
  /** c stopped reading for the server's budget: call c.maybeResume() when bytes are given back. */
  waitBudget(c: SConn): void;
  /** The connection closed. */
  connClosed(c: SConn): void;
}

/** The aux of the pings sent to find out whether a client that sent EOF is still there. */
const HANGUP_PROBE = 0x68757021;
/** How often those pings go out while calls run after the client's EOF, ms. */
const HANGUP_EVERY = 50;
/**
 * What each call in flight counts against the server's total besides its bytes (its closures,
 * promise, context), as Go's callCost: 3 KiB (a sleeping call holds about 2 KiB: 100k of them
 * grew the server by 175 MiB), so that four connections' worth of maxInFlight (4 × 4,096) fit
 * under the default 64 MiB total and connections going past their in-flight limit reach it and
 * are closed at once; at 4 KiB they filled the total exactly and were held, calls running, for
 * as long as the calls slept (the soak's "100k ids in flight": closed after 2.9 s, bound 1 s).
 */
const CALL_COST = 3 << 10;
/** A frame up to this size, on a connection with nothing in flight, is read even when the server's total is over its budget. */
const SMALL_PAYLOAD = 16 << 10;
/** How often a connection paused with request items pings its client, ms (see probePaused). */
const PAUSE_PROBE_EVERY = 250;
/** A draining NDJSON connection with nothing in flight and no new line for this long is closed, ms. */
const NDJSON_QUIET = 1000;

/**
 * Bytes all connections together take per event-loop turn; a chunk that
 * comes once the turn has had this much waits for the next turn
 * (libuv reads up to 32 chunks of 64 KiB from each ready socket per turn:
 * 20 clients sending 200 KB NDJSON lines held the loop 52 ms in one turn,
 * and every other client's call waited behind it).
 */
const TURN_READ = 1 << 20;
/**
 * Calls all connections together start per event-loop turn (Python's
 * ITER_CALLS); frames past it wait, in order, for the next turn. A connection
 * resumed when another's budget came back started up to 4,000 held calls in
 * one callback (the soak's "25 × 4,000 in flight": 467 ms in a profile), and
 * one 64 KiB read holds 2,800 small requests.
 */
export const TURN_CALLS = 256;
/**
 * What this turn has read and started. The reset at the turn's end (endTurn,
 * a setImmediate) is scheduled only once a count passes a quarter of its cap
 * (or a connection waits for it): scheduling it on every read cost an
 * Immediate per call on a server answering one call at a time. Counts left
 * from earlier turns (under a quarter) only make a turn stop sooner: never
 * more than the caps per turn.
 */
let turnRead = 0;
let turnCalls = 0;
let turnScheduled = false;
/**
 * Which turn it is (endTurn counts them): a connection notes the turn it
 * started its one call past TURN_CALLS in (SConn.extraTurn). While turnCalls
 * is at the cap, endTurn is pending (scheduled at a quarter), so that turn ends.
 */
let turnNo = 0;
let turnYielded: SConn[] = [];

function scheduleTurnEnd(): void {
  if (!turnScheduled) {
    turnScheduled = true;
    setImmediate(endTurn);
  }
}

function endTurn(): void {
  turnNo++;
  turnRead = 0;
  turnCalls = 0;
  turnScheduled = false;
  const y = turnYielded;
  turnYielded = [];
  for (const c of y) c.unyield();
}

/** One accepted connection, either protocol. */
export class SConn {
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
  private readonly stall: StallTimer;
  private readonly lines: LineReader;
  private readonly waiters = new Set<SCall>();
  /** Request bytes held by calls in flight (see account for what else counts). */
  private held = 0;
  /** The bytes this connection has added to the server's total (account keeps it current). */
  private charged = 0;
  private paused = false;
  /** maybeResume is delivering frames held at the gate (calls it makes do not resume reading). */
  private resuming = false;
  /** Stream calls among calls. */
  private streams = 0;
  /** Bytes of request items client-stream calls hold (the server's total counts them, as Go's). */
  private inboxBytes = 0;
  /** A recount after handlers read items is scheduled. */
  private inboxRecount = false;
  private pauseProbe: NodeJS.Timeout | undefined;
  private writeTimer: NodeJS.Timeout | undefined;
  private idleTimer: NodeJS.Timeout | undefined;
  /** The bytes of the last method name a request named, and that name (see methodName). */
  private lastMethod: Buffer | null = null;
  private lastMethodName = '';
  /** When bytes last came or a call last ended (performance.now()). */
  private lastActive = 0;
  private hangup: NodeJS.Timeout | undefined;
  private readonly lim: ConnLimits;

  /** The verified identity of a tls: client (set by the server before any byte is read). */
  peer: Peer | undefined = undefined;

  constructor(private readonly host: ConnHost, readonly socket: net.Socket, peer?: Peer) {
    this.peer = peer;
    this.lim = host.limits;
    this.maxFrame = this.lim.maxFrame;
    this.lines = new LineReader(this.lim.maxFrame, (line) => this.line(line), () => this.lineTooLong(), () => this.lineGate());
    this.writer = new Writer(socket, {
      onDrain: () => {
        if (this.writeTimer !== undefined) {
          clearTimeout(this.writeTimer);
          this.writeTimer = undefined;
        }
        this.account();
        this.maybeResume();
        for (const c of this.waiters) c.wake?.();
      },
      onBlocked: () => {
        if (this.lim.writeTimeout > 0 && this.writeTimer === undefined) {
          this.writeTimer = setTimeout(() => this.kill(new Error(`client read nothing for ${this.lim.writeTimeout}ms (write timeout)`)), this.lim.writeTimeout);
        }
      },
      onWritten: () => {
        this.account();
        if (this.paused) this.maybeResume();
      },
    });
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('end', () => this.peerEnded());
    socket.on('error', (err) => host.report(err));
    socket.on('close', () => this.closed());
    if (this.lim.handshakeTimeout > 0) {
      this.timer = setTimeout(() => this.kill(new Error(`no hello within the handshake timeout (${this.lim.handshakeTimeout}ms)`)), this.lim.handshakeTimeout);
    }
    this.stall = new StallTimer(this.lim.frameTimeout, () => this.kill(new Error(`peer left a frame (or line) unfinished for ${this.lim.frameTimeout}ms (frame timeout)`)));
    if (this.lim.idleTimeout > 0) this.armIdle();
  }

  /** Bytes of a frame or line received and not yet complete. */
  private get partialBytes(): number {
    return this.reader !== null ? this.reader.buffered : this.lines.buffered;
  }

  /**
   * What a partial unit counts against the server's total: a frame whose
   * header has come counts whole, as announced (bounded by maxFrame), since
   * the peer has started it (FrameTimeout ends one that stalls); a line or a
   * frame without its header yet, the bytes that came.
   */
  private get reservedBytes(): number {
    return this.reader !== null ? this.reader.reserved : this.lines.buffered;
  }

  private get partial(): boolean {
    return this.reader !== null ? this.reader.partial : this.lines.partial;
  }

  /** Whether frames (or lines) wait at the reader's gate for maybeResume. */
  private get unitsHeld(): boolean {
    return this.reader !== null ? this.reader.held : this.lines.held;
  }

  /** Frames (or lines) finished so far. */
  private get done(): number {
    return this.reader !== null ? this.reader.done : this.lines.done;
  }

  /**
   * Brings the server's total up to date with what this connection holds:
   * request bytes of calls in flight, answers not yet written to the kernel,
   * the partial frame (see reservedBytes), and CALL_COST per call in flight.
   */
  private account(): void {
    const now = this.state === 'closed' ? 0 : this.held + this.writer.pending + this.reservedBytes + CALL_COST * this.active + this.inboxBytes;
    const d = now - this.charged;
    if (d !== 0) {
      this.charged = now;
      this.host.account(d);
    }
  }

  /**
   * Whether to stop reading, and why (Go's budget.go, in Node's terms):
   * 'own' when the client does not read its answers (socket blocked) or the
   * connection holds more than its budget (one frame, up to maxFrame, is
   * always let in when it holds nothing else); 'total' when the server's
   * total is over its budget and this connection holds something or has
   * calls in flight, or is receiving a frame bigger than SMALL_PAYLOAD (a
   * small request of a connection with nothing in flight is never held up
   * by what others hold). Nothing waits when the server holds only this
   * connection's bytes.
   */
  private pauseReason(): 'own' | 'total' | null {
    if (this.writer.blocked) return 'own';
    const own = this.held + this.writer.pending;
    const limit = this.state === 'ndjson' ? this.lim.maxConnBytes / 4 : this.lim.maxConnBytes;
    if (own > 0 && own + this.partialBytes > limit) return 'own';
    if (this.host.overBudget()) {
      if (own > 0 || this.active > 0 || this.inboxBytes > 0) return 'total';
      if (this.reservedBytes > SMALL_PAYLOAD && this.host.heldByOthers(this.charged)) return 'total';
    }
    return null;
  }

  /**
   * Asked between frames of one chunk: over the server's total, a connection
   * with calls in flight takes no more of them until it is resumed (a chunk
   * can hold a thousand small requests; Go's reader waits between frames too).
   */
  private overTotal(): boolean {
    if (this.active === 0 || this.state === 'closed') return false;
    this.account();
    return this.host.overBudget();
  }

  /**
   * Calls in flight that count for the budget: unary ones. A stream waits on
   * its client's credit, which this connection must stay free to read (its
   * items are bounded by that credit and the socket).
   */
  private get active(): number {
    return this.calls.size - this.streams;
  }

  /** Not read until the next event-loop turn (see TURN_READ). */
  private yielded = false;
  /** The turn (turnNo) this connection last started a call in past TURN_CALLS; -1: none. */
  private extraTurn = -1;

  /** The turn this connection waited for came (see TURN_READ, TURN_CALLS). */
  unyield(): void {
    this.yielded = false;
    if (this.state === 'closed') return;
    if (this.paused) this.maybeResume(); // frames held at the gate (TURN_CALLS), if the budgets allow
    else this.socket.resume();
  }

  /** Waits for the next event-loop turn (unyield). */
  private yieldTurn(): void {
    if (!this.yielded) {
      this.yielded = true;
      turnYielded.push(this);
    }
    scheduleTurnEnd();
  }

  /**
   * Asked between frames (the reader's gate, with overTotal): this turn has
   * started its TURN_CALLS calls. A connection with no call in flight always
   * gets its next call in (as with the budgets): a client calling one at a
   * time is never held behind a flood (it was, in the soak's "100k ids":
   * its socket resumed after the flooders had taken the turn's calls, turn
   * after turn, and a call waited past its 1 s deadline). So a turn starts
   * at most TURN_CALLS calls and one more per such connection.
   *
   * That one call is once per turn (extraTurn): a handler that answers at
   * once (a resolved promise, or synchronously) leaves nothing in flight by
   * the next gate, and the calls held at the cap chained one by one through
   * microtasks, with no yield to the event loop: 1,987 calls of one read in
   * one turn, every other connection and timer waiting for them. The rest now
   * wait for the next turn (yieldTurn), as a connection with calls in flight.
   */
  private turnClosed(): boolean {
    return turnCalls >= TURN_CALLS && (this.active > 0 || this.extraTurn === turnNo);
  }

  /**
   * The gate before each NDJSON line: the connection's maxInFlight (a line
   * past it waits, unparsed, for a call to end, as Go's reader waits for a
   * slot), the server's total and this turn's calls, as between frames.
   */
  private lineGate(): boolean {
    if (this.state === 'closed') return true; // (nothing more is served)
    return this.calls.size >= this.lim.maxInFlight || this.overTotal() || this.turnFull();
  }

  private turnFull(): boolean {
    if (this.state === 'closed' || !this.turnClosed()) return false;
    this.yieldTurn();
    return true;
  }

  private onData(chunk: Buffer): void {
    if ((turnRead >= TURN_READ || this.turnClosed()) && this.state !== 'closed') {
      // This turn has read (or started) its share: the chunk goes back, to be taken next turn.
      this.socket.pause();
      this.socket.unshift(chunk);
      this.yieldTurn();
      return;
    }
    turnRead += chunk.length;
    if (turnRead >= TURN_READ / 4) scheduleTurnEnd();
    this.lastActive = performance.now();
    this.take(chunk);
  }

  private take(chunk: Buffer): void {
    // Answers made while the chunk is read go out in one write at its end (no tick each).
    this.writer.hold();
    try {
      this.push(chunk);
    } catch (e) {
      if (e instanceof ProtocolError) this.connError(Code.protocol_violation, e.message);
      else this.connError(Code.internal, String(e));
      return;
    } finally {
      this.writer.release();
    }
    if (this.state === 'closed') return;
    this.account();
    const why = this.paused ? null : this.unitsHeld ? 'total' : this.pauseReason();
    if (why !== null) {
      this.paused = true;
      this.socket.pause();
      // Our own backpressure is not the peer's slowness: no frame timer meanwhile. Waiting
      // for the server's total, a started frame keeps its timer (the peer announced it).
      if (why === 'own') this.stall.stop();
      else this.stall.update(this.partial, this.done);
      if (!this.writer.blocked) this.host.waitBudget(this);
      if (this.inboxBytes > 0) this.probePaused();
      return;
    }
    this.stall.update(this.partial, this.done);
    if (this.draining && this.state === 'ndjson') this.maybeClose();
  }

  /** Reads again once the socket drained and the budgets allow (see pauseReason). */
  maybeResume(): void {
    if (!this.paused || this.state === 'closed' || this.resuming) return;
    const why = this.pauseReason();
    if (why !== null) {
      if (!this.writer.blocked) this.host.waitBudget(this);
      return;
    }
    if (this.unitsHeld) {
      if (this.turnClosed()) {
        this.yieldTurn(); // the held frames start next turn
        return;
      }
      this.resuming = true;
      try {
        if (this.reader !== null) this.reader.resume();
        else this.lines.resume();
      } catch (e) {
        if (e instanceof ProtocolError) this.connError(Code.protocol_violation, e.message);
        else this.connError(Code.internal, String(e));
        return;
      } finally {
        this.resuming = false;
      }
      if ((this.state as string) === 'closed') return;
      this.account();
      if (this.unitsHeld) {
        this.host.waitBudget(this);
        return;
      }
    }
    this.paused = false;
    clearInterval(this.pauseProbe);
    this.pauseProbe = undefined;
    this.socket.resume();
    this.stall.update(this.partial, this.done);
  }

  /**
   * The idle timeout: looks every quarter of it (as Go's sweeper ticks) and
   * acts once nothing was in flight, nothing arrived and no frame finished
   * for the whole timeout: closed between idleTimeout and 1.25 times it.
   */
  private armIdle(): void {
    const tick = Math.max(10, this.lim.idleTimeout / 4);
    let since = performance.now();
    this.idleTimer = setInterval(() => {
      if (this.state === 'closed') {
        clearInterval(this.idleTimer);
        return;
      }
      const now = performance.now();
      if (this.calls.size > 0 || this.partial || this.paused) {
        since = now;
        return;
      }
      // Idle since the last bytes came or call ended (not since this tick noticed them:
      // that put up to a tick, 1.25 s at 5 s, on top of the timeout).
      since = Math.max(since, this.lastActive);
      if (now - since >= this.lim.idleTimeout) {
        clearInterval(this.idleTimer);
        this.host.report(new Error(`connection idle for ${this.lim.idleTimeout}ms; draining it`));
        this.goaway();
        // An NDJSON connection has been quiet for the whole timeout: no quiet wait on top.
        if (this.state === 'ndjson') this.maybeClose(true);
        if (this.state === 'frames') setTimeout(() => { if (this.calls.size === 0) this.kill(new Error('idle connection closed')); }, 1000).unref();
      }
    }, tick);
    this.idleTimer.unref();
  }


  /**
   * The client sent EOF. That alone means "no more requests" (half-close):
   * calls in flight finish and are answered. A client that is gone entirely
   * must cancel them at once, and Node cannot poll(2) for the hang-up as Go
   * does, so a framed connection with calls in flight gets a ping now and
   * then: writing to a closed peer fails (EPIPE or a reset), which closes
   * the connection and aborts every call's signal. (An NDJSON connection
   * has no frame a client must accept: its calls learn it when their answer
   * cannot be written.)
   */
  private peerEnded(): void {
    this.readEnded = true;
    this.stall.stop();
    // Spec 4.3: EOF between frames is request_end for every open client-stream call.
    for (const c of this.calls.values()) c.inbox?.eof();
    if (this.state === 'frames' && this.calls.size > 0) {
      const probe = (): void => {
        if (this.state === 'closed' || this.calls.size === 0) {
          clearInterval(this.hangup);
          this.hangup = undefined;
          return;
        }
        if (!this.writer.blocked) {
          this.writer.push(encodeFrame(T.ping, 0, 0, HANGUP_PROBE, EMPTY, EMPTY));
          this.writer.flush();
        }
      };
      probe();
      this.hangup = setInterval(probe, HANGUP_EVERY);
    }
    this.maybeClose();
  }

  private push(chunk: Buffer): void {
    switch (this.state) {
      case 'frames':
        this.reader!.push(chunk);
        return;
      case 'ndjson':
        this.lines.push(chunk);
        return;
      case 'sniff':
        if (chunk[0] === 0x7b) {
          clearTimeout(this.timer);
          this.state = 'ndjson';
          if (this.draining) this.quietClose(-1); // accepted as a drain began: closes after its answer, or quiet
          this.lines.push(chunk);
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
    this.writer.push(encodeHello({ version: VERSION, flags: FEATURE_STREAM_CREDIT | FEATURE_CLIENT_STREAM, maxFrame: this.lim.maxFrame, maxInFlight: this.lim.maxInFlight }));
    const client = decodeHello(all); // bad_magic, bad_version (0), bad_limits: a connection error
    this.maxFrame = Math.min(client.maxFrame, this.lim.maxFrame);
    this.state = 'frames';
    this.reader = new FrameReader(this.maxFrame, (h, b, hs, ps, end) => this.frame(h, b, hs, ps, end), () => this.overTotal() || this.turnFull());
    if (this.host.refusing) this.goaway();
    if (all.length > HELLO_SIZE) this.reader.push(all.subarray(HELLO_SIZE));
  }

  private frame(h: Header, b: Buffer, hs: number, ps: number, end: number): void {
    // Closed by an earlier frame of the same chunk (over maxInFlight, a protocol error): the rest is dropped,
    // not served (its calls were started, on a connection whose calls had all been cancelled).
    if (this.state === 'closed') return;
    switch (h.type) {
      case T.request:
        this.request(h, b, hs, ps, end);
        return;
      case T.cancel: {
        const c = this.calls.get(h.id);
        if (c === undefined || !this.finish(c)) return;
        c.ctx.abort(h.aux === Code.deadline_exceeded
          ? new UdskitError(Code.deadline_exceeded, 'caller deadline exceeded')
          : new UdskitError(Code.canceled, 'canceled by the caller'));
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
      case T.request_data: case T.request_end: {
        const c = this.calls.get(h.id);
        if (c === undefined) return; // raced with the call's end (spec 4.3)
        if (c.inbox === null) throw new ProtocolError('protocol_violation', `client sent ${TYPE_NAMES[h.type]} for call ${h.id}, which was not opened with the client_stream flag`);
        if (h.type === T.request_data) c.inbox.data(Buffer.from(b.subarray(ps, end)));
        else c.inbox.end();
        return;
      }
      case T.ping:
        // A client that pings without reading our pongs must not grow our queue.
        if (!this.writer.blocked) this.writer.push(encodeFrame(T.pong, 0, 0, h.aux, EMPTY, b.subarray(ps, end)));
        return;
      case T.pong:
        return;
      case T.response: case T.error: case T.stream_data: case T.stream_end: case T.goaway: case T.request_credit:
        throw new ProtocolError('protocol_violation', `client sent a server-to-client frame (type ${h.type})`);
      default:
        return; // unknown types are skipped
    }
  }

  private request(h: Header, b: Buffer, hs: number, ps: number, end: number): void {
    const mEnd = requestMethodEnd(b, hs, ps);
    const method = this.methodName(b, hs + 2, mEnd);
    const entries = mEnd === ps ? null : parseMetadataList(b, mEnd, ps);
    if (this.calls.has(h.id)) throw new ProtocolError('protocol_violation', `id ${h.id} reused while its call is in flight`);
    const cs = (h.flags & FLAG_CLIENT_STREAM) !== 0;
    if (cs && ps < end) throw new ProtocolError('protocol_violation', `request ${h.id} opens a client stream with a payload of ${end - ps} bytes (it must be empty)`);
    if (this.calls.size >= this.lim.maxInFlight) {
      this.connError(Code.resource_exhausted, `over ${this.lim.maxInFlight} calls in flight`);
      return;
    }
    if (this.draining && method !== HEALTH) {
      this.sendError(h.id, Code.unavailable, 'server is shutting down', FLAG_REFUSED);
      return;
    }
    const handler = this.host.handler(method);
    const isStream = (h.flags & FLAG_STREAM) !== 0;
    if (handler === undefined) {
      this.sendError(h.id, Code.unimplemented, `unknown method ${JSON.stringify(method)}`);
      return;
    }
    // Same wording as Go: `udskit call` finds streaming methods by it.
    const mismatch = kindMismatch(method, handler.kind, isStream, cs);
    if (mismatch !== null) {
      this.sendError(h.id, Code.unimplemented, mismatch);
      return;
    }
    const ctx = new Ctx(method, entries, h.aux === 0 ? undefined : Date.now() + h.aux / 1000, 'udskit');
    ctx.peer = this.peer;
    const raw = handler.kind === 'raw' || handler.kind === 'rawStream' || handler.kind === 'rawBidi' || handler.kind === 'rawClientStream';
    const call = new SCall(h.id, ctx, raw);
    call.ms = h.aux === 0 ? 0 : Math.ceil(h.aux / 1000);
    let req: unknown;
    if (cs) {
      const id = h.id;
      req = call.inbox = new Inbox(ctx, raw, this.maxFrame, (n) => {
        if (this.state === 'frames') this.writer.push(encodeFrame(T.request_credit, 0, id, n, EMPTY, EMPTY));
      }, (d) => this.inboxHeld(d));
    } else if (raw) {
      const copy = Buffer.allocUnsafe(end - ps); // (a copy: b is the reader's; one object, not a view and a copy)
      b.copy(copy, 0, ps, end);
      req = copy;
    } else if (ps < end) {
      if (jsonTooDeep(b, ps, end)) {
        this.fail(call, new UdskitError(Code.invalid_argument, `${method}: request is not JSON: nested deeper than ${MAX_JSON_DEPTH} levels`));
        return;
      }
      try {
        req = JSON.parse(b.toString('utf8', ps, end));
      } catch (e) {
        this.fail(call, new UdskitError(Code.invalid_argument, `${method}: request is not JSON: ${(e as Error).message}`));
        return;
      }
    }
    this.start(call, handler, req, end - ps);
  }

  /**
   * A connection not read (paused over the server's total) would not see
   * its client go: its held request items would stay until the handlers read
   * them. While it is paused with items, a ping now and then finds a client
   * that is gone (the write fails and the connection closes, as the hang-up
   * probe after EOF).
   */
  private probePaused(): void {
    if (this.pauseProbe !== undefined || this.state !== 'frames') return;
    this.pauseProbe = setInterval(() => {
      if (!this.paused || this.state !== 'frames') {
        clearInterval(this.pauseProbe);
        this.pauseProbe = undefined;
        return;
      }
      if (!this.writer.blocked) {
        this.writer.push(encodeFrame(T.ping, 0, 0, HANGUP_PROBE, EMPTY, EMPTY));
        this.writer.flush();
      }
    }, PAUSE_PROBE_EVERY);
    this.pauseProbe.unref();
  }

  /**
   * Request items held by client-stream calls changed by delta. Arrivals are
   * counted with the chunk they came in; reads and drops (from a handler,
   * maybe inside the reader) recount once, a microtask later, and may resume
   * a connection paused over the server's total.
   */
  private inboxHeld(delta: number): void {
    this.inboxBytes += delta;
    if (delta > 0 || this.inboxRecount) return;
    this.inboxRecount = true;
    queueMicrotask(() => {
      this.inboxRecount = false;
      if (this.state === 'closed') return;
      this.account();
      this.maybeResume();
    });
  }

  /** Puts a call in flight (holding size request bytes) and runs its handler (either protocol). */
  private start(call: SCall, handler: Spec, req: unknown, size: number): void {
    call.size = size;
    this.held += size;
    this.calls.set(call.id, call);
    if (turnCalls >= TURN_CALLS) this.extraTurn = turnNo; // this turn's one call past the cap (turnClosed)
    if (++turnCalls >= TURN_CALLS / 4) scheduleTurnEnd();
    // A call waiting on its client (credit, or request items) does not count as in flight for the budget.
    if (sendsItems(handler.kind) || readsItems(handler.kind)) {
      call.stream = true;
      this.streams++;
    }
    let out: unknown;
    try {
      out = handler.fn(req, call.ctx);
    } catch (e) {
      this.fail(call, e);
      return;
    }
    if (sendsItems(handler.kind)) {
      this.armDeadline(call);
      void this.pump(call, out as AsyncIterable<unknown> | Iterable<unknown>);
    } else if (isThenable(out)) {
      this.armDeadline(call);
      out.then((v) => this.respond(call, v), (e) => this.fail(call, e));
    } else {
      this.respond(call, out); // answered at once: no deadline timer was needed
    }
  }

  /**
   * Starts the caller's deadline timer for a call its handler did not answer
   * at once. Set here, after the handler's first return, not when the request
   * came: a handler that answers synchronously (an echo) costs no timer
   * (a Timeout, a closure and a timer-list insert and removal per call were a
   * tenth of the server's garbage per call). The time the handler took counts.
   */
  private armDeadline(call: SCall): void {
    if (call.ms === 0 || call.done) return;
    const ctx = call.ctx;
    call.timer = setTimeout(() => {
      ctx.abort(new UdskitError(Code.deadline_exceeded, 'deadline exceeded'));
      call.wake?.();
    }, Math.max(0, Math.ceil(ctx.deadline! - Date.now())));
  }

  /** A method's name from its bytes b[start:end]: the last name this connection saw is not decoded again. */
  private methodName(b: Buffer, start: number, end: number): string {
    const last = this.lastMethod;
    const n = end - start;
    if (last !== null && last.length === n) {
      let i = 0;
      while (i < n && last[i] === b[start + i]) i++;
      if (i === n) return this.lastMethodName;
    }
    const name = b.toString('utf8', start, end);
    if (n <= 64) {
      if (last !== null && last.length === n) {
        b.copy(last, 0, start, end);
      } else {
        this.lastMethod = Buffer.allocUnsafeSlow(n);
        b.copy(this.lastMethod, 0, start, end);
      }
      this.lastMethodName = name;
    }
    return name;
  }

  private clear(c: SCall): void {
    if (c.timer !== undefined) clearTimeout(c.timer);
  }

  private finish(c: SCall): boolean {
    if (c.done) return false;
    c.done = true;
    this.lastActive = performance.now();
    this.clear(c);
    this.calls.delete(c.id);
    if (c.stream) this.streams--;
    c.inbox?.close();
    this.release(c);
    return true;
  }

  /** The call no longer holds its request bytes. */
  private release(c: SCall): void {
    this.held -= c.size;
    c.size = 0;
    this.account(); // the call's CALL_COST too, once it has left calls
    this.maybeResume();
  }

  private encodeValue(c: SCall, v: unknown): Buffer | string {
    if (c.raw) {
      if (v === undefined || v === null) return EMPTY;
      if (!(v instanceof Uint8Array)) throw new UdskitError(Code.internal, `${c.ctx.method}: raw handler returned ${typeof v}, want a Buffer`);
      return toBuffer(v);
    }
    if (v === undefined) return '';
    try {
      return JSON.stringify(v);
    } catch (e) {
      // Too deep (a RangeError), a cycle or a BigInt: the call fails, the connection stays.
      throw new UdskitError(Code.internal, `${c.ctx.method}: the answer cannot be encoded as JSON: ${e instanceof Error ? e.message : String(e)}`);
    }
  }

  private frameOf(type: number, id: number, md: Metadata, body: Buffer | string): Buffer | null {
    const plen = payloadLen(body);
    if (plen > this.maxFrame) return null;
    const hl = md === NO_MD ? 0 : metadataLen(md);
    if (hl > MAX_HEAD) return null;
    return encodeFrame(type, 0, id, 0, hl === 0 ? EMPTY : encodeMetadata(md), body, plen);
  }

  /** An internal error when the handler put a key reserved for the protocol in its answer's metadata (spec 3.1). */
  private reservedError(c: SCall, what: string): UdskitError | null {
    const md = c.ctx.rmd;
    if (md === null) return null; // never looked at: empty
    const k = reservedKeyOf(md);
    return k === undefined ? null : new UdskitError(Code.internal, `${c.ctx.method}: ${what} ${reservedKeyMessage(k)}`);
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
    const bad = this.reservedError(c, 'response');
    if (bad !== null) {
      this.fail(c, bad);
      return;
    }
    if (this.state === 'ndjson') {
      if (!this.finish(c)) return;
      this.sendLine(encodeDataLine(c.id as string, typeof body === 'string' ? body : body.toString('utf8')));
      this.maybeClose();
      return;
    }
    const f = this.frameOf(T.response, c.id as number, c.ctx.rmd ?? NO_MD, body);
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
      this.sendLine(encodeErrorLine(c.id as string, err.message, codeName(err.code)));
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
    // A stream waiting for its client's credit must not keep the reader from
    // reading that very credit: its request bytes are given back now.
    this.release(c);
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
      const bad = this.reservedError(c, 'stream end');
      if (bad !== null) throw bad;
      if (!this.finish(c)) return;
      this.writer.push(this.frameOf(T.stream_end, c.id as number, c.ctx.rmd ?? NO_MD, EMPTY) ?? encodeFrame(T.stream_end, 0, c.id as number, 0, EMPTY, EMPTY));
      this.maybeClose();
    } catch (e) {
      this.fail(c, e);
    }
  }

  private lineTooLong(): void {
    this.sendLine(encodeErrorLine('null', `line over the limit of ${this.lim.maxFrame} bytes`, 'resource_exhausted'));
    this.state = 'closed';
    this.writer.flush();
    this.socket.end();
    this.host.report(new Error('NDJSON line over the limit; connection closed'));
  }

  private sendLine(s: string): void {
    this.writer.push(Buffer.from(s));
  }

  private line(bytes: Buffer): void {
    const text = bytes.toString('utf8');
    let r;
    try {
      // (before JSON.parse; lineId below stops at its own depth limit)
      if (jsonTooDeep(bytes, 0, bytes.length)) throw new ProtocolError('bad_request', `not JSON: nested deeper than ${MAX_JSON_DEPTH} levels`);
      r = parseRequestLine(text);
    } catch (e) {
      let id = 'null';
      try {
        id = lineId(text);
      } catch {
        // nested too deep to find the id: answer with null
      }
      this.sendLine(encodeErrorLine(id, e instanceof ProtocolError ? e.message : `not a request: ${String(e)}`, 'invalid_argument'));
      return;
    }
    // A line read is served, draining or not (an NDJSON client cannot retry a
    // refusal): the connection closes once no line is in flight (maybeClose).
    const handler = this.host.handler(r.func);
    if (handler === undefined) {
      this.sendLine(encodeErrorLine(r.id, `unknown method ${JSON.stringify(r.func)}`, 'unimplemented'));
      return;
    }
    if (readsItems(handler.kind)) {
      this.sendLine(encodeErrorLine(r.id, ndjsonRefusal(r.func, handler.kind), 'unimplemented'));
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
    if (this.calls.size >= this.lim.maxInFlight) {
      this.sendLine(encodeErrorLine(r.id, `over ${this.lim.maxInFlight} calls in flight`, 'resource_exhausted'));
      return;
    }
    const ctx = new Ctx(r.func, null, undefined, 'ndjson');
    ctx.peer = this.peer;
    const raw = handler.kind === 'raw';
    this.start(new SCall(r.id, ctx, raw), handler, raw ? Buffer.from(r.data) : r.value, text.length);
  }

  goaway(): void {
    if (this.draining) return;
    this.draining = true;
    if (this.state === 'frames') {
      const reason = Buffer.from('server is shutting down');
      this.writer.push(encodeFrame(T.goaway, 0, 0, 0, reason, EMPTY));
    } else if (this.state === 'sniff' || this.state === 'hello') {
      return; // goaway follows the hello; an NDJSON line is served (bounded by the handshake timeout and the drain's deadline)
    } else if (this.state === 'ndjson') {
      this.quietClose(this.done); // closed after NDJSON_QUIET ms without a new line (it took two)
      return;
    }
    this.maybeClose();
  }

  /**
   * A draining NDJSON connection closes right after an answer (our FIN goes
   * with it, so a client that waits for its answer before writing again sees
   * the close first and never writes into it). One that stays quiet, with
   * nothing in flight, is closed after NDJSON_QUIET ms without a new line:
   * closing an idle one at once would race a client just writing its next line.
   */
  private quietClose(mark: number): void {
    setTimeout(() => {
      if (this.state === 'closed') return;
      if (this.done === mark && this.calls.size === 0) {
        this.maybeClose(true);
        if ((this.state as string) === 'closed') return;
      }
      this.quietClose(this.done);
    }, NDJSON_QUIET).unref();
  }

  /**
   * Closes when done: the client half-closed, or (NDJSON) the server drains;
   * and nothing in flight. A draining NDJSON connection also waits for a line
   * it has started to receive (and bytes read but not yet looked at): that
   * line is served, not refused.
   */
  private maybeClose(ndDrained = true): void {
    if (this.calls.size !== 0 || this.state === 'closed') return;
    const drainedNd = ndDrained && this.draining && this.state === 'ndjson' && !this.lines.partial && this.socket.readableLength === 0 && !this.paused;
    if (this.readEnded || drainedNd) {
      this.state = 'closed';
      this.writer.flush();
      this.socket.end();
    }
  }

  /** A connection error: tell the peer (error frame, id 0), then close. */
  private connError(code: number, message: string): void {
    if (this.state === 'closed') return;
    this.host.report(new Error(`closing connection: ${codeName(code)}: ${message}`));
    if (this.state === 'frames' || this.state === 'hello') this.sendError(0, code, message);
    this.abortAll(new UdskitError(Code.canceled, 'connection closed'));
    this.state = 'closed';
    this.writer.flush();
    this.socket.end();
    // Nothing more is read: a peer still sending (100k requests past maxInFlight) is not read and dropped.
    this.socket.pause();
    setTimeout(() => this.socket.destroy(), 1000).unref();
  }

  kill(err: Error): void {
    if (this.state !== 'closed') this.host.report(new Error(`closing connection: ${err.message}`));
    this.state = 'closed';
    this.socket.destroy();
  }

  private abortAll(reason: UdskitError): void {
    this.streams = 0;
    for (const c of this.calls.values()) {
      c.done = true;
      this.clear(c);
      c.ctx.abortLater(reason); // the listeners in batches: the close (and other clients) need not wait for 4,096 of them
      c.wake?.();
      c.inbox?.close();
    }
    this.calls.clear();
    this.held = 0;
  }

  private closed(): void {
    clearTimeout(this.timer);
    this.stall.stop();
    this.state = 'closed';
    this.writer.close();
    this.abortAll(new UdskitError(Code.canceled, 'the client went away'));
    clearTimeout(this.writeTimer);
    clearInterval(this.idleTimer);
    clearInterval(this.hangup);
    clearInterval(this.pauseProbe);
    this.reader?.reset();
    this.lines.reset();
    this.account();
    this.host.connClosed(this);
  }
}

/** A udskit server. Create with createServer(). */
