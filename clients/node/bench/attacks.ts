// node dist-test/bench/attacks.js [--hold MS] [--only NAME] [--src DIR]
//
// Some rows of the soak table (issue 25) against the Node server, in a child
// process, at a bounded scale: each attack runs for --hold ms (default 10000)
// while a good client calls echo every 10 ms. Prints, per attack, the server's
// peak RSS, its RSS 2 s after the attack ended (memory kept), the good
// client's failures and p99, and whether every hostile connection was closed.
// --src points at another build of src (e.g. an older one) to compare.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect } from '../src/index.js';
import { encodeHello, encodeFrame, encodeRequestHead, T, FLAG_STREAM } from '../src/frame.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opt = (name: string, def: string): string => { const i = args.indexOf(name); return i >= 0 ? args[i + 1]! : def; };
const hold = Number(opt('--hold', '10000'));
const only = opt('--only', '');
const src = path.resolve(opt('--src', path.join(here, '../src')));
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'udskit-attacks-'));
const MiB = 1 << 20;
const delay = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const hello = encodeHello({ version: 1, flags: 1, maxFrame: 16 << 20, maxInFlight: 0 });

const serverScript = `
import { createServer, stream } from ${JSON.stringify(path.join(src, 'index.js'))};
const item = 'x'.repeat(16 << 10);
const s = createServer({ handlers: {
  echo: (x) => x,
  firehose: stream(async function* () { for (;;) yield item; }),
} });
await s.listen(process.argv[2]);
console.log('ready');
`;

function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m === null ? 0 : Number(m[1]) * 1024;
}

async function rawConn(p: string): Promise<net.Socket> {
  const s = net.connect(p);
  s.on('error', () => {});
  await new Promise((r) => s.once('connect', r));
  s.write(hello);
  return s;
}

const attacks: Record<string, (p: string) => Promise<net.Socket[]>> = {
  // 1,024 server streams opened and never read.
  'streams-1024': async (p) => {
    const head = encodeRequestHead('firehose');
    const out: net.Socket[] = [];
    for (let k = 0; k < 16; k++) {
      const s = await rawConn(p);
      s.pause();
      s.write(Buffer.concat(Array.from({ length: 64 }, (_, i) => encodeFrame(T.request, FLAG_STREAM, i + 1, 0, head, Buffer.alloc(0)))));
      out.push(s);
    }
    return out;
  },
  // 200 never-reading clients sending framed 1 MiB echoes (8 each).
  'echo-1mib-200': async (p) => {
    const head = encodeRequestHead('echo');
    const body = Buffer.from(JSON.stringify('a'.repeat(MiB - 2)));
    const out: net.Socket[] = [];
    for (let k = 0; k < 200; k++) {
      const s = await rawConn(p);
      s.pause();
      for (let i = 1; i <= 8; i++) s.write(encodeFrame(T.request, 0, i, 0, head, body));
      out.push(s);
    }
    return out;
  },
  // 8 connections sending 16 MiB frames in 16-byte chunks, one every ms.
  'chunks-8': async (p) => {
    const out: net.Socket[] = [];
    const frame = encodeFrame(T.request, 0, 1, 0, encodeRequestHead('echo'), Buffer.alloc((16 << 20) - 64, 0x20));
    for (let k = 0; k < 8; k++) {
      const s = await rawConn(p);
      let off = 0;
      const t = setInterval(() => {
        if (s.destroyed || off >= frame.length) return clearInterval(t);
        for (let i = 0; i < 64 && off < frame.length; i++, off += 16) s.write(frame.subarray(off, off + 16));
      }, 1);
      out.push(s);
    }
    return out;
  },
};

async function run(name: string, attack: (p: string) => Promise<net.Socket[]>): Promise<string> {
  const p = path.join(dir, `${name}.sock`);
  const script = path.join(dir, 'server.mjs');
  fs.writeFileSync(script, serverScript);
  const child = spawn(process.execPath, [script, p], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((r) => child.stdout!.once('data', () => r()));
  const pid = child.pid!;
  const base = rss(pid);
  let peak = base;
  const sampler = setInterval(() => { try { peak = Math.max(peak, rss(pid)); } catch { /* gone */ } }, 50);
  const c = await connect(p);
  const lat: number[] = [];
  let failed = 0;
  let over = false;
  const good = (async () => {
    while (!over) {
      const t0 = performance.now();
      try {
        await c.call('echo', { x: 1 }, { timeout: 2000 });
      } catch {
        failed++;
      }
      lat.push(performance.now() - t0);
      await delay(10);
    }
  })();
  const socks = await attack(p);
  const closedBy = socks.map((s) => new Promise<boolean>((r) => { if (s.destroyed) r(true); else s.on('close', () => r(true)); }));
  await delay(hold);
  const serverClosed = (await Promise.all(closedBy.map((x) => Promise.race([x, Promise.resolve(false)])))).filter(Boolean).length;
  for (const s of socks) s.destroy();
  over = true;
  await good;
  await c.close();
  await delay(2000);
  const after = rss(pid);
  clearInterval(sampler);
  child.kill('SIGKILL');
  lat.sort((a, b) => a - b);
  const p99 = lat[Math.floor(lat.length * 0.99)] ?? 0;
  const f = (b: number): string => `${(b / MiB).toFixed(0)} MiB`;
  return `| ${name} | ${f(base)} | ${f(peak)} | ${f(after)} | ${failed} of ${lat.length} | ${p99.toFixed(1)} ms | ${serverClosed} of ${socks.length} |`;
}

console.log(`# node ${process.version}, ${os.cpus().length} cores, load ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}, hold ${hold} ms, src ${src}`);
console.log('| attack | RSS at start | peak RSS | RSS 2 s after | good client failed | good p99 | hostile conns closed by the server during the hold |');
console.log('|---|---|---|---|---|---|---|');
for (const [name, attack] of Object.entries(attacks)) {
  if (only !== '' && !name.includes(only)) continue;
  console.log(await run(name, attack));
}
fs.rmSync(dir, { recursive: true, force: true });
