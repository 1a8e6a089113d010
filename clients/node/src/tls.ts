// tls:HOST:PORT for the Node client: TLS 1.3 over node:tls, the server checked by
// its host name or SPIFFE ID, a client certificate for mutual TLS. No plaintext fallback.
import tls from 'node:tls';
import { type Addr, AddrError, splitHostPort, formatAddr } from './address.js';
import { UdskitError } from './codes.js';
import { type Peer } from './handler.js';

/** How a client dials a tls: address. PEM contents (read files with fs.readFileSync). */
export interface TLSOptions {
  /** CA bundle the server's certificate must chain to. Default: Node's root store. */
  ca?: string | Buffer;
  /** Client certificate chain and key, for servers that ask for one (mutual TLS). */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** Name the server's certificate must carry. Default: the address's host. */
  serverName?: string;
  /** SPIFFE ID the server's certificate must carry (its one URI SAN), checked instead of a name. */
  serverSpiffeId?: string;
}

/** The URI SANs of a peer certificate, from Node's subjectaltname string. */
export function uriSANs(cert: { subjectaltname?: string }): string[] {
  return (cert.subjectaltname ?? '').split(', ').filter((s) => s.startsWith('URI:')).map((s) => s.slice(4));
}

/** tls.connect options for a parsed tls: address. */
export function tlsConnectOptions(a: Addr, o: TLSOptions | undefined): tls.ConnectionOptions {
  if (a.kind !== 'tls') throw new AddrError(formatAddr(a), 'not_tls', 'not a tls: address');
  if (o === undefined) {
    throw new UdskitError('failed_precondition', `connect ${formatAddr(a)}: a tls: address needs TLS options ({ tls: { ca, cert, key } }); there is no plaintext fallback`);
  }
  const { host, port } = splitHostPort(a.name);
  const h = host === '' ? 'localhost' : host;
  const opts: tls.ConnectionOptions = {
    host: h, port, minVersion: 'TLSv1.3', ca: o.ca, cert: o.cert, key: o.key, rejectUnauthorized: true,
  };
  const name = o.serverName ?? h;
  if (o.serverSpiffeId !== undefined) {
    const want = o.serverSpiffeId;
    opts.checkServerIdentity = (_host, cert) => {
      const got = uriSANs(cert);
      if (got.length !== 1 || got[0] !== want) return new Error(`SPIFFE ID mismatch: the server's certificate has URI SANs ${JSON.stringify(got)}, want ${want}`);
      return undefined;
    };
  } else {
    opts.checkServerIdentity = (_host, cert) => tls.checkServerIdentity(name, cert);
  }
  if (!/^[0-9.]+$/.test(name) && !name.includes(':')) opts.servername = name;
  return opts;
}

/** Says in words why a TLS connection failed, or undefined if err is no TLS failure. */
export function explainTLS(err: unknown): string | undefined {
  const e = err as NodeJS.ErrnoException & { reason?: string };
  const code = e?.code ?? '';
  const msg = e?.message ?? '';
  if (msg.startsWith('SPIFFE ID mismatch')) return msg;
  switch (code) {
    case 'UNABLE_TO_VERIFY_LEAF_SIGNATURE': case 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY': case 'SELF_SIGNED_CERT_IN_CHAIN': case 'DEPTH_ZERO_SELF_SIGNED_CERT':
      return "unknown CA: the server's certificate is not signed by a CA in the trusted bundle (tls.ca)";
    case 'CERT_HAS_EXPIRED': case 'CERT_NOT_YET_VALID':
      return "the server's certificate has expired or is not yet valid (renew it, or check the clocks: clock skew)";
    case 'ERR_TLS_CERT_ALTNAME_INVALID':
      return `name mismatch: ${e.reason ?? msg} (set tls.serverName, or tls.serverSpiffeId)`;
    case 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED':
      return 'the server requires a client certificate (mutual TLS): pass tls.cert and tls.key';
    case 'ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE':
      return "the server refused this client's certificate (bad certificate: not allowed by its peer policy, e.g. a wrong SPIFFE ID, or invalid)";
    case 'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA':
      return "unknown CA: the server does not trust the CA that signed this client's certificate";
    case 'ERR_SSL_SSLV3_ALERT_CERTIFICATE_EXPIRED':
      return "the server says this client's certificate has expired or is not yet valid (renew it, or check the clocks: clock skew)";
    case 'ERR_SSL_WRONG_VERSION_NUMBER': case 'ERR_SSL_PACKET_LENGTH_TOO_LONG':
      return 'the server does not speak TLS (a plaintext udskit server? dial tcp:HOST:PORT)';
  }
  if (code.startsWith('ERR_SSL_') || code.startsWith('ERR_TLS_')) return `TLS failed: ${msg}`;
  return undefined;
}

