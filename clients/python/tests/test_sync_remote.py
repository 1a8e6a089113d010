"""The blocking client (udskit.Client) off the box: tls: against a Go `udskit serve` with mutual
TLS and a SPIFFE policy (certificates made by openssl), and ssh:// through a real sshd (Debian's
openssh-server) on 127.0.0.1 with throwaway keys. Same options and the same refusals, with the
same reasons, as the async client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from typing import Any

import pytest

import udskit
from conftest import GoServer
from test_ssh import SSHD, sshd  # noqa: F401  (fixture)
from test_tls import DB, PKI, WEB, tls_server  # noqa: F401  (fixture)



def test_sync_tls_reads_decrypted_plaintext_before_polling(tls_server: PKI, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """One recv can decrypt more plaintext than it returns (a record left partial by the last
    read completes): the rest must be read before the client polls the socket again, where the
    server may send nothing more. Forced here by returning at most 1,000 bytes per call."""
    from udskit import _synctls

    real = _synctls.TLSSock.recv_some

    def small(self: Any, n: int) -> bytes | None:
        return real(self, min(n, 1000))

    monkeypatch.setattr(_synctls.TLSSock, "recv_some", small)
    p = tls_server
    cfg = udskit.TLSConfig(ca=p.ca.ca, cert=p.web.cert, key=p.web.key)
    with udskit.Client(p.addr, timeout=10, tls=cfg) as c:
        big = os.urandom(200 << 10)
        assert c.call("echo", big, timeout=10) == big


def test_sync_mutual_tls(tls_server: PKI) -> None:  # noqa: F811
    p = tls_server
    for cfg in (
        udskit.TLSConfig(ca=p.ca.ca, cert=p.web.cert, key=p.web.key, server_spiffe_id=DB),
        udskit.TLSConfig(ca=p.ca.ca, cert=p.web.cert, key=p.web.key),
    ):
        with udskit.Client(p.addr, timeout=10, tls=cfg) as c:
            assert c.call("whoami", timeout=10)["spiffe_id"] == WEB
            assert c.call("echo", {"over": "tls"}, timeout=10) == {"over": "tls"}
            assert [x["i"] for x in c.stream("stream", {"n": 5}, timeout=10)] == [0, 1, 2, 3, 4]
            big = os.urandom(3 << 20)  # many TLS records each way, records split across reads
            assert c.call("echo", big, timeout=30) == big


def test_sync_tls_threads_share_the_connection(tls_server: PKI) -> None:  # noqa: F811
    """8 threads x 40 calls over one TLS connection: the reader thread changes as calls finish,
    writers encrypt while another thread decrypts; every answer is the caller's own."""
    p = tls_server
    errors: list[BaseException] = []
    with udskit.Client(p.addr, timeout=10, tls=udskit.TLSConfig(ca=p.ca.ca, cert=p.web.cert, key=p.web.key)) as c:

        def worker(k: int) -> None:
            try:
                for i in range(40):
                    body = bytes([k]) * (1 + (i * 977) % 40000)
                    assert c.call("echo", body, timeout=30) == body
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not any(t.is_alive() for t in ts)
    assert errors == []


@pytest.mark.parametrize(
    "which,code,want",
    [
        ("batch", "unauthenticated", "peer policy"),
        ("no-cert", "unauthenticated", "requires a client certificate"),
        ("other-ca", "unauthenticated", "unknown CA"),
        ("spiffe", "unauthenticated", "SPIFFE ID mismatch"),
        ("none", "failed_precondition", "no plaintext fallback"),
    ],
)
def test_sync_tls_refusals_name_the_reason(tls_server: PKI, which: str, code: str, want: str) -> None:  # noqa: F811
    p = tls_server
    cfg = {
        "batch": udskit.TLSConfig(ca=p.ca.ca, cert=p.batch.cert, key=p.batch.key),
        "no-cert": udskit.TLSConfig(ca=p.ca.ca),
        "other-ca": udskit.TLSConfig(ca=p.other.ca, cert=p.web.cert, key=p.web.key),
        "spiffe": udskit.TLSConfig(ca=p.ca.ca, cert=p.web.cert, key=p.web.key, server_spiffe_id=WEB),
        "none": None,
    }[which]
    with pytest.raises(udskit.UdskitError) as ei:
        with udskit.Client(p.addr, timeout=10, tls=cfg, reconnect=False) as c:
            c.call("echo", {}, timeout=10)
    assert ei.value.code == code, ei.value
    assert want in ei.value.message, ei.value.message


