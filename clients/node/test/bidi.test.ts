// Client-streaming and bidirectional calls (spec 4.3), Node client x Node
// server: running sums, half-close, client streams, 1,000 concurrent calls on
// one connection, cancel from either side, deadlines, a stalled reader in
// either direction (only its call stalls; memory bounded by the credit), the
// hello flag, kind mismatches, NDJSON, udskit.methods and the wire rules on
// raw sockets.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { connect, createServer, UdskitError, bidi, clientStream, type Server, type Client, type ClientCall, type StreamClientInterceptor, type HandlerContext } from '../src/index.js';
import { encodeFrame, encodeRequestHead, encodeHello, decodeFrame, T, EMPTY, HELLO_SIZE, INITIAL_CREDIT } from '../src/frame.js';
import { NO_CLIENT_STREAMS } from '../src/bidi.js';
import { tmpDir, delay, within, rawConn } from './helpers.js';
import { handlers, seen } from './bidi-fixtures.js';

const dir = tmpDir();
const sock = path.join(dir, 'bidi.sock');
let srv: Server;
let c: Client;
const errors: Error[] = [];

before(async () => {
  srv = createServer({ handlers, onError: (e) => errors.push(e) });
  await srv.listen(sock);
  c = await connect(sock);
});
after(async () => {
  await c.close();
  await srv.close();
});

const code = (name: string) => (e: unknown): boolean => e instanceof UdskitError && e.code === name;

test('bidi sum: an answer per item, half-close ends the stream', async () => {
  const call = c.bidiJSON<number, number>('sum');
  const got: number[] = [];
  for (const n of [1, 2, 4.5]) {
    assert.equal(await call.write(n), true);
    const r = await call.next();
    got.push(r.value as number);
  }
  assert.deepEqual(got, [1, 3, 7.5]);
  assert.equal(await call.end(), true);
  assert.deepEqual(await call.next(), { value: undefined, done: true });
});

test('bidi: write all, end, then read; half-close with no items; raw bidi', async () => {
  const call = c.bidiJSON<number, number>('sum');
  const writes = Promise.all([1, 2, 3, 4].map((n) => call.write(n)));
  void call.end();
  assert.deepEqual(await call.toArray(), [1, 3, 6, 10]);
  assert.deepEqual(await writes, [true, true, true, true]);
  assert.deepEqual(await c.bidiJSON('sum').end().then(() => []), []);
  const empty = c.bidiJSON('sum');
  await empty.end();
  assert.deepEqual(await empty.toArray(), []);
  const rev = c.bidi('reverse');
  await rev.write(Buffer.from('abc'));
  await rev.write(new Uint8Array([1, 2, 3]));
  await rev.write(Buffer.alloc(0));
  await rev.end();
  assert.deepEqual((await rev.toArray()).map((b) => b.toString('hex')), ['636261', '030201', '']);
});

test('client streams: end() resolves to the one response (JSON and raw); a server may answer early', async () => {
  const t = c.clientStreamJSON<number, number>('total');
  for (let i = 1; i <= 100; i++) await t.write(i);
  assert.equal(await t.end(), 5050);
  const j = c.clientStream('join');
  await j.write(Buffer.from('ab'));
  await j.write(Buffer.from('cd'));
  assert.equal((await j.end()).toString(), 'abcd');
  assert.equal(await c.clientStreamJSON('total').end(), 0);
  // The server answers after one item: later writes resolve false (dropped), end() gives the answer.
  const f = c.clientStreamJSON('firstOnly');
  await f.write('one');
  assert.equal(await f.result, 'one');
  assert.equal(await f.write('two'), false);
  assert.equal(await f.end(), 'one');
  await assert.rejects(f.write('three'), code('failed_precondition'));
});

test('a handler that ends the call first: the stream ends, later writes resolve false', async () => {
  const call = c.bidiJSON('first');
  await call.write({ a: 1 });
  assert.deepEqual(await call.toArray(), [{ a: 1 }]);
  assert.equal(await call.write({ a: 2 }), false);
  assert.equal(await call.end(), false);
});

test('1,000 concurrent bidi calls on one connection', async () => {
  const before = srv.accepted;
  const t0 = performance.now();
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
  assert.equal(srv.accepted, before, 'no new connection');
  assert.ok(performance.now() - t0 < 60_000);
});

