// A nesting-depth check run before JSON.parse on a request (framed JSON
// methods and NDJSON lines), with Go's limit (encoding/json refuses more than
// 10,000 levels): a 100k-deep payload is refused after one byte scan instead
// of being parsed into 100k arrays that the answer then cannot encode.

/** The deepest nesting a JSON request may have (Go's encoding/json limit). */
export const MAX_JSON_DEPTH = 10_000;

/**
 * Whether b[start:end] nests arrays/objects deeper than max (brackets inside
 * strings do not count). Only a text longer than max can be, so shorter ones
 * cost nothing; the scan is one pass without allocation.
 */
export function jsonTooDeep(b: Uint8Array, start: number, end: number, max = MAX_JSON_DEPTH): boolean {
  if (end - start <= max) return false;
  let depth = 0;
  let inStr = false;
  for (let i = start; i < end; i++) {
    const c = b[i]!;
    if (inStr) {
      if (c === 0x5c) i++; // backslash: skip the escaped byte
      else if (c === 0x22) inStr = false;
    } else if (c === 0x22) {
      inStr = true;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return false;
}
