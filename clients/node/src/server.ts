// The udskit server: serves handlers to udskit clients (framed) and NDJSON
// clients on one socket, told apart by the first byte (spec 1).
//
// Per connection: state 'sniff' -> 'hello' (udskit) -> 'frames', or 'ndjson'.
// calls holds the calls in flight by id; a call leaves it when answered,
// failed or canceled (a canceled call is never answered). Reading pauses
// while the socket is blocked (write() returned false), so a client that does
// not read its responses cannot make the server buffer without bound.
// Draining (shutdown): goaway is sent, new requests are refused, and each
// connection closes once nothing is in flight and the client has closed
// (or when the shutdown timeout passes).
import net from 'node:net';
import tls from 'node:tls';
import { type ServerTLSOptions, peerOf, refusal, wantsClientCert } from './tls.js';
import { type Peer } from './handler.js';
import { type Addr, parseAddr, formatAddr } from './address.js';
import { DEFAULT_MAX_IN_FLIGHT, clampMaxFrame } from './frame.js';
import { bind, type ListenOptions, type Bound } from './listen.js';
import { type Handler, type Spec, specOf } from './handler.js';
import { SConn } from './server-conn.js';

export { raw, stream, rawStream } from './handler.js';
export type { HandlerContext, Handler, JsonHandler, RawHandler, JsonStreamHandler, RawStreamHandler } from './handler.js';

export interface ServerOptions {
  handlers: Record<string, Handler>;
  /** Largest payload accepted and sent (default 16 MiB). */
  maxFrame?: number;
  /** Most calls in flight per connection (default 4096). */
  maxInFlight?: number;
  /** A connection that sends no complete hello (or first line) in this time is closed, ms (default 5000). */
  helloTimeout?: number;
  /** A connection that leaves a frame half sent for this long is closed, ms (default 10000). */
  stallTimeout?: number;
  /**
   * Request bytes the calls in flight on one connection may hold before the
   * server stops reading it until some finish (default 4 MiB; one bigger
   * request is still read). With socket backpressure this bounds a client's cost.
   */
  maxConnBytes?: number;
  /** Connections over this many are closed at once (default 0: no limit). */
  maxConns?: number;
  /** Called with connection-level problems (hostile or broken peers); default: ignored. */
  onError?: (err: Error) => void;
}

export interface ShutdownOptions {
  /** How long in-flight calls may take before everything is closed, ms (default 10000). */
  timeout?: number;
}

export class Server {
  readonly handlers = new Map<string, Spec>();
  readonly maxFrame: number;
  readonly maxInFlight: number;
  readonly helloTimeout: number;
  readonly stallTimeout: number;
  readonly maxConnBytes: number;
  readonly conns = new Set<SConn>();
  draining = false;
  /** Connections accepted so far. */
  accepted = 0;
  private net: net.Server;
  private bound: Bound | null = null;
  private addr: Addr | null = null;
  private idle: (() => void) | null = null;

  constructor(private readonly opts: ServerOptions) {
    for (const [name, h] of Object.entries(opts.handlers)) {
      if (name === '') throw new TypeError('a method name must not be empty');
      this.handlers.set(name, specOf(h));
    }
    this.maxFrame = clampMaxFrame(opts.maxFrame);
    this.maxInFlight = Math.max(1, opts.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT);
    this.helloTimeout = opts.helloTimeout ?? 5000;
    this.stallTimeout = opts.stallTimeout ?? 10_000;
    this.maxConnBytes = opts.maxConnBytes ?? 4 << 20;
    this.net = net.createServer({ allowHalfOpen: true }, (s) => this.accept(s));
    this.net.on('error', (err) => this.report(err));
  }

  private accept(s: net.Socket, peer?: Peer): void {
    if (this.draining || (this.opts.maxConns !== undefined && this.opts.maxConns > 0 && this.conns.size >= this.opts.maxConns)) {
      s.destroy();
      return;
    }
    this.accepted++;
    this.conns.add(new SConn(this, s, peer));
  }

  /** tls: after the handshake (chain verified by Node), the policy on the certificate, before one byte is read. */
  private acceptTLS(ts: tls.TLSSocket, o: ServerTLSOptions): void {
    const peer = peerOf(ts);
    const why = refusal(o, peer);
    if (why !== undefined) {
      this.report(new Error(`TLS peer refused: ${why}`));
      ts.destroy();
      return;
    }
    this.accept(ts, peer);
  }

  /** @internal */
  report(err: Error): void {
    this.opts.onError?.(err);
  }

  /**
   * Listens on addr (any udskit address). A socket path gets mode `opts.mode`
   * (default 0o600) with no window of looser permissions; a stale socket there
   * is removed only after a connect to it is refused. Resolves to the
   * canonical address (for tcp port 0, with the real port).
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
        requestCert: mutual, rejectUnauthorized: mutual, handshakeTimeout: this.helloTimeout }, (sock) => this.acceptTLS(sock, o));
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

  private stopListening(): Promise<void> {
    return new Promise((resolve) => {
      if (!this.net.listening) return resolve();
      this.net.close(() => resolve());
      this.bound?.cleanup();
    });
  }

  /** @internal */
  connClosed(): void {
    if (this.conns.size === 0 && this.idle !== null) this.idle();
  }

  /**
   * Graceful shutdown: stop accepting (the socket file is removed), send
   * goaway so clients move new calls elsewhere (requests that still arrive
   * are refused unprocessed), let calls in flight finish and send their
   * answers, and resolve once every client has gone; after `timeout` ms the
   * rest is closed (their handlers' signals abort).
   */
  async shutdown(opts: ShutdownOptions = {}): Promise<void> {
    this.draining = true;
    const stopped = this.stopListening();
    for (const c of this.conns) c.goaway();
    if (this.conns.size > 0) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          for (const c of this.conns) c.kill(new Error('shutdown timeout'));
          resolve();
        }, opts.timeout ?? 10_000);
        this.idle = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
    await stopped;
  }

  /** Closes at once: every connection and the listener. */
  async close(): Promise<void> {
    this.draining = true;
    const stopped = this.stopListening();
    for (const c of [...this.conns]) c.socket.destroy();
    await stopped;
  }
}

/** Creates a server; call listen() on it. */
export function createServer(opts: ServerOptions): Server {
  return new Server(opts);
}
