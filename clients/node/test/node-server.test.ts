// The Node server: Go client (`udskit call`) -> Node server, Node client ->
// Node server (streams with credit, metadata, deadlines, goaway drain with a
// refused request), NDJSON, and socket hygiene.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import { spawn } from 'node:child_process';
import path from 'node:path';
import {
  connect, createServer, AddrError, raw, stream, rawStream, UdskitError, NotSocketError, InUseError, type Server, type HandlerContext,
} from '../src/index.js';
import { encodeFrame, encodeRequestHead, encodeHello, decodeFrame, T, HEADER_SIZE } from '../src/frame.js';
import { runGo, startGo, tmpDir, delay, within, rawConn } from './helpers.js';

const dir = tmpDir();
const sock = path.join(dir, 'node.sock');
let srv: Server;
let lastCtx: { metadata: Record<string, string>; deadline: number | undefined; protocol: string } | undefined;

const handlers = {
  echo: raw((b) => b),
  json: (v: unknown) => v,
  sleep: async (req: { ms: number }, ctx: HandlerContext) => {
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(resolve, req.ms);
      ctx.signal.addEventListener('abort', () => { clearTimeout(t); reject(ctx.signal.reason); });
    });
    return { slept_ms: req.ms };
  },
  fail: (req: { code?: string; message?: string }) => {
    throw new UdskitError((req?.code ?? 'failed_precondition') as 'not_found', req?.message ?? 'fails');
  },
  boom: () => { throw new Error('plain error'); },
  ctx: (_: unknown, ctx: HandlerContext) => {
    lastCtx = { metadata: ctx.metadata, deadline: ctx.deadline, protocol: ctx.protocol };
    ctx.responseMetadata.served = 'node';
    return { metadata: ctx.metadata, hasDeadline: ctx.deadline !== undefined };
  },
  stream: stream(async function* (req: { n: number; interval_ms?: number }, ctx: HandlerContext) {
    for (let i = 0; i < req.n; i++) {
      if (req.interval_ms) await new Promise((r) => setTimeout(r, req.interval_ms));
      if (ctx.signal.aborted) return;
      yield { i, n: req.n };
    }
  }),
  // Answers that carry a key reserved for the protocol (spec 3.1): the server answers internal instead.
  reservedResponse: (_: unknown, ctx: HandlerContext) => {
    ctx.responseMetadata.ok = 'yes';
    ctx.responseMetadata[':x'] = '1';
    return 'should not arrive';
  },
  reservedTrailer: stream(function* (_: unknown, ctx: HandlerContext) {
    yield 1;
    ctx.responseMetadata[':trailer'] = 'x';
  }),
  bytes: rawStream(function* (req: Buffer) {
    const n = req.readUInt32LE(0);
    for (let i = 0; i < n; i++) yield Buffer.alloc(1000, i & 0xff);
  }),
};

before(async () => {
  srv = createServer({ handlers });
  assert.equal(await srv.listen(sock), 'unix:' + sock);
});
after(async () => {
  await srv.close();
});

test('Go client -> Node server: echo, JSON, errors, streams, raw, load', async () => {
  let r = await runGo(['call', sock, 'json', '{"hello":"world"}']);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout.trim(), '{"hello":"world"}');
  r = await runGo(['call', '--raw', sock, 'echo'], Buffer.alloc(70000, 7));
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout.length, 70000);
  r = await runGo(['call', sock, 'fail', '{"code":"not_found","message":"no such user"}']);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /not_found \(5\): no such user/);
  r = await runGo(['call', sock, 'boom']);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /unknown \(2\): plain error/);
  r = await runGo(['call', sock, 'nope']);
  assert.match(r.stderr, /unimplemented/);
  r = await runGo(['call', sock, 'stream', '{"n":3}']);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(r.stdout.trim().split('\n').map((l) => JSON.parse(l)), [{ i: 0, n: 3 }, { i: 1, n: 3 }, { i: 2, n: 3 }]);
  r = await runGo(['call', '--timeout', '200ms', sock, 'sleep', '{"ms":5000}']);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /deadline_exceeded/);
  r = await runGo(['call', '-n', '5000', '-c', '16', sock, 'json', '{"x":1}']);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /ok 5000\s+errors 0/);
});

