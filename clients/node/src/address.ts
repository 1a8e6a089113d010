// The udskit address syntax (protocol/addresses.json), the same as Go's uds.ParseAddr.

/** The longest address accepted, in UTF-8 bytes. */
export const MAX_ADDR_LEN = 4096;

/** 'passed': a listening socket the process inherited (fd:N, systemd:NAME): listen only. */
export type AddrKind = 'unix' | 'abstract' | 'tcp' | 'passed' | 'tls' | 'ssh';

/** A parsed address: a unix path, a Linux abstract name (without '@'), or TCP host:port. */
export interface Addr {
  kind: AddrKind;
  name: string;
}

/** Accepted address forms, for error messages. */
export const ADDR_FORMS = 'unix:/path/to.sock, /path/to.sock, ./rel.sock, unix:@name, @name, tcp:host:port, host:port, tls:host:port, ssh://[user@]host[:port]/path/to.sock (dial only), systemd:NAME, fd:N (listen only)';

/** A bad address; `.errorName` is the name from protocol/addresses.json. */
export class AddrError extends Error {
  constructor(readonly input: string, readonly errorName: string, reason: string) {
    super(`bad address ${JSON.stringify(input.length > 80 ? input.slice(0, 64) + '...' : input)}: ${reason} (accepted forms: ${ADDR_FORMS})`);
    this.name = 'AddrError';
  }
}

/**
 * Parses an address as Go's uds.ParseAddr does. Throws AddrError. Both the input and its
 * canonical form (formatAddr) are at most MAX_ADDR_LEN bytes, so the canonical form parses again.
 */
export function parseAddr(s: string): Addr {
  const a = parseForm(s);
  const n = Buffer.byteLength(formatAddr(a));
  if (n > MAX_ADDR_LEN) throw new AddrError(s, 'too_long', `${n} bytes in canonical form, over the ${MAX_ADDR_LEN}-byte limit`);
  return a;
}

function parseForm(s: string): Addr {
  if (s === '') throw new AddrError(s, 'empty', 'empty address');
  if (Buffer.byteLength(s) > MAX_ADDR_LEN) throw new AddrError(s, 'too_long', `over the ${MAX_ADDR_LEN}-byte limit`);
  if (s.includes('\0')) throw new AddrError(s, 'nul_byte', 'contains a NUL byte');
  if (s.startsWith('unix:')) {
    const rest = s.slice(5);
    if (rest.startsWith('@')) return abstract(s, rest.slice(1));
    if (rest === '') throw new AddrError(s, 'empty_path', 'empty socket path after unix:');
    return { kind: 'unix', name: rest };
  }
  if (s.startsWith('@')) return abstract(s, s.slice(1));
  if (s.startsWith('tcp:')) return tcp(s, s.slice(4));
  if (s.startsWith('tls:')) return { kind: 'tls', name: tcp(s, s.slice(4)).name };
  if (s.startsWith('ssh:')) {
    if (!s.startsWith('ssh://')) throw new AddrError(s, 'bad_ssh', 'want ssh://[user@]host[:port]/path/to.sock');
    return { kind: 'ssh', name: sshName(splitSSHName(s, s.slice(6))) };
  }
  if (s.startsWith('fd:')) {
    if (!/^[0-9]{1,9}$/.test(s.slice(3))) throw new AddrError(s, 'bad_fd', 'fd:N wants a descriptor number, e.g. fd:3');
    return { kind: 'passed', name: s };
  }
  if (s.startsWith('systemd:')) {
    if (!/^[\x21-\x39\x3b-\x7e]{1,255}$/.test(s.slice(8))) {
      throw new AddrError(s, 'bad_systemd_name', "systemd:NAME wants the socket's FileDescriptorName= (1 to 255 printable characters, no ':')");
    }
    return { kind: 'passed', name: s };
  }
  const scheme = schemeLike(s);
  if (scheme !== '') throw new AddrError(s, 'unknown_scheme', `unknown scheme ${JSON.stringify(scheme)}`);
  if (s.includes('/')) return { kind: 'unix', name: s };
  if (s.includes(':')) return tcp(s, s);
  return { kind: 'unix', name: s };
}

/** The canonical form: unix:PATH, unix:@NAME or tcp:HOST:PORT. */
export function formatAddr(a: Addr): string {
  switch (a.kind) {
    case 'unix': return 'unix:' + a.name;
    case 'abstract': return 'unix:@' + a.name;
    case 'tcp': return 'tcp:' + a.name;
    case 'tls': return 'tls:' + a.name;
    case 'ssh': return 'ssh://' + a.name;
    case 'passed': return a.name;
  }
}

/** Splits host:port of a parsed tcp address (an IPv6 host without its brackets). */
export function splitHostPort(hostport: string): { host: string; port: number } {
  const hp = splitHP(hostport);
  if (hp === undefined) throw new AddrError(hostport, 'bad_hostport', 'want host:port');
  return { host: hp[0], port: Number(hp[1]) };
}

function abstract(input: string, name: string): Addr {
  if (name === '') throw new AddrError(input, 'empty_abstract', 'empty abstract name after @');
  if (process.platform !== 'linux') throw new AddrError(input, 'abstract_unsupported', 'abstract unix socket names (@name) exist only on Linux');
  return { kind: 'abstract', name };
}

