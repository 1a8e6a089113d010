// Lifecycle against the Go server: waiting at start, reconnect after a
// restart (SIGKILL mid-load), in-flight calls failing fast, goaway drain,
// nothing reconnecting after close().
import { test } from 'node:test';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connect, createServer, UdskitError } from '../src/index.js';
import { startGo, tmpDir, delay, within } from './helpers.js';

const dir = tmpDir();

test('wait: a client started before its server connects once the socket appears', async () => {
  const sock = path.join(dir, 'late.sock');
  const t0 = performance.now();
  const pc = connect(sock, { wait: true, timeout: 5000 });
  await delay(300);
  const go = await startGo(sock);
  try {
    const c = await within(5000, pc, 'connect with wait');
    assert.ok(performance.now() - t0 >= 250);
    assert.deepEqual(await c.call('echo', 1), 1);
    await c.close();
  } finally {
    await go.kill();
  }
});

test('wait is bounded by timeout; without wait one attempt fails at once with a hint', async () => {
  const sock = path.join(dir, 'never.sock');
  const t0 = performance.now();
  await assert.rejects(connect(sock, { wait: true, timeout: 300 }), (e: UdskitError) => e.code === 'unavailable');
  const took = performance.now() - t0;
  assert.ok(took >= 150 && took < 1500, `took ${took}`);
  const t1 = performance.now();
  await assert.rejects(connect(sock), (e: UdskitError) => e.code === 'unavailable' && /wait: true/.test(e.message));
  assert.ok(performance.now() - t1 < 500);
  const ac = new AbortController();
  setTimeout(() => ac.abort(), 100);
  await assert.rejects(connect(sock, { wait: true, timeout: 5000, signal: ac.signal }), (e: UdskitError) => e.code === 'canceled');
});

test('server killed and restarted mid-load: no call outlives its timeout, calls recover', async () => {
  const sock = path.join(dir, 'restart.sock');
  let go = await startGo(sock);
  const c = await connect(sock, { reconnect: { initialDelay: 10, maxDelay: 200 } });
  const TIMEOUT = 400;
  // Timers cannot fire while the event loop is blocked (spawning the Go server
  // forks this process; a loaded machine deschedules it): allow for the worst lag seen.
  const lag = monitorEventLoopDelay({ resolution: 5 });
  lag.enable();
  let stop = false;
  let worst = 0;
  const counts: Record<string, number> = {};
  let okAfterRestart = 0;
  let restarted = false;
  let inflightFailFast = 0;
  const worker = async (w: number): Promise<void> => {
    for (let i = 0; !stop; i++) {
      const t0 = performance.now();
      try {
        await c.call(i % 3 === 0 ? 'sleep' : 'echo', i % 3 === 0 ? { ms: 20 } : { w, i }, { timeout: TIMEOUT });
        counts.ok = (counts.ok ?? 0) + 1;
        if (restarted) okAfterRestart++;
      } catch (e) {
        assert.ok(e instanceof UdskitError, String(e));
        counts[e.code] = (counts[e.code] ?? 0) + 1;
        assert.ok(e.code === 'unavailable' || e.code === 'deadline_exceeded', `${e.code}: ${e.message}`);
        if (e.code === 'unavailable') {
          assert.equal(e.retryable, true);
          if (performance.now() - t0 < TIMEOUT / 2) inflightFailFast++; // failed, not timed out
        }
      }
      worst = Math.max(worst, performance.now() - t0);
    }
  };
  const workers = Array.from({ length: 16 }, (_, w) => worker(w));
  await delay(300);
  await go.kill(); // SIGKILL: calls in flight are lost, the socket file stays (stale)
  await delay(300);
  go = await startGo(sock); // Go removes the stale socket after a refused probe
  restarted = true;
  await delay(500);
  stop = true;
  await within(5000, Promise.all(workers), 'workers');
  await c.close();
  await go.kill();
  lag.disable();
  const maxLag = lag.max / 1e6;
  assert.ok(worst < TIMEOUT + 100 + maxLag, `a call took ${worst.toFixed(0)}ms with a ${TIMEOUT}ms timeout (event loop lag up to ${maxLag.toFixed(0)}ms)`);
  assert.ok(okAfterRestart >= 10, `only ${okAfterRestart} calls succeeded after the restart (${JSON.stringify(counts)})`);
  assert.ok(inflightFailFast > 0, `no in-flight call failed fast with unavailable (${JSON.stringify(counts)})`);
});

test('goaway: SIGTERM drains the Go server; calls in flight finish; new calls (waitForReady) wait for the next server', async () => {
  const sock = path.join(dir, 'drain.sock');
  const go = await startGo(sock);
  const c = await connect(sock, { reconnect: { initialDelay: 10, maxDelay: 100 } });
  const inflight = Array.from({ length: 10 }, () => c.call('sleep', { ms: 300 }, { timeout: 3000 }));
  await delay(50);
  const exited = go.term();
  await delay(50);
  // waitForReady: by default a call that finds no server fails fast (errors.test.ts).
  const later = c.call('echo', 'after goaway', { timeout: 3000, waitForReady: true });
  for (const r of await Promise.all(inflight)) assert.deepEqual(r, { slept_ms: 300 });
  assert.equal(await exited, 0);
  const go2 = await startGo(sock);
  try {
    assert.equal(await later, 'after goaway');
  } finally {
    await c.close();
    await go2.kill();
  }
});

test('nothing reconnects after close(); calls after close fail with canceled', async () => {
  const sock = path.join(dir, 'closed.sock');
  const s1 = createServer({ handlers: { echo: (x) => x } });
  await s1.listen(sock);
  const c = await connect(sock, { reconnect: { initialDelay: 5, maxDelay: 20 } });
  assert.equal(await c.call('echo', 1), 1);
  const pending = assert.rejects(c.call('sleep-forever', 2, { timeout: 5000 }), (e: UdskitError) => e.code === 'canceled' || e.code === 'unimplemented');
  await c.close();
  await pending;
  await assert.rejects(c.call('echo', 3), (e: UdskitError) => e.code === 'canceled');
  await s1.close();
  const s2 = createServer({ handlers: { echo: (x) => x } });
  await s2.listen(sock);
  await delay(300);
  assert.equal(s2.accepted, 0, 'a closed client connected again');
  await s2.close();
});