test('Go client streams 2.2 MB of credit through the Node server (credit granted by Go, honoured here)', async () => {
  const r = await runGo(['call', sock, 'stream', '{"n":60000}'], undefined, 60_000);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout.trim().split('\n').length, 60000);
});

test('Node client -> Node server: metadata, deadline, ctx, errors', async () => {
  const c = await connect(sock);
  try {
    const got = await c.call('ctx', null, { metadata: { trace: 'abc', tenant: '' }, timeout: 5000 });
    assert.deepEqual(got, { metadata: { trace: 'abc', tenant: '' }, hasDeadline: true });
    assert.ok(lastCtx!.deadline! > Date.now() + 4000 && lastCtx!.deadline! <= Date.now() + 5001);
    await assert.rejects(c.call('sleep', { ms: 5000 }, { timeout: 100 }), (e: UdskitError) => e.code === 'deadline_exceeded');
    await assert.rejects(c.call('fail', { code: 'permission_denied' }), (e: UdskitError) => e.code === 'permission_denied');
    await assert.rejects(c.call('json', Buffer.from('not json'), { codec: 'raw' }), (e: UdskitError) => e.code === 'invalid_argument');
    // A head over 16 KiB fails only its call (the server would close the connection); an empty method is refused.
    await assert.rejects(c.call('json', 1, { metadata: { big: 'x'.repeat(20000) } }), (e: UdskitError) => e.code === 'invalid_argument' && /over the limit/.test(e.message));
    await assert.rejects(c.call('', 1, { metadata: { a: 'b' } }), (e: unknown) => e instanceof UdskitError && e.code === 'invalid_argument');
    // codec 'json' with bytes: sent as they are, the response parsed.
    assert.deepEqual(await c.call('json', Buffer.from('{"a":1}'), { codec: 'json' }), { a: 1 });
    await assert.rejects(c.call('stream', { n: 1 }), (e: UdskitError) => e.code === 'unimplemented');
    const big = Buffer.alloc(1 << 20, 3);
    assert.ok((await c.call<Buffer>('echo', big)).equals(big));
    const all = await Promise.all(Array.from({ length: 1000 }, (_, i) => c.call('json', i)));
    assert.deepEqual(all, [...Array(1000).keys()]);
  } finally {
    await c.close();
  }
});

// Reserved metadata keys (spec 3.1): ':' keys belong to the protocol.

test('reserved metadata: a client call with a ":" key fails invalid_argument and nothing is sent', async () => {
  // A bare socket server that answers the hello and records every frame it reads.
  const p = path.join(dir, 'reserved-fake.sock');
  const seen: { type: string; method?: string; metadata?: [string, string][] }[] = [];
  let got = Buffer.alloc(0);
  const fake = net.createServer((s) => {
    s.on('data', (d) => {
      const before = got.length;
      got = Buffer.concat([got, d]);
      if (before < 16 && got.length >= 16) {
        s.write(encodeHello({ version: 1, flags: 1, maxFrame: 1 << 20, maxInFlight: 16 }));
      }
      let off = 16;
      while (got.length >= off + HEADER_SIZE) {
        const len = HEADER_SIZE + got.readUInt16LE(off + 2) + got.readUInt32LE(off + 8);
        if (got.length < off + len) break;
        const f = decodeFrame(got.subarray(off, off + len), 1 << 20);
        seen.push({ type: f.typeName, method: f.method, metadata: f.metadata });
        if (f.type === T.request) s.write(encodeFrame(T.response, 0, f.id, 0, Buffer.alloc(0), Buffer.from('"ok"')));
        off += len;
      }
      got = Buffer.concat([got.subarray(0, 16), got.subarray(off)]);
    });
  });
  await new Promise<void>((r) => fake.listen(p, r));
  const c = await connect(p);
  try {
    const reserved = (e: UdskitError): boolean => e instanceof UdskitError && e.code === 'invalid_argument' &&
      e.message.includes('":x"') && e.message.includes("keys starting with ':' are reserved for the protocol");
    await assert.rejects(c.call('json', 1, { metadata: { trace: 'a', ':x': '1' } }), reserved);
    await assert.rejects(c.stream('stream', { n: 1 }, { metadata: { ':x': '1' } }).toArray(), reserved);
    await assert.rejects(c.call('json', 1, { metadata: { ':pad': '' } }), (e: UdskitError) => e.code === 'invalid_argument' && e.message.includes('":pad"'));
    // The connection is fine, and the only request the server ever read is this one.
    assert.equal(await c.call('after', 1, { metadata: { trace: 'a' } }), 'ok');
    await delay(50);
    assert.deepEqual(seen, [{ type: 'request', method: 'after', metadata: [['trace', 'a']] }]);
  } finally {
    await c.close();
    await new Promise((r) => fake.close(r));
  }
  // NDJSON carries no metadata, but the call is refused the same way.
  const nd = await connect(sock, { protocol: 'ndjson' });
  try {
    await assert.rejects(nd.call('json', 1, { metadata: { ':x': '1' } }), (e: UdskitError) => e.code === 'invalid_argument' && e.message.includes('":x"'));
  } finally {
    await nd.close();
  }
});

