// The udskit server: serves handlers to udskit clients (framed) and NDJSON
// clients on one socket, told apart by the first byte (spec 1).
//
// Per connection: state 'sniff' -> 'hello' (udskit) -> 'frames', or 'ndjson'
// (server-conn.ts). calls holds the calls in flight by id; a call leaves it
// when answered, failed or canceled (a canceled call is never answered).
//
// Limits, with Go's rpc.ServerOptions names and defaults (docs/reliability.md):
// memory budgets per connection (maxConnBytes) and in total (maxServerBytes)
// on bytes that have arrived or wait to be written, enforced by not reading
// a connection over them; a frame timeout from a frame's first byte, a write
// timeout for a client that reads nothing, an optional idle timeout, a
// handshake timeout, and a connection cap (by default under the fd limit).
//
// Draining (shutdown): mode 'goaway' stops accepting, sends goaway (framed
// requests that still arrive are refused unprocessed; NDJSON lines already
// read are served) and closes each connection once nothing is in flight and
// the client has closed, or at the timeout. Mode 'linger' keeps serving and
// accepting until no client is left (after minGraceMs), or the timeout.
// Either way udskit.health answers "draining" from the first moment.
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { type ServerTLSOptions, peerOf, refusal, wantsClientCert } from './tls.js';
import { type Peer } from './handler.js';
import { type Addr, parseAddr, formatAddr } from './address.js';
import { UdskitError, Code } from './codes.js';
import { DEFAULT_MAX_IN_FLIGHT, HEADER_SIZE, MAX_HEAD, T, clampMaxFrame, writeHeader } from './frame.js';
import { bind, type ListenOptions, type Bound } from './listen.js';
import { type Handler, type Spec, specOf, HEALTH, METHODS, STATS, RESERVED_PREFIX } from './handler.js';
import { type UnaryServerInterceptor, type StreamServerInterceptor, serverWrapper } from './interceptors.js';
import { SConn, type ConnHost, type ConnLimits } from './server-conn.js';
import { kindName } from './server-bidi.js';

export { raw, stream, rawStream } from './handler.js';
export { bidi, rawBidi, clientStream, rawClientStream } from './server-bidi.js';
export type { JsonBidiHandler, RawBidiHandler, JsonClientStreamHandler, RawClientStreamHandler } from './server-bidi.js';
export type { HandlerContext, Handler, JsonHandler, RawHandler, JsonStreamHandler, RawStreamHandler } from './handler.js';

export interface ServerOptions {
  handlers: Record<string, Handler>;
  /** Largest payload accepted and sent (default 16 MiB). */
  maxFrame?: number;
  /** Most calls in flight per connection (default 4096): a udskit client past it is closed; NDJSON lines past it wait, unread. */
  maxInFlight?: number;
  /** A connection that sends no complete hello (or first line) in this time is closed, ms (default 10000; negative: none). */
  handshakeTimeout?: number;
  /** @deprecated the old name of handshakeTimeout (used when handshakeTimeout is not set). */
  helloTimeout?: number;
  /**
   * A frame (or NDJSON line) must arrive whole within this time of its first
   * byte, ms; more bytes of the same frame do not extend it (default 30000;
   * negative: none). Not counted while the server itself stops reading.
   */
  frameTimeout?: number;
  /** @deprecated the old name of frameTimeout (used when frameTimeout is not set). */
  stallTimeout?: number;
  /** A client that reads nothing of what waits to be sent to it for this long is closed, ms (default 30000; negative: none). */
  writeTimeout?: number;
  /** A connection with nothing in flight and nothing arriving for this long gets goaway and is closed, ms (default 0: never). */
  idleTimeout?: number;
  /**
   * Bytes one connection may hold (requests read and not answered, answers
   * not yet written, a frame partly received) before the server stops reading
   * it until calls finish (default 16 MiB; an NDJSON connection a quarter).
   * One frame up to maxFrame is always let in when the connection holds nothing else.
   */
  maxConnBytes?: number;
  /**
   * The same over all connections (default 64 MiB): while over it, a
   * connection that holds something is not read; one holding nothing always is.
   */
  maxServerBytes?: number;
  /**
   * Connections over this many are closed at once. Default: the process's
   * open-file limit less 64 (Linux; read from /proc/self/limits), so a flood
   * of connections cannot exhaust the descriptors; 0: no limit.
   */
  maxConns?: number;
  /** Called with connection-level problems (hostile or broken peers); default: ignored. */
  onError?: (err: Error) => void;
  /** Run around every unary call, the first outermost (see interceptors.ts); built-in methods too. */
  unaryInterceptors?: UnaryServerInterceptor[];
  /** Run around every server-streaming call, the first outermost. */
  streamInterceptors?: StreamServerInterceptor[];
}