test('cancel from the client (cancel(), AbortSignal, break): both directions end, the handler sees canceled', async () => {
  const call = c.bidiJSON('hang', { metadata: { tag: 'cancel' } });
  await call.write(1);
  await delay(20);
  call.cancel();
  await assert.rejects(call.next(), code('canceled'));
  assert.equal(await call.write(2), false);
  await within(5000, (async () => { while (!seen.aborted.has('cancel')) await delay(5); })());
  assert.equal((seen.aborted.get('cancel') as UdskitError).code, 'canceled');

  const ac = new AbortController();
  const s2 = c.bidiJSON('hang', { signal: ac.signal, metadata: { tag: 'signal' } });
  await s2.write(1);
  setTimeout(() => ac.abort(), 20);
  await assert.rejects(s2.toArray(), code('canceled'));
  await within(5000, (async () => { while (!seen.aborted.has('signal')) await delay(5); })());

  const s3 = c.bidiJSON<number, number>('sum', { metadata: { tag: 'break' } });
  await s3.write(5);
  for await (const v of s3) { assert.equal(v, 5); break; }
  assert.equal(await s3.write(1), false, 'breaking out of the loop canceled the call');

  const cs = c.clientStreamJSON('total');
  await cs.write(1);
  cs.cancel();
  await assert.rejects(cs.end(), code('canceled'));
});

test('cancel from the server: the handler fails the call; the client reads the error, writes resolve false', async () => {
  const call = c.bidiJSON('failAfter', { metadata: { n: '2' } });
  await call.write('a');
  await call.write('b');
  const got: unknown[] = [];
  await assert.rejects((async () => { for await (const v of call) got.push(v); })(), (e: UdskitError) => e.code === 'aborted' && /gave up/.test(e.message));
  assert.deepEqual(got, ['a', 'b']);
  assert.equal(await call.write('c'), false);
  // A non-number item: the demo sum fails with invalid_argument.
  const s = c.bidiJSON('sum');
  await s.write('x');
  await assert.rejects(s.toArray(), code('invalid_argument'));
});

test('deadline ends both directions: the client fails deadline_exceeded, the handler sees it', async () => {
  const t0 = performance.now();
  const call = c.bidiJSON('hang', { timeoutMs: 300, metadata: { tag: 'deadline' } });
  await call.write(1);
  await assert.rejects(call.toArray(), code('deadline_exceeded'));
  assert.ok(performance.now() - t0 >= 290);
  await within(5000, (async () => { while (!seen.aborted.has('deadline')) await delay(5); })());
  assert.equal((seen.aborted.get('deadline') as UdskitError).code, 'deadline_exceeded');
  assert.equal(await call.write(2), false);
  const cs = c.clientStreamJSON('total', { timeout: 200 });
  await assert.rejects(cs.result, code('deadline_exceeded'));
});

test('a handler that stops reading stalls only its call; the client holds to its credit', async () => {
  seen.stalledRead = 0;
  const call = c.bidi('stall');
  const item = Buffer.alloc(64 << 10, 1);
  let resolved = 0;
  const total = 40; // 2.5 MiB: more than the 1 MiB credit
  const writes: Promise<boolean>[] = [];
  for (let i = 0; i < total; i++) writes.push(call.write(item).then((ok) => { resolved++; return ok; }));
  await within(5000, (async () => { while (seen.stalledRead < 1) await delay(5); })());
  await delay(200);
  // Credit 1 MiB, an item costs 64 KiB + 16: 16 items use 1 MiB + 256 bytes, so 16 go out, the 17th waits.
  const perCredit = Math.ceil(INITIAL_CREDIT / (item.length + 16));
  assert.equal(resolved, perCredit, `${resolved} writes went out, want the credit's ${perCredit}`);
  // Meanwhile other calls on the same connection flow.
  for (let k = 0; k < 20; k++) {
    const s = c.bidiJSON<number, number>('sum');
    await s.write(k);
    assert.equal((await s.next()).value, k);
    await s.end();
  }
  assert.deepEqual(await c.call('json', { ok: true }), { ok: true });
  assert.equal(resolved, perCredit, 'still stalled');
  seen.release();
  await call.end();
  const [n] = await within(10_000, call.toArray());
  assert.equal(Number(n!.toString()), total, 'every item arrived once the handler read again');
  assert.equal(resolved, total);
  assert.deepEqual(await Promise.all(writes), Array(total).fill(true));
});

