// node dist-test/bench/bidi.js [--rounds 5] [--duration 1000] [--warmup 200] [--json FILE]
//
// Bidi ping-pong versus a unary call, per round trip (issue 30): this
// client against Go's `udskit serve` (demo `sum`, and unary `echo` of the
// same JSON number) and against this package's server (the same two
// methods), one caller, interleaved rounds. Reports the median over rounds
// of round trips per second and p50/p99 in µs.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect, createServer, bidi, type Client } from '../src/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const pkgDir = path.resolve(here, '../..');
const repoDir = path.resolve(pkgDir, '../..');

const args = { rounds: 5, duration: 1000, warmup: 200, json: '' };
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i]!.replace(/^--/, '');
  if (!(k in args)) { console.error(`bench/bidi: unknown argument ${process.argv[i]}`); process.exit(2); }
  (args as Record<string, unknown>)[k] = k === 'json' ? process.argv[i + 1] : Number(process.argv[i + 1]);
}

type Trip = () => Promise<unknown>;

async function measure(trip: Trip): Promise<{ rps: number; p50: number; p99: number }> {
  const end0 = performance.now() + args.warmup;
  while (performance.now() < end0) await trip();
  const lat: number[] = [];
  const t0 = performance.now();
  while (performance.now() - t0 < args.duration) {
    const s = performance.now();
    await trip();
    lat.push(performance.now() - s);
  }
  const el = performance.now() - t0;
  lat.sort((a, b) => a - b);
  const q = (p: number): number => Math.round(lat[Math.min(lat.length - 1, Math.floor(p * lat.length))]! * 1000);
  return { rps: Math.round(lat.length / (el / 1000)), p50: q(0.5), p99: q(0.99) };
}

async function trips(c: Client): Promise<{ unary: Trip; bidi: Trip; close: () => Promise<void> }> {
  const call = c.bidiJSON<number, number>('sum');
  let n = 0;
  return {
    unary: () => c.call('echo', 1),
    bidi: async () => {
      await call.write(n & 1 ? 1 : -1); // keeps the running total small
      n++;
      const r = await call.next();
      if (r.done) throw new Error('bidi stream ended');
    },
    close: async () => { await call.end(); await c.close(); },
  };
}

async function main(): Promise<void> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'udskit-bench-bidi-'));
  const bin = process.env.UDSKIT_BIN ?? path.join(pkgDir, 'dist-test', 'udskit');
  if (!fs.existsSync(bin)) execFileSync('go', ['build', '-o', bin, './cmd/udskit'], { cwd: repoDir, stdio: 'inherit' });
  const gsock = path.join(dir, 'go.sock');
  const go: ChildProcess = spawn(bin, ['serve', gsock, '-q'], { stdio: ['ignore', 'pipe', 'inherit'] });
  process.on('exit', () => go.kill('SIGKILL'));
  await new Promise<void>((r) => { let o = ''; go.stdout!.on('data', (d) => { o += d; if (o.includes('listening on')) r(); }); });
  const nsock = path.join(dir, 'node.sock');
  const srv = createServer({ handlers: {
    echo: (v: unknown) => v,
    sum: bidi(async function* (ns) { let t = 0; for await (const x of ns) yield (t += x as number); }),
  } });
  await srv.listen(nsock);
  const servers = { go: await trips(await connect(gsock)), node: await trips(await connect(nsock)) };
  const res: Record<string, { rps: number; p50: number; p99: number }[]> = {};
  for (let r = 0; r < args.rounds; r++) {
    for (const [sname, t] of Object.entries(servers)) {
      for (const kind of ['unary', 'bidi'] as const) {
        const s = await measure(t[kind]);
        (res[`${sname}/${kind}`] ??= []).push(s);
        process.stderr.write(`round ${r + 1}/${args.rounds} ${sname} server ${kind.padEnd(5)} ${String(s.rps).padStart(6)} trips/s  p50 ${s.p50}µs  p99 ${s.p99}µs\n`);
      }
    }
  }
  for (const t of Object.values(servers)) await t.close();
  await srv.close();
  go.kill('SIGTERM');
  const med = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
  const rows = Object.entries(res).map(([k, ss]) => ({ row: k, rps: med(ss.map((s) => s.rps)), p50_us: med(ss.map((s) => s.p50)), p99_us: med(ss.map((s) => s.p99)) }));
  console.log('| server / call | round trips/s | p50 µs | p99 µs |');
  console.log('|---|---:|---:|---:|');
  for (const r of rows) console.log(`| ${r.row} | ${r.rps} | ${r.p50_us} | ${r.p99_us} |`);
  for (const s of ['go', 'node']) {
    const u = rows.find((r) => r.row === `${s}/unary`)!;
    const b = rows.find((r) => r.row === `${s}/bidi`)!;
    console.log(`${s} server: bidi/unary round trips ${(b.rps / u.rps).toFixed(2)}x, p50 ${b.p50_us} vs ${u.p50_us} µs`);
  }
  if (args.json) fs.writeFileSync(args.json, JSON.stringify({ command: `node dist-test/bench/bidi.js ${process.argv.slice(2).join(' ')}`.trim(), when: new Date().toISOString(), loadavg: os.loadavg(), results: rows }, null, 1) + '\n');
  fs.rmSync(dir, { recursive: true, force: true });
  process.exit(0);
}

main().catch((e) => { console.error('bench/bidi:', e); process.exit(1); });