export interface ShutdownOptions {
  /** 'goaway' (default): stop accepting and tell clients to go; 'linger': keep serving until the clients leave. */
  mode?: 'goaway' | 'linger';
  /** How long the drain may take before everything left is closed, ms (default 10000). */
  timeoutMs?: number;
  /** The old name of timeoutMs (used when timeoutMs is not set). */
  timeout?: number;
  /** linger: do not finish before this many ms, even with no client connected (default 0). */
  minGraceMs?: number;
}

/** What udskit.health reports. */
export type HealthStatus = 'serving' | 'not_serving' | 'draining';
const STATUSES: readonly string[] = ['serving', 'not_serving', 'draining'];

/** Go's defaultTimeout: unset or 0 is the default, negative is none (0). */
function timeoutOpt(v: number | undefined, old: number | undefined, def: number): number {
  const x = v ?? old;
  if (x === undefined || x === 0 || Number.isNaN(x)) return def;
  return x < 0 ? 0 : x;
}

/** The soft open-file limit less a reserve (Linux), else 0 (no cap). */
function defaultMaxConns(): number {
  try {
    const m = /^Max open files\s+(\d+)/m.exec(fs.readFileSync('/proc/self/limits', 'utf8'));
    if (m !== null) return Math.max(16, Number(m[1]) - 64);
  } catch {
    // not Linux: no cap by default
  }
  return 0;
}

export class Server {
  readonly handlers = new Map<string, Spec>();
  readonly limits: ConnLimits;
  readonly maxServerBytes: number;
  readonly maxConns: number;
  readonly conns = new Set<SConn>();
  /** A drain (either mode) has started: udskit.health says draining. */
  draining = false;
  /** A goaway drain (or close) has started: no new connections, framed requests refused. */
  refusing = false;
  /** Connections accepted so far. */
  accepted = 0;
  private held = 0;
  private readonly budgetWaiters = new Set<SConn>();
  private net: net.Server;
  private bound: Bound | null = null;
  private addr: Addr | null = null;
  private stopping: Promise<void> | null = null;
  /** close() was called: nothing more is accepted. */
  private closing = false;
  private drain: { done: Promise<void>; check: () => void; graceOver: boolean } | null = null;
  private readonly health = new Map<string, HealthStatus>([['', 'serving']]);
  private readonly healthSpec: Spec;
  /** udskit.methods (spec 9.2). */
  private readonly methodsSpec: Spec;
  /** udskit.stats (spec 9.3): the connections served now; no shm (Node takes no shared-memory offers). */
  private readonly statsSpec: Spec;
  private refusedConns = 0;
  private refusedLogAt = 0;
  /** What the connections see of the server (nothing else of it). */
  private readonly host: ConnHost;

