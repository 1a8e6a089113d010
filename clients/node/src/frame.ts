// Wire format (protocol/spec.md sections 2, 3): hellos, frame headers, heads.
// All integers little-endian. Every decoder checks lengths before allocating.
import { ProtocolError, codeName } from './codes.js';

export const HEADER_SIZE = 16;
export const HELLO_SIZE = 16;
export const VERSION = 1;
export const MAX_HEAD = 16384;
export const DEFAULT_MAX_FRAME = 16 << 20;
export const MIN_MAX_FRAME = 1024;
export const DEFAULT_MAX_IN_FLIGHT = 4096;
/** Hello feature flag bit 0: stream credit (mandatory in v1). */
export const FEATURE_STREAM_CREDIT = 1;
/** Hello feature flag bit 1: client-streaming and bidirectional calls (spec 4.3). */
export const FEATURE_CLIENT_STREAM = 2;
/** Initial credit of each server stream (spec 4.1). */
export const INITIAL_CREDIT = 1 << 20;
/** An empty head or payload. */
export const EMPTY = Buffer.alloc(0);

/** A max frame option as used on the wire: default 16 MiB, at least 1 KiB, at most 2^32-1. */
export function clampMaxFrame(n: number | undefined): number {
  return Math.max(MIN_MAX_FRAME, Math.min(n ?? DEFAULT_MAX_FRAME, 0xffffffff));
}

/** Bytes as a Buffer without copying (a Buffer as is, another Uint8Array as a view). */
export function toBuffer(u8: Uint8Array): Buffer {
  return Buffer.isBuffer(u8) ? u8 : Buffer.from(u8.buffer, u8.byteOffset, u8.length);
}

export const T = {
  request: 1, response: 2, error: 3, cancel: 4, stream_data: 5, stream_end: 6,
  ping: 7, pong: 8, goaway: 9, stream_credit: 10,
  request_data: 11, request_end: 12, request_credit: 13,
} as const;

export const TYPE_NAMES: Record<number, string> = Object.fromEntries(Object.entries(T).map(([k, v]) => [v, k]));

/** Request flag bit 0: the caller expects a server stream. */
export const FLAG_STREAM = 1;
/** Request flag bit 1: the call carries request items from the client (spec 4.3). */
export const FLAG_CLIENT_STREAM = 2;
/** Error flag bit 0: the server did not process the request. */
export const FLAG_REFUSED = 1;

const MAGIC = 0x4b534455; // "UDSK" read as u32 LE

export interface Hello {
  version: number;
  flags: number;
  maxFrame: number;
  maxInFlight: number;
}

export function encodeHello(h: Hello): Buffer {
  const b = Buffer.allocUnsafe(HELLO_SIZE);
  b.writeUInt32LE(MAGIC, 0);
  b[4] = h.version;
  b[5] = h.flags;
  b.writeUInt16LE(0, 6);
  b.writeUInt32LE(h.maxFrame >>> 0, 8);
  b.writeUInt32LE(h.maxInFlight >>> 0, 12);
  return b;
}

/** Decodes a hello. Fails with bad_magic as soon as a magic byte mismatches, truncated when short. */
export function decodeHello(b: Uint8Array): Hello {
  const magic = [0x55, 0x44, 0x53, 0x4b];
  for (let i = 0; i < 4 && i < b.length; i++) {
    if (b[i] !== magic[i]) throw new ProtocolError('bad_magic', 'the hello does not start with UDSK');
  }
  if (b.length < HELLO_SIZE) throw new ProtocolError('truncated', `hello of ${b.length} bytes, want ${HELLO_SIZE}`);
  const dv = Buffer.from(b.buffer, b.byteOffset, HELLO_SIZE);
  const h = { version: dv[4]!, flags: dv[5]!, maxFrame: dv.readUInt32LE(8), maxInFlight: dv.readUInt32LE(12) };
  if (h.version === 0) throw new ProtocolError('bad_version', 'hello version 0');
  if (h.maxFrame < MIN_MAX_FRAME) throw new ProtocolError('bad_limits', `hello max frame ${h.maxFrame} under ${MIN_MAX_FRAME}`);
  return h;
}

export interface Negotiated {
  version: number;
  maxFrame: number;
  maxInFlight: number;
  features: number;
}

/** What both sides use after exchanging hellos (spec 2). */
export function negotiate(client: Hello, server: Hello): Negotiated {
  const version = Math.min(client.version, server.version);
  if (version !== VERSION) throw new ProtocolError('bad_version', `no common version (client ${client.version}, server ${server.version})`);
  return {
    version,
    maxFrame: Math.min(client.maxFrame, server.maxFrame),
    maxInFlight: server.maxInFlight,
    features: client.flags & server.flags & (FEATURE_STREAM_CREDIT | FEATURE_CLIENT_STREAM),
  };
}

