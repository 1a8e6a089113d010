// protocol/vectors, addresses.json and codes.json: the cross-language contract.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readJSON } from './helpers.js';
import { decodeFrame, encodeFrame, decodeHello, encodeHello, negotiate, metadataOf, parseMetadata, T } from '../src/frame.js';
import { parseRequestLine, lineId, encodeDataLine, encodeErrorLine } from '../src/ndjson.js';
import { parseAddr, formatAddr, AddrError } from '../src/address.js';
import { codeName, codeNumber, isRetryable, UdskitError, ProtocolError, Code } from '../src/codes.js';

const hex = (s: string): Buffer => Buffer.from(s, 'hex');

function errorName(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    if (e instanceof ProtocolError) return e.errorName;
    if (e instanceof AddrError) return e.errorName;
    throw e;
  }
  return '(no error)';
}

test('frames.json: valid frames decode to the listed fields and re-encode to the same bytes', () => {
  const v = readJSON('protocol/vectors/frames.json');
  assert.ok(v.valid.length >= 17);
  for (const f of v.valid) {
    const d = decodeFrame(hex(f.hex), v.max_frame);
    assert.equal(d.type, f.type, f.name);
    assert.equal(d.typeName, f.type_name, f.name);
    assert.equal(d.flags, f.flags, f.name);
    assert.equal(d.id, f.id, f.name);
    assert.equal(d.aux, f.aux, f.name);
    assert.equal(d.head.toString('hex'), f.head_hex, f.name);
    assert.equal(d.payload.toString('hex'), f.payload_hex, f.name);
    if ('method' in f) assert.equal(d.method, f.method, f.name);
    if ('metadata' in f) assert.deepEqual(d.metadata, f.metadata, f.name);
    if ('code' in f) {
      assert.equal(d.aux, f.code, f.name);
      assert.equal(d.codeName, f.code_name, f.name);
    }
    if ('message' in f) assert.equal(d.message, f.message, f.name);
    const again = encodeFrame(f.type, f.flags, f.id, f.aux, hex(f.head_hex), hex(f.payload_hex));
    assert.equal(again.toString('hex'), f.hex, f.name);
  }
});

test('frames.json: app_metadata is what the application sees (reserved keys such as :pad dropped, last value wins)', () => {
  const v = readJSON('protocol/vectors/frames.json');
  let n = 0;
  let reserved = 0;
  for (const f of v.valid) {
    if (!('metadata' in f)) continue;
    assert.ok('app_metadata' in f, `${f.name}: metadata without app_metadata`);
    const d = decodeFrame(hex(f.hex), v.max_frame);
    // The wire view keeps every entry; the application's view is both of these.
    assert.deepEqual(metadataOf(d.metadata!), f.app_metadata, f.name);
    const start = d.type === T.request ? 2 + d.head.readUInt16LE(0) : 0;
    assert.deepEqual(parseMetadata(d.head, start, d.head.length), f.app_metadata, f.name);
    n++;
    if (f.metadata.some(([k]: [string, string]) => k.startsWith(':'))) reserved++;
  }
  assert.ok(n >= 8, `${n} vectors with app_metadata`);
  assert.ok(reserved >= 4, `${reserved} vectors with reserved keys`);
});

test('frames.json: invalid frames fail with exactly the named error', () => {
  const v = readJSON('protocol/vectors/frames.json');
  assert.ok(v.invalid.length >= 20);
  for (const f of v.invalid) {
    assert.equal(errorName(() => decodeFrame(hex(f.hex), f.max_frame)), f.error, f.name);
  }
});

