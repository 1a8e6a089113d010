// Hostile bytes: a fake server that sends garbage, 4 GiB lengths, or half a
// frame and then silence; and hostile clients against the Node server. Each
// costs only its own connection, with a clear error, in bounded time and memory.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { connect, createServer, raw, UdskitError } from '../src/index.js';
import { encodeHello, writeHeader, encodeFrame, encodeRequestHead, T, decodeFrame } from '../src/frame.js';
import { tmpDir, within, delay, clientHello, rawConn } from './helpers.js';

const dir = tmpDir();
const serverHello = encodeHello({ version: 1, flags: 1, maxFrame: 16 << 20, maxInFlight: 4096 });

/** A fake udskit server: answers the hello (unless told not to), then does `after` for each request. */
async function fake(name: string, onConn: (s: net.Socket) => void): Promise<{ path: string; close: () => Promise<void> }> {
  const p = path.join(dir, name);
  const conns = new Set<net.Socket>();
  const srv = net.createServer((s) => {
    conns.add(s);
    s.on('error', () => {});
    s.on('close', () => conns.delete(s));
    onConn(s);
  });
  await new Promise<void>((r) => srv.listen(p, r));
  return { path: p, close: () => new Promise((r) => { for (const s of conns) s.destroy(); srv.close(() => r()); }) };
}

function header(type: number, id: number, payloadLen: number, headLen = 0, aux = 0): Buffer {
  const b = Buffer.alloc(16);
  writeHeader(b, 0, type, 0, headLen, id, payloadLen, aux);
  return b;
}

/** After the client's hello and first request, send `bytes`. */
function afterRequest(bytes: () => Buffer, end = false) {
  return (s: net.Socket) => {
    let got = 0;
    let sent = false;
    s.on('data', (d) => {
      got += d.length;
      if (got >= 16 && !sent && got === d.length) s.write(serverHello);
      if (got > 16 && !sent) {
        sent = true;
        s.write(bytes());
        if (end) s.end();
      }
    });
  };
}

async function expectFail(p: string, code: string, msg: RegExp, opts = {}): Promise<void> {
  const c = await connect(p, { reconnect: false, ...opts });
  const rssBefore = process.memoryUsage().rss;
  const t0 = performance.now();
  await within(3000, assert.rejects(c.call('echo', 'x', { timeout: 10_000 }), (e: UdskitError) => {
    assert.equal(e.code, code, e.message);
    assert.match(e.message, msg);
    return true;
  }), 'the call');
  assert.ok(performance.now() - t0 < 2500);
  assert.ok(process.memoryUsage().rss - rssBefore < 64 << 20, 'memory grew');
  await c.close();
}

test('client: garbage instead of a hello fails connect with bad_magic', async () => {
  const f = await fake('garbage-hello.sock', (s) => s.on('data', () => s.write('HTTP/1.1 400 Bad Request\r\n\r\n')));
  await assert.rejects(connect(f.path), (e: UdskitError) => e.code === 'protocol_violation' && /bad_magic/.test(e.message));
  await f.close();
});

test('client: a 4 GiB payload length is refused before allocating', async () => {
  const f = await fake('4g.sock', afterRequest(() => header(T.response, 1, 0xffffffff)));
  await expectFail(f.path, 'protocol_violation', /frame_too_large/);
  await f.close();
});

test('client: a head over 16 KiB, a bad id, garbage frames', async () => {
  for (const [name, bytes, re] of [
    ['head', header(T.response, 1, 0, 60000), /head_too_large/],
    ['id0', header(T.response, 0, 0), /bad_id/],
    ['code0', header(T.error, 1, 0, 0, 0), /bad_code/],
    ['request', encodeFrame(T.request, 0, 1, 0, Buffer.from('\x01\x00x'), Buffer.alloc(0)), /client-to-server/],
    ['random', Buffer.from('\xff\xfe\xfd garbage garbage garbage garbage'), /frame_too_large|head_too_large|bad_/],
  ] as const) {
    const f = await fake(`bad-${name}.sock`, afterRequest(() => bytes));
    await expectFail(f.path, 'protocol_violation', re);
    await f.close();
  }
});

test('client: half a frame then silence: the call ends at its deadline, the connection at the stall timeout', async () => {
  const half = Buffer.concat([header(T.response, 1, 1000), Buffer.alloc(10)]);
  const f = await fake('half.sock', afterRequest(() => half));
  await expectFail(f.path, 'unavailable', /truncated/, { stallTimeout: 300 });
  // With the default stall timeout the call's own deadline still holds.
  const c = await connect(f.path, { reconnect: false });
  await assert.rejects(c.call('echo', 'x', { timeout: 200 }), (e: UdskitError) => e.code === 'deadline_exceeded');
  await c.close();
  await f.close();
});

test('client: the server closing mid-frame fails calls at once with a retryable error', async () => {
  const f = await fake('cut.sock', afterRequest(() => header(T.response, 1, 1000), true));
  await expectFail(f.path, 'unavailable', /lost/);
  await f.close();
});

