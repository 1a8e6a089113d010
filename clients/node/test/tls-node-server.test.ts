// Go client (udskit call) -> Node server on tls: with a SPIFFE policy: the Node handler sees the
// Go client's SPIFFE ID in ctx.peer; a workload the policy does not name is refused before any
// handler runs. And Node client -> Node server over tls:.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createServer, connect, UdskitError, type Server } from '../src/index.js';
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
  assert.match(r.stderr, /closed|refused|EOF/);
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