test('reserved metadata: a handler answering with a ":" key in its response or stream-end metadata gets internal', async () => {
  const c = await connect(sock);
  try {
    await assert.rejects(c.call('reservedResponse', null), (e: UdskitError) => e.code === 'internal' &&
      e.message.includes('":x"') && e.message.includes("keys starting with ':' are reserved for the protocol"));
    const items: unknown[] = [];
    await assert.rejects((async () => { for await (const x of c.stream('reservedTrailer', null)) items.push(x); })(),
      (e: UdskitError) => e.code === 'internal' && e.message.includes('":trailer"'));
    assert.deepEqual(items, [1]);
  } finally {
    await c.close();
  }
  // On the wire: an error frame (code internal) in place of the response / stream end.
  const r = await rawConn(sock);
  r.s.write(encodeFrame(T.request, 0, 1, 0, encodeRequestHead('reservedResponse'), Buffer.alloc(0)));
  let f = await r.frames();
  assert.deepEqual([f.typeName, f.id, f.codeName], ['error', 1, 'internal']);
  assert.match(f.message!, /":x"/);
  r.s.write(encodeFrame(T.request, 1, 2, 0, encodeRequestHead('reservedTrailer'), Buffer.alloc(0)));
  f = await r.frames();
  assert.deepEqual([f.typeName, f.id], ['stream_data', 2]);
  f = await r.frames();
  assert.deepEqual([f.typeName, f.id, f.codeName], ['error', 2, 'internal']);
  assert.match(f.message!, /":trailer"/);
  r.s.destroy();
  // NDJSON (no metadata on the wire) answers the same.
  const nd = await connect(sock, { protocol: 'ndjson' });
  try {
    await assert.rejects(nd.call('reservedResponse', null), (e: UdskitError) => e.code === 'internal' && e.message.includes('":x"'));
  } finally {
    await nd.close();
  }
});

test('reserved metadata: a request carrying :pad (and an unknown reserved key) reaches the handler without them', async () => {
  // Hand-built head: method "ctx", trace=abc, :future=1, then a 34-byte :pad of zeros (as Go pads).
  const entry = (k: string, v: Buffer): Buffer => {
    const kb = Buffer.from(k);
    const b = Buffer.alloc(4 + kb.length + v.length);
    b.writeUInt16LE(kb.length, 0);
    kb.copy(b, 2);
    b.writeUInt16LE(v.length, 2 + kb.length);
    v.copy(b, 4 + kb.length);
    return b;
  };
  const head = Buffer.concat([Buffer.from([3, 0]), Buffer.from('ctx'), entry('trace', Buffer.from('abc')), entry(':future', Buffer.from('1')), entry(':pad', Buffer.alloc(34))]);
  const payload = Buffer.from('null');
  const hdr = Buffer.alloc(HEADER_SIZE);
  hdr[0] = T.request;
  hdr.writeUInt16LE(head.length, 2);
  hdr.writeUInt32LE(5, 4);
  hdr.writeUInt32LE(payload.length, 8);
  const r = await rawConn(sock);
  r.s.write(Buffer.concat([hdr, head, payload]));
  const f = await r.frames();
  assert.deepEqual([f.typeName, f.id], ['response', 5]);
  assert.deepEqual(JSON.parse(f.payload.toString()), { metadata: { trace: 'abc' }, hasDeadline: false });
  assert.deepEqual(lastCtx!.metadata, { trace: 'abc' });
  r.s.destroy();
});

