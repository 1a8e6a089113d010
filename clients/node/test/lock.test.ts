// PATH.lock, as Go's uds.Listen (issue 25): a regular file of ours, never
// followed through a symlink, never a FIFO or another user's file; the
// exclusive lock is real (flock(2), shared with Go servers), so a second
// server waits for it instead of racing the first.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawn, execFileSync } from 'node:child_process';
import { connect, createServer, BadLockFileError, InUseError } from '../src/index.js';
import { tmpDir, within, delay, startGo } from './helpers.js';

const dir = tmpDir();
const handlers = { echo: (x: unknown) => x };

test('lock file: a symlink, a FIFO or another user\'s file at PATH.lock is refused and left alone', async () => {
  const p = path.join(dir, 'bad.sock');
  const victim = path.join(dir, 'victim');
  fs.writeFileSync(victim, 'keep me');
  fs.symlinkSync(victim, p + '.lock');
  await assert.rejects(createServer({ handlers }).listen(p), (e: Error) => e instanceof BadLockFileError && /symlink/.test(e.message));
  assert.equal(fs.readFileSync(victim, 'utf8'), 'keep me');
  assert.ok(fs.lstatSync(p + '.lock').isSymbolicLink(), 'the symlink is left');
  assert.equal(fs.existsSync(p), false, 'nothing bound');
  fs.unlinkSync(p + '.lock');

  execFileSync('mkfifo', [p + '.lock']);
  await within(3000, assert.rejects(createServer({ handlers }).listen(p), (e: Error) => e instanceof BadLockFileError && /FIFO/.test(e.message)), 'FIFO refused without hanging');
  assert.ok(fs.lstatSync(p + '.lock').isFIFO());
  fs.unlinkSync(p + '.lock');

  if (process.geteuid!() === 0) {
    fs.writeFileSync(p + '.lock', '');
    fs.chownSync(p + '.lock', 65534, 65534);
    await assert.rejects(createServer({ handlers }).listen(p), (e: Error) => e instanceof BadLockFileError && /uid 65534/.test(e.message));
    assert.ok(fs.existsSync(p + '.lock'), 'their file is left');
    fs.unlinkSync(p + '.lock');
  } else {
    // Not root: a file of another user cannot be made here; the root run (CI) covers it.
    assert.ok(true);
  }
});

test('lock file: taken with flock(2), a second server waits for it, then finds the first live; removed at close', async () => {
  const p = path.join(dir, 'race.sock');
  // Another process (as a Go server binding) holds PATH.lock for 700 ms.
  const holder = spawn('flock', ['-x', p + '.lock', 'sleep', '0.7'], { stdio: 'ignore' });
  const exited = new Promise((r) => holder.on('exit', r));
  await delay(150);
  const srv = createServer({ handlers });
  const t0 = performance.now();
  await srv.listen(p);
  const waited = performance.now() - t0;
  assert.ok(waited >= 400, `listen went ahead after ${waited.toFixed(0)} ms while another process held the lock`);
  await within(3000, exited, 'the lock holder');
  assert.ok(fs.lstatSync(p + '.lock').isFile());
  // A second server on the same path: waits for the lock, then InUseError (never unlinks a live socket).
  await assert.rejects(createServer({ handlers }).listen(p), InUseError);
  const c = await connect(p);
  assert.equal(await c.call('echo', 1), 1);
  await c.close();
  await srv.close();
  assert.equal(fs.existsSync(p), false);
  assert.equal(fs.existsSync(p + '.lock'), false, 'lock file removed with the socket');
});

test('lock file: a Go server and a Node server started together on one path: exactly one listens, the other is refused', async () => {
  for (let i = 0; i < 3; i++) {
    const p = path.join(dir, `mix${i}.sock`);
    // A stale socket there: both decide it is stale; only the lock keeps them from unlinking each other's.
    fs.writeFileSync(p + '.tmp', '');
    const stale = createServer({ handlers });
    await stale.listen(p);
    // Leave the file behind as a crashed server would: close the listener without cleanup.
    (stale as unknown as { net: { close(): void } }).net.close();
    fs.rmSync(p + '.tmp');
    const node = createServer({ handlers });
    const [goRes, nodeRes] = await Promise.allSettled([startGo(p, ['--drain-timeout', '1s']), node.listen(p)]);
    const up = [goRes.status, nodeRes.status].filter((s) => s === 'fulfilled').length;
    assert.equal(up, 1, `go: ${goRes.status} ${goRes.status === 'rejected' ? goRes.reason : ''}; node: ${nodeRes.status} ${nodeRes.status === 'rejected' ? nodeRes.reason : ''}`);
    const c = await connect(p);
    assert.equal(await c.call('echo', 'x'), 'x');
    await c.close();
    if (goRes.status === 'fulfilled') await goRes.value.kill();
    if (nodeRes.status === 'fulfilled') await node.close();
  }
});
