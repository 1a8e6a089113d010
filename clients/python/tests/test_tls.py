"""Python async client -> Go `udskit serve tls:` with mutual TLS and a SPIFFE policy
(certificates made by openssl): the Go handler sees the Python client's SPIFFE ID; a
workload the policy does not name, a missing client certificate, the wrong CA, a SPIFFE
mismatch and a missing TLS configuration are refused with an error naming the reason."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass

import pytest

import udskit
from conftest import GoServer

WEB = "spiffe://prod.example/ns/app/sa/web"
DB = "spiffe://prod.example/ns/app/sa/db"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass
class Leaf:
    cert: str
    key: str


class CA:
    def __init__(self, d: str, name: str) -> None:
        self.d, self.ca, self.key = d, os.path.join(d, f"{name}-ca.pem"), os.path.join(d, f"{name}-ca-key.pem")
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", self.key, "-out", self.ca)

    def issue(self, name: str, san: str) -> Leaf:
        key, csr, cert, ext = (os.path.join(self.d, name + s) for s in ("-key.pem", ".csr", ".pem", ".ext"))
        with open(ext, "w") as f:
            f.write(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}", "-keyout", key, "-out", csr)
        openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.key, "-CAcreateserial", "-days", "1", "-extfile", ext, "-out", cert)
        return Leaf(cert, key)


@dataclass
class PKI:
    ca: CA
    other: CA
    web: Leaf
    batch: Leaf
    addr: str


@pytest.fixture
def tls_server(udskit_bin: str, sdir: str) -> Iterator[PKI]:
    ca, other = CA(sdir, "test"), CA(sdir, "other")
    server = ca.issue("server", f"DNS:localhost,IP:127.0.0.1,URI:{DB}")
    s = GoServer(udskit_bin, "tls:127.0.0.1:0", "--tls-cert", server.cert, "--tls-key", server.key, "--tls-ca", ca.ca, "--allow-spiffe", WEB)
    s.proc = subprocess.Popen([s.bin, "serve", s.path, "-q", *s.args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert s.proc.stdout is not None
    line = s.proc.stdout.readline().decode()
    assert line.startswith("listening on tls:"), line
    try:
        yield PKI(ca, other, ca.issue("web", f"URI:{WEB}"), ca.issue("batch", "URI:spiffe://prod.example/ns/app/sa/batch"), line.split()[2])
    finally:
        s.stop()


def test_mutual_tls_handler_sees_spiffe_id(tls_server: PKI) -> None:
    p = tls_server

    async def main() -> None:
        for cfg in (
            udskit.TLSConfig(ca=p.ca.ca, cert=p.web.cert, key=p.web.key, server_spiffe_id=DB),
            udskit.TLSConfig(ca=p.ca.ca, cert=p.web.cert, key=p.web.key),
        ):
            async with await udskit.connect(p.addr, timeout=5, tls=cfg) as c:
                who = await c.call("whoami")
                assert who["spiffe_id"] == WEB
                assert await c.call("echo", {"over": "tls"}) == {"over": "tls"}

    asyncio.run(main())


@pytest.mark.parametrize(
    "which,want",
    [
        ("batch", "peer policy"),
        ("no-cert", "requires a client certificate"),
        ("other-ca", "unknown CA"),
        ("spiffe", "SPIFFE ID mismatch"),
        ("none", "no plaintext fallback"),
    ],
)
def test_refusals_name_the_reason(tls_server: PKI, which: str, want: str) -> None:
    p = tls_server
    cfg = {
        "batch": udskit.TLSConfig(ca=p.ca.ca, cert=p.batch.cert, key=p.batch.key),
        "no-cert": udskit.TLSConfig(ca=p.ca.ca),
        "other-ca": udskit.TLSConfig(ca=p.other.ca, cert=p.web.cert, key=p.web.key),
        "spiffe": udskit.TLSConfig(ca=p.ca.ca, cert=p.web.cert, key=p.web.key, server_spiffe_id=WEB),
        "none": None,
    }[which]

    async def main() -> None:
        c = await udskit.connect(p.addr, timeout=5, tls=cfg, reconnect=False)
        try:
            await c.call("echo", {})
        finally:
            await c.aclose()

    with pytest.raises(udskit.UdskitError) as ei:
        asyncio.run(main())
    assert want in ei.value.message, ei.value.message


def test_python_tls_server_sees_spiffe_id(udskit_bin: str, sdir: str) -> None:
    """Go (udskit call) and Python clients -> a Python server on tls:; ctx.remote has the
    caller's SPIFFE ID; a workload the rules do not name is refused before any handler runs."""
    from conftest import ThreadServer

    ca = CA(sdir, "pysrv")
    server = ca.issue("pysrv-server", f"DNS:localhost,IP:127.0.0.1,URI:{DB}")
    web = ca.issue("pysrv-web", f"URI:{WEB}")
    batch = ca.issue("pysrv-batch", "URI:spiffe://prod.example/ns/app/sa/batch")
    calls: list[str | None] = []

    async def who(ctx: udskit.Context, _req: Any) -> dict[str, Any]:
        calls.append(ctx.remote.spiffe_id if ctx.remote else None)
        return {"spiffe_id": ctx.remote.spiffe_id if ctx.remote else None}

    cfg = udskit.ServerTLSConfig(cert=server.cert, key=server.key, ca=ca.ca, allow_spiffe=(WEB,))
    s = ThreadServer("tls:127.0.0.1:0", {"who": who}, tls=cfg)
    try:
        assert s.addr.startswith("tls:127.0.0.1:")
        r = subprocess.run([udskit_bin, "call", s.addr, "who", "--tls-cert", web.cert, "--tls-key", web.key, "--tls-ca", ca.ca], capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert b'"spiffe_id":"' + WEB.encode() + b'"' in r.stdout
        r = subprocess.run([udskit_bin, "call", s.addr, "who", "--tls-cert", batch.cert, "--tls-key", batch.key, "--tls-ca", ca.ca], capture_output=True, timeout=30)
        assert r.returncode == 1, r.stdout

        async def py_client() -> Any:
            async with await udskit.connect(s.addr, timeout=5, tls=udskit.TLSConfig(ca=ca.ca, cert=web.cert, key=web.key)) as c:
                return await c.call("who", {})

        assert asyncio.run(py_client()) == {"spiffe_id": WEB}
        assert calls == [WEB, WEB], calls
        assert s.srv.stats["refused"] == 1
    finally:
        s.stop()
