// Node client -> Go `udskit serve` (a real process): every demo method,
// errors, streams, deadlines, cancel, 1 MiB payloads, 1,000 concurrent calls,
// NDJSON mode, and the server killed and restarted mid-load.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connect, UdskitError, type Client } from '../src/index.js';
import { startGo, tmpDir, within, delay, type GoServer } from './helpers.js';

const dir = tmpDir();
const sock = path.join(dir, 'demo.sock');
let go: GoServer;
let c: Client;

before(async () => {
  go = await startGo(sock);
  c = await connect(sock);
});
after(async () => {
  await c.close();
  await go.kill();
});

async function rejects(p: Promise<unknown>, code: string, msg?: RegExp): Promise<UdskitError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof UdskitError, `want UdskitError, got ${e}`);
    assert.equal(e.code, code, e.message);
    if (msg) assert.match(e.message, msg);
    return e;
  }
  assert.fail(`want error ${code}, got success`);
}

test('echo: JSON values round-trip, raw bytes round-trip', async () => {
  assert.deepEqual(await c.call('echo', { hello: 'world', n: [1, 2, 3] }), { hello: 'world', n: [1, 2, 3] });
  assert.equal(await c.call('echo', 'a string'), 'a string');
  assert.equal(await c.call('echo'), undefined);
  const bytes = Buffer.from([0, 1, 2, 255, 10, 13]);
  const got = await c.call<Buffer>('echo', bytes);
  assert.ok(Buffer.isBuffer(got));
  assert.deepEqual(got, bytes);
  const u8 = await c.call<Buffer>('echo', new Uint8Array([9, 8, 7]));
  assert.deepEqual([...u8], [9, 8, 7]);
});

test('metadata is sent (and a request with metadata works)', async () => {
  assert.deepEqual(await c.call('echo', { m: 1 }, { metadata: { trace: 'abc', tenant: '' } }), { m: 1 });
});

test('sleep, whoami', async () => {
  assert.deepEqual(await c.call('sleep', { ms: 20 }), { slept_ms: 20 });
  const me = await c.call<{ pid: number; uid: number; gid: number }>('whoami');
  assert.equal(me.pid, process.pid);
  assert.equal(me.uid, process.getuid!());
  assert.equal(me.gid, process.getgid!());
});

test('errors: fail with code names and numbers, unknown method, bad request, stream/unary mismatch', async () => {
  const e = await rejects(c.call('fail', { code: 'not_found', message: 'no such user' }), 'not_found', /no such user/);
  assert.equal(e.number, 5);
  assert.equal(e.retryable, false);
  assert.equal(e.refused, false);
  await rejects(c.call('fail'), 'failed_precondition');
  await rejects(c.call('fail', { code: 'unavailable' }), 'unavailable').then((err) => assert.equal(err.retryable, true));
  await rejects(c.call('nope', {}), 'unimplemented', /nope/);
  await rejects(c.call('sleep', { ms: -1 }), 'invalid_argument');
  await rejects(c.call('sleep', 'not an object'), 'invalid_argument');
  await rejects(c.stream('echo', {}).toArray(), 'unimplemented');
  await rejects(c.call('stream', { n: 1 }), 'unimplemented');
});

test('streams: items in order, empty stream, errors, break cancels', async () => {
  const items = await c.stream<{ i: number; n: number }>('stream', { n: 50 }).toArray();
  assert.deepEqual(items.map((x) => x.i), [...Array(50).keys()]);
  assert.deepEqual(await c.stream('stream', { n: 0 }).toArray(), []);
  await rejects(c.stream('stream', { n: -1 }).toArray(), 'invalid_argument');
  let seen = 0;
  for await (const _ of c.stream('stream', { n: 1000, interval_ms: 10 })) {
    if (++seen === 3) break;
  }
  assert.equal(seen, 3);
  // The connection is fine afterwards.
  assert.deepEqual(await c.call('echo', 1), 1);
});

