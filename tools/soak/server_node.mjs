// The soak's Node server (tools/soak, -server node): the demo methods the
// soak calls (echo, sleep, stream) and _stats, on the Node package's Server,
// with the soak's timeouts under every option name the package may take.
// Usage: node server_node.mjs DIST SOCK TIMEOUT_MS   (DIST: clients/node/dist)
// Prints "ready" once listening; SIGTERM shuts it down.
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import fs from 'node:fs';
import v8 from 'node:v8';
import { monitorEventLoopDelay } from 'node:perf_hooks';

const [dist, sock, timeoutArg] = process.argv.slice(2);
const t = Number(timeoutArg);
const udskit = await import(pathToFileURL(path.join(dist, 'index.js')).href);
const { Server, raw, stream, UdskitError } = udskit;

// RSS by kind of mapping (UDSKIT_SOAK_SMAPS=1): the brk heap (glibc's main
// arena), other anonymous mappings by size class (V8 pages, glibc thread
// arenas of 64 MiB, mmap'd Buffers), and the rest (code, files).
function smaps() {
  const kinds = new Map();
  let cur = null;
  for (const l of fs.readFileSync('/proc/self/smaps', 'utf8').split('\n')) {
    const m = /^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$/.exec(l);
    if (m) {
      const size = (parseInt(m[2], 16) - parseInt(m[1], 16)) / 1024;
      const name = m[3];
      cur = name === '[heap]' ? 'brk heap' : name !== '' ? 'files/other' : size >= 65536 ? 'anon >=64MiB' : size >= 1024 ? 'anon 1-64MiB' : 'anon <1MiB';
      continue;
    }
    const r = /^Rss:\s+(\d+) kB/.exec(l);
    if (r && cur) kinds.set(cur, (kinds.get(cur) ?? 0) + Number(r[1]));
  }
  return [...kinds].map(([k, v]) => `${k} ${(v / 1024).toFixed(1)}`).join(', ');
}

let baselineLogged = false;
// How long the event loop was held up since the last log (every good call waits behind it).
const loopDelay = monitorEventLoopDelay({ resolution: 5 });
loopDelay.enable();

const sleepMs = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });

const handlers = {
  echo: raw((req) => req),
  sleep: async (req, ctx) => {
    const ms = req?.ms ?? 0;
    if (typeof ms !== 'number' || ms < 0 || ms > 60000) throw new UdskitError('invalid_argument', `sleep: ms ${ms} out of range 0..60000`);
    await sleepMs(ms, ctx.signal);
    return { slept_ms: ms };
  },
  stream: stream(async function* (req, ctx) {
    const n = Math.min(req?.n ?? 0, 100000);
    const iv = Math.min(req?.interval_ms ?? 0, 10000);
    for (let i = 0; i < n; i++) {
      if (i && iv) await sleepMs(iv, ctx.signal);
      yield { i, n };
    }
  }),
  _stats: async (req) => {
    const free = req?.free && typeof globalThis.gc === 'function';
    if (free) {
      globalThis.gc();
      // V8 sweeps and frees ArrayBuffers and pages on background threads after the
      // collection: what memoryUsage() says at once still counts them (125 MiB of
      // Buffers "left" after the stalled frames that were gone 100 ms later).
      await new Promise((r) => setTimeout(r, 100));
    }
    if (free || !baselineLogged) {
      // Where the memory is, in the server's log (-keep-log): V8's heap, Buffers, the rest (RSS);
      // first at the baseline (the soak's first _stats), then after each attack.
      baselineLogged = true;
      const m = process.memoryUsage();
      const mib = (n) => (n / 1048576).toFixed(1);
      const ms = (ns) => (ns / 1e6).toFixed(1);
      process.stderr.write(`memory${free ? '' : ' (baseline)'}: rss ${mib(m.rss)} heapTotal ${mib(m.heapTotal)} heapUsed ${mib(m.heapUsed)} external ${mib(m.external)} arrayBuffers ${mib(m.arrayBuffers)} MiB; event loop delay p99 ${ms(loopDelay.percentile(99))} max ${ms(loopDelay.max)} ms\n`);
      loopDelay.reset();
      if (process.env.UDSKIT_SOAK_SMAPS) {
        // V8's spaces, and RSS by kind of mapping (UDSKIT_SOAK_SMAPS=1).
        const spaces = v8.getHeapSpaceStatistics().filter((s) => s.space_size > 0).map((s) => `${s.space_name} ${mib(s.space_size)}/${mib(s.space_used_size)}`).join(', ');
        process.stderr.write(`  v8 spaces (size/used MiB): ${spaces}\n  rss by mapping (MiB): ${smaps()}\n`);
      }
    }
    return { goroutines: process.getActiveResourcesInfo().length, conns: server.conns?.size ?? -1 };
  },
};

// The soak's timeouts, under today's option names and those the issue asks
// for (the same as Go's where the language allows); unknown keys are ignored.
const server = new Server({
  handlers,
  helloTimeout: t, handshakeTimeout: t, stallTimeout: t, frameTimeout: t, writeTimeout: t, idleTimeout: t,
  onError: () => {},
});
await server.listen(sock);
process.on('SIGTERM', () => { server.close?.() ?? server.shutdown?.({ timeout: 1000 }); setTimeout(() => process.exit(0), 1500).unref(); });
process.stdout.write('ready\n');