test('Node server streams: credit lets a slow reader hold back only its own stream', async () => {
  const c = await connect(sock);
  try {
    const n = Buffer.alloc(4);
    n.writeUInt32LE(20000); // 20 MB of items
    const slow = c.stream<Buffer>('bytes', n);
    const first = await slow.next();
    assert.equal((first.value as Buffer).length, 1000);
    await delay(200); // the server runs out of credit at ~1 MiB and waits
    for (let i = 0; i < 50; i++) assert.equal(await c.call('json', i), i);
    let count = 1;
    for await (const item of slow) {
      assert.equal(item.length, 1000);
      count++;
    }
    assert.equal(count, 20000);
    let seen = 0;
    for await (const _ of c.stream('stream', { n: 1000, interval_ms: 5 })) if (++seen === 2) break;
    assert.equal(await c.call('json', 'still fine'), 'still fine');
  } finally {
    await c.close();
  }
});

test('NDJSON clients (seed 002 style) reach the Node server', async () => {
  const nd = await connect(sock, { protocol: 'ndjson' });
  try {
    assert.deepEqual(await nd.call('json', { service: 'barista' }), { service: 'barista' });
    await assert.rejects(nd.call('fail', { code: 'not_found' }), (e: UdskitError) => e.code === 'not_found');
    // The handler context says which protocol the call came in on; NDJSON has no deadlines.
    assert.deepEqual(await nd.call('ctx', {}), { metadata: {}, hasDeadline: false });
    assert.equal(lastCtx!.protocol, 'ndjson');
    assert.equal(lastCtx!.deadline, undefined);
  } finally {
    await nd.close();
  }
  // A raw socket: a bad line gets bad_request and the connection stays.
  const lines = await new Promise<string>((resolve) => {
    const s = net.connect(sock);
    let out = '';
    s.on('data', (d) => { out += d; if (out.split('\n').length > 2) { s.end(); resolve(out); } });
    s.write('{"id":1,"func":""}\n{"id":"a","func":"json","data":[1]}\n');
  });
  assert.equal(lines, '{"id":1,"error":"bad_request: func must be a non-empty string","code":"invalid_argument"}\n{"id":"a","data":[1]}\n');
});

test('half-close: end of requests is not abandonment (NDJSON and udskit)', async () => {
  const nd = await new Promise<string>((resolve) => {
    const s = net.connect(sock);
    let out = '';
    s.on('data', (d) => { out += d; });
    s.on('close', () => resolve(out));
    s.end('{"id":1,"func":"sleep","data":{"ms":100}}\n{"id":2,"func":"json","data":"x"}\n{"id":3,"func":"json"');
  });
  assert.deepEqual(nd.trim().split('\n').map((l) => JSON.parse(l)).sort((a, b) => a.id - b.id), [{ id: 1, data: { slept_ms: 100 } }, { id: 2, data: 'x' }]);
  const r = await rawConn(sock);
  r.s.end(encodeFrame(T.request, 0, 7, 0, encodeRequestHead('sleep'), Buffer.from('{"ms":100}')));
  let f = await r.frames();
  while (f.typeName === 'ping') f = await r.frames(); // the server checks that a client after EOF is still there
  assert.equal(f.typeName, 'response');
  assert.equal(f.payload.toString(), '{"slept_ms":100}');
  await within(2000, new Promise((res) => r.s.on('close', res)), 'server close after half-close');
});

