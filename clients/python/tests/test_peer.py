"""One identity model for local and remote peers (issue 26): handlers see ctx.peer, a local
process (kernel credentials) on a unix socket or a remote workload (verified certificate) on a
tls: listener; one policy composed of both kinds guards a unix and a tls: listener alike, and
refuses before any handler runs."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

import udskit
from conftest import ThreadServer
from test_tls import CA, WEB

BATCH = "spiffe://prod.example/ns/app/sa/batch"


def local(uid: int) -> udskit.Peer:
    return udskit.Peer(cred=udskit.PeerCred(pid=1, uid=uid, gid=uid))


def remote(*uris: str, dns: tuple[str, ...] = ()) -> udskit.Peer:
    sid = uris[0] if len(uris) == 1 and uris[0].startswith("spiffe://") else None
    return udskit.Peer(remote=udskit.RemotePeer("CN=x", dns, tuple(uris), sid))


def test_policies_compose_across_local_and_remote() -> None:
    p = udskit.any_peer(udskit.allow_uids(1000), udskit.allow_spiffe(WEB))
    assert p(local(1000)) and not p(local(1001))
    assert p(remote(WEB)) and not p(remote(BATCH))
    assert not p(udskit.Peer())

    td = udskit.allow_spiffe("spiffe://prod.example/*")
    assert td(remote(WEB)) and td(remote(BATCH)) and not td(remote("spiffe://other.example/ns/app/sa/web"))
    assert not td(remote("spiffe://prod.example.evil/x"))  # the prefix ends at a '/'
    assert not td(remote(WEB, "spiffe://prod.example/second"))  # two URI SANs: no SVID

    dns = udskit.allow_dns("api.example")
    assert dns(remote(dns=("api.example",))) and not dns(remote(dns=("web.example",))) and not dns(local(0))

    anyv = udskit.allow_any_verified()
    assert anyv(remote(BATCH)) and not anyv(local(0))

    both = udskit.all_peers(udskit.allow_spiffe("spiffe://prod.example/*"), udskit.allow_dns("api.example"))
    assert both(remote(WEB, dns=("api.example",))) and not both(remote(WEB))

    # kernel policies never admit a remote peer, and still take a bare PeerCred (peercred.require)
    assert not udskit.allow_uids(1000)(remote(WEB))
    assert udskit.allow_uids(1000)(udskit.PeerCred(1, 1000, 1000))
    assert not udskit.allow_same_user()(remote(WEB))

    with pytest.raises(ValueError):
        udskit.allow_spiffe("prod.example/ns/app")


def test_peer_fields() -> None:
    lp, rp = local(7), remote(WEB, dns=("a.example",))
    assert (lp.is_local, lp.is_remote, lp.uid, lp.gid, lp.pid, lp.spiffe_id, lp.dns_names) == (True, False, 7, 7, 1, None, ())
    assert (rp.is_local, rp.is_remote, rp.uid, rp.spiffe_id, rp.dns_names, rp.subject) == (False, True, None, WEB, ("a.example",), "CN=x")
    assert str(lp) == "pid=1 uid=7 gid=7" and str(rp) == WEB


def test_one_policy_on_unix_and_tls_listeners(sdir: str) -> None:
    ca = CA(sdir, "peer")
    server = ca.issue("peer-server", "DNS:localhost,IP:127.0.0.1")
    web = ca.issue("peer-web", f"URI:{WEB}")
    batch = ca.issue("peer-batch", f"URI:{BATCH}")
    seen: list[dict[str, Any]] = []

    def who(ctx: udskit.Context, _req: Any) -> dict[str, Any]:
        p = ctx.peer
        assert p is not None
        d = {"local": p.is_local, "uid": p.uid, "spiffe_id": p.spiffe_id,
             "cred_uid": ctx.cred.uid if ctx.cred else None, "alias": ctx.remote.spiffe_id if ctx.remote else None}  # fmt: skip
        seen.append(d)
        return d

    me = os.getuid()
    policy = udskit.any_peer(udskit.allow_uids(me), udskit.allow_spiffe(WEB))
    tls_cfg = udskit.ServerTLSConfig(cert=server.cert, key=server.key, ca=ca.ca)  # no allow_* rules: the policy decides
    u = ThreadServer(os.path.join(sdir, "p.sock"), {"who": who}, policy=policy)
    t = ThreadServer("tls:127.0.0.1:0", {"who": who}, policy=policy, tls=tls_cfg)
    other = ThreadServer(os.path.join(sdir, "o.sock"), {"who": who}, policy=udskit.any_peer(udskit.allow_uids(me + 1), udskit.allow_spiffe(WEB)))
    try:
        with udskit.Client(u.addr, timeout=10) as c:
            assert c.call("who", {}, timeout=10) == {"local": True, "uid": me, "spiffe_id": None, "cred_uid": me, "alias": None}
        with udskit.Client(t.addr, timeout=10, tls=udskit.TLSConfig(ca=ca.ca, cert=web.cert, key=web.key)) as c:
            assert c.call("who", {}, timeout=10) == {"local": False, "uid": None, "spiffe_id": WEB, "cred_uid": None, "alias": WEB}

        async def async_web() -> Any:
            async with await udskit.connect(t.addr, timeout=10, tls=udskit.TLSConfig(ca=ca.ca, cert=web.cert, key=web.key)) as c:
                return await c.call("who", {})

        assert asyncio.run(async_web())["spiffe_id"] == WEB
        assert len(seen) == 3

        refused = [
            # a workload the policy does not name: the reason, in place of the server's hello (spec 5.4)
            (t.addr, udskit.TLSConfig(ca=ca.ca, cert=batch.cert, key=batch.key), "permission_denied", f"peer refused by policy: {BATCH}"),
            # no client certificate: the policy made TLS mutual
            (t.addr, udskit.TLSConfig(ca=ca.ca), "permission_denied", "no client certificate"),
            # this uid is not allowed locally; a SPIFFE rule admits no local process
            (other.addr, None, "unavailable", "connection lost"),
        ]
        for addr, cfg, code, want in refused:
            with pytest.raises(udskit.UdskitError) as ei:
                with udskit.Client(addr, timeout=10, tls=cfg, reconnect=False) as c:
                    c.call("who", {}, timeout=10)
            assert ei.value.code == code and want in ei.value.message, ei.value

            async def refused_async() -> None:
                async with await udskit.connect(addr, timeout=10, tls=cfg, reconnect=False) as c:
                    await c.call("who", {})

            if cfg is not None:
                with pytest.raises(udskit.UdskitError) as ai:
                    asyncio.run(refused_async())
                assert ai.value.code == code and want in ai.value.message, ai.value
        assert len(seen) == 3, seen  # no handler ran for a refused peer
        # (refused_bytes_read is not 0 here: TLS's close reads until the client's close_notify,
        # and what it decrypts meanwhile is dropped unparsed, so no TCP reset hides the reason)
        assert t.srv.stats["refused"] == 4
        assert other.srv.stats["refused"] == 1
    finally:
        for s in (u, t, other):
            s.stop()


def test_policy_needs_an_identity_to_check(sdir: str) -> None:
    ca = CA(sdir, "pn")
    server = ca.issue("pn-server", "DNS:localhost,IP:127.0.0.1")

    async def main(addr: str, **kw: Any) -> None:
        s = await udskit.serve(addr, {}, policy=udskit.allow_spiffe(WEB), **kw)
        await s.shutdown()

    with pytest.raises(udskit.ListenError) as ei:
        asyncio.run(main("tls:127.0.0.1:0", tls=udskit.ServerTLSConfig(cert=server.cert, key=server.key)))
    assert "ca=" in str(ei.value)
    with pytest.raises(udskit.ListenError) as ei:
        asyncio.run(main("tcp:127.0.0.1:0"))
    assert "TCP" in str(ei.value)


def test_remote_md_python_block() -> None:
    """docs/remote.md's Python block runs as written and prints the policy's decisions."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "remote.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = [(line.split()[0], line.split()[-1]) for line in r.stdout.decode().splitlines()]
    assert got == [("pid=4242", "True"), ("pid=4243", "False"), (WEB, "True"), (BATCH, "False")], r.stdout
