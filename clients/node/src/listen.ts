// Listening on a unix socket path safely, as Go's uds.Listen does where Node
// allows it (docs: README "Socket hygiene").
//
// Why a private directory and link(2), not umask or chmod-after-listen:
//  - Node binds and listens in one step, so chmod after listen() leaves a
//    window with the umask's (often world-connectable) bits; process.umask()
//    is process-wide (other code creating files meanwhile is affected) and
//    throws in worker threads.
//  - libuv unlinks a pipe server's path on close unconditionally, even when
//    another server has bound that path since. Binding a private path keeps
//    libuv's unlink away from the public path.
// So: bind in a new 0700 directory next to the target (nobody else can reach
// the socket there), chmod the socket to the mode, then link(2) it to the
// target path (link never replaces an existing file, unlike rename) and
// remove the private name. On close we unlink the target only if it is still
// our socket (same dev, ino and ctime: ext4 reuses inode numbers at once).
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { type Addr, AddrError, splitHostPort } from './address.js';
import { abstractUnsupported } from './dial.js';

/** Linux's usable sun_path length (108 with the NUL); macOS 103. */
export const MAX_SUN_PATH = process.platform === 'linux' ? 107 : 103;

export interface ListenOptions {
  /** Socket file mode (default 0o600: owner only). Ignored for abstract names and TCP. */
  mode?: number;
  /** How long a connect probe of an existing socket may take, ms (default 200). */
  probeTimeout?: number;
  /** listen(2) backlog (default 511). */
  backlog?: number;
}

/** Something that is not a socket is at the path: never removed. */
export class NotSocketError extends Error {
  constructor(readonly path: string, what: string) {
    super(`${path} exists and is ${what}, not a socket; refusing to remove it`);
    this.name = 'NotSocketError';
  }
}

/** A live server answers at the path. */
export class InUseError extends Error {
  constructor(readonly path: string) {
    super(`${path} is in use by a live server (a connect succeeded); stop it or pick another path`);
    this.name = 'InUseError';
  }
}

export interface Bound {
  server: net.Server;
  /** Removes the socket file if it is still ours (unix paths). */
  cleanup(): void;
}

function describe(st: fs.Stats): string {
  if (st.isSymbolicLink()) return 'a symlink';
  if (st.isDirectory()) return 'a directory';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isFile()) return 'a regular file';
  return 'not a socket';
}

/** Connects briefly: 'live', 'refused' (stale) or 'gone'. */
function probe(p: string, timeoutMs: number): Promise<'live' | 'refused' | 'gone'> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ path: p });
    const t = setTimeout(() => { s.destroy(); resolve('live'); }, timeoutMs); // backlog full: someone is there
    s.on('connect', () => { clearTimeout(t); s.destroy(); resolve('live'); });
    s.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(t);
      if (err.code === 'ECONNREFUSED') resolve('refused');
      else if (err.code === 'ENOENT') resolve('gone');
      else if (err.code === 'EAGAIN') resolve('live');
      else reject(new Error(`cannot tell whether the socket at ${p} is live, leaving it: ${err.message}`));
    });
  });
}

/** Removes a stale socket at p: only a socket, only if a connect is refused, only if unchanged since. */
export async function clearStale(p: string, probeTimeout: number): Promise<void> {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw e;
  }
  if (!st.isSocket()) throw new NotSocketError(p, describe(st));
  const r = await probe(p, probeTimeout);
  if (r === 'live') throw new InUseError(p);
  if (r === 'gone') return;
  let now: fs.Stats;
  try {
    now = fs.lstatSync(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw e;
  }
  if (now.dev !== st.dev || now.ino !== st.ino) throw new Error(`${p} changed while probing it; leaving it`);
  try {
    fs.unlinkSync(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
}

function listenOn(server: net.Server, opts: net.ListenOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    const onErr = (err: Error): void => reject(err);
    server.once('error', onErr);
    server.listen(opts, () => {
      server.off('error', onErr);
      resolve();
    });
  });
}