  constructor(private readonly opts: ServerOptions) {
    for (const [name, h] of Object.entries(opts.handlers)) {
      if (name === '') throw new TypeError('a method name must not be empty');
      if (name.startsWith(RESERVED_PREFIX)) throw new TypeError(`method ${JSON.stringify(name)}: names starting with ${RESERVED_PREFIX} are reserved for built-in methods`);
      this.handlers.set(name, specOf(h));
    }
    this.limits = {
      maxFrame: clampMaxFrame(opts.maxFrame),
      maxInFlight: Math.max(1, opts.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT),
      handshakeTimeout: timeoutOpt(opts.handshakeTimeout, opts.helloTimeout, 10_000),
      frameTimeout: timeoutOpt(opts.frameTimeout, opts.stallTimeout, 30_000),
      writeTimeout: timeoutOpt(opts.writeTimeout, undefined, 30_000),
      idleTimeout: Math.max(0, opts.idleTimeout ?? 0),
      maxConnBytes: opts.maxConnBytes !== undefined && opts.maxConnBytes > 0 ? opts.maxConnBytes : 16 << 20,
    };
    this.maxServerBytes = opts.maxServerBytes !== undefined && opts.maxServerBytes > 0 ? opts.maxServerBytes : 64 << 20;
    this.maxConns = opts.maxConns === undefined ? defaultMaxConns() : Math.max(0, opts.maxConns);
    this.healthSpec = specOf((req: unknown) => this.healthOf(req));
    const srv = this;
    const plain = (method: string): Spec | undefined =>
      method === HEALTH ? this.healthSpec : method === METHODS ? this.methodsSpec : method === STATS ? this.statsSpec : this.handlers.get(method);
    // No interceptors: connections call the registered handler itself (no wrapper, no lookup).
    const wrap = serverWrapper(opts.unaryInterceptors, opts.streamInterceptors);
    this.host = {
      limits: this.limits,
      get refusing(): boolean { return srv.refusing; },
      handler: wrap === null ? plain : (method) => {
        const sp = plain(method);
        return sp === undefined ? undefined : wrap(sp);
      },
      report: (err) => this.report(err),
      account: (delta) => this.account(delta),
      overBudget: () => this.held > this.maxServerBytes,
      heldByOthers: (mine) => this.held - mine > 0,
      waitBudget: (c) => { this.budgetWaiters.add(c); },
      connClosed: (c) => this.connClosed(c),
    };
    this.methodsSpec = specOf(() => ({ methods: this.methodInfos() }));
    this.statsSpec = specOf(() => ({ conns: this.conns.size }));
    this.net = net.createServer({ allowHalfOpen: true }, (s) => this.accept(s));
    this.net.on('error', (err) => this.report(err));
  }

  /** Largest payload accepted and sent. */
  get maxFrame(): number {
    return this.limits.maxFrame;
  }

  /** Most calls in flight per connection. */
  get maxInFlight(): number {
    return this.limits.maxInFlight;
  }

  /** Bytes all connections hold now (see maxServerBytes). */
  get heldBytes(): number {
    return this.held;
  }

  private accept(s: net.Socket, peer?: Peer): void {
    if (this.closing) {
      s.destroy();
      return;
    }
    if (this.maxConns > 0 && this.conns.size >= this.maxConns) {
      s.destroy();
      // One line a second at most, with the count: a flood must not flood the log.
      this.refusedConns++;
      const now = Date.now();
      if (now - this.refusedLogAt >= 1000) {
        this.report(new Error(`${this.refusedConns} connection(s) refused: ${this.conns.size} open, the limit (maxConns) is ${this.maxConns}`));
        this.refusedConns = 0;
        this.refusedLogAt = now;
      }
      return;
    }
    this.accepted++;
    const c = new SConn(this.host, s, peer);
    this.conns.add(c);
    // Accepted as the listener closed (a goaway drain): served as a draining
    // connection rather than dropped (an NDJSON client cannot retry).
    if (this.refusing) c.goaway();
  }

  /** tls: after the handshake (chain verified by Node), the policy on the certificate, before one byte is read. */
  private acceptTLS(ts: tls.TLSSocket, o: ServerTLSOptions): void {
    const peer = peerOf(ts);
    const why = refusal(o, peer);
    if (why !== undefined) {
      this.report(new Error(`TLS peer refused: ${why}`));
      // Spec 5.4: the reason as an error frame in place of the hello, then close. The
      // socket keeps reading (and dropping) what the client sent until it closes, so no
      // TCP reset overtakes the frame; a client that never closes is cut off after 5s.
      const head = Buffer.from(`${why}; retrying will not help`).subarray(0, MAX_HEAD);
      const f = Buffer.alloc(HEADER_SIZE + head.length);
      writeHeader(f, 0, T.error, 0, head.length, 0, 0, Code.permission_denied);
      head.copy(f, HEADER_SIZE);
      ts.on('data', () => {});
      ts.on('error', () => {});
      ts.end(f);
      setTimeout(() => ts.destroy(), 5000).unref();
      return;
    }
    this.accept(ts, peer);
  }