test('stream credit: a stream of 2 MiB arrives whole while another call is served', async () => {
  // stream items are ~20 bytes; 60000 items cost 2.2 MB of credit (payload+16 each):
  // the client must grant credit as it reads, or the stream stalls after 1 MiB.
  let n = 0;
  const s = c.stream('stream', { n: 60000 }, { timeout: 30_000 });
  for await (const _ of s) {
    n++;
    if (n === 40000) assert.deepEqual(await c.call('echo', 'meanwhile'), 'meanwhile');
  }
  assert.equal(n, 60000);
});

test('stream credit: a reader that stops does not stall other calls', async () => {
  const slow = c.stream('stream', { n: 100000 });
  await slow.next(); // started, then not read: the server runs out of credit
  await delay(100);
  const t0 = performance.now();
  for (let i = 0; i < 20; i++) assert.equal(await c.call('echo', i), i);
  assert.ok(performance.now() - t0 < 2000);
  await slow.return();
});

test('deadlines: the caller gives up on time and the server stops the handler', async () => {
  const t0 = performance.now();
  await rejects(c.call('sleep', { ms: 5000 }, { timeout: 100 }), 'deadline_exceeded');
  const took = performance.now() - t0;
  assert.ok(took >= 95 && took < 1000, `took ${took}ms`);
  // A stream's deadline too.
  await rejects(c.stream('stream', { n: 100, interval_ms: 50 }, { timeout: 120 }).toArray(), 'deadline_exceeded');
});

test('cancel with an AbortSignal', async () => {
  const ac = new AbortController();
  const p = c.call('sleep', { ms: 5000 }, { signal: ac.signal });
  setTimeout(() => ac.abort(), 50);
  const t0 = performance.now();
  await rejects(p, 'canceled');
  assert.ok(performance.now() - t0 < 1000);
  await rejects(c.call('echo', 1, { signal: AbortSignal.abort() }), 'canceled');
});

test('1 MiB payloads, raw and JSON', async () => {
  const big = Buffer.alloc(1 << 20);
  for (let i = 0; i < big.length; i++) big[i] = (i * 7) & 0xff;
  const got = await c.call<Buffer>('echo', big);
  assert.equal(got.length, big.length);
  assert.ok(got.equals(big));
  const s = 'x'.repeat((1 << 20) - 2);
  assert.equal(await c.call('echo', s), s);
  const many = await Promise.all(Array.from({ length: 8 }, () => c.call<Buffer>('echo', big)));
  for (const m of many) assert.ok(m.equals(big));
});

test('1,000 concurrent calls', async () => {
  const got = await within(20_000, Promise.all(Array.from({ length: 1000 }, (_, i) => c.call('echo', { i }))), '1000 calls');
  got.forEach((g, i) => assert.deepEqual(g, { i }));
  const slept = await within(20_000, Promise.all(Array.from({ length: 1000 }, (_, i) => c.call('sleep', { ms: i % 20 }))), '1000 sleeps');
  assert.equal(slept.length, 1000);
});

test('NDJSON mode speaks to the same server', async () => {
  const nd = await connect(sock, { protocol: 'ndjson' });
  try {
    assert.deepEqual(await nd.call('echo', { service: 'barista' }), { service: 'barista' });
    assert.deepEqual(await nd.call('sleep', { ms: 5 }), { slept_ms: 5 });
    await rejects(nd.call('fail', { code: 'not_found', message: 'x' }), 'not_found');
    await rejects(nd.call('nope'), 'unimplemented');
    await rejects(nd.stream('stream', { n: 1 }).toArray(), 'unimplemented');
    const all = await Promise.all(Array.from({ length: 200 }, (_, i) => nd.call('echo', i)));
    assert.deepEqual(all, [...Array(200).keys()]);
    await rejects(nd.call('sleep', { ms: 2000 }, { timeout: 50 }), 'deadline_exceeded');
  } finally {
    await nd.close();
  }
});
