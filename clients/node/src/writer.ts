// Coalescing writer: frames queued during one tick go out in one write (one
// syscall), and the socket's backpressure is honoured: once write() returns
// false nothing more is written until 'drain'; callers see `blocked` and wait.
//
// The flush is scheduled with process.nextTick, but code that keeps the
// microtask queue busy (a stream handler whose items resolve at once) can
// starve nextTick: so a queue reaching FLUSH_AT bytes is written at once,
// and a peer that does not read is seen as `blocked` after at most that
// much, whatever the handlers do.
import type { Socket } from 'node:net';

/** Frames up to this total are joined into one buffer; bigger batches use writev. */
const JOIN_LIMIT = 64 << 10;
/** A queue this big is written at once, without waiting for the tick. */
export const FLUSH_AT = 64 << 10;

export interface WriterEvents {
  /** A blocked socket drained (the peer read): callers waiting may go on. */
  onDrain(): void;
  /** A write that did not block was handed to the socket (optional). */
  onFlushed?(): void;
  /** write() returned false: the peer is not reading fast enough (optional). */
  onBlocked?(): void;
  /** Bytes handed to the socket were written out (optional; for accounting). */
  onWritten?(): void;
}

export class Writer {
  /**
   * What is queued: one buffer in `one` (the common case: one answer per
   * tick, with no array made for it), more in `queue` (`one` first).
   */
  private one: Buffer | null = null;
  private queue: Buffer[] | null = null;
  private queuedBytes = 0;
  private scheduled = false;
  /** Pushes are being batched by the caller (hold/release): no tick is scheduled for them. */
  private holding = false;
  /** True between a write() that returned false and the next 'drain'. */
  blocked = false;
  private closed = false;
  private readonly flushFn = (): void => this.flush();
  private readonly writtenFn: (() => void) | undefined;

  constructor(private readonly socket: Socket, private readonly ev: WriterEvents) {
    const w = ev.onWritten;
    this.writtenFn = w === undefined ? undefined : (): void => w();
    socket.on('drain', () => {
      this.blocked = false;
      this.flush();
      if (!this.blocked) this.ev.onDrain();
    });
  }

  /** Bytes queued here (not yet handed to the socket). */
  get queued(): number {
    return this.queuedBytes;
  }

  /** Bytes queued here or in the socket and not yet written to the kernel. */
  get pending(): number {
    return this.closed ? 0 : this.queuedBytes + this.socket.writableLength;
  }

  /** Queues a buffer for this tick's write (or writes at once past FLUSH_AT). */
  push(b: Buffer): void {
    if (this.closed) return;
    if (this.one === null) this.one = b;
    else if (this.queue === null) this.queue = [this.one, b];
    else this.queue.push(b);
    this.queuedBytes += b.length;
    if (this.queuedBytes >= FLUSH_AT) {
      this.flush();
    } else if (!this.scheduled && !this.holding) {
      this.scheduled = true;
      process.nextTick(this.flushFn);
    }
  }

  /**
   * Batches what is pushed until release() (a server reading one chunk of
   * requests): answered synchronously, they go out in one write at release,
   * with no tick scheduled for them.
   */
  hold(): void {
    this.holding = true;
  }

  /** Ends hold(): writes what was pushed meanwhile (unless a flush is scheduled anyway). */
  release(): void {
    this.holding = false;
    if (!this.scheduled && this.one !== null) this.flush();
  }

  /** Writes what is queued now (unless the socket is blocked). */
  flush(): void {
    this.scheduled = false;
    if (this.blocked || this.closed || this.one === null) return;
    const q = this.queue;
    const one = this.one;
    const n = this.queuedBytes;
    this.one = null;
    this.queue = null;
    this.queuedBytes = 0;
    let ok: boolean;
    const cb = this.writtenFn;
    if (q === null) {
      ok = this.socket.write(one, cb);
    } else if (n <= JOIN_LIMIT) {
      ok = this.socket.write(Buffer.concat(q, n), cb);
    } else {
      this.socket.cork();
      for (let i = 0; i < q.length - 1; i++) this.socket.write(q[i]!);
      ok = this.socket.write(q[q.length - 1]!, cb);
      this.socket.uncork();
    }
    if (!ok) {
      this.blocked = true;
      this.ev.onBlocked?.();
    } else {
      this.ev.onFlushed?.();
    }
  }

  /** Drops the queue; later pushes are ignored. */
  close(): void {
    this.closed = true;
    this.one = null;
    this.queue = null;
    this.queuedBytes = 0;
  }
}