  private report(err: Error): void {
    this.opts.onError?.(err);
  }

  private account(delta: number): void {
    this.held += delta;
    if (delta < 0 && this.budgetWaiters.size > 0 && this.held <= this.maxServerBytes) {
      const ws = [...this.budgetWaiters];
      this.budgetWaiters.clear();
      for (const c of ws) c.maybeResume();
    }
  }

  private connClosed(c: SConn): void {
    this.conns.delete(c);
    this.budgetWaiters.delete(c);
    if (this.conns.size === 0) this.drain?.check();
  }

  /**
   * Sets what udskit.health reports for service ('' is the server as a
   * whole; a name makes that service known to the health method). While a
   * drain runs, every service reports draining.
   */
  setHealth(service: string, status: HealthStatus): void {
    if (!STATUSES.includes(status)) throw new TypeError(`health status ${JSON.stringify(status)}: want serving, not_serving or draining`);
    this.health.set(service, status);
  }

  /** The registered methods as udskit.methods lists them (spec 9.2): sorted by name, kind and format. */
  methodInfos(): { name: string; kind: 'unary' | 'stream' | 'client_stream' | 'bidi'; format: 'json' | 'raw' }[] {
    return [...this.handlers.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([name, sp]) => ({
        name,
        kind: kindName(sp.kind),
        format: sp.kind === 'raw' || sp.kind === 'rawStream' || sp.kind === 'rawBidi' || sp.kind === 'rawClientStream' ? 'raw' as const : 'json' as const,
      }));
  }

  private healthOf(req: unknown): { status: HealthStatus } {
    let service = '';
    if (req !== undefined && req !== null) {
      if (typeof req !== 'object' || Array.isArray(req)) throw new UdskitError(Code.invalid_argument, `${HEALTH}: want {} or {"service":"NAME"}`);
      const s = (req as { service?: unknown }).service;
      if (s !== undefined && s !== null) {
        if (typeof s !== 'string') throw new UdskitError(Code.invalid_argument, `${HEALTH}: service must be a string`);
        service = s;
      }
    }
    const st = this.health.get(service);
    if (st === undefined) throw new UdskitError(Code.not_found, `${HEALTH}: unknown service ${JSON.stringify(service)}`);
    return { status: this.draining ? 'draining' : st };
  }

  /**
   * Listens on addr (any udskit address). A socket path gets mode `opts.mode`
   * (default 0o600) with no window of looser permissions; a stale socket there
   * is removed only after a connect to it is refused, under the PATH.lock
   * lock (see listen.ts). Resolves to the canonical address (for tcp port 0,
   * with the real port).
   */
  async listen(address: string, opts: ListenOptions & { tls?: ServerTLSOptions } = {}): Promise<string> {
    const a = parseAddr(address);
    if (a.kind === 'tls') {
      const o = opts.tls;
      if (o === undefined) throw new TypeError(`${address}: a tls: address needs { tls: { cert, key, ca? } }; there is no plaintext fallback`);
      if (wantsClientCert(o) && o.ca === undefined) throw new TypeError('allowSpiffe/allowDns/requireClientCert need tls.ca: the CA bundle client certificates are verified against');
      const mutual = wantsClientCert(o);
      // A tls.Server in place of the plain one: Node verifies the client's chain (rejectUnauthorized)
      // and sets socket.authorized; the policy then runs on the verified certificate.
      const ts = tls.createServer({ allowHalfOpen: true, cert: o.cert, key: o.key, ca: o.ca, minVersion: 'TLSv1.3',
        requestCert: mutual, rejectUnauthorized: mutual, handshakeTimeout: this.limits.handshakeTimeout || 10_000 }, (sock) => this.acceptTLS(sock, o));
      ts.on('tlsClientError', (err) => this.report(new Error(`TLS peer refused: ${err.message}`)));
      ts.on('error', (err) => this.report(err));
      this.net = ts;
      this.bound = await bind(this.net, { kind: 'tcp', name: a.name }, opts);
      const ai = this.net.address() as net.AddressInfo;
      const host = a.name.slice(0, a.name.lastIndexOf(':'));
      this.addr = { kind: 'tls', name: `${host}:${ai.port}` };
      return formatAddr(this.addr);
    }
    this.bound = await bind(this.net, a, opts);
    if (a.kind === 'tcp') {
      const ai = this.net.address() as net.AddressInfo;
      const host = a.name.slice(0, a.name.lastIndexOf(':'));
      this.addr = { kind: 'tcp', name: `${host}:${ai.port}` };
    } else {
      this.addr = a;
    }
    return formatAddr(this.addr);
  }

