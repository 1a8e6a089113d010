// The README's "Shared memory: why Node keeps the socket path": a Node
// client never negotiates shared memory with a Go server (no shm hello
// flag), so its large payloads travel on the socket. The Go server's
// udskit.stats (protocol/spec.md 9.3) shows it: shared memory on, no region
// in use, nothing through it, after a 1 MiB echo.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connect } from '../src/index.js';
import { startGo, tmpDir } from './helpers.js';

const sock = path.join(tmpDir(), 'demo.sock');
const go = await startGo(sock);
after(() => go.kill());

interface Stats {
  conns: number;
  shm: { enabled: boolean; conns: number; sent: number; received: number; in_use: number; capacity: number; waits: number };
}

test('a Node client keeps the socket path with a Go server (udskit.stats)', async () => {
  const c = await connect(sock);
  try {
    const big = Buffer.alloc(1 << 20, 0x61);
    const got = await c.call<Buffer>('echo', big);
    assert.ok(Buffer.isBuffer(got) && got.equals(big), 'the 1 MiB echo came back');
    const st = await c.call<Stats>('udskit.stats');
    assert.ok(st.conns >= 1, `conns ${st.conns}`);
    assert.equal(st.shm.enabled, true, 'the Go server offers shared memory to clients that ask');
    assert.deepEqual([st.shm.conns, st.shm.sent, st.shm.received, st.shm.capacity], [0, 0, 0, 0], JSON.stringify(st));
  } finally {
    await c.close();
  }
});