/** A decoded frame header. */
export interface Header {
  type: number;
  flags: number;
  headLen: number;
  id: number;
  payloadLen: number;
  aux: number;
}

/**
 * Reads and checks a 16-byte header at off (the caller made sure 16 bytes are
 * there). Throws ProtocolError for limits and id/code rules: all of them are
 * checked before a byte of head or payload is read or allocated.
 */
export function readHeader(b: Buffer, off: number, maxFrame: number): Header {
  const type = b[off]!;
  const headLen = b[off + 2]! | (b[off + 3]! << 8);
  const id = b.readUInt32LE(off + 4);
  const payloadLen = b.readUInt32LE(off + 8);
  const aux = b.readUInt32LE(off + 12);
  if (payloadLen > maxFrame) throw new ProtocolError('frame_too_large', `payload of ${payloadLen} bytes over the limit of ${maxFrame}`);
  if (headLen > MAX_HEAD) throw new ProtocolError('head_too_large', `head of ${headLen} bytes over the limit of ${MAX_HEAD}`);
  checkId(type, id);
  if (type === T.error && aux === 0) throw new ProtocolError('bad_code', 'error frame with code 0');
  return { type, flags: b[off + 1]!, headLen, id, payloadLen, aux };
}

function checkId(type: number, id: number): void {
  switch (type) {
    case T.request: case T.response: case T.cancel: case T.stream_data: case T.stream_end: case T.stream_credit:
    case T.request_data: case T.request_end: case T.request_credit:
      if (id === 0) throw new ProtocolError('bad_id', `${TYPE_NAMES[type]} frame with id 0`);
      break;
    case T.ping: case T.pong: case T.goaway:
      if (id !== 0) throw new ProtocolError('bad_id', `${TYPE_NAMES[type]} frame with id ${id}, want 0`);
      break;
  }
}

/** Writes a header into b at off. */
export function writeHeader(b: Buffer, off: number, type: number, flags: number, headLen: number, id: number, payloadLen: number, aux: number): void {
  b[off] = type;
  b[off + 1] = flags;
  b[off + 2] = headLen & 0xff;
  b[off + 3] = headLen >>> 8;
  b.writeUInt32LE(id >>> 0, off + 4);
  b.writeUInt32LE(payloadLen >>> 0, off + 8);
  b.writeUInt32LE(aux >>> 0, off + 12);
}

/** Metadata: string keys and values (keys SHOULD be lowercase ASCII). */
export type Metadata = Record<string, string>;

/** The byte length of metadata entries in a head. */
export function metadataLen(md: Metadata | undefined): number {
  if (md === undefined) return 0;
  let n = 0;
  for (const k in md) n += 4 + Buffer.byteLength(k) + Buffer.byteLength(md[k]!);
  return n;
}

/** Writes metadata entries at off; returns the new offset. */
export function writeMetadata(b: Buffer, off: number, md: Metadata | undefined): number {
  if (md === undefined) return off;
  for (const k in md) {
    off = writeStr(b, off, k);
    off = writeStr(b, off, md[k]!);
  }
  return off;
}

function writeStr(b: Buffer, off: number, s: string): number {
  const n = b.write(s, off + 2, 'utf8');
  b[off] = n & 0xff;
  b[off + 1] = n >>> 8;
  return off + 2 + n;
}

/** Parses metadata entries in b[start:end] (a list of [key, value] in wire order). */
export function parseMetadataList(b: Buffer, start: number, end: number): [string, string][] {
  const out: [string, string][] = [];
  let off = start;
  while (off < end) {
    if (off + 2 > end) throw new ProtocolError('bad_head', 'metadata key length cut short');
    const kl = b[off]! | (b[off + 1]! << 8);
    off += 2;
    if (kl === 0) throw new ProtocolError('bad_head', 'metadata with an empty key');
    if (off + kl > end) throw new ProtocolError('bad_head', 'metadata key overruns the head');
    const k = b.toString('utf8', off, off + kl);
    off += kl;
    if (off + 2 > end) throw new ProtocolError('bad_head', 'metadata value length cut short');
    const vl = b[off]! | (b[off + 1]! << 8);
    off += 2;
    if (off + vl > end) throw new ProtocolError('bad_head', 'metadata value overruns the head');
    out.push([k, b.toString('utf8', off, off + vl)]);
    off += vl;
  }
  return out;
}

/** Whether a metadata key is reserved for the protocol: it starts with ':' (spec 3.1, e.g. ':pad'). */
export function isReservedKey(k: string): boolean {
  return k.charCodeAt(0) === 0x3a; // ':'
}

/** The first key of md that is reserved for the protocol, if any (applications must not send one). */
export function reservedKeyOf(md: Metadata | undefined): string | undefined {
  if (md === undefined) return undefined;
  for (const k in md) if (isReservedKey(k)) return k;
  return undefined;
}