test('a client that stops reading one bidi call stalls only that call (stream credit)', async () => {
  const size = 32 << 10;
  const slow = c.bidi('flood', { metadata: { n: '200', size: String(size) } }); // 6.4 MiB
  await delay(300);
  for (let k = 0; k < 10; k++) {
    const s = c.bidiJSON<number, number>('sum');
    await s.write(1);
    assert.equal((await s.next()).value, 1);
    await s.end();
  }
  let n = 0;
  await slow.end();
  for await (const b of slow) {
    assert.equal(b.length, size);
    assert.equal(b[0], n & 0xff);
    n++;
  }
  assert.equal(n, 200);
});

test('a server without the client_stream hello flag: the call fails locally with unimplemented, nothing sent', async () => {
  const p = path.join(dir, 'old.sock');
  const got: Buffer[] = [];
  const old = net.createServer((s) => {
    s.on('data', (d) => {
      got.push(d);
      if (Buffer.concat(got).length >= HELLO_SIZE && got.length === 1) {
        s.write(encodeHello({ version: 1, flags: 1, maxFrame: 1 << 20, maxInFlight: 100 }));
      }
    });
  });
  await new Promise<void>((r) => old.listen(p, r));
  const oc = await connect(p);
  try {
    const b = oc.bidiJSON('sum');
    assert.equal(await b.write(1), false);
    await assert.rejects(b.toArray(), (e: UdskitError) => e.code === 'unimplemented' && e.message === NO_CLIENT_STREAMS);
    await assert.rejects(oc.clientStreamJSON('total').end(), (e: UdskitError) => e.code === 'unimplemented' && e.message === NO_CLIENT_STREAMS);
    await delay(50);
    const all = Buffer.concat(got);
    assert.equal(all.length, HELLO_SIZE, 'only the hello was sent');
    assert.equal(all[5], 3, 'the client hello sets stream_credit and client_stream');
  } finally {
    await oc.close();
    old.close();
  }
});

test('kind mismatch is unimplemented, naming the kind', async () => {
  await assert.rejects(c.call('sum', 1), (e: UdskitError) => e.code === 'unimplemented' && /is a bidirectional stream/.test(e.message));
  await assert.rejects(c.stream('sum', 1).toArray(), (e: UdskitError) => e.code === 'unimplemented' && /is a bidirectional stream/.test(e.message));
  await assert.rejects(c.clientStreamJSON('sum').end(), (e: UdskitError) => e.code === 'unimplemented' && /is a bidirectional stream/.test(e.message));
  await assert.rejects(c.bidiJSON('total').toArray(), (e: UdskitError) => e.code === 'unimplemented' && /is a client stream/.test(e.message));
  await assert.rejects(c.bidiJSON('json').toArray(), (e: UdskitError) => e.code === 'unimplemented' && /is unary/.test(e.message));
  await assert.rejects(c.clientStreamJSON('stream').end(), (e: UdskitError) => e.code === 'unimplemented' && /is server-streaming/.test(e.message));
  await assert.rejects(c.bidiJSON('nope').toArray(), code('unimplemented'));
  assert.equal(await c.call('json', 7), 7, 'the connection is fine');
});

test('NDJSON: a bidi or client-stream method gets the clear error; the connection stays open', async () => {
  const s = net.connect(sock);
  await new Promise((r) => s.once('connect', r));
  let buf = '';
  s.on('data', (d) => { buf += d; });
  s.write('{"id":1,"func":"sum","data":1}\n{"id":2,"func":"total","data":null}\n{"id":3,"func":"json","data":5}\n');
  await within(5000, (async () => { while (buf.split('\n').length < 4) await delay(5); })());
  const lines = buf.trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(lines[0], { id: 1, error: 'method "sum" is a bidirectional stream; NDJSON has no streams: use a udskit client', code: 'unimplemented' });
  assert.deepEqual(lines[1], { id: 2, error: 'method "total" is a client stream; NDJSON has no streams: use a udskit client', code: 'unimplemented' });
  assert.deepEqual(lines[2], { id: 3, data: 5 });
  s.destroy();
  const nd = await connect(sock, { protocol: 'ndjson' });
  await assert.rejects(nd.bidiJSON('sum').toArray(), code('unimplemented'));
  await nd.close();
});

test('udskit.methods lists bidi and client_stream kinds', async () => {
  const r = await c.call<{ methods: { name: string; kind: string; format: string }[] }>('udskit.methods');
  const by = Object.fromEntries(r.methods.map((m) => [m.name, `${m.kind}/${m.format}`]));
  assert.equal(by.sum, 'bidi/json');
  assert.equal(by.reverse, 'bidi/raw');
  assert.equal(by.total, 'client_stream/json');
  assert.equal(by.join, 'client_stream/raw');
  assert.equal(by.echo, 'unary/raw');
  assert.equal(by.stream, 'stream/json');
});

