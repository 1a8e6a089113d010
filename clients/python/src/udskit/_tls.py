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
