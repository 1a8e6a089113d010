// Dialing an address: one attempt (with the udskit hello exchange), and the
// bounded wait-with-backoff loop used at start and for reconnects.
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { type TLSOptions, tlsConnectOptions, explainTLS } from './tls.js';
import { type SSHOptions, sshConnect, remoteSocketHint } from './ssh.js';
import { type Addr, AddrError, parseAddr, splitHostPort, formatAddr } from './address.js';
import { UdskitError, ProtocolError } from './codes.js';
import { type Hello, type Negotiated, encodeHello, decodeHello, negotiate, VERSION, FEATURE_STREAM_CREDIT, FEATURE_CLIENT_STREAM, HELLO_SIZE, EMPTY } from './frame.js';

export interface Dialed {
  socket: net.Socket;
  /** The negotiated hello; undefined for NDJSON. */
  neg: Negotiated | undefined;
  /** Bytes that arrived after the server's hello. */
  rest: Buffer;
}

/**
 * Node 20's libuv binds and connects abstract names padded with NULs to the
 * full sun_path length, so a Node peer on @name never meets a Go (or any C)
 * peer on @name. Refuse clearly rather than fail with a confusing ECONNREFUSED.
 */
export function abstractUnsupported(a: Addr): AddrError {
  return new AddrError('@' + a.name, 'abstract_unsupported',
    "abstract socket names are not supported by udskit for Node: Node's libuv pads them to 108 bytes, so they never match a Go peer's @name; use a socket path");
}

/** net.connect options for an address. */
export function netOptions(a: Addr): net.NetConnectOpts {
  switch (a.kind) {
    case 'unix': return { path: a.name };
    case 'abstract': throw abstractUnsupported(a);
    case 'passed': throw new AddrError(a.name, 'listen_only', `${a.name} names an inherited listening socket: only a server can use it`);
    case 'tcp': {
      const { host, port } = splitHostPort(a.name);
      return { host: host === '' ? 'localhost' : host, port, noDelay: true };
    }
    case 'tls': // dialOnce uses tls.connect
    case 'ssh': // dialOnce runs ssh
      throw new AddrError(formatAddr(a), 'unsupported_here', `${formatAddr(a)}: the Node client does not dial ${a.kind} addresses yet; use the Go client or udskit proxy`);
  }
}

/** Errors worth retrying while waiting for a server: nothing listens (yet). */
export function transient(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ECONNREFUSED' || code === 'EAGAIN' || code === 'ECONNRESET' || code === 'EPIPE' || code === 'ETIMEDOUT';
}

/**
 * The one deadline of a whole connect, across every phase (ssh, TCP/unix connect, TLS, the hello)
 * and every attempt of a wait: each phase's timer is set for what is left of it, never for a fresh
 * length.
 */
export interface Deadline {
  /** When the connect ends, on performance.now()'s clock. */
  at: number;
  /** Its whole length, ms (for messages: a later attempt has only what is left). */
  ms: number;
}

/** A deadline ms from now. */
export function deadlineIn(ms: number): Deadline {
  return { at: performance.now() + ms, ms };
}

/** What is left of d, ms (at least 1: a timer for it). */
function left(d: Deadline): number {
  return Math.max(1, d.at - performance.now());
}

/** Makes one connection attempt that ends by the deadline, the hello exchange included. */
export function dialOnce(a: Addr, ndjson: boolean, maxFrame: number, d: Deadline, tlsOpts?: TLSOptions, sshOpts?: SSHOptions): Promise<Dialed> {
  if (a.kind === 'ssh') {
    return sshConnect(a, sshOpts ?? {}, left(d)).then((s) => hello(a, s, ndjson, maxFrame, d, true));
  }
  const isTLS = a.kind === 'tls';
  const socket: net.Socket = isTLS ? tls.connect(tlsConnectOptions(a, tlsOpts)) : net.connect(netOptions(a));
  return hello(a, socket, ndjson, maxFrame, d, false, isTLS ? 'secureConnect' : 'connect');
}

