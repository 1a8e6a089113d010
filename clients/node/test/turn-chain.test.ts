// The per-turn call cap (TURN_CALLS) holds when handlers answer at once. The
// rule "a connection with nothing in flight always gets its next call in"
// (for a client calling one at a time) let the calls held at the cap chain
// one by one through microtasks, each ending before the next was let in, with
// no yield to the event loop: 1,987 calls of one read started in one turn,
// and every other connection and timer waited for the whole read. Now such a
// connection gets its one call past the cap once per turn; the rest of the
// read starts on the next turns.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { createServer } from '../src/index.js';
import { TURN_CALLS } from '../src/server-conn.js';
import { encodeFrame, encodeRequestHead, T } from '../src/frame.js';
import { tmpDir, within, delay, rawConn } from './helpers.js';

const dir = tmpDir();
let n = 0;
const sockPath = (): string => path.join(dir, `t${n++}.sock`);

/**
 * Counts event-loop turns: a setImmediate that queues itself. Started while
 * the server is idle (no turn end of the server's pending), it runs first in
 * every check phase, so the calls started between two of its ticks are those
 * of one of the server's turns (or fewer: a turn that starts under 64 calls
 * does not end at the next check phase).
 */
function turnCounter(): { now: () => number; stop: () => void } {
  let turn = 0;
  let on = true;
  const tick = (): void => {
    turn++;
    if (on) setImmediate(tick);
  };
  setImmediate(tick);
  return { now: () => turn, stop: () => { on = false; } };
}

/** How the handlers answer at once. */
type How = 'async' | 'sync';

/** What the burst test checks, for frames and NDJSON alike. */
interface Seen {
  /** The burst's calls (their numbers), in the order they started. */
  order: number[];
  /** Event-loop turn -> calls started in it (the burst's and the other connection's). */
  perTurn: Map<number, number>;
  /** Event-loop turn -> the burst's calls started in it. */
  burstPerTurn: Map<number, number>;
  /** The burst's calls started when the other connection's call ran. */
  otherRanAt: number;
}

function assertBurst(s: Seen, count: number, answers: Map<number, unknown>, otherAnsweredAt: number): void {
  const mostBurst = Math.max(...s.burstPerTurn.values());
  // The cap, and the one call past it of a connection with nothing in flight.
  assert.ok(mostBurst <= TURN_CALLS + 1, `${mostBurst} of the burst's calls started in one event-loop turn (${s.burstPerTurn.size} turns; cap ${TURN_CALLS})`);
  const most = Math.max(...s.perTurn.values());
  // With the other connection's: one call past the cap for each.
  assert.ok(most <= TURN_CALLS + 2, `${most} calls started in one event-loop turn (${s.perTurn.size} turns; cap ${TURN_CALLS})`);
  assert.ok(s.perTurn.size >= Math.ceil(count / (TURN_CALLS + 2)), `${count} calls started in ${s.perTurn.size} turns`);
  assert.deepEqual(s.order, Array.from({ length: count }, (_, i) => i + 1), 'calls started in the order of the read');
  assert.equal(answers.size, count);
  for (let i = 1; i <= count; i++) assert.equal(answers.get(i), i, `call ${i} answered with its own data`);
  // The other connection's call was read and answered while the burst's calls were still starting.
  assert.ok(s.otherRanAt >= 1 && s.otherRanAt <= count - TURN_CALLS, `the other connection's call ran after ${s.otherRanAt} of the burst's ${count} calls had started`);
  assert.ok(otherAnsweredAt < count, `the other connection's answer came after ${otherAnsweredAt} of the burst's ${count} calls had started`);
}

/**
 * A server whose handlers answer at once: a resolved promise (async), or
 * synchronously; onFirst runs when the burst's first call (b) runs.
 */
function burstServer(how: How, turn: () => number, onFirst: () => void): { srv: ReturnType<typeof createServer>; seen: Seen } {
  const seen: Seen = { order: [], perTurn: new Map(), burstPerTurn: new Map(), otherRanAt: -1 };
  const b = (x: number): number => {
    seen.perTurn.set(turn(), (seen.perTurn.get(turn()) ?? 0) + 1);
    seen.burstPerTurn.set(turn(), (seen.burstPerTurn.get(turn()) ?? 0) + 1);
    seen.order.push(x);
    if (x === 1) onFirst();
    return x;
  };
  const srv = createServer({
    maxInFlight: 10_000,
    maxServerBytes: 1 << 30, // only the per-turn cap holds the burst back
    handlers: {
      b: how === 'async' ? async (x: number) => b(x) : b,
      o: async (x: number) => {
        seen.perTurn.set(turn(), (seen.perTurn.get(turn()) ?? 0) + 1);
        seen.otherRanAt = seen.order.length;
        return x;
      },
    },
  });
  return { srv, seen };
}

