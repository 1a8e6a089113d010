// Randomized client-stream traffic (spec 4.3): the Inbox under random
// operations, and random frame sequences (requests with every flag
// combination, request_data, request_end, cancel, credit, wrong-direction
// frames) against a live Node server in random chunks. Only ProtocolErrors,
// buffered items never beyond the credit bound, and the server keeps serving.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { connect, createServer, raw } from '../src/index.js';
import { Inbox } from '../src/server-bidi.js';
import { Ctx } from '../src/handler.js';
import { ProtocolError, UdskitError } from '../src/codes.js';
import { encodeFrame, encodeRequestHead, encodeHello, T, EMPTY, INITIAL_CREDIT } from '../src/frame.js';
import { tmpDir, delay, within } from './helpers.js';
import { handlers } from './bidi-fixtures.js';

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

test('fuzz: the Inbox under random data/end/eof/next/return/close/abort', async () => {
  const r = rng(30);
  const maxFrame = 65536;
  for (let run = 0; run < 300; run++) {
    const ctx = new Ctx('m', null, undefined, 'udskit');
    let granted = 0;
    const inbox = new Inbox(ctx, r() < 0.5, maxFrame, (n) => { granted += n; });
    let sent = 0;
    let read = 0;
    let broken = false;
    const pending: Promise<unknown>[] = [];
    for (let op = 0; op < 400 && !broken; op++) {
      const x = r();
      try {
        if (x < 0.6) {
          const n = Math.floor(r() * maxFrame);
          const b = r() < 0.5 ? Buffer.from(String(Math.floor(r() * 100))) : Buffer.alloc(n, 0x20);
          inbox.data(b);
          sent += b.length + 16;
        } else if (x < 0.62) {
          inbox.end();
        } else if (x < 0.63) {
          inbox.eof();
        } else if (x < 0.9) {
          pending.push(inbox.next().then((v) => { if (!v.done) read++; }, (e) => assert.ok(e instanceof UdskitError, String(e))));
        } else if (x < 0.905) {
          pending.push(inbox.return());
        } else if (x < 0.91) {
          inbox.close();
        } else if (x < 0.912) {
          ctx.abort(new UdskitError('canceled', 'fuzz'));
        }
      } catch (e) {
        assert.ok(e instanceof ProtocolError, String(e));
        broken = true;
      }
      // Held items never exceed the credit bound: 1 MiB + what was granted + one item.
      assert.ok(inbox.bytes <= INITIAL_CREDIT + granted + maxFrame + 16, `${inbox.bytes} bytes held`);
      assert.ok(sent - granted <= INITIAL_CREDIT + maxFrame + 16 || broken);
    }
    inbox.close();
    await within(5000, Promise.all(pending), 'reads after close');
    assert.equal(inbox.bytes, 0);
    assert.ok(read >= 0);
  }
});

test('fuzz: random client-stream frame sequences against the Node server', async () => {
  const r = rng(31);
  const dir = tmpDir();
  const sock = path.join(dir, 'fz.sock');
  const srv = createServer({ handlers: { ...handlers, echo: raw((b) => b) } });
  await srv.listen(sock);
  const methods = ['sum', 'hold', 'total', 'join', 'reverse', 'echo', 'json', 'stream', 'first', 'nope'];
  const t0 = performance.now();
  try {
    for (let run = 0; run < 150; run++) {
      const frames: Buffer[] = [encodeHello({ version: 1, flags: Math.floor(r() * 4), maxFrame: 1 << 16, maxInFlight: 0 })];
      for (let k = 0; k < 1 + Math.floor(r() * 20); k++) {
        const id = 1 + Math.floor(r() * 4);
        const x = r();
        if (x < 0.25) {
          const m = methods[Math.floor(r() * methods.length)]!;
          const payload = r() < 0.8 ? EMPTY : Buffer.from('{"n":2}');
          frames.push(encodeFrame(T.request, Math.floor(r() * 4), id, r() < 0.2 ? Math.floor(r() * 200_000) : 0, encodeRequestHead(m), payload));
        } else if (x < 0.65) {
          const p = r() < 0.6 ? Buffer.from(String(Math.floor(r() * 1000) - 500)) : Buffer.alloc(Math.floor(r() * 3000), Math.floor(r() * 256));
          frames.push(encodeFrame(T.request_data, 0, id, 0, EMPTY, p));
        } else if (x < 0.8) {
          frames.push(encodeFrame(T.request_end, 0, id, 0, EMPTY, EMPTY));
        } else if (x < 0.87) {
          frames.push(encodeFrame(T.cancel, 0, id, 1, EMPTY, EMPTY));
        } else if (x < 0.94) {
          frames.push(encodeFrame(T.stream_credit, 0, id, Math.floor(r() * 100_000), EMPTY, EMPTY));
        } else {
          frames.push(encodeFrame(T.request_credit, 0, id, 100, EMPTY, EMPTY));
        }
      }
      const bytes = Buffer.concat(frames);
      const s = net.connect(sock);
      await new Promise((res) => s.once('connect', res));
      s.on('error', () => {});
      s.resume(); // read and drop what the server sends
      for (let off = 0; off < bytes.length;) {
        const n = 1 + Math.floor(r() * 200);
        s.write(bytes.subarray(off, off + n));
        off += n;
      }
      if (r() < 0.5) s.end(); // half-close: EOF ends every open client stream
      await delay(r() < 0.1 ? 20 : 1);
      s.destroy();
    }
    // The server still serves, and once every connection is gone it holds nothing.
    const c = await connect(sock);
    const call = c.bidiJSON<number, number>('sum');
    await call.write(2);
    await call.write(3);
    await call.end();
    assert.deepEqual(await within(5000, call.toArray()), [2, 5]);
    await c.close();
    await within(10_000, (async () => { while (srv.conns.size > 0 || srv.heldBytes !== 0) await delay(10); })(), 'connections closed');
  } finally {
    await srv.close();
  }
  assert.ok(performance.now() - t0 < 60_000);
});
