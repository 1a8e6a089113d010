// Interceptors (src/interceptors.ts) on the Node server and client: what they see (method,
// metadata, deadline, peer, trace, the server's address), refusing with a code, wrapping a
// handler or a call, streams; and that without any the dispatch path is the plain one.
// Trace propagation through a handler (ctx.trace and CallOptions.trace) is here too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  connect, createServer, stream, raw, newTrace, UdskitError,
  type HandlerContext, type UnaryServerInterceptor, type StreamServerInterceptor,
  type UnaryClientInterceptor, type StreamClientInterceptor, type ClientCall,
} from '../src/index.js';
import { tmpDir } from './helpers.js';

test('server interceptors see the call, run in order, refuse with a code and wrap the handler', async () => {
  const sock = path.join(tmpDir(), 'ic.sock');
  const order: string[] = [];
  let handled = 0;
  const seen: { method: string; metadata: Record<string, string>; deadline: number | undefined; peer: unknown; protocol: string }[] = [];
  const outer: UnaryServerInterceptor = async (req, ctx, next) => {
    order.push(`outer:${ctx.method}`);
    seen.push({ method: ctx.method, metadata: { ...ctx.metadata }, deadline: ctx.deadline, peer: ctx.peer, protocol: ctx.protocol });
    const out = await next(req, ctx);
    order.push('outer:done');
    return out;
  };
  const auth: UnaryServerInterceptor = (req, ctx, next) => {
    order.push('auth');
    if (ctx.metadata.token !== 'ok') throw new UdskitError('permission_denied', `${ctx.method}: no token`);
    if (Buffer.isBuffer(req)) return next(req, ctx);
    // Wrap: the handler gets a changed request, the caller a changed answer.
    const out = next({ ...(req as object), wrapped: true }, ctx);
    return Promise.resolve(out).then((v) => ({ inner: v, by: 'auth' }));
  };
  const items: number[] = [];
  const counter: StreamServerInterceptor = async function* (req, ctx, next) {
    if (ctx.metadata.token !== 'ok') throw new UdskitError('permission_denied', 'stream: no token');
    for await (const it of next(req, ctx)) {
      items.push(it as number);
      yield (it as number) * 10;
    }
  };
  const srv = createServer({
    handlers: {
      echo: (req: unknown) => {
        handled++;
        return req;
      },
      bytes: raw((b) => Buffer.concat([b, Buffer.from('!')])),
      count: stream(function* (req: { n: number }) {
        for (let i = 1; i <= req.n; i++) yield i;
      }),
    },
    unaryInterceptors: [outer, auth],
    streamInterceptors: [counter],
  });
  await srv.listen(sock);
  const c = await connect(sock);
  try {
    const before = Date.now();
    assert.deepEqual(await c.call('echo', { a: 1 }, { metadata: { token: 'ok' }, timeout: 5000 }), { inner: { a: 1, wrapped: true }, by: 'auth' });
    assert.deepEqual(order, ['outer:echo', 'auth', 'outer:done']);
    assert.equal(seen[0]!.method, 'echo');
    assert.deepEqual(seen[0]!.metadata, { token: 'ok' });
    assert.equal(seen[0]!.protocol, 'udskit');
    assert.equal(seen[0]!.peer, undefined, 'unix sockets: Node cannot read SO_PEERCRED');
    const dl = seen[0]!.deadline!;
    assert.ok(dl > before + 3000 && dl < Date.now() + 5500, `deadline ${dl - before}ms from the call`);

    // Refused before the handler, with the interceptor's code and message.
    await assert.rejects(c.call('echo', { a: 2 }), (e: UdskitError) => e.code === 'permission_denied' && /no token/.test(e.message));
    assert.equal(handled, 1, 'a refused call never reaches its handler');

    // Raw unary handlers go through the same chain (the wrapper sees and changes bytes).
    order.length = 0;
    assert.deepEqual(await c.call('bytes', Buffer.from('x'), { metadata: { token: 'ok' } }), Buffer.from('x!'));
    assert.deepEqual(order, ['outer:bytes', 'auth', 'outer:done']);

    // The built-in health method goes through the interceptors too.
    order.length = 0;
    await assert.rejects(c.call('udskit.health', {}), (e: UdskitError) => e.code === 'permission_denied');
    assert.deepEqual(order, ['outer:udskit.health', 'auth']);

    // A stream interceptor counts and changes items, or refuses.
    assert.deepEqual(await c.stream('count', { n: 3 }, { metadata: { token: 'ok' } }).toArray(), [10, 20, 30]);
    assert.deepEqual(items, [1, 2, 3]);
    await assert.rejects(c.stream('count', { n: 3 }).toArray(), (e: UdskitError) => e.code === 'permission_denied');
  } finally {
    await c.close();
    await srv.shutdown();
  }
});

