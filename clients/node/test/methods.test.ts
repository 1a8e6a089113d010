// udskit.methods (spec 9.2) on the Node server: sorted, kind and format, no
// standard methods; and Go's `udskit call ADDR --list` prints them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connect, createServer, raw, stream, rawStream } from '../src/index.js';
import { tmpDir, runGo } from './helpers.js';

test('udskit.methods lists the Node server\'s methods; udskit call --list prints them', async () => {
  const p = path.join(tmpDir(), 'm.sock');
  const server = createServer({ handlers: {
    zeta: () => 1,
    blob: raw((b) => b),
    alpha: stream(function* () { yield 1; }),
    bytes: rawStream(async function* () { yield Buffer.from('x'); }),
  } });
  await server.listen(p);
  const c = await connect(p);
  try {
    assert.deepEqual(await c.call('udskit.methods', {}), { methods: [
      { name: 'alpha', kind: 'stream', format: 'json' },
      { name: 'blob', kind: 'unary', format: 'raw' },
      { name: 'bytes', kind: 'stream', format: 'raw' },
      { name: 'zeta', kind: 'unary', format: 'json' },
    ] });
    const r = await runGo(['call', p, '--list']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.trim().split('\n').map((l) => l.split(/\s+/)), [
      ['alpha', 'stream', 'json'], ['blob', 'unary', 'raw'], ['bytes', 'stream', 'raw'], ['zeta', 'unary', 'json'],
    ]);
  } finally {
    await c.close();
    await server.close();
  }
});
