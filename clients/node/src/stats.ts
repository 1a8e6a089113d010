// Reading a server's statistics: the standard method udskit.stats (protocol/spec.md 9.3).
import type { CallOptions, Client } from './client.js';
import { STATS } from './handler.js';
import { UdskitError } from './codes.js';

/** The server side of the shared-memory data path (spec section 10), as udskit.stats reports it. */
export interface ShmServerStats {
  /** The server accepts shared-memory offers (a Go server on Linux without NoShm). */
  enabled: boolean;
  /** The payload size from which the server puts a payload in the region. */
  threshold: number;
  /** Open connections using a region (one each). */
  conns: number;
  /** Bytes of the server's halves held by payloads the clients have not released; inUse/capacity is the fill level. */
  inUse: number;
  capacity: number;
  /** Payloads through a region since the server started: sent (responses, stream items), received (requests). */
  sent: number;
  received: number;
  /** Payloads that waited for space in a full half (back-pressure). */
  waits: number;
  /** Payloads larger than a half, sent on the socket. */
  overHalf: number;
  /**
   * Answers sent on the socket because the half was full while the connection's reader waited for the
   * server's memory budget (spec 10.6). Not 0: a client keeps more large payloads in flight on one
   * connection than the budget and region hold (`udskit doctor ADDR` says what to change).
   */
  stalled: number;
  /**
   * Call slots (a Go client's ShmCalls, spec 10.8; older servers leave these out: 0): unary calls the
   * server answered through a call slot, and the bytes of their payloads carried in the slots' payload
   * areas each way (answers sent, requests received; those payloads also count in sent/received).
   */
  slotCalls: number;
  areaSentBytes: number;
  areaReceivedBytes: number;
  /** Wake-ups of the server's call-slot pollers that found nothing changed (a client flooding FUTEX_WAKE). */
  spuriousWakes: number;
}

/** A server's answer to udskit.stats. */
export interface ServerStats {
  /** Connections the server serves now (the asking one included). */
  conns: number;
  /** All zero, enabled false, for a server without shared memory (Node, Python, NoShm). */
  shm: ShmServerStats;
}

const count = (o: Record<string, unknown>, k: string): number => {
  const v = o[k];
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : 0;
};

/**
 * Reads an udskit.stats answer (the parsed JSON): a missing `shm` or field reads as 0 (`enabled`
 * false; an older server has no `stalled` or call-slot counters), unknown fields are ignored. Throws a UdskitError
 * (internal) for an answer that is not a JSON object.
 */
export function parseStats(v: unknown): ServerStats {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) {
    throw new UdskitError('internal', `${STATS}: the answer is not a JSON object`);
  }
  const o = v as Record<string, unknown>;
  const s = typeof o.shm === 'object' && o.shm !== null && !Array.isArray(o.shm) ? (o.shm as Record<string, unknown>) : {};
  return {
    conns: count(o, 'conns'),
    shm: {
      enabled: s.enabled === true,
      threshold: count(s, 'threshold'),
      conns: count(s, 'conns'),
      inUse: count(s, 'in_use'),
      capacity: count(s, 'capacity'),
      sent: count(s, 'sent'),
      received: count(s, 'received'),
      waits: count(s, 'waits'),
      overHalf: count(s, 'over_half'),
      stalled: count(s, 'stalled'),
      slotCalls: count(s, 'slot_calls'),
      areaSentBytes: count(s, 'area_sent_bytes'),
      areaReceivedBytes: count(s, 'area_received_bytes'),
      spuriousWakes: count(s, 'spurious_wakes'),
    },
  };
}

/** Calls udskit.stats on c's server. A server without it (an older one) fails with `unimplemented`. */
export async function fetchStats(c: Client, opts?: CallOptions): Promise<ServerStats> {
  return parseStats(await c.call(STATS, {}, opts));
}
