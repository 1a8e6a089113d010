// The soak's Node server (tools/soak, -server node): the demo methods the
// soak calls (echo, sleep, stream) and _stats, on the Node package's Server,
// with the soak's timeouts under every option name the package may take.
// Usage: node server_node.mjs DIST SOCK TIMEOUT_MS   (DIST: clients/node/dist)
// Prints "ready" once listening; SIGTERM shuts it down.
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [dist, sock, timeoutArg] = process.argv.slice(2);
const t = Number(timeoutArg);
const udskit = await import(pathToFileURL(path.join(dist, 'index.js')).href);
const { Server, raw, stream, UdskitError } = udskit;

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
  _stats: (req) => {
    if (req?.free && typeof globalThis.gc === 'function') {
      globalThis.gc();
      // Where the memory is, in the server's log (-keep-log): V8's heap, Buffers, the rest (RSS).
      const m = process.memoryUsage();
      const mib = (n) => (n / 1048576).toFixed(1);
      process.stderr.write(`memory: rss ${mib(m.rss)} heapTotal ${mib(m.heapTotal)} heapUsed ${mib(m.heapUsed)} external ${mib(m.external)} arrayBuffers ${mib(m.arrayBuffers)} MiB\n`);
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
