"""tls: between Python and Node (clients/node): the Python client against a Node server and the
Node client against a Python server, with mutual TLS; each handler sees the caller's SPIFFE ID."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import udskit
from conftest import ThreadServer
from test_node_interop import HERE, node_dist  # noqa: F401  (a fixture)
from test_tls import CA, DB, WEB


def test_python_client_to_node_tls_server(node_dist: str, sdir: str) -> None:  # noqa: F811
    ca = CA(sdir, "pn")
    server = ca.issue("pn-server", f"DNS:localhost,IP:127.0.0.1,URI:{DB}")
    web = ca.issue("pn-web", f"URI:{WEB}")
    p = subprocess.Popen(["node", str(HERE / "tls-server.mjs"), node_dist, server.cert, server.key, ca.ca, WEB], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        addr = p.stdout.readline().decode().strip()
        assert addr.startswith("tls:127.0.0.1:"), addr

        async def main() -> Any:
            async with await udskit.connect(addr, timeout=10, tls=udskit.TLSConfig(ca=ca.ca, cert=web.cert, key=web.key, server_spiffe_id=DB)) as c:
                return await c.call("who", {})

        assert asyncio.run(main()) == {"spiffe_id": WEB}
    finally:
        p.terminate()
        p.wait(timeout=10)
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()


def test_node_client_to_python_tls_server(node_dist: str, sdir: str) -> None:  # noqa: F811
    ca = CA(sdir, "np")
    server = ca.issue("np-server", f"DNS:localhost,IP:127.0.0.1,URI:{DB}")
    web = ca.issue("np-web", f"URI:{WEB}")

    async def who(ctx: udskit.Context, _req: Any) -> dict[str, Any]:
        return {"spiffe_id": ctx.remote.spiffe_id if ctx.remote else None}

    s = ThreadServer("tls:127.0.0.1:0", {"who": who}, tls=udskit.ServerTLSConfig(cert=server.cert, key=server.key, ca=ca.ca, allow_spiffe=(WEB,)))
    try:
        r = subprocess.run(["node", str(HERE / "tls-client.mjs"), node_dist, s.addr, web.cert, web.key, ca.ca], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"spiffe_id": WEB}
    finally:
        s.stop()