test('the client keeps to the server\'s max in-flight (the server closes connections that exceed it)', async () => {
  const p = path.join(dir, 'limit.sock');
  let peak = 0;
  let now = 0;
  const s = createServer({
    maxInFlight: 4,
    handlers: { work: async (ms: number) => { peak = Math.max(peak, ++now); await delay(ms); now--; return ms; } },
  });
  await s.listen(p);
  const c = await connect(p);
  const got = await within(10_000, Promise.all(Array.from({ length: 50 }, (_, i) => c.call('work', i % 5))), '50 calls through 4 slots');
  assert.deepEqual(got, Array.from({ length: 50 }, (_, i) => i % 5));
  assert.equal(peak, 4);
  // A raw client that ignores the limit loses its connection with resource_exhausted.
  const r = await rawConn(p);
  const head = encodeRequestHead('work');
  r.s.write(Buffer.concat(Array.from({ length: 5 }, (_, i) => encodeFrame(T.request, 0, i + 1, 0, head, Buffer.from('200')))));
  const f = await r.frames();
  assert.equal(f.typeName, 'error');
  assert.equal(f.id, 0);
  assert.equal(f.codeName, 'resource_exhausted');
  r.s.destroy();
  await c.close();
  await s.close();
});

test('shutdown: goaway, in-flight calls finish, a late request is refused unprocessed, socket removed', async () => {
  const p = path.join(dir, 'drain.sock');
  const s = createServer({ handlers });
  await s.listen(p);
  const c = await connect(p, { reconnect: false });
  const inflight = Array.from({ length: 5 }, () => c.call('sleep', { ms: 200 }));
  const r = await rawConn(p);
  r.s.write(encodeFrame(T.request, 0, 1, 0, encodeRequestHead('sleep'), Buffer.from('{"ms":300}')));
  await delay(50);
  const done = s.shutdown({ timeout: 3000 });
  const ga = await r.frames();
  assert.equal(ga.typeName, 'goaway');
  r.s.write(encodeFrame(T.request, 0, 2, 0, encodeRequestHead('json'), Buffer.from('1')));
  // Either order: on a loaded machine the 300 ms call may finish before the refusal is read.
  const two = [await r.frames(), await r.frames()].sort((x, y) => x.id - y.id);
  const [answered, refused] = two as [typeof two[0], typeof two[0]];
  assert.equal(refused.typeName, 'error');
  assert.equal(refused.id, 2);
  assert.equal(refused.codeName, 'unavailable');
  assert.equal(refused.flags & 1, 1);
  assert.equal(answered.typeName, 'response');
  assert.equal(answered.id, 1);
  for (const x of await Promise.all(inflight)) assert.deepEqual(x, { slept_ms: 200 });
  assert.equal(fs.existsSync(p), false, 'socket file removed at shutdown');
  r.s.end();
  await c.close();
  await within(3000, done, 'shutdown');
});

test('shutdown timeout closes what is left and aborts handlers', async () => {
  const p = path.join(dir, 'drain2.sock');
  const s = createServer({ handlers });
  await s.listen(p);
  const c = await connect(p, { reconnect: false });
  const stuck = c.call('sleep', { ms: 10_000 }, { timeout: 20_000 });
  const check = assert.rejects(stuck, (e: UdskitError) => e.code === 'unavailable' && e.retryable);
  await delay(50);
  const t0 = performance.now();
  await s.shutdown({ timeout: 200 });
  assert.ok(performance.now() - t0 < 1000);
  await check;
  await c.close();
});