test('client: a response larger than the client max frame is refused', async () => {
  const f = await fake('big.sock', afterRequest(() => header(T.response, 1, 2048)));
  await expectFail(f.path, 'protocol_violation', /frame_too_large/, { maxFrame: 1024 });
  await f.close();
});

test('client: responses for unknown ids and unknown frame types are ignored', async () => {
  const f = await fake('unknown.sock', (s) => {
    let sent = false;
    s.on('data', () => {
      if (!sent) { sent = true; s.write(serverHello); return; }
      s.write(Buffer.concat([
        encodeFrame(T.response, 0, 999, 0, Buffer.alloc(0), Buffer.from('"stray"')),
        encodeFrame(200, 0x80, 0, 0, Buffer.from('xy'), Buffer.from('z')),
        encodeFrame(T.response, 0, 1, 0, Buffer.alloc(0), Buffer.from('"ok"')),
      ]));
    });
  });
  const c = await connect(f.path, { reconnect: false });
  assert.equal(await c.call('echo', 'x'), 'ok');
  await c.close();
  await f.close();
});

test('client: answers pings, and a ping flood from a server that does not read stays bounded', async () => {
  let pongs = 0;
  const f = await fake('ping.sock', (s) => {
    let hello = false;
    s.on('data', (d) => {
      if (!hello) { hello = true; s.write(serverHello); s.write(encodeFrame(T.ping, 0, 0, 42, Buffer.alloc(0), Buffer.from('abc'))); return; }
      for (let off = 0; off + 16 <= d.length;) {
        const h = decodeFrame(d.subarray(off, off + 16 + d.readUInt16LE(off + 2) + d.readUInt32LE(off + 8)), 1 << 20);
        if (h.typeName === 'pong') {
          assert.equal(h.aux, 42);
          assert.equal(h.payload.toString(), 'abc');
          pongs++;
          s.pause(); // from now on: never read again, and flood pings
          const ping = encodeFrame(T.ping, 0, 0, 1, Buffer.alloc(0), Buffer.alloc(60000));
          let sent = 0;
          const flood = (): void => { while (sent < 2000 && s.write(ping)) sent++; if (sent < 2000) s.once('drain', flood); };
          flood();
        }
        off += 16 + d.readUInt16LE(off + 2) + d.readUInt32LE(off + 8);
      }
    });
  });
  const before = process.memoryUsage().rss;
  const c = await connect(f.path, { reconnect: false });
  await delay(1500);
  assert.equal(pongs, 1);
  assert.ok(process.memoryUsage().rss - before < 96 << 20, `rss grew by ${(process.memoryUsage().rss - before) >> 20} MiB`);
  await c.close();
  await f.close();
});

test('client: a server that streams far beyond the credit it was given is a protocol violation', async () => {
  const f = await fake('overcredit.sock', (s) => {
    let hello = false;
    s.on('data', () => {
      if (!hello) { hello = true; s.write(serverHello); return; }
      const item = encodeFrame(T.stream_data, 0, 1, 0, Buffer.alloc(0), Buffer.alloc(60000, 1));
      for (let i = 0; i < 60; i++) s.write(item); // 3.6 MB, never waiting for credit
    });
  });
  // Max frame 64 KiB: the client tolerates at most 1 MiB + 64 KiB + 16 beyond its grants.
  const c = await connect(f.path, { reconnect: false, maxFrame: 65536 });
  const st = c.stream<Buffer>('flood', Buffer.alloc(0));
  assert.equal((await st.next()).value!.length, 60000);
  await delay(500); // the flood arrives while the application does not read
  await within(5000, assert.rejects((async () => { for await (const _ of st) { /* drain */ } })(),
    (e: UdskitError) => e.code === 'protocol_violation' && /beyond its credit/.test(e.message)), 'stream error');
  await c.close();
  await f.close();
});

test('client: a server that never reads: calls wait for room and time out, memory stays bounded', async () => {
  const f = await fake('noread.sock', (s) => {
    s.once('data', () => { s.write(serverHello); s.pause(); }); // then never read again
  });
  const c = await connect(f.path, { reconnect: false });
  const big = Buffer.alloc(1 << 20, 7);
  const before = process.memoryUsage();
  const calls = Array.from({ length: 100 }, () => c.call('echo', big, { timeout: 500 }).then(() => 'ok', (e: UdskitError) => e.code));
  await delay(200);
  const during = process.memoryUsage();
  const grew = (during.rss - before.rss + during.arrayBuffers - before.arrayBuffers) / 2 ** 20;
  const codes = await within(5000, Promise.all(calls), 'calls');
  assert.deepEqual(new Set(codes), new Set(['deadline_exceeded']));
  // 100 calls of 1 MiB: without backpressure ~100 MiB of frames would be queued.
  assert.ok(grew < 40, `memory grew by ${grew.toFixed(0)} MiB`);
  await c.close();
  await f.close();
});

