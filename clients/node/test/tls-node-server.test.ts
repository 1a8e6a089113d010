// Go client (udskit call) -> Node server on tls: with a SPIFFE policy: the Node handler sees the
// Go client's SPIFFE ID in ctx.peer; a workload the policy does not name is refused before any
// handler runs. And Node client -> Node server over tls:.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createServer, connect, UdskitError, type Server, type Peer, anyPeer, allPeers, allowSpiffeIds, allowDnsNames, allowAnyVerified } from '../src/index.js';
import { runGo } from './helpers.js';
import { makeCA } from './tlsutil.js';

const WEB = 'spiffe://prod.example/ns/app/sa/web';
const pki = makeCA('nodesrv');
const server = pki.issue('nodesrv-server', 'DNS:localhost,IP:127.0.0.1,URI:spiffe://prod.example/ns/app/sa/db');
const web = pki.issue('nodesrv-web', `URI:${WEB}`);
const batch = pki.issue('nodesrv-batch', 'URI:spiffe://prod.example/ns/app/sa/batch');
let srv: Server;
let addr: string;
let calls = 0;
const refusals: string[] = [];

before(async () => {
  srv = createServer({
    handlers: { who: (_req: unknown, ctx) => { calls++; return { spiffe_id: ctx.peer?.spiffeId, subject: ctx.peer?.subject }; } },
    onError: (e) => refusals.push(e.message),
  });
  addr = await srv.listen('tls:127.0.0.1:0', {
    tls: { cert: fs.readFileSync(server.cert), key: fs.readFileSync(server.key), ca: fs.readFileSync(pki.ca), allowSpiffe: [WEB] },
  });
});
after(async () => { await srv.close(); });

const goTLS = (leaf: { cert: string; key: string }): string[] => ['--tls-cert', leaf.cert, '--tls-key', leaf.key, '--tls-ca', pki.ca];

test('a Go client reaches a Node tls: server; ctx.peer has its SPIFFE ID', async () => {
  assert.match(addr, /^tls:127\.0\.0\.1:\d+$/);
  const r = await runGo(['call', addr, 'who', ...goTLS(web)]);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(JSON.parse(r.stdout).spiffe_id, WEB);
});

test('a workload the policy does not name is refused before any handler runs', async () => {
  const before = calls;
  const r = await runGo(['call', addr, 'who', ...goTLS(batch)]);
  assert.equal(r.code, 1, r.stdout);
  assert.match(r.stderr, /peer refused by policy: spiffe:\/\/prod\.example\/ns\/app\/sa\/batch not in/); // the reason, in place of the hello
  assert.equal(calls, before);
  assert.ok(refusals.some((m) => m.includes('not in')), refusals.join('\n'));
});

test('a Node client reaches a Node tls: server', async () => {
  const c = await connect(addr, { tls: { ca: fs.readFileSync(pki.ca), cert: fs.readFileSync(web.cert), key: fs.readFileSync(web.key) }, reconnect: false });
  try {
    assert.equal((await c.call<{ spiffe_id: string }>('who')).spiffe_id, WEB);
  } finally {
    await c.close();
  }
  await assert.rejects(connect(addr, { tls: { ca: fs.readFileSync(pki.ca) }, reconnect: false }), (e: unknown) => e instanceof UdskitError);
});

test('policies compose: anyPeer/allPeers of SPIFFE IDs, DNS names, any verified certificate', () => {
  const peer = (spiffeId: string | undefined, dnsNames: string[] = []): Peer => ({ kind: 'remote', subject: 'CN=x', dnsNames, uris: spiffeId ? [spiffeId] : [], spiffeId });
  const p = anyPeer(allowSpiffeIds(WEB), allowDnsNames('api.example'));
  assert.equal(p(peer(WEB)), true);
  assert.equal(p(peer('spiffe://prod.example/ns/app/sa/batch')), false);
  assert.equal(p(peer(undefined, ['api.example'])), true);
  const td = allowSpiffeIds('spiffe://prod.example/*');
  assert.equal(td(peer('spiffe://prod.example/ns/x')), true);
  assert.equal(td(peer('spiffe://prod.example.evil/x')), false);
  assert.equal(allPeers(td, allowDnsNames('api.example'))(peer(WEB)), false);
  assert.equal(allPeers(td, allowDnsNames('api.example'))(peer(WEB, ['api.example'])), true);
  assert.equal(allowAnyVerified()(peer(undefined)), true);
  assert.throws(() => allowSpiffeIds('prod.example/ns'), TypeError);
});

test('a composed policy guards a Node tls: server; a refused client gets the reason, no handler runs', async () => {
  let ran = 0;
  const errs: string[] = [];
  const s = createServer({ handlers: { who: (_req: unknown, ctx) => { ran++; return { spiffe_id: ctx.peer?.spiffeId }; } }, onError: (e) => errs.push(e.message) });
  const a = await s.listen('tls:127.0.0.1:0', {
    tls: { cert: fs.readFileSync(server.cert), key: fs.readFileSync(server.key), ca: fs.readFileSync(pki.ca), policy: anyPeer(allowSpiffeIds(WEB), allowDnsNames('api.example')) },
  });
  try {
    const c = await connect(a, { tls: { ca: fs.readFileSync(pki.ca), cert: fs.readFileSync(web.cert), key: fs.readFileSync(web.key) }, reconnect: false });
    try {
      assert.equal((await c.call<{ spiffe_id: string }>('who')).spiffe_id, WEB);
    } finally {
      await c.close();
    }
    await assert.rejects(
      connect(a, { tls: { ca: fs.readFileSync(pki.ca), cert: fs.readFileSync(batch.cert), key: fs.readFileSync(batch.key) }, reconnect: false }),
      (e: unknown) => e instanceof UdskitError && e.code === 'permission_denied' && /is not admitted by the server's policy/.test(e.message),
    );
    const r = await runGo(['call', a, 'who', ...goTLS(batch)]);
    assert.equal(r.code, 1, r.stdout);
    assert.match(r.stderr, /is not admitted by the server's policy/);
    assert.equal(ran, 1);
    assert.ok(errs.filter((m) => m.includes('not admitted')).length >= 2, errs.join('\n'));
  } finally {
    await s.close();
  }
});