def test_sync_tls_client_on_plaintext_port(udskit_bin: str) -> None:
    g = GoServer(udskit_bin, "tcp:127.0.0.1:0")
    g.proc = subprocess.Popen([g.bin, "serve", g.path, "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert g.proc.stdout is not None
    line = g.proc.stdout.readline().decode()
    assert line.startswith("listening on tcp:"), line
    try:
        addr = "tls:" + line.split()[2].removeprefix("tcp:")
        with pytest.raises(udskit.UdskitError) as ei:
            udskit.Client(addr, timeout=10, reconnect=False, tls=udskit.TLSConfig())
        assert "does not speak TLS" in ei.value.message, ei.value.message
    finally:
        g.stop()


def test_sync_ssh(sshd: SSHD, udskit_bin: str) -> None:  # noqa: F811
    g = GoServer(udskit_bin, os.path.join(sshd.dir, "app.sock"), "--mode", "0666")
    g.start()
    try:
        addr = f"ssh://nobody@127.0.0.1:{sshd.port}{sshd.dir}/app.sock"
        c = udskit.Client(addr, timeout=20, ssh=udskit.SSHConfig(args=sshd.args))
        conn = c._conn
        assert conn is not None and conn.fwd is not None
        with c:
            assert c.call("echo", {"via": "ssh"}, timeout=10) == {"via": "ssh"}
            assert c.call("whoami", timeout=10)["uid"] == 65534  # the ssh login user, from SO_PEERCRED
        assert conn.fwd.proc.wait(timeout=10) is not None  # the forwarder ends with its connection
        assert not os.path.exists(conn.fwd.dir)

        with pytest.raises(udskit.UdskitError) as ei:
            udskit.Client(addr, timeout=20, reconnect=False, ssh=udskit.SSHConfig(args=sshd.wrong))
        assert "authentication refused" in ei.value.message, ei.value.message
    finally:
        g.stop()


def test_ssh_remote_socket_missing_says_so(sshd: SSHD) -> None:  # noqa: F811
    """No server at the remote path: ssh gets through, the remote connect fails; both clients
    say the remote socket could not be opened (not just "the server closed the connection")."""
    path = f"{sshd.dir}/missing.sock"
    addr = f"ssh://nobody@127.0.0.1:{sshd.port}{path}"
    with pytest.raises(udskit.UdskitError) as ei:
        udskit.Client(addr, timeout=20, reconnect=False, ssh=udskit.SSHConfig(args=sshd.args))
    assert ei.value.code == "unavailable"
    assert f"the remote socket {path} on 127.0.0.1 could not be opened" in ei.value.message, ei.value.message

    async def main() -> Any:
        c = await udskit.connect(addr, timeout=20, reconnect=False, ssh=udskit.SSHConfig(args=sshd.args))
        await c.aclose()

    with pytest.raises(udskit.UdskitError) as ai:
        asyncio.run(main())
    assert f"the remote socket {path} on 127.0.0.1 could not be opened" in ai.value.message, ai.value.message


def test_sync_tls_deadline_against_a_server_that_reads_nothing(sdir: str) -> None:
    """A tls: server that completes the handshake, says hello, then reads nothing: every call of
    the blocking client returns by its deadline (the TLS write path never blocks past it, with
    the socket buffers full), with deadline_exceeded or, once a request was cut off half-written,
    unavailable; nothing hangs."""
    import socket
    import ssl
    import time

    from test_tls import CA
    from udskit._wire import Hello

    ca = CA(sdir, "deaf")
    leaf = ca.issue("deaf-server", "DNS:localhost,IP:127.0.0.1")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(leaf.cert, leaf.key)
    ls = socket.create_server(("127.0.0.1", 0))
    port = ls.getsockname()[1]
    held: list[ssl.SSLSocket] = []
    stop = threading.Event()

    def serve() -> None:
        raw, _ = ls.accept()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s = ctx.wrap_socket(raw, server_side=True)
        s.sendall(Hello().encode())
        held.append(s)
        stop.wait(60)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        c = udskit.Client(f"tls:127.0.0.1:{port}", timeout=10, reconnect=False, tls=udskit.TLSConfig(ca=ca.ca))
        codes = []
        body = b"x" * (256 << 10)
        for _ in range(24):  # 6 MiB in all: far more than the socket buffers hold
            t0 = time.monotonic()
            with pytest.raises(udskit.UdskitError) as ei:
                c.call("echo", body, timeout=0.3)
            took = time.monotonic() - t0
            assert took < 0.3 + 3, f"a call took {took:.2f}s past a 0.3s deadline"
            codes.append(ei.value.code)
            if ei.value.code == "unavailable":
                break
        assert set(codes) <= {"deadline_exceeded", "unavailable"}, codes
        if "unavailable" not in codes:
            # requests that found no room were never encrypted: the TLS stream is intact
            assert c._conn is not None and not c._conn.closed
        c.close()
    finally:
        stop.set()
        for s in held:
            s.close()
        ls.close()
        t.join(10)
