// ssh://[user@]host[:port]/path for the Node client: like Go's uds.Dial, each connection runs the
// system's ssh with OpenSSH stream-local forwarding (-L LOCAL:/remote.sock) to a socket in a fresh
// 0700 temp dir, and connects there once ssh has bound it. The user's ssh config, agent,
// known_hosts and ProxyJump apply; BatchMode: no prompts. Zero runtime dependencies.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { type Addr, formatAddr, splitSSH } from './address.js';
import { UdskitError } from './codes.js';

/** How a client reaches ssh:// addresses. */
export interface SSHOptions {
  /** The ssh client to run (default 'ssh'). */
  binary?: string;
  /** Extra ssh arguments before the destination, e.g. ['-i', 'key']. */
  args?: string[];
}

/** Says why ssh exited before the forwarding was up. */
export function explainSSH(stderr: string, host: string): string {
  const s = stderr.toLowerCase();
  if (s.includes('host key verification failed') || s.includes('host key is known') || s.includes('remote host identification has changed')) {
    return `the host key of ${host} is unknown or changed: check it and add it to known_hosts (connect once with ssh, or ssh-keyscan)`;
  }
  if (s.includes('permission denied')) return `authentication refused by ${host}: load a key it accepts into ssh-agent, or name it in ~/.ssh/config (no prompts: BatchMode)`;
  if (s.includes('could not resolve hostname')) return `host ${host} does not resolve`;
  if (s.includes('connection refused') || s.includes('timed out') || s.includes('no route to host')) return `no ssh server answers at ${host}`;
  return `ssh to ${host} failed`;
}

/** Connects to an ssh:// address through a new ssh process; the socket's close ends the process. */
export function sshConnect(a: Addr, o: SSHOptions, timeoutMs: number): Promise<net.Socket> {
  const t = splitSSH(a.name);
  const addr = formatAddr(a);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'udskit-ssh-'));
  const local = path.join(dir, 's.sock');
  const args = ['-N', '-T', '-o', 'ExitOnForwardFailure=yes', '-o', 'BatchMode=yes', '-o', 'StreamLocalBindMask=0177'];
  if (t.port !== '') args.push('-p', t.port);
  args.push(...(o.args ?? []), '-L', `${local}:${t.path}`, '--', t.user !== '' ? `${t.user}@${t.host}` : t.host);
  let stderr = '';
  let proc: ChildProcess;
  try {
    proc = spawn(o.binary ?? 'ssh', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (e) {
    fs.rmSync(dir, { recursive: true, force: true });
    return Promise.reject(new UdskitError('unavailable', `connect ${addr}: cannot run ssh: ${(e as Error).message}`));
  }
  proc.stderr!.on('data', (d: Buffer) => { stderr = (stderr + d.toString()).slice(-16384); });
  const stop = (): void => {
    proc.kill('SIGTERM');
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return new Promise((resolve, reject) => {
    let done = false;
    const finish = (err: Error | null, s?: net.Socket): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      clearInterval(poll);
      if (err !== null) {
        stop();
        reject(err);
        return;
      }
      s!.once('close', stop);
      resolve(s!);
    };
    proc.on('error', (e) => finish(new UdskitError('unavailable', `connect ${addr}: no ssh client (${e.message}): install OpenSSH's client`)));
    proc.on('exit', (code) => finish(new UdskitError('unavailable', `connect ${addr}: ${explainSSH(stderr, t.host)} (ssh exited ${code}: ${stderr.trim().split('\n').slice(-2).join('; ')})`)));
    const timer = setTimeout(() => finish(new UdskitError('deadline_exceeded', `connect ${addr}: ssh did not set up the forwarding within ${timeoutMs}ms`)), Math.max(1, timeoutMs));
    let trying = false;
    const poll = setInterval(() => {
      if (trying || done || !fs.existsSync(local)) return;
      trying = true;
      const s = net.connect({ path: local });
      s.once('connect', () => { s.removeAllListeners('error'); finish(null, s); });
      s.once('error', () => { trying = false; s.destroy(); }); // bound, not listening yet
    }, 10);
  });
}

/** ssh's note on stderr when the remote socket cannot be opened, for the first read's error. */
export function remoteSocketHint(a: Addr): string {
  const t = splitSSH(a.name);
  return `the remote socket ${t.path} on ${t.host} could not be opened (missing, or the login user may not connect to it)`;
}