test('client interceptors see the call, add metadata, refuse without sending, and wrap streams', async () => {
  const sock = path.join(tmpDir(), 'icc.sock');
  let handled = 0;
  const srv = createServer({
    handlers: {
      md: (_req: unknown, ctx: HandlerContext) => {
        handled++;
        return { md: ctx.metadata, deadline: ctx.deadline !== undefined };
      },
      count: stream(function* (req: { n: number }) {
        for (let i = 1; i <= req.n; i++) yield i;
      }),
    },
  });
  await srv.listen(sock);
  const calls: ClientCall[] = [];
  const tag: UnaryClientInterceptor = (call, next) => {
    calls.push(call);
    if (call.method === 'forbidden') throw new UdskitError('permission_denied', 'not from this client');
    return next({ ...call, opts: { ...call.opts, metadata: { ...call.opts.metadata, 'x-tag': 'client' } } });
  };
  const retry: UnaryClientInterceptor = async (call, next) => {
    try {
      return await next(call);
    } catch (e) {
      if (e instanceof UdskitError && e.code === 'unimplemented') return { fallback: call.method };
      throw e;
    }
  };
  const got: unknown[] = [];
  const tap: StreamClientInterceptor = async function* (call, next) {
    for await (const it of next(call)) {
      got.push(it);
      yield it;
    }
  };
  const c = await connect(sock, { unaryInterceptors: [tag, retry], streamInterceptors: [tap], callTimeout: 7000 });
  try {
    assert.deepEqual(await c.call('md', {}, { metadata: { a: '1' } }), { md: { a: '1', 'x-tag': 'client' }, deadline: true });
    assert.equal(calls[0]!.method, 'md');
    assert.equal(calls[0]!.opts.timeout, 7000, 'the effective timeout (the client default)');
    assert.equal(calls[0]!.address, `unix:${sock}`);
    // A trace option reaches interceptors as the metadata the call sends (where an OpenTelemetry
    // SDK would start its client span).
    const root = newTrace();
    const traced = await c.call<{ md: Record<string, string> }>('md', {}, { trace: root });
    const sentTp = calls.at(-1)!.opts.metadata!.traceparent!;
    assert.match(sentTp, new RegExp(`^00-${root.traceId}-[0-9a-f]{16}-01$`));
    assert.equal(traced.md.traceparent, sentTp);
    assert.equal(calls.at(-1)!.opts.trace, undefined);
    assert.deepEqual(await c.call('nosuch', {}), { fallback: 'nosuch' }, 'an interceptor may replace a failure');
    await assert.rejects(c.call('forbidden', {}), (e: UdskitError) => e.code === 'permission_denied');
    assert.equal(handled, 2);
    assert.deepEqual(await c.stream('count', { n: 4 }).toArray(), [1, 2, 3, 4]);
    assert.deepEqual(got, [1, 2, 3, 4]);
    // Breaking out of an intercepted stream stops it; the iterator stays done.
    const s = c.stream<number>('count', { n: 100 });
    for await (const v of s) if (v === 2) break;
    assert.deepEqual(await s.next(), { value: undefined, done: true });
  } finally {
    await c.close();
    await srv.shutdown();
  }
});

test('without interceptors the server calls the registered handler itself and the client takes its direct path', async () => {
  const echo = (req: unknown): unknown => req;
  const plain = createServer({ handlers: { echo } });
  // The connections' dispatch (ConnHost.handler) hands out the registered function: no wrapper runs.
  const host = (s: unknown): { handler(m: string): { fn: unknown } | undefined } => (s as { host: { handler(m: string): { fn: unknown } | undefined } }).host;
  assert.equal(host(plain).handler('echo')!.fn, echo);
  const wrapped = createServer({ handlers: { echo }, unaryInterceptors: [(req, ctx, next) => next(req, ctx)] });
  assert.notEqual(host(wrapped).handler('echo')!.fn, echo);
  assert.equal(host(wrapped).handler('echo'), host(wrapped).handler('echo'), 'the wrapper is made once per method');
  assert.equal(host(wrapped).handler('nosuch'), undefined);

  const sock = path.join(tmpDir(), 'fast.sock');
  await plain.listen(sock);
  const c = await connect(sock);
  const ci = await connect(sock, { unaryInterceptors: [(call, next) => next(call)] });
  try {
    const chains = (cl: unknown): [unknown, unknown] => [(cl as { unaryChain: unknown }).unaryChain, (cl as { streamChain: unknown }).streamChain];
    assert.deepEqual(chains(c), [null, null]);
    assert.equal(typeof chains(ci)[0], 'function');
    assert.deepEqual(await c.call('echo', { x: 1 }), { x: 1 });
    assert.deepEqual(await ci.call('echo', { x: 2 }), { x: 2 });
  } finally {
    await c.close();
    await ci.close();
    await plain.shutdown();
  }
});

test('a trace is passed on through a handler: ctx.trace and CallOptions.trace', async () => {
  const dir = tmpDir();
  const back = path.join(dir, 'back.sock');
  const front = path.join(dir, 'front.sock');
  let backTrace: HandlerContext['trace'];
  const backend = createServer({
    handlers: {
      leaf: (_req: unknown, ctx: HandlerContext) => {
        backTrace = ctx.trace;
        return { traceparent: ctx.metadata.traceparent ?? null };
      },
    },
  });
  await backend.listen(back);
  const toBack = await connect(back);
  let frontTrace: HandlerContext['trace'];
  const frontend = createServer({
    handlers: {
      hop: async (_req: unknown, ctx: HandlerContext) => {
        frontTrace = ctx.trace;
        return toBack.call('leaf', {}, { trace: ctx.trace });
      },
    },
  });
  await frontend.listen(front);
  const app = await connect(front);
  try {
    const root = { ...newTrace(), state: 'vendor=1' };
    await app.call('hop', {}, { trace: root });
    assert.equal(frontTrace!.traceId, root.traceId);
    assert.notEqual(frontTrace!.spanId, root.spanId, 'the call carries a child span of the app\'s');
    assert.equal(frontTrace!.state, 'vendor=1');
    assert.equal(backTrace!.traceId, root.traceId, 'one trace id across both hops');
    assert.notEqual(backTrace!.spanId, frontTrace!.spanId);
    assert.equal(backTrace!.state, 'vendor=1');
    // Without a trace, none is made up.
    await app.call('hop', {});
    assert.equal(frontTrace, undefined);
    assert.equal(backTrace, undefined);
  } finally {
    await app.close();
    await toBack.close();
    await frontend.shutdown();
    await backend.shutdown();
  }
});
