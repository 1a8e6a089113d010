// Newline-delimited JSON (protocol/spec.md section 7): the seed-002 wire format.
import { ProtocolError } from './codes.js';
import { Partial } from './reader.js';

/** A decoded NDJSON request: id and data as raw JSON text (data '' when absent or null). */
export interface NdjsonRequest {
  id: string;
  func: string;
  /** data as JSON text, made when asked for (only raw handlers need it). */
  readonly data: string;
  /** data parsed (undefined when absent or null). */
  value: unknown;
}

/** Parses one request line (without the newline). Throws ProtocolError('bad_request'). */
export function parseRequestLine(line: string): NdjsonRequest {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch (e) {
    throw new ProtocolError('bad_request', `not JSON: ${(e as Error).message}`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new ProtocolError('bad_request', 'want a JSON object');
  const o = v as Record<string, unknown>;
  if (typeof o.id !== 'number' && typeof o.id !== 'string') throw new ProtocolError('bad_request', 'id must be a number or a string');
  if (typeof o.func !== 'string' || o.func === '') throw new ProtocolError('bad_request', 'func must be a non-empty string');
  const value = o.data === null ? undefined : o.data;
  return { id: JSON.stringify(o.id), func: o.func, value, get data() { return value === undefined ? '' : JSON.stringify(value); } };
}

/** How deep lineId looks for the id before giving up on the rest of the line. */
const LINE_ID_DEPTH = 1000;

/**
 * The id to answer a line that is not a valid request with (spec 7): the raw
 * text of a number or string "id" member of the top-level object, read before
 * the first syntax error (the last one wins, as in JSON.parse); else 'null'.
 */
export function lineId(line: string): string {
  let i = 0;
  let id = 'null';
  const n = line.length;
  const ws = (): void => {
    while (i < n && (line[i] === ' ' || line[i] === '\t' || line[i] === '\r' || line[i] === '\n')) i++;
  };
  // Returns the end of the string starting at i (a '"'), or -1.
  const str = (at: number): number => {
    for (let j = at + 1; j < n; j++) {
      const c = line[j];
      if (c === '\\') j++;
      else if (c === '"') return j + 1;
      else if (c! < ' ') return -1;
    }
    return -1;
  };
  // Skips one JSON value at i; returns its end or -1 on a syntax error or
  // nesting past LINE_ID_DEPTH (the search stops there: no stack overflow).
  let depth = 0;
  const value = (at: number): number => {
    const c = line[at];
    if (c === '"') return str(at);
    if (c === '{' || c === '[') {
      if (depth >= LINE_ID_DEPTH) return -1;
      depth++;
      try {
        return container(at, c);
      } finally {
        depth--;
      }
    }
    const m = /^(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false|null)/.exec(line.slice(at, at + 400));
    return m === null ? -1 : at + m[0].length;
  };
  const container = (at: number, c: string): number => {
    const close = c === '{' ? '}' : ']';
    let j = at + 1;
    i = j;
    ws();
    if (line[i] === close) return i + 1;
    for (;;) {
      if (c === '{') {
        ws();
        if (line[i] !== '"') return -1;
        const k = str(i);
        if (k < 0) return -1;
        i = k;
        ws();
        if (line[i] !== ':') return -1;
        i++;
      }
      ws();
      j = value(i);
      if (j < 0) return -1;
      i = j;
      ws();
      if (line[i] === ',') { i++; continue; }
      if (line[i] === close) return i + 1;
      return -1;
    }
  };
  ws();
  if (line[i] !== '{') return id;
  i++;
  ws();
  if (line[i] === '}') return id;
  for (;;) {
    ws();
    if (line[i] !== '"') return id;
    const kEnd = str(i);
    if (kEnd < 0) return id;
    let key: unknown;
    try {
      key = JSON.parse(line.slice(i, kEnd));
    } catch {
      return id;
    }
    i = kEnd;
    ws();
    if (line[i] !== ':') return id;
    i++;
    ws();
    const vStart = i;
    const vEnd = value(i);
    if (vEnd < 0) return id;
    if (key === 'id') {
      const c = line[vStart];
      if (c === '"' || c === '-' || (c! >= '0' && c! <= '9')) id = line.slice(vStart, vEnd);
      else id = 'null';
    }
    i = vEnd;
    ws();
    if (line[i] === ',') { i++; continue; }
    return id;
  }
}

/** A response line with data (raw JSON text; '' means null). */
export function encodeDataLine(id: string, data: string): string {
  return `{"id":${id},"data":${data === '' ? 'null' : data}}\n`;
}

/** An error response line. */
export function encodeErrorLine(id: string, message: string, code: string): string {
  return `{"id":${id},"error":${JSON.stringify(message)},"code":${JSON.stringify(code)}}\n`;
}

/**
 * Splits a byte stream into lines of at most max bytes (without the '\n').
 * A partial line is copied into one buffer grown as bytes arrive (see
 * Partial); each chunk is scanned once, from where the last scan stopped.
 * Once a line (complete or not) is over max, onTooLong runs and the reader
 * stops. A final line without a newline is never delivered.
 *
 * gate (optional) is asked before each line that lies whole in the bytes at
 * hand (a line completing a partial one is delivered: the gate was open when
 * its start came): true keeps that line and the rest of the chunk, unparsed,
 * until resume() (the caller stops reading meanwhile). One 64 KiB read holds
 * 2,000 short lines; without it they all started calls in one callback,
 * past maxInFlight and the server's budget (the frame reader's gate, for lines).
 */
export class LineReader {
  private readonly part = new Partial();
  private stopped = false;
  /** Lines delivered so far (a line timer restarts when this moves). */
  lines = 0;
  /** Bytes from the line the gate held on, delivered by resume() (about one chunk). */
  private backlog: Buffer | null = null;

  constructor(
    private readonly max: number,
    private readonly onLine: (line: Buffer) => void,
    private readonly onTooLong: (len: number) => void,
    private readonly gate?: () => boolean,
  ) {}

  /** Whether part of a line is buffered (the peer owes us bytes; lines held at the gate are not that). */
  get partial(): boolean {
    return this.part.len > 0;
  }

  /** Bytes buffered: a partial line, and what waits at the gate. */
  get buffered(): number {
    return this.part.len + (this.backlog?.length ?? 0);
  }

  /** Whether lines wait for resume(). */
  get held(): boolean {
    return this.backlog !== null;
  }

  /** Delivers the lines held back at the gate (it may close again). */
  resume(): void {
    const b = this.backlog;
    if (b === null) return;
    this.backlog = null;
    this.push(b);
  }

  /** Lines finished so far. */
  get done(): number {
    return this.lines;
  }

  push(chunk: Buffer): void {
    if (this.backlog !== null) {
      this.backlog = Buffer.concat([this.backlog, chunk]);
      return;
    }
    let start = 0;
    let nl = chunk.indexOf(10);
    while (nl >= 0 && !this.stopped) {
      if (this.part.len === 0 && this.gate?.() === true) {
        this.backlog = chunk.subarray(start);
        return;
      }
      let line = chunk.subarray(start, nl);
      if (this.part.len > 0) {
        if (this.part.len + line.length > this.max) return this.tooLong(this.part.len + line.length);
        this.part.append(line, 0);
        line = this.part.bytes();
        this.part.clear();
      }
      if (line.length > this.max) return this.tooLong(line.length);
      this.lines++;
      this.onLine(line);
      start = nl + 1;
      nl = chunk.indexOf(10, start);
    }
    if (start < chunk.length && !this.stopped) {
      const n = this.part.len + chunk.length - start;
      if (n > this.max) return this.tooLong(n);
      this.part.append(chunk.subarray(start), this.max);
    }
  }

  /** Drops buffered bytes (on close). */
  reset(): void {
    this.backlog = null;
    this.part.clear();
  }

  private tooLong(n: number): void {
    this.stopped = true;
    this.part.clear();
    this.onTooLong(n);
  }
}
