// udskit.stats (protocol/spec.md 9.3) on the Node server: it answers the connections it serves
// and no shared memory, and the Go CLI's `udskit doctor --probe udskit` shows it (before, it said
// "no statistics": the method was unknown).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connect, createServer, raw } from '../src/index.js';
import { tmpDir, runGo, rawConn, readJSON } from './helpers.js';

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
