// Incremental frame reader: turns socket chunks into frames without trusting
// the peer's lengths. Limits are checked as soon as a header's 16 bytes are
// there, before anything is allocated for the frame; a partial frame is kept
// as the chunks that actually arrived and joined once it is complete, so
// memory grows only with bytes received (at most one frame plus one chunk).
import { HEADER_SIZE, type Header, readHeader } from './frame.js';

/**
 * Called for each complete frame. `b` is valid only during the call: head is
 * b[headStart:payloadStart], payload b[payloadStart:end]. Copy what you keep.
 */
export type FrameHandler = (h: Header, b: Buffer, headStart: number, payloadStart: number, end: number) => void;

export class FrameReader {
  private pending: Buffer[] = [];
  private pendingLen = 0;
  private need = HEADER_SIZE;

  constructor(public maxFrame: number, private readonly onFrame: FrameHandler) {}

  /** Whether part of a frame is buffered (the peer owes us bytes). */
  get partial(): boolean {
    return this.pendingLen > 0;
  }

  /** Bytes buffered for a partial frame. */
  get buffered(): number {
    return this.pendingLen;
  }

  /** Feeds bytes; throws ProtocolError (from readHeader or onFrame) on a bad frame. */
  push(chunk: Buffer): void {
    let data = chunk;
    if (this.pendingLen > 0) {
      this.pending.push(chunk);
      this.pendingLen += chunk.length;
      if (this.pendingLen < this.need) return;
      data = Buffer.concat(this.pending, this.pendingLen);
      this.pending = [];
      this.pendingLen = 0;
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
      this.onFrame(h, data, hs, hs + h.headLen, off);
    }
  }

  private keep(rest: Buffer, need: number): void {
    this.pending = [rest];
    this.pendingLen = rest.length;
    this.need = need;
  }

  /** Drops buffered bytes (on close). */
  reset(): void {
    this.pending = [];
    this.pendingLen = 0;
    this.need = HEADER_SIZE;
  }
}

/**
 * The stall timeout of a connection (client and server): runs onStall once
 * the peer has left a frame (or line) half sent for ms without more bytes.
 */
export class StallTimer {
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly ms: number, private readonly onStall: () => void) {}

  /** After each chunk: (re)starts the timeout while the peer owes bytes, else stops it. */
  update(owed: boolean): void {
    if (owed) {
      if (this.timer === undefined) this.timer = setTimeout(this.onStall, this.ms);
      else this.timer.refresh();
    } else {
      this.stop();
    }
  }

  stop(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
  }
}