/** The hello exchange on socket (connected already, or when connectEvent fires), by the deadline. */
function hello(a: Addr, socket: net.Socket, ndjson: boolean, maxFrame: number, d: Deadline, connected: boolean, connectEvent = 'connect'): Promise<Dialed> {
  return new Promise((resolve, reject) => {
    const hello: Hello = { version: VERSION, flags: FEATURE_STREAM_CREDIT | FEATURE_CLIENT_STREAM, maxFrame, maxInFlight: 0 };
    let got: Buffer[] = [];
    let gotLen = 0;
    const fail = (err: unknown): void => {
      cleanup();
      socket.destroy();
      reject(err);
    };
    const onError = (err: Error): void => fail(a.kind === 'ssh'
      ? new UdskitError('unavailable', `connect ${formatAddr(a)}: ${remoteSocketHint(a)} (${err.message})`)
      : err);
    const onClose = (): void => fail(a.kind === 'ssh'
      ? new UdskitError('unavailable', `connect ${formatAddr(a)}: ${remoteSocketHint(a)}`)
      : Object.assign(new Error('connection closed during the hello'), { code: 'ECONNRESET' }));
    const onConnect = (): void => {
      connected = true;
      if (ndjson) {
        cleanup();
        resolve({ socket, neg: undefined, rest: EMPTY });
        return;
      }
      socket.write(encodeHello(hello));
    };
    const onData = (chunk: Buffer): void => {
      got.push(chunk);
      gotLen += chunk.length;
      const all = Buffer.concat(got, gotLen);
      got = [all];
      const refusal = parseRefusal(all);
      if (refusal === 'partial') return;
      if (refusal !== null) {
        fail(new UdskitError(refusal.code, `connect ${formatAddr(a)}: refused by the server: ${refusal.message}`));
        return;
      }
      try {
        if (gotLen < HELLO_SIZE) {
          decodeHello(all); // fails at once on a wrong magic byte
          return;
        }
        const server = decodeHello(all);
        const neg = negotiate(hello, server);
        cleanup();
        resolve({ socket, neg, rest: all.subarray(HELLO_SIZE) });
      } catch (e) {
        if (e instanceof ProtocolError && e.errorName === 'truncated') return;
        fail(new UdskitError('protocol_violation', `connect ${formatAddr(a)}: the server does not speak udskit: it answered the hello with ${JSON.stringify(all.subarray(0, 40).toString('latin1'))} (${(e as Error).message})`, { cause: e }));
      }
    };
    // connected is the parameter: true for a socket handed over connected (ssh://), set by onConnect otherwise.
    const timer = setTimeout(() => fail(connected
      ? new UdskitError('unavailable', `connect ${formatAddr(a)}: connected, but no udskit hello came back within the connect timeout (${Math.round(d.ms)}ms${gotLen > 0 ? `; it sent ${gotLen} of its ${HELLO_SIZE} bytes` : ''}): the server does not speak udskit (a Redis or HTTP socket?), or it is stuck or slow (then give connect a longer timeout)`)
      : Object.assign(new Error(`no connection within the connect timeout (${Math.round(d.ms)}ms)`), { code: 'ETIMEDOUT' })), left(d));
    const cleanup = (): void => {
      clearTimeout(timer);
      socket.off('error', onError);
      socket.off('close', onClose);
      socket.off(connectEvent, onConnect);
      socket.off('data', onData);
    };
    socket.on('error', onError);
    socket.on('close', onClose);
    socket.on(connectEvent, onConnect);
    if (connected) onConnect();
    socket.on('data', onData);
  });
}

/** Exponential backoff with jitter: attempt 0 is initial, capped at max, each in [d/2, d]. */
export function backoff(attempt: number, initial: number, max: number): number {
  const d = Math.min(max, initial * 2 ** Math.min(attempt, 30));
  return d / 2 + Math.random() * (d / 2);
}

/** Sleeps ms unless the signal aborts first (resolves false then). unref: does not keep the process alive. */
export function sleep(ms: number, signal?: AbortSignal, unref = false): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve(true); }, ms);
    if (unref) t.unref();
    const onAbort = (): void => { clearTimeout(t); resolve(false); };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Spec 5.4: a server that refuses the connection sends one connection-level
 * error frame in place of its hello. Returns null when buf does not start
 * with one (a hello, or anything else), 'partial' while it is incomplete.
 */
export function parseRefusal(buf: Buffer): { code: number; message: string } | 'partial' | null {
  if (buf.length === 0 || buf[0] !== 3) return null;
  if (buf.length < HELLO_SIZE) return 'partial';
  const headLen = buf.readUInt16LE(2);
  if (buf.readUInt32LE(4) !== 0 || headLen > 16384 || buf.readUInt32LE(12) === 0) return null; // not a refusal: bad_magic follows
  if (buf.length < HELLO_SIZE + headLen) return 'partial';
  return { code: buf.readUInt32LE(12), message: buf.subarray(HELLO_SIZE, HELLO_SIZE + headLen).toString('utf8') };
}

/** What is at a unix socket path, in words, for an ECONNREFUSED. */
function whatIsAt(p: string): string {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(p);
  } catch {
    return 'nothing is there any more';
  }
  if (st.isSocket()) return `${p} is a socket file, but nothing listens on it (its server stopped or crashed without removing it): start the server`;
  if (st.isDirectory()) return `${p} is a directory, not a socket: point the client at the server's socket file`;
  if (st.isSymbolicLink()) return `${p} is a symlink to something that is not a listening socket`;
  if (st.isFile()) return `${p} is a regular file, not a socket: point the client at the server's socket file`;
  return `${p} is not a socket`;
}

/** Describes a dial error for a person: what failed and what to do. */
export function dialError(addr: string, err: unknown, waited: boolean): UdskitError {
  if (err instanceof UdskitError) return err;
  const e = err as NodeJS.ErrnoException;
  const tlsWhy = explainTLS(err);
  if (tlsWhy !== undefined) return new UdskitError('unauthenticated', `connect ${addr}: ${tlsWhy}`, { cause: err });
  let a: Addr | null = null;
  try { a = parseAddr(addr); } catch { /* only for hints */ }
  let hint = '';
  switch (e.code) {
    case 'ENOENT': hint = waited ? 'the socket did not appear' : 'no socket at that path: is the server running, and is this where it listens? pass {wait: true} to wait for it'; break;
    case 'ECONNREFUSED':
      if (a?.kind === 'unix') hint = whatIsAt(a.name);
      else hint = waited ? 'nothing accepted connections in time' : 'nothing listens on that port: is the server running?';
      break;
    case 'EACCES': return new UdskitError('permission_denied', `connect ${addr}: permission denied (the socket's mode or its directory does not let this user in)`, { cause: err });
    case 'ETIMEDOUT': hint = 'timed out'; break;
  }
  return new UdskitError('unavailable', `connect ${addr}: ${e.message}${hint ? ` (${hint})` : ''}`, { cause: err });
}

export { parseAddr };
