// Incremental frame reader: turns socket chunks into frames without trusting
// the peer's lengths. Limits are checked as soon as a header's 16 bytes are
// there, before anything is allocated for the frame. A partial frame is
// copied into one buffer that grows only as bytes arrive (doubling from a
// small start, never past the frame's size), so memory is at most about
// twice the bytes received plus one chunk, whatever the chunking: a peer
// sending a frame one byte per read costs bytes, not a Buffer object each.
import { HEADER_SIZE, type Header, readHeader } from './frame.js';

/**
 * Called for each complete frame. `b` is valid only during the call: head is
 * b[headStart:payloadStart], payload b[payloadStart:end]. Copy what you keep.
 */
export type FrameHandler = (h: Header, b: Buffer, headStart: number, payloadStart: number, end: number) => void;

/**
 * The first buffer of a partial unit is what arrived rounded up to this (it
 * doubles as more arrives): a connection that sent one byte of a line (the
 * soak's 2,000 NDJSON slowlorises) holds 256 bytes, not 16 KiB (32 MiB of
 * the allocator's small chunks, whose pages stayed with the process after).
 */
const GROW_START = 256;

/**
 * A buffer for a partial unit (frame or line) of `need` bytes (or unknown:
 * grown by what arrives): starts small, doubles as bytes arrive, never
 * allocated beyond max(need, 2 × received).
 */
export class Partial {
  buf: Buffer | null = null;
  len = 0;

  /** Appends b, growing the buffer to fit (cap: a hint of the final size, 0 if unknown). */
  append(b: Buffer, cap: number): void {
    const want = this.len + b.length;
    if (this.buf === null || this.buf.length < want) {
      // The first buffer fits what arrived (rounded up to GROW_START), not the
      // next power of two: a 64 KiB read of a large frame took 128 KiB per
      // connection (2,000 stalled 16 MiB frames: 250 MiB for 125 MiB that came),
      // and one byte of a line took 16 KiB.
      let size = this.buf === null ? Math.ceil(want / GROW_START) * GROW_START : this.buf.length * 2;
      while (size < want) size *= 2;
      if (cap > 0 && size > cap) size = Math.max(cap, want);
      const nb = Buffer.allocUnsafeSlow(size);
      if (this.buf !== null) this.buf.copy(nb, 0, 0, this.len);
      this.buf = nb;
    }
    b.copy(this.buf, this.len);
    this.len = want;
  }

  /** The bytes held (valid until the next append or clear). */
  bytes(): Buffer {
    return this.buf === null ? Buffer.alloc(0) : this.buf.subarray(0, this.len);
  }

  clear(): void {
    this.buf = null;
    this.len = 0;
  }
}

export class FrameReader {
  private readonly part = new Partial();
  private need = HEADER_SIZE;
  /** Frames delivered so far (a frame timer restarts when this moves). */
  frames = 0;
  /** Bytes after a frame when the gate closed, delivered by resume() (at most one chunk). */
  private backlog: Buffer | null = null;

  /**
   * gate (optional), asked after each frame: true stops delivering frames
   * until resume(), keeping the rest of the chunk (the caller stops reading).
   */
  constructor(public maxFrame: number, private readonly onFrame: FrameHandler, private readonly gate?: () => boolean) {}

  /** Whether frames wait for resume(). */
  get held(): boolean {
    return this.backlog !== null;
  }

  /** Delivers the frames held back at the gate (it may close again). */
  resume(): void {
    const b = this.backlog;
    if (b === null) return;
    this.backlog = null;
    this.push(b);
  }

  /** Whether part of a frame is buffered (the peer owes us bytes). */
  get partial(): boolean {
    return this.part.len > 0;
  }

  /** Bytes buffered: a partial frame, and what waits at the gate. */
  get buffered(): number {
    return this.part.len + (this.backlog?.length ?? 0);
  }

  /** The whole size of the partial frame once its header has come (else the bytes that came); 0 between frames. */
  get reserved(): number {
    const waiting = this.backlog?.length ?? 0;
    if (this.part.len === 0) return waiting;
    return waiting + (this.need > this.part.len ? this.need : this.part.len);
  }

  /** Frames finished so far. */
  get done(): number {
    return this.frames;
  }

  /** Feeds bytes; throws ProtocolError (from readHeader or onFrame) on a bad frame. */
  push(chunk: Buffer): void {
    if (this.backlog !== null) {
      this.backlog = Buffer.concat([this.backlog, chunk]);
      return;
    }
    let data = chunk;
    while (this.part.len > 0) {
      // Complete the partial frame (first its header, then the rest) from the chunk.
      const take = Math.min(data.length, this.need - this.part.len);
      this.part.append(data.subarray(0, take), this.need);
      data = data.subarray(take);
      if (this.part.len < this.need) return;
      const b = this.part.bytes();
      if (this.need === HEADER_SIZE) {
        const h = readHeader(b, 0, this.maxFrame);
        const total = HEADER_SIZE + h.headLen + h.payloadLen;
        if (total > HEADER_SIZE) {
          this.need = total;
          continue;
        }
      }
      const h = readHeader(b, 0, this.maxFrame);
      this.part.clear();
      this.need = HEADER_SIZE;
      this.frames++;
      this.onFrame(h, b, HEADER_SIZE, HEADER_SIZE + h.headLen, b.length);
      if (data.length > 0 && this.gate?.() === true) {
        this.backlog = data;
        return;
      }
    }
    let off = 0;
    const len = data.length;
    while (true) {
      const rem = len - off;
      if (rem < HEADER_SIZE) {
        if (rem > 0) this.keep(data.subarray(off), HEADER_SIZE);
        return;
      }
      const h = readHeader(data, off, this.maxFrame);
      const total = HEADER_SIZE + h.headLen + h.payloadLen;
      if (rem < total) {
        this.keep(data.subarray(off), total);
        return;
      }
      const hs = off + HEADER_SIZE;
      off += total;
      this.frames++;
      this.onFrame(h, data, hs, hs + h.headLen, off);
      if (off < len && this.gate?.() === true) {
        this.backlog = data.subarray(off);
        return;
      }
    }
  }

  private keep(rest: Buffer, need: number): void {
    this.part.clear();
    this.part.append(rest, need);
    this.need = need;
  }

  /** Drops buffered bytes (on close). */
  reset(): void {
    this.backlog = null;
    this.part.clear();
    this.need = HEADER_SIZE;
  }
}

/**
 * The frame (or line) timeout of a connection, client and server: runs
 * onStall once a frame has been started and not finished for ms. The time
 * counts from the frame's first byte: more bytes of the same frame do not
 * restart it (a peer dribbling one byte at a time is still bounded); a
 * finished frame does.
 */
export class StallTimer {
  private timer: NodeJS.Timeout | undefined;
  private mark = -1;

  constructor(private readonly ms: number, private readonly onStall: () => void) {}

  /**
   * After each chunk: owed says whether a frame is partly received, done is
   * the count of frames finished so far. Starts the timeout when a frame
   * starts, restarts it only when done moved, stops it when nothing is owed.
   */
  update(owed: boolean, done: number): void {
    if (!owed || this.ms <= 0) {
      this.stop();
      return;
    }
    if (this.timer === undefined) {
      this.timer = setTimeout(this.onStall, this.ms);
    } else if (done !== this.mark) {
      this.timer.refresh();
    }
    this.mark = done;
  }

  stop(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
  }
}
