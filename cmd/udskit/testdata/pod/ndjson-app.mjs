// An app in a pod calling its sidecar the way the Pipedrive article's client
// does (newline-delimited JSON {"id","func","data"} over a unix socket, the
// socket file awaited before connecting, reconnect when the connection
// ends), with the article's shutdown: on SIGTERM it keeps calling for
// SHUTDOWN_MS (its own graceful shutdown), then closes its connection and
// exits. Used by cmd/udskit/podlife_test.go.
//
// Environment: SOCK (the sidecar's socket), SHUTDOWN_MS (default 3000),
// RECONNECT_MS (during the shutdown, close the connection once this many ms
// after SIGTERM and call on over a new one; 0: never).
// stdout: {"event":"ready"} after the first answered call, {"event":"dropped"}
// when it has closed its connection for RECONNECT_MS, then
// {"event":"done",...counters} once its connection has closed.
import fs from 'node:fs';
import net from 'node:net';
import readline from 'node:readline';

const sock = process.env.SOCK;
const shutdownMs = Number(process.env.SHUTDOWN_MS ?? 3000);
const reconnectMs = Number(process.env.RECONNECT_MS ?? 0);
const callTimeoutMs = 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');

const stats = { calls: 0, failed: 0, failedBeforeTerm: 0, connects: 0, errors: [] };
let client = null; // the open connection, or null
let connecting = null; // the connect in progress
let nextId = 0;
const pending = new Map(); // id -> { resolve, reject, timer, conn }

const waitSocket = async () => {
  for (;;) {
    try {
      fs.accessSync(sock, fs.constants.R_OK | fs.constants.W_OK);
      return;
    } catch {
      await sleep(50);
    }
  }
};

// connectOnce opens one connection; it rejects if the connect fails.
const connectOnce = () =>
  new Promise((resolve, reject) => {
    const c = net.createConnection({ path: sock });
    let up = false;
    c.on('connect', () => {
      up = true;
      stats.connects++;
      client = c;
      resolve();
    });
    c.on('error', (err) => {
      if (!up) {
        reject(err);
        return;
      }
      console.warn(`sidecar connection error: ${err.message}`);
    });
    const rl = readline.createInterface({ input: c, crlfDelay: Infinity });
    rl.on('line', (line) => {
      let res;
      try {
        res = JSON.parse(line);
      } catch {
        console.warn(`sidecar sent a line that is not JSON: ${line}`);
        return;
      }
      const p = pending.get(res.id);
      if (!p) return;
      pending.delete(res.id);
      clearTimeout(p.timer);
      if (res.error) p.reject(new Error(`error ${JSON.stringify(res.error)}`));
      else p.resolve(res.data);
    });
    c.on('close', () => {
      rl.close();
      if (client === c) client = null;
      for (const [id, p] of pending) {
        if (p.conn !== c) continue;
        pending.delete(id);
        clearTimeout(p.timer);
        p.reject(new Error('connection closed with the call in flight'));
      }
    });
  });

// ensureConnected waits for the socket file and connects; a refused or
// missing socket (the sidecar binding, or not up yet) is retried quietly.
const ensureConnected = () => {
  if (client) return Promise.resolve();
  if (!connecting) {
    connecting = (async () => {
      for (;;) {
        await waitSocket();
        try {
          await connectOnce();
          return;
        } catch (err) {
          if (err.code !== 'ECONNREFUSED' && err.code !== 'ENOENT') console.warn(`sidecar connect: ${err.message}`);
          await sleep(50);
        }
      }
    })().finally(() => {
      connecting = null;
    });
  }
  return connecting;
};

const call = async (func, data) => {
  const deadline = Date.now() + callTimeoutMs;
  let timer;
  await Promise.race([
    ensureConnected(),
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error('no connection to the sidecar within the call timeout')), callTimeoutMs);
    }),
  ]).finally(() => clearTimeout(timer));
  const conn = client;
  if (!conn) throw new Error('the connection closed before the call was sent');
  const id = ++nextId;
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      pending.delete(id);
      reject(new Error('request to sidecar timed out'));
    }, Math.max(1, deadline - Date.now()));
    pending.set(id, { resolve, reject, timer: t, conn });
    conn.write(`${JSON.stringify({ id, func, data })}\n`);
  });
};

let termAt = 0;
process.on('SIGTERM', () => {
  if (!termAt) termAt = Date.now();
});

await ensureConnected(); // like the article: wait for the sidecar before serving
let ready = false;
let reconnected = false;
for (let n = 0; ; n++) {
  if (termAt && Date.now() - termAt >= shutdownMs) break;
  if (termAt && reconnectMs > 0 && !reconnected && Date.now() - termAt >= reconnectMs && client) {
    reconnected = true;
    const c = client;
    const closed = new Promise((r) => c.once('close', r));
    c.end();
    await closed;
    out({ event: 'dropped' });
  }
  stats.calls++;
  try {
    const res = await call('echo', { n });
    if (!res || res.n !== n) throw new Error(`echo answered ${JSON.stringify(res)} for n=${n}`);
    if (!ready) {
      ready = true;
      out({ event: 'ready' });
    }
  } catch (err) {
    stats.failed++;
    if (!termAt) stats.failedBeforeTerm++;
    if (stats.errors.length < 5) stats.errors.push(`${termAt ? `${Date.now() - termAt} ms after SIGTERM` : 'before SIGTERM'}: ${err.message}`);
  }
  await sleep(10);
}
if (client) {
  const c = client;
  const closed = new Promise((r) => c.once('close', r));
  c.end();
  await closed;
}
out({ event: 'done', ...stats });
process.exit(0);