/** Sends bytes to the Node server and returns what it answers before closing (bounded). */
function talk(p: string, bytes: Buffer, wait = 2000): Promise<Buffer> {
  return new Promise((resolve) => {
    const s = net.connect(p);
    const got: Buffer[] = [];
    s.on('data', (d) => got.push(d));
    s.on('error', () => {});
    s.on('close', () => { clearTimeout(t); resolve(Buffer.concat(got)); });
    const t = setTimeout(() => { s.destroy(); resolve(Buffer.concat(got)); }, wait);
    s.write(bytes);
  });
}

test('server: calls holding more than maxConnBytes of requests stop the reading, then all are served', async () => {
  let running = 0;
  let peak = 0;
  const srv = createServer({
    maxConnBytes: 1 << 20,
    handlers: { hold: raw(async (b) => { peak = Math.max(peak, ++running); await delay(100); running--; return b.subarray(0, 1); }) },
  });
  const p = path.join(dir, 'budget.sock');
  await srv.listen(p);
  const r = await rawConn(p);
  const head = encodeRequestHead('hold');
  const body = Buffer.alloc(256 << 10, 1);
  for (let i = 1; i <= 40; i++) r.s.write(encodeFrame(T.request, 0, i, 0, head, body)); // 10 MiB at once
  await within(15_000, (async () => { for (let i = 0; i < 40; i++) await r.frames(); })(), '40 answers'); // of one byte each
  r.s.destroy();
  assert.ok(peak <= 6, `${peak} calls of 256 KiB held at once with a 1 MiB budget`);
  await srv.close();
});

test('server: hostile clients cost only their own connection', async () => {
  const errors: string[] = [];
  const srv = createServer({ handlers: { echo: (x) => x }, helloTimeout: 300, stallTimeout: 300, onError: (e) => errors.push(e.message) });
  const p = path.join(dir, 'srv.sock');
  await srv.listen(p);
  const good = await connect(p);
  const connErr = (b: Buffer): ReturnType<typeof decodeFrame> => decodeFrame(b.subarray(16), 1 << 20);
  // Garbage first byte: closed at once.
  const t0 = performance.now();
  assert.equal((await talk(p, Buffer.from('GET / HTTP/1.1\r\n\r\n'))).length, 0);
  assert.ok(performance.now() - t0 < 1000);
  // Bad hello: our hello, then a connection error.
  const bad = await talk(p, Buffer.from('UDSK\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00', 'latin1'));
  assert.equal(connErr(bad).codeName, 'protocol_violation');
  assert.match(connErr(bad).message!, /bad_version/);
  // 4 GiB length after a good hello.
  const huge = await talk(p, Buffer.concat([clientHello, header(T.request, 1, 0xffffffff, 6)]));
  assert.equal(connErr(huge).aux, 32);
  assert.match(connErr(huge).message!, /frame_too_large/);
  // Over the negotiated max (1 MiB).
  const over = await talk(p, Buffer.concat([clientHello, header(T.request, 1, (1 << 20) + 1, 6)]));
  assert.match(connErr(over).message!, /frame_too_large/);
  // Wrong direction, bad head.
  assert.match(connErr(await talk(p, Buffer.concat([clientHello, encodeFrame(T.response, 0, 1, 0, Buffer.alloc(0), Buffer.alloc(0))]))).message!, /server-to-client/);
  assert.match(connErr(await talk(p, Buffer.concat([clientHello, encodeFrame(T.request, 0, 1, 0, Buffer.from([9, 0, 1]), Buffer.alloc(0))]))).message!, /bad_head/);
  // Half a frame then silence: closed after the stall timeout; no hello: closed after the hello timeout.
  const t1 = performance.now();
  await talk(p, Buffer.concat([clientHello, header(T.request, 1, 100, 6), Buffer.from('ab')]), 5000);
  const stalled = performance.now() - t1;
  assert.ok(stalled >= 250 && stalled < 3000, `stall close took ${stalled}`);
  const t2 = performance.now();
  await talk(p, Buffer.from('UDS'), 5000);
  assert.ok(performance.now() - t2 < 3000);
  // An NDJSON line over the limit: error line, then closed.
  const srvSmall = createServer({ handlers: { echo: (x) => x }, maxFrame: 1024 });
  const p2 = path.join(dir, 'small.sock');
  await srvSmall.listen(p2);
  const long = await talk(p2, Buffer.from('{"id":1,"func":"echo","data":"' + 'a'.repeat(5000)));
  assert.match(long.toString(), /"code":"resource_exhausted"/);
  await srvSmall.close();
  // Through all of that the good client kept working.
  assert.equal(await good.call('echo', 'still here'), 'still here');
  assert.ok(errors.length >= 5, errors.join('\n'));
  await good.close();
  await srv.close();
  await delay(10);
});