const req = (id: number, flags: number, method: string, payload: Buffer = EMPTY): Buffer => encodeFrame(T.request, flags, id, 0, encodeRequestHead(method), payload);
const data = (id: number, s: string): Buffer => encodeFrame(T.request_data, 0, id, 0, EMPTY, Buffer.from(s));
const end = (id: number): Buffer => encodeFrame(T.request_end, 0, id, 0, EMPTY, EMPTY);

test('wire: the server hello sets client_stream; EOF (SHUT_WR) counts as request_end', async () => {
  const s = net.connect(sock);
  await new Promise((r) => s.once('connect', r));
  let buf = Buffer.alloc(0);
  s.on('data', (d) => { buf = Buffer.concat([buf, d]); });
  s.write(encodeHello({ version: 1, flags: 3, maxFrame: 1 << 20, maxInFlight: 0 }));
  s.write(Buffer.concat([req(9, 3, 'sum'), data(9, '2'), data(9, '3')]));
  s.end();
  await within(5000, new Promise((r) => s.once('end', r)));
  assert.equal(buf[5], 3, 'server hello flags: stream_credit | client_stream');
  const frames = [];
  for (let off = HELLO_SIZE; off < buf.length;) {
    const f = decodeFrame(buf.subarray(off), 1 << 20);
    if (f.typeName !== 'ping') frames.push(`${f.typeName}:${f.payload.toString()}`); // pings: the server's hang-up probe
    off += 16 + f.headLen + f.payloadLen;
  }
  assert.deepEqual(frames, ['stream_data:2', 'stream_data:5', 'stream_end:']);
  s.destroy();
});

async function violation(frames: Buffer[], pattern: RegExp): Promise<void> {
  const { s, frames: next } = await rawConn(sock);
  for (const f of frames) s.write(f);
  for (;;) {
    const f = await within(5000, next(), 'connection error');
    if (f.id !== 0) continue; // call frames that came first
    assert.equal(f.typeName, 'error');
    assert.equal(f.codeName, 'protocol_violation');
    assert.match(f.message!, pattern);
    break;
  }
  await within(5000, new Promise((r) => (s.readableEnded ? r(null) : s.once('end', r))));
  s.destroy();
}

test('wire violations are connection errors (protocol_violation)', async () => {
  await violation([req(1, 3, 'sum'), end(1), data(1, '1')], /after its request_end/);
  await violation([req(1, 3, 'sum'), end(1), end(1)], /second request_end/);
  await violation([req(1, 3, 'sum', Buffer.from('1'))], /payload/);
  await violation([req(1, 0, 'slow'), data(1, '1')], /not opened with the client_stream flag/);
  await violation([encodeFrame(T.request_credit, 0, 1, 100, EMPTY, EMPTY)], /server-to-client/);
  // Beyond the credit: 1 MiB, then one more item of any size may go; more is a violation.
  const big = Buffer.alloc(256 << 10, 0x31);
  const over = [req(1, 3, 'stall')];
  for (let i = 0; i < 10; i++) over.push(encodeFrame(T.request_data, 0, 1, 0, EMPTY, big));
  await violation(over, /beyond the credit/);
  seen.release();
});

test('wire: items for an unknown id and after a kind mismatch are ignored', async () => {
  const { s, frames } = await rawConn(sock);
  s.write(Buffer.concat([data(77, '1'), end(77), req(3, 2, 'json'), data(3, '1'), end(3), req(4, 3, 'sum'), data(4, '4'), end(4)]));
  const f1 = await frames();
  assert.equal(f1.id, 3);
  assert.equal(f1.codeName, 'unimplemented');
  const got = [await frames(), await frames()].map((f) => `${f.id}:${f.typeName}:${f.payload.toString()}`);
  assert.deepEqual(got, ['4:stream_data:4', '4:stream_end:']);
  s.destroy();
});