// splitHP follows Go's net.SplitHostPort: [v6]:port or host:port with no ':' in host.
function splitHP(hp: string): [string, string] | undefined {
  let host: string;
  let port: string;
  if (hp.startsWith('[')) {
    const end = hp.indexOf(']');
    if (end < 0 || hp[end + 1] !== ':') return undefined;
    host = hp.slice(1, end);
    port = hp.slice(end + 2);
    if (host.includes('[') || host.includes(']')) return undefined;
  } else {
    const i = hp.lastIndexOf(':');
    if (i < 0) return undefined;
    host = hp.slice(0, i);
    port = hp.slice(i + 1);
    if (host.includes(':') || host.includes('[') || host.includes(']')) return undefined;
  }
  if (port.includes(']')) return undefined;
  return [host, port];
}

function tcp(input: string, hostport: string): Addr {
  const hp = splitHP(hostport);
  if (hp === undefined) throw new AddrError(input, 'bad_hostport', 'want host:port, with [brackets] around IPv6 hosts');
  const [host, port] = hp;
  if (!/^[0-9]{1,5}$/.test(port) || Number(port) > 65535) {
    throw new AddrError(input, 'bad_port', `port ${JSON.stringify(port)} is not a number from 0 to 65535`);
  }
  if (host.includes(' ') || host.includes('/')) throw new AddrError(input, 'bad_host', `host ${JSON.stringify(host)} is not a host name or IP`);
  return { kind: 'tcp', name: (host.includes(':') ? `[${host}]` : host) + ':' + port };
}

function schemeLike(s: string): string {
  const i = s.indexOf(':');
  if (i <= 0 || !/^[A-Za-z]+$/.test(s.slice(0, i))) return '';
  const rest = s.slice(i + 1);
  if (rest.startsWith('/') || (rest.includes(':') && !rest.startsWith('['))) return s.slice(0, i);
  return '';
}

/** An ssh:// address taken apart; empty user and port leave the choice to ssh. */
export interface SSHTarget {
  user: string;
  host: string;
  port: string;
  path: string;
}

/** Splits the name of a parsed ssh address ("[user@]host[:port]/path"). */
export function splitSSH(name: string): SSHTarget {
  return splitSSHName('ssh://' + name, name);
}

function sshName(t: SSHTarget): string {
  return (t.user ? t.user + '@' : '') + (t.host.includes(':') ? `[${t.host}]` : t.host) + (t.port ? ':' + t.port : '') + t.path;
}

function splitSSHName(input: string, rest: string): SSHTarget {
  const slash = rest.indexOf('/');
  if (slash < 0) throw new AddrError(input, 'bad_ssh', 'ssh:// wants a remote socket path: ssh://[user@]host[:port]/path/to.sock');
  let auth = rest.slice(0, slash);
  const path = rest.slice(slash);
  let user = '';
  let port = '';
  let host: string;
  const at = auth.lastIndexOf('@');
  if (at >= 0) {
    user = auth.slice(0, at);
    auth = auth.slice(at + 1);
    if (!/^[\x21-\x2c\x2e\x30-\x39\x3b-\x7e][\x21-\x2e\x30-\x39\x3b-\x7e]*$/.test(user)) {
      throw new AddrError(input, 'bad_user', `ssh user ${JSON.stringify(user)}: want printable characters without ':' or '/', not starting with '-'`);
    }
  }
  const badPort = (p: string) => !/^[0-9]{1,5}$/.test(p) || Number(p) < 1 || Number(p) > 65535;
  if (auth.startsWith('[')) {
    const end = auth.indexOf(']');
    if (end < 0) throw new AddrError(input, 'bad_host', "missing ']' after an IPv6 host");
    host = auth.slice(1, end);
    if (!/^[0-9A-Fa-f:.]+$/.test(host)) throw new AddrError(input, 'bad_host', `host ${JSON.stringify(host)} in brackets is not an IPv6 address`);
    const after = auth.slice(end + 1);
    if (after !== '' && !after.startsWith(':')) throw new AddrError(input, 'bad_host', "unexpected text after ']'");
    if (after !== '') {
      port = after.slice(1);
      if (badPort(port)) throw new AddrError(input, 'bad_port', `port ${JSON.stringify(port)} is not a number from 1 to 65535`);
    }
  } else {
    const i = auth.lastIndexOf(':');
    host = auth;
    if (i >= 0) {
      host = auth.slice(0, i);
      port = auth.slice(i + 1);
      if (host.includes(':')) throw new AddrError(input, 'bad_host', 'an IPv6 host needs [brackets]');
      if (badPort(port)) throw new AddrError(input, 'bad_port', `port ${JSON.stringify(port)} is not a number from 1 to 65535`);
    }
    if (!/^[A-Za-z0-9._][A-Za-z0-9._-]*$/.test(host)) {
      throw new AddrError(input, 'bad_host', `host ${JSON.stringify(host)}: want a host name (letters, digits, '.', '-', '_', not starting with '-') or [IPv6]`);
    }
  }
  if (Buffer.byteLength(path) > 107) throw new AddrError(input, 'bad_ssh_path', 'remote socket path is over the 107 bytes a socket path may have');
  if (/[\x00-\x1f\x7f:]/.test(path)) throw new AddrError(input, 'bad_ssh_path', "remote socket path has ':' or a control character (OpenSSH's forwarding syntax cannot carry it)");
  return { user, host, port, path };
}
