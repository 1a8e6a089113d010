// protocol/errors.json: every condition set up for real, and what the Node
// client reports (code, retryable, the words saying what it found), as Go and
// Python do; the refusal vectors (spec 5.4); fail fast (spec 4.2); and the
// README's promise that every failure is a UdskitError.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { connect, createServer, UdskitError } from '../src/index.js';
import { parseRefusal } from '../src/dial.js';
import { readJSON, tmpDir, startGo, delay } from './helpers.js';

interface Condition { name: string; code: string; retryable: boolean; says: string[] }

async function failure(p: Promise<unknown>): Promise<UdskitError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof UdskitError, `not a UdskitError: ${String(e)}`);
    return e;
  }
  assert.fail('it succeeded');
}

/** redis-server on a unix socket in dir (no TCP, no persistence), stopped at exit. */
async function startRedis(dir: string): Promise<string> {
  const sock = path.join(dir, 'redis.sock');
  const proc = spawn('redis-server', ['--port', '0', '--unixsocket', sock, '--unixsocketperm', '700', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
  process.on('exit', () => proc.kill('SIGKILL'));
  for (let i = 0; i < 400; i++) { // ready once it accepts
    const ok = await new Promise<boolean>((r) => {
      const s = net.connect(sock, () => { s.destroy(); r(true); });
      s.on('error', () => r(false));
    });
    if (ok) return sock;
    await delay(25);
  }
  assert.fail('redis-server did not start');
}

test('protocol/errors.json: each condition gives its code, retryability and words', async () => {
  const table = readJSON<{ conditions: Condition[] }>('protocol/errors.json');
  const dir = tmpDir();
  const setups: Record<string, () => Promise<UdskitError>> = {
    no_socket: () => failure(connect(path.join(dir, 'missing.sock'))),
    stale_socket: async () => {
      const p = path.join(dir, 'stale.sock');
      const l = net.createServer();
      await new Promise<void>((r) => l.listen(p, r));
      // close() unlinks the path: link it aside first, and back after.
      fs.linkSync(p, p + '.keep');
      await new Promise((r) => l.close(r));
      fs.renameSync(p + '.keep', p);
      return failure(connect(p));
    },
    regular_file: () => {
      const p = path.join(dir, 'file.sock');
      fs.writeFileSync(p, 'x');
      return failure(connect(p));
    },
    directory: () => {
      const p = path.join(dir, 'dir.sock');
      fs.mkdirSync(p);
      return failure(connect(p));
    },
    silent_server: async () => failure(connect(await startRedis(dir), { timeout: 500 })),
    foreign_server: async () => {
      const p = path.join(dir, 'foreign.sock');
      const l = net.createServer((s) => { s.once('data', () => s.end("-ERR unknown command 'UDSK'\r\n")); });
      await new Promise<void>((r) => l.listen(p, r));
      try {
        return await failure(connect(p));
      } finally {
        l.close();
      }
    },
    policy_refused: async () => {
      const go = await startGo(path.join(dir, 'policy.sock'), ['--allow-uid', '4242']);
      try {
        return await failure(connect(go.addr));
      } finally {
        await go.term();
      }
    },
    server_gone: async () => {
      const go = await startGo(path.join(dir, 'gone.sock'));
      const c = await connect(go.addr, { reconnect: { initialDelay: 10, maxDelay: 50 } });
      try {
        await c.call('echo', { a: 1 });
        await go.term();
        let last: UdskitError | null = null;
        for (let i = 0; i < 3; i++) { // a call may meet the broken connection itself first
          const t0 = Date.now();
          last = await failure(c.call('echo', { a: 1 }));
          assert.ok(Date.now() - t0 < 5000, `a call took ${Date.now() - t0}ms to fail with the server gone`);
          if (last.message.includes('fail fast')) break;
        }
        return last!;
      } finally {
        await c.close();
      }
    },
  };
  for (const cond of table.conditions) {
    const setup = setups[cond.name];
    assert.ok(setup, `protocol/errors.json has ${cond.name}, which this test does not set up`);
    const e = await setup();
    assert.equal(e.code, cond.code, `${cond.name}: ${e.message}`);
    assert.equal(e.retryable, cond.retryable, `${cond.name}: ${e.message}`);
    for (const w of cond.says) assert.ok(e.message.includes(w), `${cond.name}: message does not say ${JSON.stringify(w)}: ${e.message}`);
  }
});

test('refusal vectors (spec 5.4): the error frame a server sends in place of its hello', () => {
  const v = readJSON<{ refusals: { name: string; hex: string; code: number; code_name?: string; message: string; retryable: boolean }[] }>('protocol/vectors/refusal.json');
  for (const r of v.refusals) {
    const buf = Buffer.from(r.hex, 'hex');
    for (let n = 1; n < buf.length; n++) assert.equal(parseRefusal(buf.subarray(0, n)), 'partial', `${r.name}: ${n} bytes`);
    const got = parseRefusal(buf);
    assert.ok(got !== null && got !== 'partial', r.name);
    assert.equal(got.code, r.code);
    assert.equal(got.message, r.message);
    const e = new UdskitError(got.code, got.message);
    if (r.code_name !== undefined) assert.equal(e.code, r.code_name);
    assert.equal(e.retryable, r.retryable);
  }
  assert.equal(parseRefusal(Buffer.from('UDSK')), null, 'a hello is not a refusal');
});

test('waitForReady: a call waits for the server to come back (the default fails fast)', async () => {
  const dir = tmpDir();
  const p = path.join(dir, 'wfr.sock');
  let go = await startGo(p);
  const c = await connect(p, { reconnect: { initialDelay: 10, maxDelay: 50 } });
  try {
    await c.call('echo', 1);
    await go.term();
    await c.call('echo', 1, { timeout: 200 }).catch(() => {}); // meets the broken connection
    const waiting = c.call('echo', { back: true }, { waitForReady: true, timeout: 20_000 });
    await delay(300);
    go = await startGo(p);
    assert.deepEqual(await waiting, { back: true });
  } finally {
    await c.close();
    await go.term();
  }
});

test('every failure is a UdskitError: AbortSignal.timeout is deadline_exceeded with its cause; a BigInt payload is invalid_argument', async () => {
  const dir = tmpDir();
  const p = path.join(dir, 's.sock');
  const server = createServer({ handlers: { slow: async (_: unknown, ctx) => { await new Promise((r) => ctx.signal.addEventListener('abort', r)); return 1; } } });
  await server.listen(p);
  const c = await connect(p);
  try {
    let e = await failure(c.call('slow', {}, { signal: AbortSignal.timeout(50) }));
    assert.equal(e.code, 'deadline_exceeded', e.message);
    assert.ok(e.cause instanceof Error && e.cause.name === 'TimeoutError', String(e.cause));
    const ac = new AbortController();
    const pending = c.call('slow', {}, { signal: ac.signal });
    ac.abort(new Error('user gave up'));
    e = await failure(pending);
    assert.equal(e.code, 'canceled');
    assert.equal((e.cause as Error).message, 'user gave up');
    e = await failure(c.call('slow', { n: 1n }));
    assert.equal(e.code, 'invalid_argument', e.message);
    assert.match(e.message, /BigInt/);
    e = await failure(c.call('', {}));
    assert.equal(e.code, 'invalid_argument');
  } finally {
    await c.close();
    await server.close();
  }
});
