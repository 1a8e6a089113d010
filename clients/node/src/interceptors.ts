// Interceptors (middleware) around every call, on servers (ServerOptions.unaryInterceptors,
// streamInterceptors) and clients (ConnectOptions.unaryInterceptors, streamInterceptors), as
// Go's rpc package has them (rpc/intercept.go): for logging, metrics, tracing, authorization.
// The first in a list is the outermost.
//
// A server interceptor gets the request, the handler's context (method, metadata, deadline,
// peer, signal) and next, the rest of the chain and the handler. It refuses the call by
// throwing a UdskitError (new UdskitError('permission_denied', ...)) without calling next, or
// calls next (with a request or context of its own if it likes) and sees the outcome.
// A client interceptor gets the call (method, payload, options with the effective timeout, the
// server's address) and next, which sends it; it may add metadata, refuse, or retry.
//
// Without interceptors nothing here runs: the server dispatches to the registered handler
// itself and the client's call() takes its direct path (tested by interceptors.test.ts).
import type { HandlerContext, Spec } from './handler.js';

/** The rest of a server chain and the handler of a unary call: its value or a promise of it. */
export type UnaryNext = (req: unknown, ctx: HandlerContext) => unknown;
/** A unary server interceptor: returns the response (or a promise of it), or throws to refuse. */
export type UnaryServerInterceptor = (req: unknown, ctx: HandlerContext, next: UnaryNext) => unknown;
/** The rest of a server chain and the handler of a server stream: the items. */
export type StreamNext = (req: unknown, ctx: HandlerContext) => AsyncIterable<unknown> | Iterable<unknown>;
/**
 * A server-streaming interceptor: returns the items (next's, or an async generator that wraps
 * them to count or inspect each), or throws to refuse. For a raw stream the items are bytes.
 */
export type StreamServerInterceptor = (req: unknown, ctx: HandlerContext, next: StreamNext) => AsyncIterable<unknown> | Iterable<unknown>;

function chainServer<N extends (req: unknown, ctx: HandlerContext) => unknown>(
  ics: readonly ((req: unknown, ctx: HandlerContext, next: N) => ReturnType<N>)[], last: N): N {
  let next = last;
  for (let i = ics.length - 1; i >= 0; i--) {
    const ic = ics[i]!;
    const inner = next;
    next = ((req: unknown, ctx: HandlerContext) => ic(req, ctx, inner)) as N;
  }
  return next;
}

/**
 * @internal The server's dispatch with interceptors: a function from a registered spec to one
 * whose fn runs the chain (made once per spec and kept), or null when there are none.
 * Calls that answer once (unary, and client streams: req is then the request items) go through
 * the unary interceptors; calls that answer with items (server streams, bidirectional: req is
 * the request items) through the stream interceptors.
 */
export function serverWrapper(unary: readonly UnaryServerInterceptor[] | undefined,
  stream: readonly StreamServerInterceptor[] | undefined): ((sp: Spec) => Spec) | null {
  const u = unary ?? [];
  const s = stream ?? [];
  if (u.length === 0 && s.length === 0) return null;
  const done = new WeakMap<Spec, Spec>();
  return (sp) => {
    let w = done.get(sp);
    if (w !== undefined) return w;
    const k: string = sp.kind; // client-stream and bidi kinds come with issue 30
    if ((k === 'json' || k === 'raw' || k === 'clientStream' || k === 'rawClientStream') && u.length > 0) {
      w = { ...sp, fn: chainServer<UnaryNext>(u, sp.fn as UnaryNext) };
    } else if ((k === 'stream' || k === 'rawStream' || k === 'bidi' || k === 'rawBidi') && s.length > 0) {
      w = { ...sp, fn: chainServer<StreamNext>(s, sp.fn as StreamNext) };
    } else {
      w = sp;
    }
    done.set(sp, w);
    return w;
  };
}

/** @internal The client's unary chain around send, or null without interceptors (the types are client.ts's). */
export function unaryClientChain<C>(ics: readonly ((call: C, next: (call: C) => Promise<unknown>) => Promise<unknown>)[] | undefined,
  send: (call: C) => Promise<unknown>): ((call: C) => Promise<unknown>) | null {
  if (ics === undefined || ics.length === 0) return null;
  let next = send;
  for (let i = ics.length - 1; i >= 0; i--) {
    const ic = ics[i]!;
    const inner = next;
    next = (call: C) => {
      try {
        return Promise.resolve(ic(call, inner));
      } catch (e) {
        return Promise.reject(e as Error);
      }
    };
  }
  return next;
}

/** @internal The client's stream chain around open, or null without interceptors. */
export function streamClientChain<C>(ics: readonly ((call: C, next: (call: C) => AsyncIterable<unknown>) => AsyncIterable<unknown>)[] | undefined,
  open: (call: C) => AsyncIterable<unknown>): ((call: C) => AsyncIterable<unknown>) | null {
  if (ics === undefined || ics.length === 0) return null;
  let next = open;
  for (let i = ics.length - 1; i >= 0; i--) {
    const ic = ics[i]!;
    const inner = next;
    next = (call: C) => ic(call, inner);
  }
  return next;
}
