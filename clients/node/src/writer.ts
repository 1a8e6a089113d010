// Coalescing writer: frames queued during one tick go out in one write (one
// syscall), and the socket's backpressure is honoured: once write() returns
// false nothing more is written until 'drain'; callers see `blocked` and wait.
import type { Socket } from 'node:net';

/** Frames up to this total are joined into one buffer; bigger batches use writev. */
const JOIN_LIMIT = 64 << 10;

export class Writer {
  private queue: Buffer[] = [];
  private queuedBytes = 0;
  private scheduled = false;
  /** True between a write() that returned false and the next 'drain'. */
  blocked = false;
  private closed = false;
  private readonly flushFn = (): void => this.flush();

  /**
   * onDrain runs when a blocked socket drains; onFlushed (optional) after each
   * write that did not block, so callers waiting for queue room can go on.
   */
  constructor(private readonly socket: Socket, private readonly onDrain: () => void, private readonly onFlushed?: () => void) {
    socket.on('drain', () => {
      this.blocked = false;
      this.flush();
      if (!this.blocked) this.onDrain();
    });
  }

  /** Bytes queued here (not yet handed to the socket). */
  get queued(): number {
    return this.queuedBytes;
  }

  /** Queues a buffer for this tick's write. */
  push(b: Buffer): void {
    if (this.closed) return;
    this.queue.push(b);
    this.queuedBytes += b.length;
    if (!this.scheduled) {
      this.scheduled = true;
      process.nextTick(this.flushFn);
    }
  }

  /** Writes what is queued now (unless the socket is blocked). */
  flush(): void {
    this.scheduled = false;
    if (this.blocked || this.closed || this.queue.length === 0) return;
    const q = this.queue;
    const n = this.queuedBytes;
    this.queue = [];
    this.queuedBytes = 0;
    let ok: boolean;
    if (q.length === 1) {
      ok = this.socket.write(q[0]!);
    } else if (n <= JOIN_LIMIT) {
      ok = this.socket.write(Buffer.concat(q, n));
    } else {
      this.socket.cork();
      for (let i = 0; i < q.length - 1; i++) this.socket.write(q[i]!);
      ok = this.socket.write(q[q.length - 1]!);
      this.socket.uncork();
    }
    if (!ok) this.blocked = true;
    else if (this.onFlushed !== undefined) this.onFlushed();
  }

  /** Drops the queue; later pushes are ignored. */
  close(): void {
    this.closed = true;
    this.queue = [];
    this.queuedBytes = 0;
  }
}
