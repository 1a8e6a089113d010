// npm run bench -- [--json FILE] [--rounds N] [--duration MS] [--cases ...] [--clients ...]
//
// Side by side, interleaved (A B C A B C ...), against Go servers in child processes:
//   udskit   this package's client -> `udskit serve` (Go)
//   ndjson   a minimal hand-written newline-JSON client (the seed-002 approach) -> the same socket
//   grpc-js  @grpc/grpc-js -> grpc-go echo (tools/grpcecho) over a unix socket
// Every client sends the same JSON value and returns it parsed. Reports, per case and client,
// the median over rounds of requests/s and of p50/p99 latency in µs.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect } from '../src/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const pkgDir = path.resolve(here, '../..');
const repoDir = path.resolve(pkgDir, '../..');

interface Args { json?: string; rounds: number; duration: number; warmup: number; cases?: string[]; clients?: string[] }

function parseArgs(argv: string[]): Args {
  const a: Args = { rounds: 5, duration: 1500, warmup: 300 };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case '--json': a.json = v; i++; break;
      case '--rounds': a.rounds = Number(v); i++; break;
      case '--duration': a.duration = Number(v); i++; break;
      case '--warmup': a.warmup = Number(v); i++; break;
      case '--cases': a.cases = v!.split(','); i++; break;
      case '--clients': a.clients = v!.split(','); i++; break;
      case '-h': case '--help':
        console.log('usage: npm run bench -- [--json FILE] [--rounds 5] [--duration 1500] [--warmup 300] [--cases c1-64,c16-1k] [--clients udskit,ndjson,grpc-js]\n  profile this client: node --cpu-prof dist-test/bench/bench.js --clients udskit --cases c16-1k');
        process.exit(0);
        break;
      default:
        console.error(`bench: unknown argument ${argv[i]}`);
        process.exit(2);
    }
  }
  return a;
}

/** Builds a Go binary unless an env var names one. */
function goBin(env: string, pkg: string, out: string): string {
  const given = process.env[env];
  if (given) return given;
  const p = path.join(pkgDir, 'dist-test', out);
  if (!fs.existsSync(p)) execFileSync('go', ['build', '-o', p, pkg], { cwd: repoDir, stdio: 'inherit' });
  return p;
}

function start(bin: string, args: string[], ready: string): Promise<ChildProcess> {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, args, { stdio: ['pipe', 'pipe', 'inherit'] });
    let out = '';
    p.stdout!.on('data', (d) => {
      out += d;
      if (out.includes(ready)) resolve(p);
    });
    p.on('exit', (code) => reject(new Error(`${bin} exited (${code})`)));
    process.on('exit', () => p.kill('SIGKILL'));
  });
}

type CallFn = (v: unknown) => Promise<unknown>;
interface Bench { name: string; call: CallFn; close(): Promise<void> | void }

/** The seed-002 client, minimal: ids, a pending map, a timeout per request, newline framing. */
async function ndjsonClient(sock: string): Promise<Bench> {
  const s = net.createConnection({ path: sock });
  await new Promise((r) => s.once('connect', r));
  const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  let id = 0;
  let rest = '';
  s.setEncoding('utf8');
  s.on('data', (chunk: string) => {
    let data = rest + chunk;
    let nl = data.indexOf('\n');
    let start = 0;
    while (nl >= 0) {
      const res = JSON.parse(data.slice(start, nl));
      const p = pending.get(res.id);
      if (p) {
        pending.delete(res.id);
        clearTimeout(p.timer);
        if (res.error) p.reject(new Error(res.error));
        else p.resolve(res.data);
      }
      start = nl + 1;
      nl = data.indexOf('\n', start);
    }
    rest = data.slice(start);
    data = '';
  });
  return {
    name: 'ndjson',
    call: (v) => new Promise((resolve, reject) => {
      id = (id + 1) % 131071;
      const my = id;
      s.write(`${JSON.stringify({ id: my, func: 'echo', data: v })}\n`);
      pending.set(my, { resolve, reject, timer: setTimeout(() => { pending.delete(my); reject(new Error('timeout')); }, 30_000) });
    }),
    close: () => { s.destroy(); },
  };
}

async function udskitClient(sock: string): Promise<Bench> {
  const c = await connect(sock);
  return { name: 'udskit', call: (v) => c.call('echo', v), close: () => c.close() };
}

async function grpcClient(sock: string): Promise<Bench> {
  const grpc = await import('@grpc/grpc-js');
  const client = new grpc.Client('unix:' + sock, grpc.credentials.createInsecure());
  await new Promise<void>((resolve, reject) => client.waitForReady(Date.now() + 10_000, (e) => (e ? reject(e) : resolve())));
  const ser = (v: unknown): Buffer => Buffer.from(JSON.stringify(v));
  const de = (b: Buffer): unknown => JSON.parse(b.toString('utf8'));
  return {
    name: 'grpc-js',
    call: (v) => new Promise((resolve, reject) => {
      client.makeUnaryRequest('/udskit.bench.Echo/Echo', ser, de, v, (err, res) => (err ? reject(err) : resolve(res)));
    }),
    close: () => client.close(),
  };
}

interface Sample { rps: number; p50: number; p99: number; n: number; cpu: number }

