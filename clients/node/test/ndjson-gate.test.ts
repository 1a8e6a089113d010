// NDJSON lines obey the limits frames do, inside one read too (protocol/spec.md
// section 7; Go's reader waits for an in-flight slot before each line): a line
// past maxInFlight, the server's total or the turn's calls waits, unparsed, and
// is served once calls end. One 64 KiB read holds 2,000 short lines.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { createServer } from '../src/index.js';
import { tmpDir, within, delay } from './helpers.js';

const dir = tmpDir();
let n = 0;
const sockPath = (): string => path.join(dir, `g${n++}.sock`);

/** A raw NDJSON client: its answers as parsed lines, as they come. */
async function ndConn(p: string): Promise<{ s: net.Socket; got: Array<{ id: number; data?: unknown; error?: string; code?: string }> }> {
  const s = net.connect(p);
  s.on('error', () => {});
  await new Promise((r) => s.once('connect', r));
  const got: Array<{ id: number; data?: unknown; error?: string; code?: string }> = [];
  let rest = '';
  s.setEncoding('utf8');
  s.on('data', (d: string) => {
    const parts = (rest + d).split('\n');
    rest = parts.pop()!;
    for (const l of parts) got.push(JSON.parse(l));
  });
  return { s, got };
}

const lines = (count: number, func: string): Buffer =>
  Buffer.from(Array.from({ length: count }, (_, i) => `{"id":${i + 1},"func":"${func}","data":${i + 1}}\n`).join(''));

/** Every id 1..count answered once, with its own number as data, and no error. */
function assertAllAnswered(got: Array<{ id: number; data?: unknown; error?: string }>, count: number): void {
  const errors = got.filter((g) => g.error !== undefined);
  assert.equal(errors.length, 0, `${errors.length} error answers, the first: ${JSON.stringify(errors[0])}`);
  assert.equal(got.length, count);
  assert.ok(got.every((g) => g.data === g.id), 'each answer carries its own request\'s data');
  assert.deepEqual(got.map((g) => g.id).sort((a, b) => a - b), Array.from({ length: count }, (_, i) => i + 1));
}

test('NDJSON: 1,800 lines in one read to a blocking handler run at most maxInFlight at once; the rest wait unparsed and are all answered after release', async () => {
  const p = sockPath();
  const cap = 16;
  let running = 0;
  let peak = 0;
  let started = 0;
  let released = false;
  const waiting: Array<() => void> = [];
  const srv = createServer({
    maxInFlight: cap,
    handlers: {
      b: async (x: number) => {
        started++;
        peak = Math.max(peak, ++running);
        if (!released) await new Promise<void>((r) => waiting.push(r));
        running--;
        return x;
      },
    },
  });
  await srv.listen(p);
  const c = await ndConn(p);
  const count = 1800;
  const burst = lines(count, 'b');
  assert.ok(burst.length < 64 << 10, `${burst.length} bytes: one read`);
  c.s.write(burst);
  await within(10_000, (async () => { while (started < cap) await delay(5); })(), `the first ${cap} calls started (${started})`);
  await delay(300); // (before: the whole read's lines were taken at once, those past the cap refused)
  assert.equal(started, cap, `${started} handlers started with maxInFlight ${cap}`);
  assert.equal(c.got.length, 0, `${c.got.length} lines answered while every call blocked: ${JSON.stringify(c.got[0])}`);
  // What waits is the unread lines (at most a read or two of them), not calls or their promises.
  assert.ok(srv.heldBytes <= cap * (3 << 10) + 2 * burst.length, `server holds ${srv.heldBytes} bytes`);
  released = true;
  for (const r of waiting.splice(0)) r();
  await within(20_000, (async () => { while (c.got.length < count) await delay(10); })(), `${count} answers (${c.got.length} so far)`);
  assert.ok(peak <= cap, `${peak} calls ran at once with maxInFlight ${cap}`);
  assertAllAnswered(c.got, count);
  c.s.destroy();
  await srv.close();
});

test('NDJSON: a burst of lines waits for the server\'s total and starts at most 256 calls per event-loop turn, in order', async () => {
  const p = sockPath();
  let turn = 0;
  let counting = true;
  const count = (): void => { turn++; if (counting) setImmediate(count); };
  setImmediate(count);
  const perTurn = new Map<number, number>(); // event-loop turn -> calls started in it
  const order: number[] = [];
  let running = 0;
  let peak = 0;
  let released = false;
  const waiting: Array<() => void> = [];
  const srv = createServer({
    maxServerBytes: 3 << 20, // about 1,000 calls' worth at 3 KiB each
    handlers: {
      block: async (x: number) => {
        perTurn.set(turn, (perTurn.get(turn) ?? 0) + 1);
        order.push(x);
        peak = Math.max(peak, ++running);
        if (!released) await new Promise<void>((r) => waiting.push(r));
        running--;
        return x;
      },
    },
  });
  await srv.listen(p);
  const c = await ndConn(p);
  const total = 3000;
  c.s.write(lines(total, 'block'));
  await within(10_000, (async () => { while (order.length < 900) await delay(5); })(), `calls started (${order.length})`);
  await delay(300);
  // Before: every line of a read started a call (2,600 in the first read's callback).
  assert.ok(order.length <= 1024 + 1, `${order.length} calls started with room for about 1,000 in the server's total`);
  const most = Math.max(...perTurn.values());
  assert.ok(most <= 256, `${most} calls started in one event-loop turn (${perTurn.size} turns)`);
  released = true;
  for (const r of waiting.splice(0)) r();
  await within(20_000, (async () => { while (c.got.length < total) await delay(10); })(), `${total} answers (${c.got.length} so far)`);
  counting = false;
  // Once released, a call ends a microtask after it starts: the connection has nothing in flight at
  // each gate, and gets its one call past the turn's 256 once per turn (before: once per call, and
  // the held lines chained through microtasks, 1,987 in one turn).
  const mostAll = Math.max(...perTurn.values());
  assert.ok(mostAll <= 256 + 1, `${mostAll} calls started in one event-loop turn, the burst and after release (${perTurn.size} turns)`);
  assert.ok(peak <= 1024 + 1, `${peak} calls ran at once`);
  assert.deepEqual(order, Array.from({ length: total }, (_, i) => i + 1), 'calls started in the order of their lines');
  assertAllAnswered(c.got, total);
  c.s.destroy();
  await within(10_000, (async () => { while (srv.conns.size > 0 || srv.heldBytes !== 0) await delay(10); })(), `budget given back (held ${srv.heldBytes})`);
  await srv.close();
});

test('NDJSON: lines held at maxInFlight when the client half-closes are all answered, then the server closes (spec 7: end of stream)', async () => {
  const p = sockPath();
  const srv = createServer({
    maxInFlight: 8,
    handlers: { b: async (x: number) => { await delay(1); return x; } },
  });
  await srv.listen(p);
  const c = await ndConn(p);
  const closed = new Promise<void>((r) => c.s.on('close', () => r()));
  const count = 1800;
  c.s.end(lines(count, 'b')); // everything, then EOF
  await within(20_000, closed, `the server closes after answering (${c.got.length} answers so far)`);
  assertAllAnswered(c.got, count);
  await srv.close();
});
