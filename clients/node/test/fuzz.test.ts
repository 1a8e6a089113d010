// Randomized decoding: mutated vectors and random bytes, fed whole and in
// random chunks, must either decode or fail with a ProtocolError, never
// throw anything else, hang, or buffer more than a frame.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readJSON } from './helpers.js';
import { decodeFrame, decodeHello, encodeFrame, encodeRequestHead, T } from '../src/frame.js';
import { FrameReader } from '../src/reader.js';
import { parseRequestLine, lineId, LineReader } from '../src/ndjson.js';
import { parseAddr, AddrError } from '../src/address.js';
import { ProtocolError } from '../src/codes.js';
import { jsonTooDeep } from '../src/jsondepth.js';

// A small deterministic PRNG so failures reproduce.
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function mutate(b: Buffer, r: () => number): Buffer {
  const out = Buffer.from(b);
  const n = 1 + Math.floor(r() * 4);
  for (let i = 0; i < n && out.length > 0; i++) out[Math.floor(r() * out.length)] = Math.floor(r() * 256);
  return r() < 0.2 ? out.subarray(0, Math.floor(r() * out.length)) : out;
}

const only = (fn: () => unknown, ...ok: (new (...a: never[]) => Error)[]): void => {
  try {
    fn();
  } catch (e) {
    if (!ok.some((k) => e instanceof k)) throw e;
  }
};

test('fuzz: frames, hellos, reader chunking, NDJSON lines, addresses', () => {
  const r = rng(12);
  const frames = readJSON('protocol/vectors/frames.json');
  const seeds: Buffer[] = [...frames.valid, ...frames.invalid].map((f: { hex: string }) => Buffer.from(f.hex, 'hex'));
  const t0 = performance.now();
  for (let i = 0; i < 5000; i++) {
    const b = r() < 0.8 ? mutate(seeds[Math.floor(r() * seeds.length)]!, r) : Buffer.from(Array.from({ length: Math.floor(r() * 64) }, () => Math.floor(r() * 256)));
    only(() => decodeFrame(b, 1 << 16), ProtocolError);
    only(() => decodeHello(b.subarray(0, 16)), ProtocolError);
    // Streams of frames in random chunks: the reader never buffers more than one frame + a chunk.
    const reader = new FrameReader(1 << 16, () => {});
    const stream = Buffer.concat([b, seeds[Math.floor(r() * seeds.length)]!, b]);
    only(() => {
      for (let off = 0; off < stream.length;) {
        const n = 1 + Math.floor(r() * 20);
        reader.push(stream.subarray(off, off + n));
        off += n;
        assert.ok(reader.buffered <= 16 + 16384 + (1 << 16) + 20);
      }
    }, ProtocolError);
    const line = b.toString('latin1');
    only(() => parseRequestLine(line), ProtocolError);
    assert.equal(typeof lineId(line), 'string');
    only(() => parseAddr(line), AddrError);
  }
  assert.ok(performance.now() - t0 < 20_000);
});

test('fuzz: the readers deliver the same frames and lines whatever the chunking (growing partial buffers)', () => {
  const r = rng(7);
  const frames = readJSON('protocol/vectors/frames.json');
  const valid: Buffer[] = frames.valid.map((f: { hex: string }) => Buffer.from(f.hex, 'hex'));
  for (let i = 0; i < 300; i++) {
    // A stream of valid frames, some with big payloads, cut at random points.
    const parts: Buffer[] = [];
    for (let k = 0; k < 1 + Math.floor(r() * 6); k++) {
      if (r() < 0.3) parts.push(encodeFrame(T.request, 0, k + 1, 0, encodeRequestHead('m'), Buffer.alloc(Math.floor(r() * 70_000), k)));
      else parts.push(valid[Math.floor(r() * valid.length)]!);
    }
    const stream = Buffer.concat(parts);
    const whole: string[] = [];
    const cut: string[] = [];
    const sig = (into: string[]) => (h: { type: number; id: number }, b: Buffer, hs: number, ps: number, end: number): void => {
      into.push(`${h.type}/${h.id}/${b.subarray(hs, end).toString('hex').slice(0, 64)}/${end - hs}`);
    };
    try {
      new FrameReader(1 << 20, sig(whole)).push(stream);
    } catch (e) {
      assert.ok(e instanceof ProtocolError);
      continue;
    }
    const reader = new FrameReader(1 << 20, sig(cut));
    for (let off = 0; off < stream.length;) {
      const n = 1 + Math.floor(r() * (r() < 0.5 ? 8 : 9000));
      reader.push(stream.subarray(off, off + n));
      off += n;
      // Memory: at most twice what arrived of the partial frame, or its size.
      assert.ok(reader.buffered < stream.length + 1);
    }
    assert.deepEqual(cut, whole);
    assert.equal(reader.buffered, 0);
    // Lines: random text with newlines, cut at random points; lines over max stop the reader.
    const text = Buffer.from(Array.from({ length: Math.floor(r() * 5000) }, () => (r() < 0.02 ? 10 : 32 + Math.floor(r() * 90))));
    const want = text.toString('latin1').split('\n').slice(0, -1);
    const got: string[] = [];
    let tooLong = false;
    const lr = new LineReader(600, (l) => got.push(l.toString('latin1')), () => { tooLong = true; });
    for (let off = 0; off < text.length;) {
      const n = 1 + Math.floor(r() * 300);
      lr.push(text.subarray(off, off + n));
      off += n;
    }
    const firstLong = want.findIndex((l) => l.length > 600);
    if (firstLong >= 0) {
      assert.ok(tooLong);
      assert.deepEqual(got, want.slice(0, firstLong));
    } else {
      assert.deepEqual(got, want);
    }
  }
});

test('fuzz: the JSON depth pre-check agrees with the nesting of random JSON values, strings with brackets and escapes included', () => {
  const r = rng(25);
  const strs = ['"["', '"]{"', '"\\\\"', '"\\"["', '"a"', '1', 'null'];
  for (let k = 0; k < 2000; k++) {
    // A value nested d deep, built from random arrays/objects around random leaves.
    const d = Math.floor(r() * 40);
    let v = strs[Math.floor(r() * strs.length)]!;
    for (let i = 0; i < d; i++) {
      const leaf = strs[Math.floor(r() * strs.length)]!;
      v = r() < 0.5 ? `[${leaf},${v}]` : `{${JSON.stringify(leaf)}:${v}}`;
    }
    JSON.parse(v); // it is valid JSON
    const b = Buffer.from(v);
    const max = Math.floor(r() * 40);
    // (the pre-check skips texts no longer than max: they cannot be deeper)
    assert.equal(jsonTooDeep(b, 0, b.length, max), d > max, `depth ${d}, max ${max}: ${v}`);
  }
});
