// W3C trace context (https://www.w3.org/TR/trace-context/) in call metadata, without a
// dependency: the same two metadata keys, traceparent and tracestate, that the Go
// OpenTelemetry adapter (rpc/rpcotel) reads and writes, so a trace crosses from a Node app
// through a Go sidecar. With the OpenTelemetry SDK, use its propagator instead:
//   const metadata = {}; propagation.inject(context.active(), metadata); client.call(m, req, { metadata })
// and on a server: propagation.extract(context.active(), ctx.metadata).
import { randomBytes } from 'node:crypto';
import type { Metadata } from './frame.js';

/** A W3C trace context: 32 hex digits of trace id, 16 of parent span id, the flags (1: sampled). */
export interface TraceContext {
  traceId: string;
  spanId: string;
  flags: number;
  /** The tracestate header, passed on unchanged (vendor entries). */
  state?: string;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** Parses a traceparent value (version 00, or a later one read as 00); undefined if it is not one. */
export function parseTraceparent(value: string | undefined): TraceContext | undefined {
  if (value === undefined || value.length > 512) return undefined;
  const m = TRACEPARENT.exec(value.trim());
  if (!m) return undefined;
  const [, version, traceId, spanId, flags, rest] = m;
  if (version === 'ff' || (version === '00' && rest !== undefined)) return undefined;
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return undefined;
  return { traceId, spanId, flags: parseInt(flags, 16) };
}

/** Formats a traceparent value (version 00). */
export function formatTraceparent(tc: TraceContext): string {
  return `00-${tc.traceId}-${tc.spanId}-${(tc.flags & 0xff).toString(16).padStart(2, '0')}`;
}

function nonZeroHex(bytes: number): string {
  for (;;) {
    const h = randomBytes(bytes).toString('hex');
    if (!/^0+$/.test(h)) return h;
  }
}

/** A new trace: random ids, sampled. */
export function newTrace(): TraceContext {
  return { traceId: nonZeroHex(16), spanId: nonZeroHex(8), flags: 1 };
}

/** A child of parent (same trace, a new span id, the same flags and state), or a new trace without a parent. */
export function childOf(parent: TraceContext | undefined): TraceContext {
  if (!parent) return newTrace();
  return { traceId: parent.traceId, spanId: nonZeroHex(8), flags: parent.flags, state: parent.state };
}

/** The metadata that carries tc on a call: { traceparent, tracestate? }. Merge it into CallOptions.metadata. */
export function traceMetadata(tc: TraceContext): Metadata {
  const md: Metadata = { traceparent: formatTraceparent(tc) };
  if (tc.state) md.tracestate = tc.state;
  return md;
}

/** The trace context a caller sent (a server handler's ctx.metadata), or undefined. */
export function traceFromMetadata(md: Metadata | undefined): TraceContext | undefined {
  const tc = parseTraceparent(md?.traceparent);
  if (tc && md?.tracestate) tc.state = md.tracestate;
  return tc;
}