/**
 * The descriptor of fd:N, or of systemd:NAME from socket activation
 * (LISTEN_PID must be this process; LISTEN_FDS descriptors from 3, named by
 * LISTEN_FDNAMES).
 */
export function passedFd(name: string): number {
  if (name.startsWith('fd:')) return Number(name.slice(3));
  const want = name.slice('systemd:'.length);
  const env = process.env;
  if (env.LISTEN_PID !== String(process.pid)) {
    throw new Error(`${name}: no sockets passed by systemd to this process (LISTEN_PID is ${env.LISTEN_PID ?? 'unset'}, this is ${process.pid}); start it from a .socket unit or systemd-socket-activate`);
  }
  const n = Number(env.LISTEN_FDS ?? '0');
  const names = (env.LISTEN_FDNAMES ?? '').split(':');
  const i = names.indexOf(want);
  if (i < 0 || i >= n) throw new Error(`${name}: no passed socket named ${JSON.stringify(want)} (LISTEN_FDNAMES=${env.LISTEN_FDNAMES ?? ''})`);
  return 3 + i;
}

/** Binds server on a (parsed) address with the hygiene described above. */
export async function bind(server: net.Server, a: Addr, opts: ListenOptions): Promise<Bound> {
  const backlog = opts.backlog ?? 511;
  if (a.kind === 'tcp') {
    const { host, port } = splitHostPort(a.name);
    await listenOn(server, { host: host === '' ? undefined : host, port, backlog });
    return { server, cleanup: () => {} };
  }
  if (a.kind === 'abstract') throw abstractUnsupported(a);
  if (a.kind === 'tls' || a.kind === 'ssh') {
    throw new AddrError(a.name, 'unsupported_here', `${a.kind} addresses: the Node server does not listen on them; put it behind udskit proxy --listen tls:HOST:PORT`);
  }
  if (a.kind === 'passed') {
    // An inherited listening socket: its file, mode and cleanup belong to whoever made it.
    await listenOn(server, { fd: passedFd(a.name), backlog } as net.ListenOptions);
    return { server, cleanup: () => {} };
  }
  const target = a.name;
  const mode = opts.mode ?? 0o600;
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o777) throw new RangeError(`mode ${mode}: want permission bits like 0o600`);
  const dir = path.dirname(target);
  const privDir = path.join(dir, '.udskit-XXXXXX'); // mkdtemp replaces nothing; length check below
  const tmpSock = privDir + '/s';
  for (const p of [target, tmpSock]) {
    if (Buffer.byteLength(p) > MAX_SUN_PATH) {
      throw new Error(`socket path ${JSON.stringify(p)} is ${Buffer.byteLength(p)} bytes, over the ${MAX_SUN_PATH}-byte limit` +
        (p === tmpSock ? ` (udskit binds in a private directory next to it first, which needs ${Buffer.byteLength(tmpSock) - Buffer.byteLength(target)} more bytes)` : '') +
        '; use a shorter or relative path, or an abstract @name');
    }
  }
  if (!fs.existsSync(dir)) fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  await clearStale(target, opts.probeTimeout ?? 200);
  const priv = fs.mkdtempSync(path.join(dir, '.udskit-')); // created 0700, ours
  const privSock = path.join(priv, 's');
  let linked = false;
  try {
    await listenOn(server, { path: privSock, backlog });
    fs.chmodSync(privSock, mode);
    try {
      fs.linkSync(privSock, target);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      // Someone bound it between our probe and now: probe again (never replace).
      await clearStale(target, opts.probeTimeout ?? 200);
      fs.linkSync(privSock, target);
    }
    linked = true;
  } finally {
    try { fs.unlinkSync(privSock); } catch { /* already gone */ }
    try { fs.rmdirSync(priv); } catch { /* not empty: leave it */ }
    if (!linked && server.listening) server.close();
  }
  const mine = fs.lstatSync(target);
  return {
    server,
    cleanup: () => {
      try {
        const now = fs.lstatSync(target);
        if (now.isSocket() && now.dev === mine.dev && now.ino === mine.ino && now.ctimeMs === mine.ctimeMs) fs.unlinkSync(target);
      } catch {
        // gone already
      }
    },
  };
}
