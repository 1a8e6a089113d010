// An app in a pod calling its sidecar with the udskit Node package
// (clients/node/dist, given as UDSKIT_NODE_DIST): connect({ wait: true })
// waits for the sidecar; on SIGTERM the app keeps calling for SHUTDOWN_MS
// (its own graceful shutdown), then closes the client and exits. Used by
// cmd/udskit/podlife_test.go.
//
// stdout: {"event":"ready"} after the first answered call, then
// {"event":"done",...counters} once the client is closed.
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const { connect } = await import(pathToFileURL(path.join(process.env.UDSKIT_NODE_DIST, 'index.js')).href);
const sock = process.env.SOCK;
const shutdownMs = Number(process.env.SHUTDOWN_MS ?? 3000);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');

let termAt = 0;
process.on('SIGTERM', () => {
  if (!termAt) termAt = Date.now();
});

const stats = { calls: 0, failed: 0, failedBeforeTerm: 0, codes: {}, errors: [] };
const c = await connect(sock, { wait: true, timeout: 30000 });
let ready = false;
for (let n = 0; ; n++) {
  if (termAt && Date.now() - termAt >= shutdownMs) break;
  stats.calls++;
  try {
    const res = await c.call('echo', { n }, { timeout: 1000 });
    if (!res || res.n !== n) throw new Error(`echo answered ${JSON.stringify(res)} for n=${n}`);
    if (!ready) {
      ready = true;
      out({ event: 'ready' });
    }
  } catch (err) {
    stats.failed++;
    // Calls fail fast once the sidecar is gone (spec 4.2): let a SIGTERM sent
    // together with the sidecar's be handled before calling this failure early.
    if (!termAt) await sleep(50);
    if (!termAt) stats.failedBeforeTerm++;
    stats.codes[err.code ?? 'none'] = (stats.codes[err.code ?? 'none'] ?? 0) + 1;
    if (stats.errors.length < 5) stats.errors.push(`${termAt ? `${Date.now() - termAt} ms after SIGTERM` : 'before SIGTERM'}: ${err.code ?? ''} ${err.message}`);
  }
  await sleep(10);
}
await c.close();
out({ event: 'done', ...stats });
process.exit(0);
