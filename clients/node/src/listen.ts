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
//
// The lock (PATH.lock), as Go's uds.Listen: probe, unlink and bind happen
// under an exclusive flock(2) on PATH.lock, so two servers starting on one
// path (Go or Node, in any mix) never both decide a socket is stale and
// unlink each other's: the second waits, then finds the first one live
// (InUseError). PATH.lock must be a regular file of ours: it is opened with
// O_NOFOLLOW|O_NONBLOCK (a symlink is refused, never followed; a FIFO cannot
// hang the open) and refused unless fstat says regular and owned by our
// euid. Node has no flock, so the lock is taken by flock(1) (util-linux) on
// the descriptor we opened, passed to it as fd 3: flock(2) locks belong to
// the open file description, which we share, so the lock stays ours after
// flock(1) exits and is released when we close the descriptor. Limits: each
// lock costs a process spawn (a few ms, at listen and close only); where
// flock(1) is missing (macOS, minimal images) the lock file is still checked
// and created, but not locked (we say so through the returned Bound.locked),
// and the probe-and-compare steps below are the only guard.
import { spawn } from 'node:child_process';
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
  /** listen(2) backlog (default: the kernel's cap, net.core.somaxconn on Linux, as Go's net.Listen; else 511). */
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
  /** Removes the socket file if it is still ours, and then PATH.lock (unix paths). */
  cleanup(): Promise<void>;
  /** Whether PATH.lock was really locked while binding (false: no flock(1) here, or not a path). */
  locked: boolean;
}

/** PATH.lock is not a regular file of ours: never used, never removed. */
export class BadLockFileError extends Error {
  constructor(readonly path: string, what: string) {
    super(`lock file ${path} is ${what}, not a regular file of ours: someone else put it there; remove it (after checking who) and retry`);
    this.name = 'BadLockFileError';
  }
}

/** Opens (creating 0600) the lock file: a regular file owned by our euid, never through a symlink. */
function openLockFile(name: string): number {
  let fd: number;
  try {
    fd = fs.openSync(name, fs.constants.O_RDONLY | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK, 0o600);
  } catch (e) {
    let st: fs.Stats | undefined;
    try { st = fs.lstatSync(name); } catch { /* gone */ }
    if (st !== undefined && !st.isFile()) throw new BadLockFileError(name, describe(st));
    throw new Error(`lock file ${name}: ${(e as Error).message}`);
  }
  const st = fs.fstatSync(fd);
  let bad: string | null = null;
  if (!st.isFile()) bad = describe(st);
  else if (process.geteuid !== undefined && st.uid !== process.geteuid()) bad = `a file owned by uid ${st.uid} (we are uid ${process.geteuid()})`;
  if (bad !== null) {
    fs.closeSync(fd);
    throw new BadLockFileError(name, bad);
  }
  return fd;
}

/** flock(1) availability: undefined until first tried. */
let flockMissing: boolean | undefined;

/** Takes an exclusive flock on fd through flock(1): true locked, false no flock(1); throws on timeout. */
function flockFd(fd: number, name: string, timeoutMs: number): Promise<boolean> {
  if (flockMissing === true) return Promise.resolve(false);
  return new Promise((resolve, reject) => {
    const secs = Math.max(0.01, timeoutMs / 1000).toFixed(2);
    const p = spawn('flock', ['-x', '-w', secs, '3'], { stdio: ['ignore', 'ignore', 'pipe', fd] });
    let err = '';
    p.stderr!.on('data', (d) => { if (err.length < 1000) err += d; });
    p.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOENT') {
        flockMissing = true;
        resolve(false);
      } else {
        reject(new Error(`lock ${name}: cannot run flock(1): ${e.message}`));
      }
    });
    p.on('close', (code) => {
      if (code === 0) {
        flockMissing = false;
        resolve(true);
      } else if (code === 1 && err === '') {
        reject(new Error(`waiting for lock ${name}: another process held it for ${timeoutMs}ms (a server stuck while starting or stopping?)`));
      } else if (code !== null) {
        reject(new Error(`lock ${name}: flock(1) exited ${code}: ${err.trim()}`));
      }
    });
  });
}

/**
 * Opens and exclusively locks the lock file name, waiting up to timeoutMs.
 * Retries when the file it locked was replaced meanwhile (a close removing
 * it), so the lock is always on the file now at name. Returns the fd (close
 * it to release the lock) and whether it is really locked.
 */