test('request credit: the server grants what its handler has read (half the initial credit at a time)', async () => {
  const { s, frames } = await rawConn(sock);
  const item = Buffer.alloc((64 << 10) - 16, 0x20); // costs exactly 64 KiB
  s.write(req(5, 2, 'join'));
  for (let i = 0; i < 16; i++) s.write(encodeFrame(T.request_data, 0, 5, 0, EMPTY, item)); // the whole 1 MiB
  const f = await within(5000, frames());
  assert.equal(f.typeName, 'request_credit');
  assert.equal(f.id, 5);
  assert.equal(f.aux, INITIAL_CREDIT / 2);
  const g = await within(5000, frames());
  assert.equal(g.typeName, 'request_credit');
  assert.equal(g.aux, INITIAL_CREDIT / 2);
  s.write(end(5));
  const r = await within(5000, frames());
  assert.equal(r.typeName, 'response');
  assert.equal(r.payload.length, 16 * item.length);
  s.destroy();
  assert.equal(errors.filter((e) => /internal/.test(e.message)).length, 0);
});

test('request items count toward the server total: a client flooding stalled calls is paused, others are served', async () => {
  const p = path.join(dir, 'budget.sock');
  const max = 4 << 20;
  const s = createServer({ handlers, maxServerBytes: max });
  await s.listen(p);
  const flood = await connect(p);
  const other = await connect(p);
  try {
    const item = Buffer.alloc(64 << 10, 7);
    const calls = Array.from({ length: 8 }, () => flood.bidi('hold'));
    let sent = 0;
    for (const call of calls) for (let i = 0; i < 16; i++) void call.write(item).then((ok) => { if (ok) sent++; });
    let peak = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < 800) {
      peak = Math.max(peak, s.heldBytes);
      await delay(10);
    }
    // 8 MiB written within the calls' credit; the server holds at most its total plus a read chunk or two.
    assert.ok(peak > max / 2, `the server held ${peak} bytes: the items arrived`);
    assert.ok(peak <= max + (1 << 20), `the server held ${peak} bytes, over ${max} + 1 MiB`);
    assert.ok(sent < 8 * 16, `${sent} items sent: the flood waits`);
    // A new connection's small call is read and answered meanwhile.
    assert.deepEqual(await within(5000, other.call('json', { still: 'served' })), { still: 'served' });
    // Paused, the connection reads nothing (cancels neither, as Go's): closing it gives the bytes back.
    await flood.close();
    await within(5000, (async () => { while (s.heldBytes > 0) await delay(10); })(), 'items released').catch((e) => { throw new Error(`${e.message}: held ${s.heldBytes}, conns ${s.conns.size}`); });
  } finally {
    await flood.close();
    await other.close();
    await s.close();
  }
});

test('server interceptors: bidi calls go through the stream interceptors, client streams through the unary ones', async () => {
  const p = path.join(dir, 'ic.sock');
  const log: string[] = [];
  const s = createServer({
    handlers,
    streamInterceptors: [(req, ctx, next) => { log.push(`stream ${ctx.method}`); return next(req, ctx); }],
    unaryInterceptors: [(req, ctx, next) => {
      log.push(`unary ${ctx.method}`);
      if (ctx.metadata.deny === '1') throw new UdskitError('permission_denied', 'denied by an interceptor');
      return next(req, ctx);
    }],
  });
  await s.listen(p);
  const ic = await connect(p);
  try {
    const b = ic.bidiJSON<number, number>('sum');
    await b.write(2);
    await b.end();
    assert.deepEqual(await b.toArray(), [2]);
    const t = ic.clientStreamJSON<number, number>('total');
    await t.write(3);
    assert.equal(await t.end(), 3);
    const d = ic.clientStreamJSON('total', { metadata: { deny: '1' } });
    await assert.rejects(d.end(), code('permission_denied'));
    assert.deepEqual(log, ['stream sum', 'unary total', 'unary total']);
  } finally {
    await ic.close();
    await s.close();
  }
});