/** Why an application may not send key (for reservedKeyOf's answer). */
export function reservedKeyMessage(k: string): string {
  return `metadata key ${JSON.stringify(k)} is reserved: keys starting with ':' are reserved for the protocol`;
}

/**
 * Metadata entries as the application sees them (spec 3.1): reserved keys
 * (starting with ':', such as ':pad') are dropped; a key appearing twice: the
 * last one wins. parseMetadataList is the wire view with every entry.
 */
export function metadataOf(list: [string, string][]): Metadata {
  const md: Metadata = {};
  for (const [k, v] of list) if (!isReservedKey(k)) md[k] = v;
  return md;
}

/** Metadata as the application sees it (see metadataOf). */
export function parseMetadata(b: Buffer, start: number, end: number): Metadata {
  return start === end ? {} : metadataOf(parseMetadataList(b, start, end));
}

/** Parses a request head: method, then metadata. */
export function parseRequestHead(b: Buffer, start: number, end: number): { method: string; metadata: [string, string][] } {
  const mEnd = requestMethodEnd(b, start, end);
  return { method: b.toString('utf8', start + 2, mEnd), metadata: parseMetadataList(b, mEnd, end) };
}

/**
 * Checks a request head's method length: the method is b[start+2:returned],
 * the metadata entries follow it up to end (parseRequestHead, without its objects).
 */
export function requestMethodEnd(b: Buffer, start: number, end: number): number {
  if (start + 2 > end) throw new ProtocolError('bad_head', 'request head without a method length');
  const ml = b[start]! | (b[start + 1]! << 8);
  if (ml === 0) throw new ProtocolError('bad_head', 'request with an empty method');
  if (start + 2 + ml > end) throw new ProtocolError('bad_head', 'method length overruns the head');
  return start + 2 + ml;
}

/** A whole decoded frame (used by tests and tools; connections use FrameReader). */
export interface Frame extends Header {
  typeName: string;
  head: Buffer;
  payload: Buffer;
  method?: string;
  metadata?: [string, string][];
  codeName?: string;
  message?: string;
}

/** Decodes exactly one frame from b, checking every rule a receiver checks. */
export function decodeFrame(b: Buffer, maxFrame: number): Frame {
  if (b.length < HEADER_SIZE) throw new ProtocolError('truncated', `${b.length} bytes, want a ${HEADER_SIZE}-byte header`);
  const h = readHeader(b, 0, maxFrame);
  const end = HEADER_SIZE + h.headLen + h.payloadLen;
  if (b.length < end) throw new ProtocolError('truncated', `frame of ${end} bytes cut at ${b.length}`);
  const head = Buffer.from(b.subarray(HEADER_SIZE, HEADER_SIZE + h.headLen));
  const payload = Buffer.from(b.subarray(HEADER_SIZE + h.headLen, end));
  const f: Frame = { ...h, typeName: TYPE_NAMES[h.type] ?? `type_${h.type}`, head, payload };
  switch (h.type) {
    case T.request: {
      const r = parseRequestHead(head, 0, head.length);
      f.method = r.method;
      f.metadata = r.metadata;
      break;
    }
    case T.response: case T.stream_end:
      f.metadata = parseMetadataList(head, 0, head.length);
      break;
    case T.error:
      f.codeName = codeName(h.aux);
      f.message = head.toString('utf8');
      break;
    case T.goaway:
      f.message = head.toString('utf8');
      break;
  }
  return f;
}

/** The byte length of a payload: bytes, or a string sent as UTF-8. */
export function payloadLen(payload: Uint8Array | string): number {
  return typeof payload === 'string' ? Buffer.byteLength(payload) : payload.length;
}

/**
 * Encodes one whole frame (header + head + payload) into a new buffer, each
 * part copied once; a string payload is written as UTF-8 straight into it.
 * plen is payloadLen(payload), for callers that checked it already.
 */
export function encodeFrame(type: number, flags: number, id: number, aux: number, head: Uint8Array, payload: Uint8Array | string, plen = payloadLen(payload)): Buffer {
  const b = Buffer.allocUnsafe(HEADER_SIZE + head.length + plen);
  writeHeader(b, 0, type, flags, head.length, id, plen, aux);
  b.set(head, HEADER_SIZE);
  if (typeof payload === 'string') b.write(payload, HEADER_SIZE + head.length, 'utf8');
  else b.set(payload, HEADER_SIZE + head.length);
  return b;
}

/** Encodes a request head (method + metadata). */
export function encodeRequestHead(method: string, md?: Metadata): Buffer {
  const b = Buffer.allocUnsafe(2 + Buffer.byteLength(method) + metadataLen(md));
  const off = writeMetadata(b, writeStr(b, 0, method), md);
  return b.subarray(0, off);
}

/** Encodes metadata as a response/stream_end head. */
export function encodeMetadata(md: Metadata | undefined): Buffer {
  const b = Buffer.allocUnsafe(metadataLen(md));
  writeMetadata(b, 0, md);
  return b;
}
