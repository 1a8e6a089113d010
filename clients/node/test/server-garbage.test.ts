// The server's garbage per call (issue 25, on V8's defaults). V8 grows the
// young generation (4 -> 32 MiB) under an attack and keeps it; it shrinks it
// back at a full collection only while the process allocates little (under
// 1,000 bytes/ms), or when its memory reducer finds the allocation rate low.
// A server answering the soak's good client (500 calls/s) at 3,400 bytes of
// garbage a call was over that line for good; these tests hold what a call
// costs, measured in a server process of its own with a young generation big
// enough that nothing is collected while it is measured.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { connect, createServer, type HandlerContext } from '../src/index.js';
import { encodeFrame, encodeRequestHead, EMPTY, T } from '../src/frame.js';
import { tmpDir, within, delay, rawConn } from './helpers.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const indexUrl = pathToFileURL(path.join(here, '../src/index.js')).href;
const dir = tmpDir();

/** The server's process: echo (raw, answered at once), and the young generation's bytes on request. */
const serverScript = (sock: string): string => `
import v8 from 'node:v8';
import { PerformanceObserver } from 'node:perf_hooks';
const { createServer, raw } = await import(${JSON.stringify(indexUrl)});
const srv = createServer({ handlers: { echo: raw((b) => b) } });
await srv.listen(${JSON.stringify(sock)});
let gcs = 0;
new PerformanceObserver((l) => { gcs += l.getEntries().length; }).observe({ entryTypes: ['gc'] });
const used = () => v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').space_used_size;
let u0 = 0;
let g0 = 0;
process.stdin.setEncoding('utf8');
process.stdin.on('data', (d) => {
  for (const cmd of d.trim().split('\\n')) {
    if (cmd === 'start') { g0 = gcs; u0 = used(); process.stdout.write('started\\n'); }
    if (cmd === 'stop') process.stdout.write(JSON.stringify({ bytes: used() - u0, gcs: gcs - g0 }) + '\\n');
    if (cmd === 'exit') srv.close().then(() => process.exit(0));
  }
});
process.stdout.write('ready\\n');
`;

test('an echo call with a deadline, answered at once, leaves under 2,600 bytes of garbage in the server (3,400 before; a bare net echo leaves 1,340)', async () => {
  const sock = path.join(dir, 'g.sock');
  const child = spawn(process.execPath, ['--max-semi-space-size=64', '--min-semi-space-size=64', '--input-type=module', '-e', serverScript(sock)], { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  const lines: string[] = [];
  const waiters: (() => void)[] = [];
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (d: string) => {
    out += d;
    let i;
    while ((i = out.indexOf('\n')) >= 0) {
      lines.push(out.slice(0, i));
      out = out.slice(i + 1);
    }
    waiters.splice(0).forEach((w) => w());
  });
  const next = async (): Promise<string> => {
    while (lines.length === 0) await new Promise<void>((r) => waiters.push(r));
    return lines.shift()!;
  };
  try {
    assert.equal(await within(20_000, next(), 'server ready'), 'ready');
    const c = await connect(sock);
    const payload = Buffer.alloc(64, 0x67); // the soak's good client: 64 bytes, a 1 s deadline
    const calls = async (n: number): Promise<void> => {
      for (let i = 0; i < n; i++) await c.call('echo', payload, { timeout: 1000 });
    };
    await calls(3000); // warm: compiled, pools filled
    const N = 3000;
    let perCall = Infinity;
    // A collection during the window (V8's idle-time work) spoils it: measured again (3 tries).
    for (let attempt = 0; attempt < 3 && perCall === Infinity; attempt++) {
      child.stdin.write('start\n');
      assert.equal(await next(), 'started');
      await calls(N);
      child.stdin.write('stop\n');
      const r = JSON.parse(await next()) as { bytes: number; gcs: number };
      if (r.gcs === 0) perCall = r.bytes / N;
      else await delay(100);
    }
    await c.close();
    assert.ok(perCall !== Infinity, 'a collection ran during every window');
    // 2,000 measured; before: 3,400 (the deadline's timer, metadata objects, a tick, an array and an
    // Immediate per answer...). Node's socket read and write alone take 1,340 (a hand-written net echo).
    assert.ok(perCall < 2600, `${perCall.toFixed(0)} bytes of garbage per call`);
  } finally {
    child.stdin.write('exit\n');
    await within(10_000, new Promise((r) => child.on('exit', r)), 'server exit').catch(() => child.kill());
  }
});

test('the deadline timer: none for a call answered at once; a handler that answers later is aborted at its deadline, counted from the request', async () => {
  const sock = path.join(dir, 'd.sock');
  const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
  let inside = -1;
  let abortedAfter = -1;
  const srv = createServer({
    handlers: {
      now: () => { inside = timers(); return 1; },
      // Busy for 300 ms before its first await, with a 200 ms deadline: aborted right after, not 200 ms later.
      busy: async (_: unknown, ctx: HandlerContext) => {
        const t0 = performance.now();
        while (performance.now() - t0 < 300) { /* the handler's synchronous part */ }
        const back = performance.now();
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, 5000);
          ctx.signal.addEventListener('abort', () => { clearTimeout(t); abortedAfter = performance.now() - back; resolve(); });
        });
        return 1;
      },
    },
  });
  await srv.listen(sock);
  // (a bare connection: a client in this process would have timers of its own)
  const r = await rawConn(sock);
  const head = encodeRequestHead('now');
  r.s.write(encodeFrame(T.request, 0, 1, 0, head, EMPTY));
  assert.equal((await r.frames()).type, T.response);
  const without = inside;
  r.s.write(encodeFrame(T.request, 0, 2, 5_000_000, head, EMPTY)); // aux: a 5 s deadline (µs)
  assert.equal((await r.frames()).type, T.response);
  r.s.destroy();
  assert.equal(inside, without, 'a call with a deadline answered at once had a timer set while its handler ran');
  const c = await connect(sock);
  try {
    await assert.rejects(c.call('busy', null, { timeout: 200 }), /deadline/);
    await within(5000, (async () => { while (abortedAfter < 0) await delay(5); })(), 'the busy handler aborted');
    assert.ok(abortedAfter < 150, `aborted ${abortedAfter.toFixed(0)} ms after the handler's first return (its deadline had passed)`);
  } finally {
    await c.close();
    await srv.close();
  }
});
