// Newline-delimited JSON (protocol/spec.md section 7): the seed-002 wire format.
import { ProtocolError } from './codes.js';

/** A decoded NDJSON request: id and data as raw JSON text (data '' when absent or null). */
export interface NdjsonRequest {
  id: string;
  func: string;
  data: string;
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
  const data = o.data === undefined || o.data === null ? '' : JSON.stringify(o.data);
  return { id: JSON.stringify(o.id), func: o.func, data, value: data === '' ? undefined : o.data };
}

/** The id of a line that is not a valid request, as raw JSON ('null' when it has none). */
export function lineId(line: string): string {
  try {
    const o = JSON.parse(line) as Record<string, unknown>;
    if (o !== null && typeof o === 'object' && (typeof o.id === 'number' || typeof o.id === 'string')) return JSON.stringify(o.id);
  } catch {
    // not JSON: no id
  }
  return 'null';
}

/** A response line with data (raw JSON text; '' means null). */
export function encodeDataLine(id: string, data: string): string {
  return `{"id":${id},"data":${data === '' ? 'null' : data}}\n`;
}

/** An error response line. */
export function encodeErrorLine(id: string, message: string, code: string): string {
  return `{"id":${id},"error":${JSON.stringify(message)},"code":${JSON.stringify(code)}}\n`;
}
