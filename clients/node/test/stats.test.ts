// udskit.stats (protocol/spec.md 9.3) on the Node server: it answers the connections it serves
// and no shared memory, and the Go CLI's `udskit doctor --probe udskit` shows it (before, it said
// "no statistics": the method was unknown).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connect, createServer, raw, fetchStats, parseStats, UdskitError } from '../src/index.js';
import type { ShmServerStats } from '../src/index.js';
import { tmpDir, runGo, rawConn, readJSON, startGo } from './helpers.js';

test('udskit.stats: the Node server answers its connections; udskit doctor shows it', async () => {
  const p = path.join(tmpDir(), 'stats.sock');
  const srv = createServer({ handlers: { echo: raw((req: Buffer) => req) } });
  await srv.listen(p);
  const a = await connect(p);
  const b = await connect(p);
  try {
    assert.deepEqual(await a.call('udskit.stats', {}), { conns: 2 });
    const doc = await runGo(['doctor', '--probe', 'udskit', p]);
    const shm = doc.stdout.split('\n').find((l) => l.split(/\s+/)[1] === 'shm');
    assert.ok(shm?.startsWith('PASS') && shm.includes('shared memory is off'), doc.stdout);
  } finally {
    await a.close();
    await b.close();
    await srv.close();
  }
});

test('stats.json: the Node server answers the vectors\' request bytes with conns and no shm', async () => {
  const v = readJSON<{ request_hex: string; request_id: number }>('protocol/vectors/stats.json');
  const p = path.join(tmpDir(), 'statsvec.sock');
  const srv = createServer({ handlers: {} });
  await srv.listen(p);
  const c = await rawConn(p);
  try {
    c.s.write(Buffer.from(v.request_hex, 'hex'));
    const f = await c.frames();
    assert.equal(f.type, 2, `a response, not type ${f.type} (${f.payload.toString()})`);
    assert.equal(f.id, v.request_id);
    const ans = JSON.parse(f.payload.toString()) as { conns: unknown; shm?: unknown };
    assert.ok(Number.isInteger(ans.conns) && (ans.conns as number) >= 1 && ans.shm === undefined, f.payload.toString());
  } finally {
    c.s.destroy();
    await srv.close();
  }
});

interface StatsVectors {
  shm_fields: string[];
  answers: { name: string; payload: string; conns: number; shm: Record<string, number | boolean> }[];
}

/** A vector's shm (the wire's snake_case names) as ShmServerStats. */
const camel = (shm: Record<string, number | boolean>): ShmServerStats => ({
  enabled: shm.enabled as boolean, threshold: shm.threshold as number, conns: shm.conns as number,
  inUse: shm.in_use as number, capacity: shm.capacity as number, sent: shm.sent as number,
  received: shm.received as number, waits: shm.waits as number, overHalf: shm.over_half as number,
  stalled: shm.stalled as number, slotCalls: shm.slot_calls as number, areaSentBytes: shm.area_sent_bytes as number,
  areaReceivedBytes: shm.area_received_bytes as number, spuriousWakes: shm.spurious_wakes as number,
});

test('stats.json: parseStats reads every answer as listed (stalled included; missing fields read as 0)', () => {
  const v = readJSON<StatsVectors>('protocol/vectors/stats.json');
  assert.ok(v.shm_fields.includes('stalled'), 'the vectors name shm.stalled');
  assert.ok(v.answers.some((a) => a.shm.stalled !== 0), 'a vector with stalled answers');
  assert.ok(v.answers.some((a) => a.shm.slot_calls !== 0 && a.shm.area_sent_bytes !== 0), 'a vector with call slots');
  for (const a of v.answers) {
    for (const f of v.shm_fields) assert.ok(f in a.shm, `${a.name}: the vector lists shm.${f}`);
    assert.equal(Object.keys(camel(a.shm)).length, v.shm_fields.length, 'every field mapped');
    assert.deepEqual(parseStats(JSON.parse(a.payload)), { conns: a.conns, shm: camel(a.shm) }, a.name);
  }
  assert.throws(() => parseStats([1]), (e: unknown) => e instanceof UdskitError && e.code === 'internal');
});

test('fetchStats: a Go server reports its shared memory on (stalled 0), the Node server off', async () => {
  const dir = tmpDir();
  const go = await startGo(path.join(dir, 'go.sock'));
  const srv = createServer({ handlers: {} });
  await srv.listen(path.join(dir, 'node.sock'));
  const a = await connect(path.join(dir, 'go.sock'));
  const b = await connect(path.join(dir, 'node.sock'));
  try {
    const g = await fetchStats(a);
    assert.ok(g.conns >= 1 && g.shm.enabled && g.shm.threshold > 0 && g.shm.stalled === 0 && g.shm.conns === 0, JSON.stringify(g));
    const n = await fetchStats(b, { timeout: 5000 });
    assert.deepEqual(n, parseStats({ conns: 1 }));
    assert.equal(n.shm.enabled, false);
  } finally {
    await a.close();
    await b.close();
    await srv.close();
    await go.kill();
  }
});