async function measure(b: Bench, callers: number, value: unknown, warmup: number, duration: number): Promise<Sample> {
  const lat: number[] = [];
  let recording = false;
  let stop = false;
  const worker = async (): Promise<void> => {
    while (!stop) {
      const t0 = performance.now();
      await b.call(value);
      if (recording) lat.push(performance.now() - t0);
    }
  };
  const ws = Array.from({ length: callers }, worker);
  await new Promise((r) => setTimeout(r, warmup));
  recording = true;
  const t0 = performance.now();
  const u0 = process.cpuUsage();
  await new Promise((r) => setTimeout(r, duration));
  recording = false;
  const u = process.cpuUsage(u0);
  const elapsed = performance.now() - t0;
  stop = true;
  await Promise.all(ws);
  lat.sort((x, y) => x - y);
  const q = (p: number): number => Math.round(lat[Math.min(lat.length - 1, Math.floor(p * lat.length))]! * 1000);
  return { rps: Math.round(lat.length / (elapsed / 1000)), p50: q(0.5), p99: q(0.99), n: lat.length, cpu: Math.round((10 * (u.user + u.system)) / Math.max(1, lat.length)) / 10 };
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : Math.round((s[m - 1]! + s[m]!) / 2);
};

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const loadBefore = os.loadavg();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'udskit-bench-'));
  const udskitBin = goBin('UDSKIT_BIN', './cmd/udskit', 'udskit');
  const grpcBin = goBin('UDSKIT_GRPCECHO_BIN', './tools/grpcecho', 'grpcecho');
  const sock = path.join(dir, 'udskit.sock');
  const gsock = path.join(dir, 'grpc.sock');
  const srv = await start(udskitBin, ['serve', sock, '-q'], 'listening on');
  const gsrv = await start(grpcBin, ['--addr', gsock], 'READY');
  const makers: [string, () => Promise<Bench>][] = [['udskit', () => udskitClient(sock)], ['ndjson', () => ndjsonClient(sock)], ['grpc-js', () => grpcClient(gsock)]];
  const clients: Bench[] = [];
  for (const [name, make] of makers) if (args.clients === undefined || args.clients.includes(name)) clients.push(await make());
  const cases = [
    { name: 'c1-64', callers: 1, bytes: 64 },
    { name: 'c16-1k', callers: 16, bytes: 1024 },
  ].filter((c) => args.cases === undefined || args.cases.includes(c.name));
  const results: Record<string, Record<string, Sample[]>> = {};
  for (const k of cases) {
    const value = 'x'.repeat(k.bytes - 2); // JSON-encoded: exactly k.bytes bytes
    results[k.name] = {};
    for (let r = 0; r < args.rounds; r++) {
      for (const c of clients) {
        const s = await measure(c, k.callers, value, args.warmup, args.duration);
        (results[k.name]![c.name] ??= []).push(s);
        process.stderr.write(`${k.name} round ${r + 1}/${args.rounds} ${c.name.padEnd(8)} ${String(s.rps).padStart(7)} req/s  p50 ${s.p50}µs  p99 ${s.p99}µs  client CPU ${s.cpu}µs/call\n`);
      }
    }
  }
  for (const c of clients) await c.close();
  srv.kill('SIGTERM');
  gsrv.kill('SIGTERM');
  const rows: { case: string; callers: number; bytes: number; client: string; rps: number; p50_us: number; p99_us: number; client_cpu_us_per_call: number; rounds: Sample[] }[] = [];
  for (const k of cases) {
    for (const c of clients) {
      const ss = results[k.name]![c.name]!;
      rows.push({ case: k.name, callers: k.callers, bytes: k.bytes, client: c.name, rps: median(ss.map((s) => s.rps)), p50_us: median(ss.map((s) => s.p50)), p99_us: median(ss.map((s) => s.p99)), client_cpu_us_per_call: median(ss.map((s) => s.cpu * 10)) / 10, rounds: ss });
    }
  }
  const loadAfter = os.loadavg();
  const out = {
    command: `npm run bench -- ${process.argv.slice(2).join(' ')}`.trim(),
    when: new Date().toISOString(),
    conditions: { node: process.version, cpus: os.cpus().length, cpu: os.cpus()[0]?.model, loadavg_before: loadBefore, loadavg_after: loadAfter, rounds: args.rounds, duration_ms: args.duration },
    results: rows,
  };
  console.log('| case | client | req/s | p50 µs | p99 µs | client CPU µs/call |');
  console.log('|---|---|---:|---:|---:|---:|');
  for (const r of rows) console.log(`| ${r.callers} caller${r.callers > 1 ? 's' : ''}, ${r.bytes} B | ${r.client} | ${r.rps} | ${r.p50_us} | ${r.p99_us} | ${r.client_cpu_us_per_call} |`);
  for (const k of cases) {
    if (clients.length < 3) break;
    const get = (n: string) => rows.find((r) => r.case === k.name && r.client === n)!;
    const u = get('udskit');
    console.log(`${k.name}: udskit/ndjson req/s ${(u.rps / get('ndjson').rps).toFixed(2)}x, p50 ${u.p50_us} vs ${get('ndjson').p50_us} µs; udskit/grpc-js req/s ${(u.rps / get('grpc-js').rps).toFixed(2)}x, p99 ${u.p99_us} vs ${get('grpc-js').p99_us} µs`);
  }
  if (args.json) fs.writeFileSync(args.json, JSON.stringify(out, null, 1) + '\n');
  fs.rmSync(dir, { recursive: true, force: true });
}

main().catch((e) => {
  console.error('bench:', e);
  process.exit(1);
});
