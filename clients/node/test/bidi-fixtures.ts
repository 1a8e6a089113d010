// Handlers of the bidi tests and the demo methods of spec 4.3's vectors
// (calls.json): `sum` (JSON bidi: a running total per item, an item that is
// not a number fails the call with invalid_argument) and `echo` (unary).
import {
  bidi, rawBidi, clientStream, rawClientStream, raw, stream, UdskitError, type HandlerContext,
} from '../src/index.js';

/** The demo `sum` (the same in Go's `udskit serve` and Python's test server). */
export const sum = bidi(async function* (requests) {
  let total = 0;
  for await (const n of requests) {
    if (typeof n !== 'number') throw new UdskitError('invalid_argument', `sum: item ${JSON.stringify(n)} is not a number`);
    total += n;
    yield total;
  }
});

/** The vectors' `hold` (calls.json): reads no items, sends none; ends only when canceled or the connection closes. */
export const hold = bidi(async function* (_requests, ctx: HandlerContext) {
  await new Promise((r) => ctx.signal.addEventListener('abort', r));
});

/** What the handlers saw, for the tests to look at. */
export const seen = {
  /** ctx.signal.reason of calls whose handler saw its signal abort, by tag. */
  aborted: new Map<string, unknown>(),
  /** Items a stalled handler has read. */
  stalledRead: 0,
  /** Release the stalled handler. */
  release: (): void => {},
};

export const handlers = {
  sum,
  hold,
  echo: raw((b) => b),
  json: (v: unknown) => v,
  // a unary call that stays in flight until canceled (or 5 s)
  slow: (_: unknown, ctx: HandlerContext) => new Promise((resolve) => {
    const t = setTimeout(resolve, 5000);
    ctx.signal.addEventListener('abort', () => { clearTimeout(t); resolve(null); });
  }),
  stream: stream(function* (req: { n: number }) { for (let i = 0; i < req.n; i++) yield i; }),
  // client-streaming: the sum of the items (as Go's demo `total`)
  total: clientStream(async (requests) => {
    let t = 0;
    for await (const x of requests) t += x as number;
    return t;
  }),
  // raw client-streaming: the items joined
  join: rawClientStream(async (requests) => {
    const parts: Buffer[] = [];
    for await (const b of requests) parts.push(b);
    return Buffer.concat(parts);
  }),
  // raw bidi: each item back, reversed
  reverse: rawBidi(async function* (requests) {
    for await (const b of requests) yield Buffer.from(b).reverse();
  }),
  // reads one item, answers it, and ends the call (the client may still be writing)
  first: bidi(async function* (requests) {
    const r = await requests.next();
    yield r.value;
  }),
  // client-streaming that answers after the first item
  firstOnly: clientStream(async (requests) => (await requests.next()).value),
  // records how its call ended: never answers until canceled or past its deadline
  hang: bidi(async function* (requests, ctx: HandlerContext) {
    const tag = String(ctx.metadata.tag);
    ctx.signal.addEventListener('abort', () => seen.aborted.set(tag, ctx.signal.reason));
    for await (const _ of requests) { /* never answers */ }
    yield 'ended';
  }),
  // fails the call after n items with the given code
  failAfter: bidi(async function* (requests, ctx: HandlerContext) {
    const n = Number(ctx.metadata.n ?? '1');
    let i = 0;
    for await (const x of requests) {
      yield x;
      if (++i === n) throw new UdskitError('aborted', 'the server gave up');
    }
  }),
  // reads one item, then stops reading until released
  stall: rawBidi(async function* (requests) {
    await requests.next();
    seen.stalledRead++;
    await new Promise<void>((r) => { seen.release = r; });
    for await (const _ of requests) seen.stalledRead++;
    yield Buffer.from(String(seen.stalledRead));
  }),
  // sends n items of size bytes each, not waiting for requests
  flood: rawBidi(async function* (requests, ctx: HandlerContext) {
    const n = Number(ctx.metadata.n);
    for (let i = 0; i < n; i++) yield Buffer.alloc(Number(ctx.metadata.size), i & 0xff);
    for await (const _ of requests) { /* drain */ }
  }),
};
