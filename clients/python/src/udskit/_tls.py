"""tls:HOST:PORT for the Python client: TLS 1.3 with the standard ssl module, the
server checked by host name or SPIFFE ID, a client certificate for mutual TLS.
There is no plaintext fallback."""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class TLSConfig:
    """How a client dials a tls: address. Paths of PEM files."""

    #: CA bundle the server's certificate must chain to (None: the system's roots).
    ca: str | None = None
    #: Client certificate chain and key, for servers that ask for one (mutual TLS).
    cert: str | None = None
    key: str | None = None
    #: Name the server's certificate must carry (None: the address's host).
    server_name: str | None = None
    #: SPIFFE ID the server's certificate must carry (its one URI SAN), checked instead of a name.
    server_spiffe_id: str | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        if self.cert is not None:
            ctx.load_cert_chain(self.cert, self.key)
        if self.server_spiffe_id is not None:
            # The chain is still verified (CERT_REQUIRED); the identity is the
            # SPIFFE ID, checked by check_spiffe after the handshake.
            ctx.check_hostname = False
        return ctx


def uri_sans(peercert: object) -> list[str]:
    """The URI SANs of ssl's getpeercert() dict."""
    if not isinstance(peercert, dict):
        return []
    return [v for k, v in peercert.get("subjectAltName", ()) if k == "URI"]


def check_spiffe(peercert: object, want: str) -> str | None:
    """None when the server's certificate is want's X.509-SVID, else why not."""
    got = uri_sans(peercert)
    if got != [want]:
        return f"SPIFFE ID mismatch: the server's certificate has URI SANs {got}, want {want}"
    return None


_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the server requires a client certificate (mutual TLS): pass TLSConfig(cert=..., key=...)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the server refused this client's certificate (bad certificate: not allowed by its peer policy, e.g. a wrong SPIFFE ID, or invalid)",
    "TLSV1_ALERT_UNKNOWN_CA": "unknown CA: the server does not trust the CA that signed this client's certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the server says this client's certificate has expired or is not yet valid (renew it, or check the clocks: clock skew)",
    "WRONG_VERSION_NUMBER": "the server does not speak TLS (a plaintext udskit server? dial tcp:HOST:PORT)",
}


def explain_tls(e: BaseException) -> str | None:
    """Says in words why a TLS connection failed, or None if e is no TLS failure."""
    if isinstance(e, ssl.SSLCertVerificationError):
        msg = e.verify_message or str(e)
        if "unable to get local issuer" in msg or "self-signed" in msg or "self signed" in msg:
            return "unknown CA: the server's certificate is not signed by a CA in the trusted bundle (TLSConfig.ca)"
        if "expired" in msg or "not yet valid" in msg:
            return f"the server's certificate {msg} (renew it, or check the clocks: clock skew)"
        if "mismatch" in msg or "match" in msg:
            return f"name mismatch: {msg} (set TLSConfig.server_name, or server_spiffe_id)"
        return f"the server's certificate did not verify: {msg}"
    if isinstance(e, ssl.SSLError):
        reason = getattr(e, "reason", None) or ""
        for key, why in _ALERTS.items():
            if key in reason or key in str(e):
                return why
        return f"TLS failed: {e}"
    return None


@dataclass(frozen=True)
class ServerTLSConfig:
    """How a server listens on a tls: address. Paths of PEM files."""

    cert: str
    key: str
    #: CA bundle client certificates must chain to; required with the allow_* rules.
    ca: str | None = None
    #: Only clients whose certificate has one of these SPIFFE IDs ('/*' at the end: a prefix). Makes TLS mutual.
    allow_spiffe: tuple[str, ...] = ()
    #: Only clients whose certificate has one of these DNS names. Makes TLS mutual.
    allow_dns: tuple[str, ...] = ()
    #: Any client with a certificate from ca. Makes TLS mutual.
    require_client_cert: bool = False

    @property
    def mutual(self) -> bool:
        return bool(self.allow_spiffe or self.allow_dns or self.require_client_cert)

    def context(self, require_client_cert: bool = False) -> ssl.SSLContext:
        """The server's SSLContext; require_client_cert (a server's peer policy) makes it mutual."""
        mutual = self.mutual or require_client_cert
        if mutual and self.ca is None:
            raise ValueError("allow_spiffe/allow_dns/require_client_cert need ca: the CA bundle client certificates are verified against")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain(self.cert, self.key)
        if self.ca is not None:
            ctx.load_verify_locations(self.ca)
        # CERT_OPTIONAL, not CERT_REQUIRED, when mutual: a certificate that is sent is verified
        # all the same (a bad one fails the handshake), and a client that sends none completes
        # the handshake only to be refused, before a byte of it is read, with an error frame
        # that says why (TLS 1.3 gives a client no alert it could show for that case).
        ctx.verify_mode = ssl.CERT_OPTIONAL if mutual else ssl.CERT_NONE
        return ctx

    def refusal(self, peer: RemotePeer | None) -> str | None:
        """None allows; a string is why the peer is refused."""
        if not self.mutual:
            return None
        if peer is None:
            return "no verified client certificate"
        if self.require_client_cert:
            return None
        for want in self.allow_spiffe:
            if peer.spiffe_id is not None and (peer.spiffe_id.startswith(want[:-1]) if want.endswith("/*") else peer.spiffe_id == want):
                return None
        if any(n in peer.dns_names for n in self.allow_dns):
            return None
        return f"peer refused by policy: {peer.spiffe_id or peer.subject} not in {list(self.allow_spiffe) + list(self.allow_dns)}"


@dataclass(frozen=True)
class RemotePeer:
    """A tls: client's verified certificate identity."""

    subject: str
    dns_names: tuple[str, ...]
    uris: tuple[str, ...]
    #: the URI SAN when the certificate is an X.509-SVID (one URI SAN, scheme spiffe)
    spiffe_id: str | None


def remote_peer(peercert: object) -> RemotePeer | None:
    """The identity in ssl's getpeercert() dict (empty unless verified)."""
    if not isinstance(peercert, dict) or not peercert:
        return None
    subject = ",".join(f"{k}={v}" for rdn in peercert.get("subject", ()) for k, v in rdn)
    sans = peercert.get("subjectAltName", ())
    uris = tuple(v for k, v in sans if k == "URI")
    dns = tuple(v for k, v in sans if k == "DNS")
    spiffe = uris[0] if len(uris) == 1 and uris[0].startswith("spiffe://") else None
    return RemotePeer(subject, dns, uris, spiffe)
