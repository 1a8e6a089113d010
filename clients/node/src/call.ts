// A call's state, shared by the client and its connections.
import { INITIAL_CREDIT } from './frame.js';

export const PENDING = 0;
export const INFLIGHT = 1;
export const DONE = 2;

/** What a call needs of the connection it is in flight on (a client connection implements it). */
export interface CallConn {
  readonly calls: Map<number, Call>;
  /** Tells the server the caller gave up (reason: canceled or deadline_exceeded). */
  cancel(call: Call, reason: number): void;
  /** Grants the server bytes more of stream credit. */
  credit(call: Call, bytes: number): void;
  /** A call left calls: start waiting ones, or close a draining connection. */
  afterCall(): void;
  /** The connection has closed. */
  readonly dead: boolean;
  /** Sends a frame of call's that is only a payload (request_data, request_end). */
  sendFrame(call: Call, type: number, payload: Buffer | string): void;
  /** The negotiated max frame (a request item over it is refused locally). */
  readonly maxFrame: number;
  /** The socket does not take more now (wait with onDrain). */
  readonly blocked: boolean;
  /** Runs fn once the blocked socket drains. */
  onDrain(fn: () => void): void;
  /** One of its calls settled: ref the socket while calls are in flight, unref it when idle. */
  refresh(): void;
}

/** The request direction of a client-stream call, as a connection drives it (bidi.ts's UpState). */
export interface CallUp {
  /** Frames sent so far (a refused call is sent again only if none went). */
  readonly sent: number;
  /** Sends queued items that may go now. */
  pump(): void;
  /** request_credit: bytes more may be sent. */
  grant(bytes: number): void;
  /** The call is over: unsent items are dropped. */
  close(): void;
}

/** One call, unary or stream. */
export class Call {
  id = 0;
  state = PENDING;
  conn: CallConn | null = null;
  timer: NodeJS.Timeout | undefined = undefined;
  onAbort: (() => void) | undefined = undefined;
  retries = 0;
  /** Wait for a reconnect instead of failing fast (CallOptions.waitForReady). */
  waitForReady = false;
  /** The request direction of a client-streaming or bidirectional call (bidi.ts), else null. */
  up: CallUp | null = null;
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
export class StreamState {
  items: Buffer[] = [];
  head = 0;
  ended = false;
  err: Error | null = null;
  wake: (() => void) | null = null;
  consumed = 0; // payload+16 bytes read by the application since the last grant
  outstanding = INITIAL_CREDIT; // credit the server still has (may go below 0 by one item)
}

