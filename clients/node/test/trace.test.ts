// W3C trace context helpers (src/trace.ts): parsing per the spec's rules, and a trace carried
// from a Node client to a Node server in call metadata (the Go side is tested by
// rpc/rpcotel's TestNodeAppThroughGoSidecar).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  connect, createServer, parseTraceparent, formatTraceparent, newTrace, childOf, traceMetadata, traceFromMetadata, type HandlerContext,
} from '../src/index.js';
import { tmpDir } from './helpers.js';

test('traceparent parsing follows W3C trace context', () => {
  const v = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  const tc = parseTraceparent(v);
  assert.deepEqual(tc, { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', flags: 1 });
  assert.equal(formatTraceparent(tc!), v);
  for (const bad of [
    '', 'garbage', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7', // too few fields
    '00-00000000000000000000000000000000-00f067aa0ba902b7-01', // all-zero trace id
    '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01', // all-zero span id
    'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', // version ff is invalid
    '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01', // upper case
    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra', // version 00 has no more fields
    'x'.repeat(1000),
  ]) {
    assert.equal(parseTraceparent(bad), undefined, bad);
  }
  // A later version is read as far as version 00 goes.
  assert.equal(parseTraceparent('01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more')?.flags, 0);
  const a = newTrace();
  assert.match(formatTraceparent(a), /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
  const b = childOf({ ...a, state: 'vendor=x' });
  assert.equal(b.traceId, a.traceId);
  assert.notEqual(b.spanId, a.spanId);
  assert.deepEqual(traceMetadata(b), { traceparent: formatTraceparent(b), tracestate: 'vendor=x' });
  assert.notEqual(childOf(undefined).traceId, a.traceId);
});

test('a trace crosses a call in metadata', async () => {
  const sock = path.join(tmpDir(), 'trace.sock');
  let seen: ReturnType<typeof traceFromMetadata>;
  const srv = createServer({
    handlers: {
      who: (_req: unknown, ctx: HandlerContext) => {
        seen = traceFromMetadata(ctx.metadata);
        return { ok: true };
      },
    },
  });
  await srv.listen(sock);
  const c = await connect(sock);
  try {
    const app = newTrace();
    const call = childOf({ ...app, state: 'vendor=x' });
    await c.call('who', {}, { metadata: traceMetadata(call) });
    assert.deepEqual(seen, { traceId: app.traceId, spanId: call.spanId, flags: 1, state: 'vendor=x' });
    await c.call('who', {});
    assert.equal(seen, undefined, 'a call without trace metadata carries no trace');
  } finally {
    c.close();
    await srv.shutdown();
  }
});
