// Node client -> Go `udskit serve tls:` with mutual TLS and a SPIFFE policy: the handler sees the
// client's SPIFFE ID; a workload the policy does not name, a client from another CA and a client
// without TLS options are refused with an error that names the reason.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { connect, UdskitError } from '../src/index.js';
import { startGo, type GoServer } from './helpers.js';
import { makeCA } from './tlsutil.js';

const WEB = 'spiffe://prod.example/ns/app/sa/web';
const DB = 'spiffe://prod.example/ns/app/sa/db';

const pki = makeCA('test');
const server = pki.issue('server', `DNS:localhost,IP:127.0.0.1,URI:${DB}`);
const web = pki.issue('web', `URI:${WEB}`);
const batch = pki.issue('batch', 'URI:spiffe://prod.example/ns/app/sa/batch');
const other = makeCA('other');
const stranger = other.issue('stranger', `URI:${WEB}`);
const read = (p: string): Buffer => fs.readFileSync(p);
let go: GoServer;

before(async () => {
  go = await startGo('tls:127.0.0.1:0', ['--tls-cert', server.cert, '--tls-key', server.key, '--tls-ca', pki.ca, '--allow-spiffe', WEB]);
});
after(async () => { await go.kill(); });


test('mutual TLS: the Go handler sees the Node client\'s SPIFFE ID; the server is checked by its SPIFFE ID and by name', async () => {
  for (const tlsOpts of [
    { ca: read(pki.ca), cert: read(web.cert), key: read(web.key), serverSpiffeId: DB },
    { ca: read(pki.ca), cert: read(web.cert), key: read(web.key) },
  ]) {
    const c = await connect(go.listening, { tls: tlsOpts, reconnect: false });
    try {
      const who = await c.call<{ spiffe_id: string }>('whoami');
      assert.equal(who.spiffe_id, WEB);
      assert.deepEqual(await c.call('echo', { over: 'tls' }), { over: 'tls' });
    } finally {
      await c.close();
    }
  }
});

async function refused(opts: Parameters<typeof connect>[1], want: RegExp): Promise<void> {
  try {
    const c = await connect(go.listening, { reconnect: false, ...opts });
    await c.close();
  } catch (e) {
    assert.ok(e instanceof UdskitError, String(e));
    assert.match(e.message, want);
    return;
  }
  assert.fail('connected');
}

test('refusals name the reason', async () => {
  await refused({ tls: { ca: read(pki.ca), cert: read(batch.cert), key: read(batch.key) } }, /peer policy/);
  await refused({ tls: { ca: read(pki.ca), cert: read(stranger.cert), key: read(stranger.key) } }, /unknown CA|bad certificate|refused/);
  await refused({ tls: { ca: read(pki.ca) } }, /requires a client certificate/);
  await refused({ tls: { ca: read(other.ca), cert: read(web.cert), key: read(web.key) } }, /unknown CA/);
  await refused({ tls: { ca: read(pki.ca), cert: read(web.cert), key: read(web.key), serverSpiffeId: WEB } }, /SPIFFE ID mismatch/);
  await refused({}, /no plaintext fallback/);
});
