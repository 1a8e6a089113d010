"""Python <-> Node (clients/node): each side's client against the other's server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

import udskit
from conftest import REPO, ThreadServer

NODE_PKG = REPO / "clients" / "node"
HERE = Path(__file__).resolve().parent / "node"


@pytest.fixture(scope="session")
def node_dist() -> Iterator[str]:
    """clients/node built (npm ci + tsc) if its dist is missing or older than its sources."""
    assert shutil.which("node") and shutil.which("npm"), "node and npm are needed for the Node interop tests"
    index = NODE_PKG / "dist" / "index.js"
    newest = max(p.stat().st_mtime for p in (NODE_PKG / "src").rglob("*.ts"))
    if not index.exists() or index.stat().st_mtime < newest:
        if not (NODE_PKG / "node_modules" / "typescript").exists():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_PKG, check=True, timeout=600)
        subprocess.run(["npm", "run", "--silent", "build"], cwd=NODE_PKG, check=True, timeout=600)
    yield str(index)


def test_node_client_to_python_server(node_dist: str, py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    r = subprocess.run(["node", str(HERE / "client.mjs"), node_dist, s.path], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["echo"] == {"hi": 1} and out["raw"] == "0001ff"
    assert out["who"] == {"pid": out["pid"], "uid": os.getuid(), "gid": os.getgid()}  # the Node process, per the kernel
    assert out["fail"] == ["not_found", "gone"] and out["deadline"] == "deadline_exceeded"
    assert out["items"] == [{"i": i, "n": 3} for i in range(3)] and out["many"] == 30000
    assert out["big"] is True and out["conc"] is True


def test_python_clients_to_node_server(node_dist: str, sdir: str) -> None:
    path = os.path.join(sdir, "node.sock")
    p = subprocess.Popen(["node", str(HERE / "server.mjs"), node_dist, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith(b"listening"), line + (p.stderr.read() if p.stderr else b"")

        async def main() -> None:
            async with await udskit.connect(path, timeout=5) as c:
                assert await c.call("echo", {"hi": 1}) == {"hi": 1}
                assert await c.call("echo", b"\x00\xff") == b"\x00\xff"
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("fail", {"code": "not_found", "message": "gone"})
                assert (ei.value.code, ei.value.message) == ("not_found", "gone")
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("sleep", {"ms": 2000}, timeout=0.1)
                assert ei.value.code == "deadline_exceeded"
                assert [x async for x in c.stream("stream", {"n": 3})] == [{"i": i, "n": 3} for i in range(3)]
                n = 0
                async for _ in c.stream("stream", {"n": 30000}):
                    n += 1
                assert n == 30000
                big = os.urandom(1 << 20)
                assert await c.call("echo", big, timeout=10) == big
                outs = await asyncio.gather(*[c.call("echo", {"i": i}, timeout=20) for i in range(1000)])
                assert outs == [{"i": i} for i in range(1000)]
                slow = asyncio.ensure_future(c.call("sleep", {"ms": 300}, timeout=5))
                await asyncio.sleep(0.1)
                p.send_signal(signal.SIGTERM)  # goaway: the call in flight is still answered
                assert await slow == {"slept_ms": 300}

        with udskit.Client(path) as sc:
            assert sc.call("echo", [1, 2], timeout=5) == [1, 2]
            assert len(list(sc.stream("stream", {"n": 5000}))) == 5000
        asyncio.run(main())
        assert p.wait(20) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()