export async function lockFile(name: string, timeoutMs: number): Promise<{ fd: number; locked: boolean }> {
  const end = performance.now() + timeoutMs;
  for (;;) {
    const fd = openLockFile(name);
    let locked: boolean;
    try {
      locked = await flockFd(fd, name, Math.max(10, end - performance.now()));
    } catch (e) {
      fs.closeSync(fd);
      throw e;
    }
    let same = false;
    try {
      const held = fs.fstatSync(fd);
      const now = fs.lstatSync(name);
      same = held.dev === now.dev && held.ino === now.ino;
    } catch {
      // gone: lock the new one
    }
    if (same || !locked) return { fd, locked };
    fs.closeSync(fd);
  }
}

/** Removes PATH.lock after a failed listen, unless a socket is at path (a live server's, whose close removes it). */
function removeLockUnlessSocket(p: string): void {
  try {
    if (fs.lstatSync(p).isSocket()) return;
  } catch {
    // nothing there
  }
  try { fs.unlinkSync(p + '.lock'); } catch { /* gone */ }
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

/** The kernel's cap on the accept queue (Linux), as Go's net.Listen uses: a burst of connects is queued, not refused with EAGAIN. */
function defaultBacklog(): number {
  try {
    const n = Number(fs.readFileSync('/proc/sys/net/core/somaxconn', 'utf8').trim());
    if (Number.isInteger(n) && n > 0) return Math.min(n, 65535);
  } catch {
    // not Linux
  }
  return 511;
}

/** Binds server on a (parsed) address with the hygiene described above. */
export async function bind(server: net.Server, a: Addr, opts: ListenOptions): Promise<Bound> {
  const backlog = opts.backlog ?? defaultBacklog();
  if (a.kind === 'tcp') {
    const { host, port } = splitHostPort(a.name);
    await listenOn(server, { host: host === '' ? undefined : host, port, backlog });
    return { server, cleanup: async () => {}, locked: false };
  }
  if (a.kind === 'abstract') throw abstractUnsupported(a);
  if (a.kind === 'tls' || a.kind === 'ssh') {
    throw new AddrError(a.name, 'unsupported_here', `${a.kind} addresses: the Node server does not listen on them; put it behind udskit proxy --listen tls:HOST:PORT`);
  }
  if (a.kind === 'passed') {
    // An inherited listening socket: its file, mode and cleanup belong to whoever made it.
    await listenOn(server, { fd: passedFd(a.name), backlog } as net.ListenOptions);
    return { server, cleanup: async () => {}, locked: false };
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
  const probeTimeout = opts.probeTimeout ?? 200;
  // Held only across probe, unlink and bind, so a long wait means a stuck
  // process: give up rather than hang (Go: max(5s, 10 probe timeouts)).
  const lock = await lockFile(target + '.lock', Math.max(5000, 10 * probeTimeout));
  let mine: fs.Stats;
  try {
    mine = await bindLocked(server, target, dir, mode, probeTimeout, backlog);
  } catch (e) {
    removeLockUnlessSocket(target);
    throw e;
  } finally {
    fs.closeSync(lock.fd); // releases the flock; the file stays until cleanup
  }
  return {
    server,
    locked: lock.locked,
    cleanup: async () => {
      let l: { fd: number } | null = null;
      try {
        l = await lockFile(target + '.lock', 2000);
      } catch {
        // best effort without the lock: still only our own inode
      }
      try {
        const now = fs.lstatSync(target);
        if (now.isSocket() && now.dev === mine.dev && now.ino === mine.ino && now.ctimeMs === mine.ctimeMs) fs.unlinkSync(target);
      } catch {
        // gone already
      }
      // Nobody else is bound there: the lock file is ours to remove (anyone
      // waiting on it re-checks the inode after locking and retries).
      if (l !== null && !fs.existsSync(target)) {
        try { fs.unlinkSync(target + '.lock'); } catch { /* gone */ }
      }
      if (l !== null) fs.closeSync(l.fd);
    },
  };
}

/** Probe, unlink a stale socket, bind privately and link to target; under the lock. Returns the socket file's stat. */
async function bindLocked(server: net.Server, target: string, dir: string, mode: number, probeTimeout: number, backlog: number): Promise<fs.Stats> {
  await clearStale(target, probeTimeout);
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
      // Someone not using the lock bound it between our probe and now: probe again (never replace).
      await clearStale(target, probeTimeout);
      fs.linkSync(privSock, target);
    }
    linked = true;
  } finally {
    try { fs.unlinkSync(privSock); } catch { /* already gone */ }
    try { fs.rmdirSync(priv); } catch { /* not empty: leave it */ }
    if (!linked && server.listening) server.close();
  }
  return fs.lstatSync(target);
}
