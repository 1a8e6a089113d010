// Test helpers: the Go binary, temp dirs, starting `udskit serve`, raw udskit connections.
import { after } from 'node:test';
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { encodeHello, decodeHello, decodeFrame, type Frame } from '../src/frame.js';

const here = path.dirname(fileURLToPath(import.meta.url));

// node:test (Node 20) waits for a test file's process to exit; a failed test
// that leaves a socket open would hang the run. After the last test, exit
// with the file's result if something still holds the event loop.
after(() => {
  setTimeout(() => process.exit(), 3000).unref();
});
/** clients/node */
export const pkgDir = path.resolve(here, '../..');
/** The repository root. */
export const repoDir = path.resolve(pkgDir, '../..');
/** The Go udskit CLI (scripts/build-go.sh builds it before the tests). */
export const udskitBin = process.env.UDSKIT_BIN ?? path.join(pkgDir, 'dist-test/udskit');

export function readJSON<T = any>(rel: string): T {
  return JSON.parse(fs.readFileSync(path.join(repoDir, rel), 'utf8')) as T;
}

/** A private temp dir removed at exit. */
export function tmpDir(): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'udskit-node-'));
  process.on('exit', () => fs.rmSync(d, { recursive: true, force: true }));
  return d;
}

export interface GoServer {
  proc: ChildProcess;
  addr: string;
  /** The address serve printed ("listening on ADDR"): the real port for tcp:/tls: port 0. */
  listening: string;
  stderr: () => string;
  /** SIGKILL and wait. */
  kill(): Promise<void>;
  /** SIGTERM and wait for exit. */
  term(): Promise<number | null>;
}

/** Starts `udskit serve ADDR ...args` and waits for its "listening on" line. */
export function startGo(addr: string, args: string[] = []): Promise<GoServer> {
  return new Promise((resolve, reject) => {
    const proc = spawn(udskitBin, ['serve', addr, '-q', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    const exited = new Promise<number | null>((r) => proc.on('exit', (code) => r(code)));
    proc.stderr!.on('data', (d) => { err += d; });
    proc.stdout!.on('data', (d) => {
      out += d;
      if (out.includes('listening on')) {
        resolve({
          proc, addr, listening: /listening on (\S+)/.exec(out)?.[1] ?? addr, stderr: () => err,
          kill: async () => { proc.kill('SIGKILL'); await exited; },
          term: async () => { proc.kill('SIGTERM'); return exited; },
        });
      }
    });
    proc.on('error', reject);
    void exited.then((code) => reject(new Error(`udskit serve exited (${code}) before listening: ${err}`)));
    setTimeout(() => reject(new Error('udskit serve did not start in 10s')), 10_000).unref();
    process.on('exit', () => proc.kill('SIGKILL'));
  });
}

/** Runs the Go CLI and collects its output. */
export function runGo(args: string[], input?: Buffer | string, timeoutMs = 20_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const proc = spawn(udskitBin, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    proc.stdout.on('data', (d) => { stdout += d; });
    proc.stderr.on('data', (d) => { stderr += d; });
    const t = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error(`udskit ${args.join(' ')} timed out`)); }, timeoutMs);
    proc.on('error', reject);
    proc.on('close', (code) => { clearTimeout(t); resolve({ code, stdout, stderr }); });
    proc.stdin.end(input);
  });
}

/** Rejects if p does not settle within ms. */
export async function within<T>(ms: number, p: Promise<T>, what = 'operation'): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, rej) => { t = setTimeout(() => rej(new Error(`${what} did not settle within ${ms}ms`)), ms); })]);
  } finally {
    clearTimeout(t);
  }
}

export const delay = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A client hello asking for a 1 MiB max frame. */
export const clientHello = encodeHello({ version: 1, flags: 1, maxFrame: 1 << 20, maxInFlight: 0 });

/** A raw udskit connection for byte-level checks: sends clientHello, checks the server's, then reads frames. */
export async function rawConn(p: string): Promise<{ s: net.Socket; frames: () => Promise<Frame> }> {
  const s = net.connect(p);
  await new Promise((r) => s.once('connect', r));
  s.write(clientHello);
  let buf = Buffer.alloc(0);
  const waiters: (() => void)[] = [];
  s.on('data', (d) => { buf = Buffer.concat([buf, d]); waiters.splice(0).forEach((w) => w()); });
  const take = async (n: number): Promise<Buffer> => {
    while (buf.length < n) await new Promise<void>((r) => waiters.push(r));
    const out = buf.subarray(0, n);
    buf = buf.subarray(n);
    return out;
  };
  decodeHello(await take(16));
  return {
    s,
    frames: async () => {
      const h = await take(16);
      const total = h.readUInt16LE(2) + h.readUInt32LE(8);
      return decodeFrame(Buffer.concat([h, await take(total)]), 1 << 20);
    },
  };
}
