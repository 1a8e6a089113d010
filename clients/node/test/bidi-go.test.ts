// Client streams across languages (spec 4.3): this client against Go's
// `udskit serve` demo (`sum` bidi, `total` client-streaming), and Go's
// `udskit call` (items from stdin lines) against the Node server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connect, createServer, UdskitError, type Client, type Server } from '../src/index.js';
import net from 'node:net';
import { encodeHello } from '../src/frame.js';
import { startGo, runGo, tmpDir, within, delay, type GoServer } from './helpers.js';
import { handlers } from './bidi-fixtures.js';

const dir = tmpDir();
let go: GoServer;
let c: Client;
let node: Server;
const nodeSock = path.join(dir, 'node.sock');

before(async () => {
  go = await startGo(path.join(dir, 'go.sock'));
  c = await connect(go.addr);
  node = createServer({ handlers });
  await node.listen(nodeSock);
});
after(async () => {
  await c.close();
  await go.kill();
  await node.close();
});

test('Node client -> Go server: sum (bidi) and total (client-streaming)', async () => {
  const call = c.bidiJSON<number, number>('sum');
  const got: number[] = [];
  for (const n of [1, 2, 4.5]) {
    await call.write(n);
    got.push((await call.next()).value as number);
  }
  await call.end();
  assert.equal((await call.next()).done, true);
  assert.deepEqual(got, [1, 3, 7.5]);
  const t = c.clientStreamJSON<number, number>('total');
  for (let i = 1; i <= 100; i++) await t.write(i);
  assert.equal(await t.end(), 5050);
  const bad = c.bidiJSON('sum');
  await bad.write('x');
  await assert.rejects(bad.toArray(), (e: UdskitError) => e.code === 'invalid_argument');
  await assert.rejects(c.call('sum', 1), (e: UdskitError) => e.code === 'unimplemented');
  const m = await c.call<{ methods: { name: string; kind: string }[] }>('udskit.methods');
  assert.equal(m.methods.find((x) => x.name === 'sum')?.kind, 'bidi');
  assert.equal(m.methods.find((x) => x.name === 'total')?.kind, 'client_stream');
});

test('Node client -> Go server: 1,000 concurrent bidi calls on one connection; cancel; deadline; half-close', async () => {
  const results = await within(60_000, Promise.all(Array.from({ length: 1000 }, async (_, i) => {
    const call = c.bidiJSON<number, number>('sum');
    const out: number[] = [];
    for (const n of [i, 1, 2]) {
      await call.write(n);
      out.push((await call.next()).value as number);
    }
    await call.end();
    assert.equal((await call.next()).done, true);
    return out;
  })), '1000 bidi calls');
  results.forEach((r, i) => assert.deepEqual(r, [i, i + 1, i + 3]));
  // Cancel mid-call: the reader fails canceled, the connection serves on.
  const x = c.bidiJSON('sum');
  await x.write(1);
  await x.next();
  x.cancel();
  await assert.rejects(x.next(), (e: UdskitError) => e.code === 'canceled');
  assert.equal(await x.write(2), false);
  // A deadline while the server waits for items.
  const d = c.bidiJSON('sum', { timeoutMs: 200 });
  await d.write(1);
  await assert.rejects(d.toArray(), (e: UdskitError) => e.code === 'deadline_exceeded');
  // Half-close without items.
  const h = c.bidiJSON('sum');
  await h.end();
  assert.deepEqual(await h.toArray(), []);
  assert.deepEqual(await c.call('echo', { ok: 1 }), { ok: 1 });
});

test('Go server: its hello sets client_stream', async () => {
  const s = net.connect(go.addr);
  await new Promise((r) => s.once('connect', r));
  s.write(encodeHello({ version: 1, flags: 3, maxFrame: 1 << 20, maxInFlight: 0 }));
  const hello = await within(5000, new Promise<Buffer>((r) => s.once('data', r)));
  assert.equal(hello[5]! & 2, 2);
  s.destroy();
});

test('Go client (udskit call, items from stdin) -> Node server: sum, total, raw', async () => {
  let r = await runGo(['call', nodeSock, 'sum'], '1\n2\n4.5\n');
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(r.stdout.trim().split('\n'), ['1', '3', '7.5']);
  r = await runGo(['call', nodeSock, 'total'], Array.from({ length: 100 }, (_, i) => `${i + 1}`).join('\n') + '\n');
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout.trim(), '5050');
  r = await runGo(['call', nodeSock, 'sum'], '1\n"x"\n');
  assert.equal(r.code, 1);
  assert.match(r.stderr, /invalid_argument/);
  r = await runGo(['call', nodeSock, '--list']);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^sum\s+bidi\s+json$/m);
  assert.match(r.stdout, /^total\s+client_stream\s+json$/m);
});

test('Node client -> Go server: a client that stops reading one bidi call stalls only that call (both credits hold)', async () => {
  const slow = c.bidiJSON<number, number>('sum');
  let sent = 0;
  const max = 400_000;
  const writer = (async () => {
    for (let i = 0; i < max; i++) {
      if (!(await slow.write(1))) return;
      sent++;
    }
  })();
  // The writes stop once Go's handler is blocked on the unread responses (1 MiB of stream credit)
  // and the request credit it no longer grants is used up (1 MiB more): about 110,000 items of "1".
  let last = -1;
  await within(60_000, (async () => {
    while (sent !== last) {
      last = sent;
      await delay(300);
    }
  })(), 'the writes stall');
  assert.ok(sent > 10_000 && sent < 200_000, `${sent} items went before the call stalled`);
  // Other calls on the same connection flow meanwhile.
  const other = c.bidiJSON<number, number>('sum');
  await other.write(41);
  await other.write(1);
  await other.end();
  assert.deepEqual(await within(5000, other.toArray()), [41, 42]);
  assert.equal(sent, last, 'still stalled');
  // Reading the stalled call's responses lets it go on (the writes resume), then cancel it.
  const reader = (async () => { for await (const _ of slow) { /* read */ } })().catch((e: UdskitError) => e.code);
  await within(20_000, (async () => { while (sent < last + 1000) await delay(20); })(), 'the writes resume');
  slow.cancel();
  assert.equal(await within(10_000, reader), 'canceled');
  await within(10_000, writer);
  assert.ok(sent > last, `the call moved on once read (${last} -> ${sent})`);
});
