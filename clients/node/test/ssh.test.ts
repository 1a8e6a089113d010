// Node client -> ssh:// -> a Go `udskit serve` socket, through a real sshd (Debian's openssh-server)
// on 127.0.0.1 with throwaway keys in a temp dir: the server sees the ssh login user (nobody, uid
// 65534) as the caller; a wrong key fails with an error that says authentication was refused.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { connect, UdskitError } from '../src/index.js';
import { startGo, type GoServer } from './helpers.js';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'udskit-node-sshd-'));
fs.chmodSync(dir, 0o755); // authorized_keys is read as the login user
let sshd: ChildProcess;
let port = 0;
let go: GoServer;
let sshArgs: string[] = [];
let wrongArgs: string[] = [];

const keygen = (p: string): void => { execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', p]); };

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

before(async () => {
  if (process.getuid!() === 0) fs.mkdirSync('/run/sshd', { recursive: true, mode: 0o755 });
  for (const k of ['host_key', 'user_key', 'wrong_key']) keygen(path.join(dir, k));
  fs.copyFileSync(path.join(dir, 'user_key.pub'), path.join(dir, 'authorized_keys'));
  fs.chmodSync(path.join(dir, 'authorized_keys'), 0o644);
  port = await freePort();
  fs.writeFileSync(path.join(dir, 'sshd_config'), [
    `ListenAddress 127.0.0.1:${port}`, `HostKey ${dir}/host_key`, `AuthorizedKeysFile ${dir}/authorized_keys`,
    'PidFile none', 'StrictModes no', 'UsePAM no', 'PasswordAuthentication no', 'KbdInteractiveAuthentication no',
    'PermitRootLogin prohibit-password', 'AllowStreamLocalForwarding yes', '',
  ].join('\n'));
  sshd = spawn('/usr/sbin/sshd', ['-D', '-e', '-f', path.join(dir, 'sshd_config')], { stdio: 'ignore' });
  for (let i = 0; i < 500; i++) {
    const up = await new Promise<boolean>((r) => { const s = net.connect(port, '127.0.0.1', () => { s.destroy(); r(true); }); s.on('error', () => r(false)); });
    if (up) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  const hostPub = fs.readFileSync(path.join(dir, 'host_key.pub'), 'utf8').split(' ');
  fs.writeFileSync(path.join(dir, 'known_hosts'), `[127.0.0.1]:${port} ${hostPub[0]} ${hostPub[1]}\n`);
  const base = (key: string): string[] => ['-F', '/dev/null', '-i', path.join(dir, key), '-o', 'IdentitiesOnly=yes', '-o', 'IdentityAgent=none',
    '-o', `UserKnownHostsFile=${dir}/known_hosts`, '-o', 'GlobalKnownHostsFile=/dev/null', '-o', 'StrictHostKeyChecking=yes'];
  sshArgs = base('user_key');
  wrongArgs = base('wrong_key');
  go = await startGo(path.join(dir, 'app.sock'), ['--mode', '0666']);
});
after(async () => {
  await go?.kill();
  sshd?.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

test('ssh://: the remote server sees the ssh user', async () => {
  const c = await connect(`ssh://nobody@127.0.0.1:${port}${dir}/app.sock`, { ssh: { args: sshArgs }, reconnect: false, timeout: 20_000 });
  try {
    const who = await c.call<{ uid: number }>('whoami');
    assert.equal(who.uid, 65534);
    assert.deepEqual(await c.call('echo', { via: 'ssh' }), { via: 'ssh' });
  } finally {
    await c.close();
  }
});

test('ssh://: a wrong key and a missing remote socket fail with the reason', async () => {
  await assert.rejects(connect(`ssh://nobody@127.0.0.1:${port}${dir}/app.sock`, { ssh: { args: wrongArgs }, reconnect: false, timeout: 20_000 }),
    (e: unknown) => e instanceof UdskitError && /authentication refused/.test(e.message));
  await assert.rejects(connect(`ssh://nobody@127.0.0.1:${port}${dir}/gone.sock`, { ssh: { args: sshArgs }, reconnect: false, timeout: 20_000 }),
    (e: unknown) => e instanceof UdskitError && /could not be opened/.test(e.message));
});