test('socket hygiene: mode, stale cleanup, never a live socket or a non-socket, unlink only if ours', async () => {
  // Default owner-only, and an explicit mode exactly.
  const p1 = path.join(dir, 'm1.sock');
  const s1 = createServer({ handlers });
  await s1.listen(p1);
  assert.equal(fs.statSync(p1).mode & 0o777, 0o600);
  const p2 = path.join(dir, 'm2.sock');
  const s2 = createServer({ handlers });
  await s2.listen(p2, { mode: 0o660 });
  assert.equal(fs.statSync(p2).mode & 0o777, 0o660);
  assert.deepEqual(fs.readdirSync(dir).filter((f) => f.startsWith('.udskit-')), [], 'no private bind dirs left');
  // A live server at the path: refused, and it keeps working.
  await assert.rejects(createServer({ handlers }).listen(p1), InUseError);
  const c = await connect(p1);
  assert.equal(await c.call('json', 1), 1);
  await c.close();
  // Not a socket: never removed.
  const f = path.join(dir, 'file.sock');
  fs.writeFileSync(f, 'precious');
  await assert.rejects(createServer({ handlers }).listen(f), NotSocketError);
  assert.equal(fs.readFileSync(f, 'utf8'), 'precious');
  fs.mkdirSync(path.join(dir, 'adir.sock'));
  await assert.rejects(createServer({ handlers }).listen(path.join(dir, 'adir.sock')), NotSocketError);
  // A stale socket (its server was SIGKILLed) is removed after a refused probe.
  const stale = path.join(dir, 'stale.sock');
  const go = await startGo(stale);
  await go.kill();
  assert.ok(fs.lstatSync(stale).isSocket());
  const s3 = createServer({ handlers });
  await s3.listen(stale);
  const c3 = await connect(stale);
  assert.equal(await c3.call('json', 'fresh'), 'fresh');
  await c3.close();
  // Close removes the file only while it is still ours: here another server took the path.
  fs.unlinkSync(stale);
  const go2 = await startGo(stale);
  await s3.close();
  assert.ok(fs.existsSync(stale), 'the other server\'s socket was removed');
  const r = await runGo(['call', stale, 'echo', '"go is alive"']);
  assert.equal(r.stdout.trim(), '"go is alive"');
  await go2.kill();
  // And removed when it is ours.
  await s1.close();
  await s2.close();
  assert.equal(fs.existsSync(p1), false);
  assert.equal(fs.existsSync(p2), false);
});

test('inherited sockets: systemd:NAME and fd:N under systemd-socket-activate', async () => {
  await assert.rejects(connect('fd:3'), (e: AddrError) => e.errorName === 'listen_only');
  const script = path.join(dir, 'activated.mjs');
  const index = new URL('../src/index.js', import.meta.url).href;
  fs.writeFileSync(script, `import { createServer } from ${JSON.stringify(index)};
const s = createServer({ handlers: { who: () => process.argv[2] } });
await s.listen(process.argv[2]);
process.once('SIGTERM', () => s.shutdown({ timeout: 1000 }));
`);
  for (const addr of ['systemd:api', 'fd:3']) {
    const p = path.join(dir, `act-${addr.replace(':', '-')}.sock`);
    const act = spawn('systemd-socket-activate', ['-l', p, '--fdname=api', process.execPath, script, addr], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    act.stderr!.on('data', (d) => { err += d; });
    try {
      const r = await runGo(['call', '--wait', '--timeout', '10s', p, 'who']);
      assert.equal(r.code, 0, r.stderr + err);
      assert.equal(JSON.parse(r.stdout), addr);
    } finally {
      act.kill('SIGTERM');
      await new Promise((res) => act.on('exit', res));
    }
  }
});

test('abstract and TCP addresses', async () => {
  // Abstract names: refused with a clear error (Node pads them; see dial.ts).
  await assert.rejects(createServer({ handlers }).listen('@udskit-node-test'), (e: AddrError) => e.errorName === 'abstract_unsupported');
  await assert.rejects(connect('@udskit-node-test'), (e: AddrError) => e.errorName === 'abstract_unsupported' && /socket path/.test(e.message));
  const t = createServer({ handlers });
  const addr = await t.listen('tcp:127.0.0.1:0');
  assert.match(addr, /^tcp:127\.0\.0\.1:\d+$/);
  const c = await connect(addr);
  assert.equal(await c.call('json', 'tcp'), 'tcp');
  await c.close();
  await t.close();
});