test('hello.json: valid, invalid and negotiation', () => {
  const v = readJSON('protocol/vectors/hello.json');
  for (const h of v.valid) {
    const d = decodeHello(hex(h.hex));
    assert.deepEqual(d, { version: h.version, flags: h.flags, maxFrame: h.max_frame, maxInFlight: h.max_in_flight }, h.name);
    if (!h.name.includes('reserved')) assert.equal(encodeHello(d).toString('hex'), h.hex, h.name);
  }
  for (const h of v.invalid) assert.equal(errorName(() => decodeHello(hex(h.hex))), h.error, h.name);
  for (const n of v.negotiate) {
    const got = negotiate(decodeHello(hex(n.client)), decodeHello(hex(n.server)));
    assert.deepEqual(got, { version: n.version, maxFrame: n.max_frame, maxInFlight: n.max_in_flight, features: n.features }, n.name);
  }
});

test('ndjson.json: requests, invalid lines, response lines', () => {
  const v = readJSON('protocol/vectors/ndjson.json');
  for (const r of v.requests) {
    const d = parseRequestLine(r.line);
    assert.deepEqual({ id: d.id, func: d.func, data: d.data }, { id: r.id, func: r.func, data: r.data }, r.name);
  }
  for (const r of v.invalid) {
    assert.equal(errorName(() => parseRequestLine(r.line)), r.error, r.name);
    assert.equal(lineId(r.line), r.id, `id of ${r.name}`);
  }
  for (const r of v.responses) {
    const line = 'error' in r ? encodeErrorLine(r.id, r.error, r.code) : encodeDataLine(r.id, r.data);
    assert.equal(line, r.line, r.name);
  }
});

test('addresses.json: valid inputs parse to kind, name and canonical form; invalid ones fail by name', () => {
  const v = readJSON('protocol/addresses.json');
  for (const a of v.valid) {
    const got = parseAddr(a.input);
    assert.deepEqual(got, { kind: a.kind, name: a.name }, a.input);
    assert.equal(formatAddr(got), a.canonical, a.input);
    assert.deepEqual(parseAddr(a.canonical), got, `canonical of ${a.input}`);
  }
  for (const a of v.invalid) {
    const input = a.input ?? a.input_repeat.text.repeat(a.input_repeat.count);
    assert.equal(errorName(() => parseAddr(input)), a.error, JSON.stringify(input.slice(0, 40)));
  }
});

test('addresses.json listen_only: inherited sockets parse (and a client refuses them)', () => {
  const v = readJSON('protocol/addresses.json').listen_only;
  for (const a of v.valid) {
    const got = parseAddr(a.input);
    assert.deepEqual(got, { kind: a.kind, name: a.name }, a.input);
    assert.equal(formatAddr(got), a.canonical);
  }
  for (const a of v.invalid) assert.equal(errorName(() => parseAddr(a.input)), a.error, a.input);
});

test('codes.json: every code has the same name, number and retryability here', () => {
  const v = readJSON('protocol/codes.json');
  for (const c of v.codes) {
    assert.equal(codeName(c.code), c.name);
    assert.equal(codeNumber(c.name), c.code);
    assert.equal(isRetryable(c.code), c.retryable, c.name);
    assert.equal((Code as Record<string, number>)[c.name], c.code);
    if (c.code !== 0) {
      const e = new UdskitError(c.code, 'x');
      assert.equal(e.code, c.name);
      assert.equal(e.retryable, c.retryable);
    }
  }
  // Unknown codes are accepted, treated as unknown, and keep their number.
  const e = new UdskitError(77, 'from the future');
  assert.equal(e.code, 'unknown');
  assert.equal(e.number, 77);
  assert.equal(e.retryable, false);
  assert.equal(v.refused.flag_bit, 0);
  assert.equal(new UdskitError('unavailable', 'x', { refused: true }).refused, true);
  // Every protocol error name the vectors use is one codes.json lists.
  const names = new Set(v.protocol_errors.map((p: { name: string }) => p.name));
  for (const f of readJSON('protocol/vectors/frames.json').invalid) assert.ok(names.has(f.error), f.error);
  for (const f of readJSON('protocol/vectors/hello.json').invalid) assert.ok(names.has(f.error), f.error);
});