  /** The canonical address listened on. */
  get address(): string {
    return this.addr === null ? '' : formatAddr(this.addr);
  }

  /** Stops accepting and removes the socket file (if still ours); resolves once the listener and every connection are closed. */
  private stopListening(): Promise<void> {
    this.refusing = true;
    if (this.stopping === null) {
      const closed = new Promise<void>((resolve) => {
        if (!this.net.listening) return resolve();
        this.net.close(() => resolve());
      });
      const cleaned = this.bound?.cleanup() ?? Promise.resolve();
      this.stopping = Promise.all([closed, cleaned]).then(() => {});
    }
    return this.stopping;
  }

  /**
   * Graceful shutdown (udskit.health reports draining at once).
   *
   * mode 'goaway' (default): stop accepting (the socket file is removed),
   * send goaway so clients move new calls elsewhere (framed requests that
   * still arrive are refused unprocessed; NDJSON lines read are served), let
   * calls in flight finish and send their answers, and resolve once every
   * client has gone; after timeoutMs the rest is closed (their handlers'
   * signals abort).
   *
   * mode 'linger': keep serving and accepting as usual, send no goaway;
   * resolve once no client is connected and minGraceMs has passed (then stop
   * listening), or at timeoutMs, closing what is left. For a sidecar in a
   * pod: the app, shutting down too, still needs it for its last calls.
   *
   * Calling it again joins the drain under way; a goaway call during a
   * linger turns it into a goaway drain (same deadline).
   */
  shutdown(opts: ShutdownOptions = {}): Promise<void> {
    const mode = opts.mode ?? 'goaway';
    if (mode !== 'goaway' && mode !== 'linger') throw new TypeError(`shutdown mode ${JSON.stringify(mode)}: want 'goaway' or 'linger'`);
    this.draining = true;
    if (mode === 'goaway') this.goawayAll();
    if (this.drain !== null) {
      this.drain.check();
      return this.drain.done;
    }
    const timeout = opts.timeoutMs ?? opts.timeout ?? 10_000;
    const minGrace = mode === 'linger' ? Math.max(0, opts.minGraceMs ?? 0) : 0;
    let finish!: () => void;
    const left = new Promise<void>((resolve) => { finish = resolve; });
    const st = {
      done: left.then(async () => {
        clearTimeout(deadline);
        clearTimeout(grace);
        const stopped = this.stopListening();
        this.closing = true;
        for (const c of [...this.conns]) c.kill(new Error('shutdown timeout'));
        await stopped;
      }),
      graceOver: minGrace === 0,
      check: (): void => {
        if (this.conns.size === 0 && (st.graceOver || this.refusing)) finish();
      },
    };
    const deadline = setTimeout(finish, timeout);
    const grace = setTimeout(() => { st.graceOver = true; st.check(); }, minGrace);
    this.drain = st;
    st.check();
    return st.done;
  }

  private goawayAll(): void {
    if (this.refusing && this.stopping !== null) return;
    void this.stopListening();
    for (const c of this.conns) c.goaway();
  }

  /** Closes at once: every connection and the listener. */
  async close(): Promise<void> {
    this.draining = true;
    this.closing = true;
    const stopped = this.stopListening();
    for (const c of [...this.conns]) c.socket.destroy();
    await stopped;
  }
}

/** Creates a server; call listen() on it. */
export function createServer(opts: ServerOptions): Server {
  return new Server(opts);
}