test('client stream interceptors see bidi() and clientStream() opens: kind, method, metadata, deadline; they add metadata and refuse', async () => {
  const p = path.join(dir, 'cic.sock');
  const md = (ctx: HandlerContext): string => `${ctx.metadata['x-tag'] ?? '-'} ${ctx.deadline === undefined ? 'nodeadline' : 'deadline'}`;
  const s = createServer({
    handlers: {
      ...handlers,
      mdBidi: bidi(async function* (requests, ctx: HandlerContext) {
        for await (const x of requests) yield `${String(x)} ${md(ctx)}`;
      }),
      mdTotal: clientStream(async (requests, ctx: HandlerContext) => {
        let n = 0;
        for await (const x of requests) n += x as number;
        return `${n} ${md(ctx)}`;
      }),
    },
  });
  await s.listen(p);
  const seenCalls: ClientCall[] = [];
  const tag: StreamClientInterceptor = (call, next) => {
    seenCalls.push(call);
    if (call.opts.metadata?.deny === '1') throw new UdskitError('permission_denied', `${call.method}: denied by a client interceptor`);
    return next({ ...call, opts: { ...call.opts, metadata: { ...call.opts.metadata, 'x-tag': `${call.kind}` } } });
  };
  const got: unknown[] = [];
  const tap: StreamClientInterceptor = async function* (call, next) {
    if (call.opts.metadata?.deny === '2') throw new UdskitError('unauthenticated', 'denied in a generator');
    for await (const it of next(call)) {
      got.push(it);
      yield it;
    }
  };
  const ic = await connect(p, { streamInterceptors: [tag, tap] });
  try {
    const b = ic.bidiJSON<number, string>('mdBidi', { timeoutMs: 20_000 });
    // Written before anything is read: the generator interceptor must not hold the open back.
    assert.equal(await within(10_000, b.write(1)), true);
    await b.write(2);
    await b.end();
    assert.deepEqual(await b.toArray(), ['1 bidi deadline', '2 bidi deadline']);
    assert.deepEqual(got, ['1 bidi deadline', '2 bidi deadline']);
    assert.equal(seenCalls[0]!.kind, 'bidi');
    assert.equal(seenCalls[0]!.method, 'mdBidi');
    assert.equal(seenCalls[0]!.opts.timeout, 20_000, 'the deadline interceptors see');
    assert.equal(seenCalls[0]!.address, `unix:${p}`);

    const t = ic.clientStreamJSON<number, string>('mdTotal', { metadata: { a: '1' } });
    await t.write(3);
    await t.write(4);
    assert.equal(await t.end(), '7 clientStream nodeadline');
    assert.equal(seenCalls[1]!.kind, 'clientStream');
    assert.equal(seenCalls[1]!.opts.metadata!.a, '1');
    assert.equal(seenCalls[1]!.payload, undefined);
    assert.deepEqual(got.at(-1), '7 clientStream nodeadline', 'the response passes the stream chain');

    // A trace option reaches them as traceparent metadata.
    const tb = ic.bidi('hang', { metadata: { tag: 'cic-trace' }, trace: { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', flags: 1 } });
    assert.match(seenCalls[2]!.opts.metadata!.traceparent!, /^00-0af7651916cd43dd8448eb211c80319c-[0-9a-f]{16}-01$/);
    assert.equal(seenCalls[2]!.opts.trace, undefined);
    tb.cancel();
    await assert.rejects(tb.toArray());

    // Refusals: with a code, the call never sent; writes report the call is over.
    const rb = ic.bidiJSON('mdBidi', { metadata: { deny: '1' } });
    assert.equal(await rb.write(1), false);
    await assert.rejects(rb.toArray(), code('permission_denied'));
    const rg = ic.bidiJSON('mdBidi', { metadata: { deny: '2' } });
    await assert.rejects(rg.toArray(), code('unauthenticated'));
    assert.equal(await within(10_000, rg.write(1)), false);
    const rt = ic.clientStreamJSON('mdTotal', { metadata: { deny: '1' } });
    assert.equal(await rt.write(1), false);
    await assert.rejects(rt.end(), code('permission_denied'));
    const rt2 = ic.clientStreamJSON('mdTotal', { metadata: { deny: '2' } });
    await assert.rejects(rt2.end(), code('unauthenticated'));

    // Breaking out of an intercepted bidi call cancels it on the server.
    const h = ic.bidiJSON('hang', { metadata: { tag: 'cic-break' } });
    await h.write(1);
    const it = h[Symbol.asyncIterator]();
    await it.return!();
    await within(10_000, (async () => { while (!seen.aborted.has('cic-break')) await delay(10); })());

    // Without interceptors the opens take the direct path: the responses are the call's own stream.
    const plain = await connect(p);
    const responsesOf = (x: unknown): string => ((x as { responses: object }).responses).constructor.name;
    const pb = plain.bidiJSON<number, string>('mdBidi');
    assert.equal(responsesOf(pb), 'ClientStream');
    await pb.write(5);
    await pb.end();
    assert.deepEqual(await pb.toArray(), ['5 - nodeadline']);
    assert.equal(responsesOf(ic.bidiJSON('mdBidi', { metadata: { deny: '1' } })), 'InterceptedStream');
    await plain.close();
  } finally {
    await ic.close();
    await s.close();
  }
});