for (const how of ['async', 'sync'] as const) test(`frames: one read of 2,000 requests to a handler that answers at once (${how}) starts at most 256 (+1) calls per event-loop turn, in order; all answered; another connection is answered during the burst`, async () => {
  const p = sockPath();
  const count = 2000;
  let other: net.Socket | null = null;
  let turns = { now: () => 0, stop: () => {} };
  const { srv, seen } = burstServer(how, () => turns.now(), () => {
    other!.write(encodeFrame(T.request, 0, 1, 0, encodeRequestHead('o'), '7'));
  });
  await srv.listen(p);
  const a = await rawConn(p);
  const b = await rawConn(p);
  other = b.s;
  const head = encodeRequestHead('b');
  const burst = Buffer.concat(Array.from({ length: count }, (_, i) => encodeFrame(T.request, 0, i + 1, 0, head, String(i + 1))));
  assert.ok(burst.length < 64 << 10, `${burst.length} bytes: one read`);
  await delay(20); // (the server idle: no turn end of its pending)
  turns = turnCounter();
  const answers = new Map<number, unknown>();
  const gotAll = (async () => {
    while (answers.size < count) {
      const f = await a.frames();
      assert.equal(f.type, T.response, `frame ${f.typeName} for call ${f.id}: ${f.message ?? ''}`);
      answers.set(f.id, JSON.parse(f.payload.toString()));
    }
  })();
  let otherAnsweredAt = -1;
  const gotOther = (async () => {
    const f = await b.frames();
    otherAnsweredAt = seen.order.length;
    assert.equal(f.type, T.response, `frame ${f.typeName}: ${f.message ?? ''}`);
    assert.equal(f.id, 1);
    assert.equal(JSON.parse(f.payload.toString()), 7);
  })();
  a.s.write(burst);
  await within(20_000, Promise.all([gotAll, gotOther]), `${count} answers (${answers.size} so far) and the other connection's`);
  turns.stop();
  assertBurst(seen, count, answers, otherAnsweredAt);
  a.s.destroy();
  b.s.destroy();
  await srv.close();
});

/** A raw NDJSON client: its answers, by id, as they come; onLine runs for each. */
async function ndConn(p: string, onLine: (id: number, data: unknown) => void): Promise<net.Socket> {
  const s = net.connect(p);
  s.on('error', () => {});
  await new Promise((r) => s.once('connect', r));
  let rest = '';
  s.setEncoding('utf8');
  s.on('data', (d: string) => {
    const parts = (rest + d).split('\n');
    rest = parts.pop()!;
    for (const l of parts) {
      const o = JSON.parse(l) as { id: number; data?: unknown; error?: string };
      assert.equal(o.error, undefined, `an error answer: ${l}`);
      onLine(o.id, o.data);
    }
  });
  return s;
}

for (const how of ['async', 'sync'] as const) test(`NDJSON: one read of 1,800 lines to a handler that answers at once (${how}) starts at most 256 (+1) calls per event-loop turn, in order; all answered; another connection is answered during the burst`, async () => {
  const p = sockPath();
  const count = 1800;
  let other: net.Socket | null = null;
  let turns = { now: () => 0, stop: () => {} };
  const { srv, seen } = burstServer(how, () => turns.now(), () => {
    other!.write('{"id":1,"func":"o","data":7}\n');
  });
  await srv.listen(p);
  const answers = new Map<number, unknown>();
  const a = await ndConn(p, (id, data) => answers.set(id, data));
  let otherAnsweredAt = -1;
  let otherData: unknown;
  other = await ndConn(p, (id, data) => {
    assert.equal(id, 1);
    otherData = data;
    otherAnsweredAt = seen.order.length;
  });
  const burst = Buffer.from(Array.from({ length: count }, (_, i) => `{"id":${i + 1},"func":"b","data":${i + 1}}\n`).join(''));
  assert.ok(burst.length < 64 << 10, `${burst.length} bytes: one read`);
  await delay(20); // (the server idle: no turn end of its pending)
  turns = turnCounter();
  a.write(burst);
  await within(20_000, (async () => { while (answers.size < count || otherAnsweredAt < 0) await delay(5); })(), `${count} answers (${answers.size} so far) and the other connection's`);
  turns.stop();
  assert.equal(otherData, 7);
  assertBurst(seen, count, answers, otherAnsweredAt);
  a.destroy();
  other.destroy();
  await srv.close();
});