/** How a server listens on a tls: address. PEM contents. */
export interface ServerTLSOptions {
  cert: string | Buffer;
  key: string | Buffer;
  /** CA bundle client certificates must chain to; required with allowSpiffe/allowDns/requireClientCert. */
  ca?: string | Buffer;
  /** Only clients whose certificate has one of these SPIFFE IDs (a trailing '/*' allows a prefix). Makes TLS mutual. */
  allowSpiffe?: string[];
  /** Only clients whose certificate has one of these DNS names. Makes TLS mutual. */
  allowDns?: string[];
  /** Any client with a certificate from ca. Makes TLS mutual. */
  requireClientCert?: boolean;
  /**
   * A policy on the verified client (after allowSpiffe/allowDns, which it narrows further):
   * compose one with anyPeer/allPeers of allowSpiffeIds/allowDnsNames/allowAnyVerified or
   * any `(peer) => boolean`. Makes TLS mutual; it runs before one byte of the client is read.
   */
  policy?: PeerPolicy;
}

/** A policy on a peer: true admits it. Node servers see remote peers only (no SO_PEERCRED). */
export type PeerPolicy = (peer: Peer) => boolean;

/** Peers whose verified certificate has one of these SPIFFE IDs ('spiffe://td/*': the whole trust domain). */
export function allowSpiffeIds(...ids: string[]): PeerPolicy {
  for (const id of ids) if (!id.startsWith('spiffe://')) throw new TypeError(`allowSpiffeIds: ${JSON.stringify(id)} is not a SPIFFE ID (spiffe://trust-domain/path)`);
  return (p) => p.spiffeId !== undefined && ids.some((id) => (id.endsWith('/*') ? p.spiffeId!.startsWith(id.slice(0, -1)) : p.spiffeId === id));
}

/** Peers whose verified certificate has one of these DNS names. */
export function allowDnsNames(...names: string[]): PeerPolicy {
  return (p) => p.dnsNames.some((n) => names.includes(n));
}

/** Any peer whose certificate verified against the server's CA bundle. */
export function allowAnyVerified(): PeerPolicy {
  return (p) => p.kind === 'remote';
}

/** Admits a peer any of the policies admits. */
export function anyPeer(...ps: PeerPolicy[]): PeerPolicy {
  return (p) => ps.some((f) => f(p));
}

/** Admits a peer every one of the policies admits (none: everyone). */
export function allPeers(...ps: PeerPolicy[]): PeerPolicy {
  return (p) => ps.every((f) => f(p));
}

/** The verified identity of a TLS peer, from Node's peer certificate. */
export function peerOf(s: tls.TLSSocket): Peer | undefined {
  if (!s.authorized) return undefined;
  const c = s.getPeerCertificate();
  if (c === null || Object.keys(c).length === 0) return undefined;
  const sans = (c.subjectaltname ?? '').split(', ');
  const uris = sans.filter((x) => x.startsWith('URI:')).map((x) => x.slice(4));
  const subject = Object.entries(c.subject ?? {}).map(([k, v]) => `${k}=${String(v)}`).join(',');
  return {
    kind: 'remote', subject, uris,
    dnsNames: sans.filter((x) => x.startsWith('DNS:')).map((x) => x.slice(4)),
    spiffeId: uris.length === 1 && uris[0].startsWith('spiffe://') ? uris[0] : undefined,
  };
}

/** Whether a server with these options asks clients for certificates. */
export function wantsClientCert(o: ServerTLSOptions): boolean {
  return (o.allowSpiffe?.length ?? 0) > 0 || (o.allowDns?.length ?? 0) > 0 || o.requireClientCert === true || o.policy !== undefined;
}

/** Checks a verified peer against the options' rules: undefined allows, a string is the reason. */
export function refusal(o: ServerTLSOptions, p: Peer | undefined): string | undefined {
  if (!wantsClientCert(o)) return undefined;
  if (p === undefined) return 'no verified client certificate';
  const rules = (o.allowSpiffe?.length ?? 0) > 0 || (o.allowDns?.length ?? 0) > 0;
  if (rules && o.requireClientCert !== true) {
    const byId = (o.allowSpiffe ?? []).some((id) => p.spiffeId !== undefined && (id.endsWith('/*') ? p.spiffeId.startsWith(id.slice(0, -1)) : p.spiffeId === id));
    const byName = (o.allowDns ?? []).some((n) => p.dnsNames.includes(n));
    if (!byId && !byName) return `peer refused by policy: ${p.spiffeId ?? p.subject} not in ${JSON.stringify([...(o.allowSpiffe ?? []), ...(o.allowDns ?? [])])}`;
  }
  if (o.policy !== undefined) {
    let ok = false;
    try {
      ok = o.policy(p) === true;
    } catch {
      ok = false; // a policy that throws refuses
    }
    if (!ok) return `peer refused by policy: ${p.spiffeId ?? p.subject} is not admitted by the server's policy`;
  }
  return undefined;
}
