"""The cross-language matrix of bidirectional calls over `sum` (spec 4.3): Go, Node and
Python clients x Go, Node and Python servers. The Python client runs the whole set
against each server (running totals, half-close, 1,000 concurrent calls on one
connection, cancel from either side, deadlines, a direction that stops being read);
the Node client its script's set (tests/node/bidi-client.mjs); the Go client is
`udskit call ADDR sum` fed one JSON value per stdin line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any, Iterator

import pytest

import udskit
from conftest import GoServer, ThreadServer
from test_node_interop import HERE, node_dist  # noqa: F401  (a fixture, through node_pkg)

SERVERS = ["go", "node", "python"]
UNIT = 10**10  # large items and totals: the credits run out after fewer items


@pytest.fixture(scope="session")
def node_pkg(request: pytest.FixtureRequest) -> str:
    """The Node package's dist/index.js: $UDSKIT_NODE_DIST (another build to check
    against), else clients/node built (the node_dist fixture)."""
    env = os.environ.get("UDSKIT_NODE_DIST")
    if env:
        return env
    return str(request.getfixturevalue("node_dist"))


class NodeServer:
    def __init__(self, dist: str, path: str) -> None:
        self.path = path
        self.proc = subprocess.Popen(["node", str(HERE / "bidi-server.mjs"), dist, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(b"listening"), line + (self.proc.stderr.read() if self.proc.stderr else b"")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest, udskit_bin: str, node_pkg: str, sdir: str) -> Iterator[str]:
    """The path of a running server of each language serving `sum` and `echo`."""
    kind = request.param
    path = os.path.join(sdir, f"{kind}.sock")
    if kind == "go":
        g = GoServer(udskit_bin, path)
        g.start()
        yield path
        g.stop()
    elif kind == "node":
        n = NodeServer(node_pkg, path)
        yield path
        n.stop()
    else:
        t = ThreadServer(path)
        yield path
        t.stop()


def test_python_client(server: str) -> None:
    async def main() -> None:
        async with await udskit.connect(server, timeout=10) as c:
            # one item each way per round, then half-close
            async with c.bidi("sum", timeout=10) as call:
                got = []
                for x in (1, 2, 4.5):
                    assert await call.send(x)
                    got.append(await call.recv())
                await call.done_writing()
                assert [r async for r in call] == []
            assert got == [1, 3, 7.5]

            # 1,000 concurrent calls on one connection
            async def one(i: int) -> list[Any]:
                async with c.bidi("sum", timeout=60) as b:
                    await b.send(i)
                    await b.send(1)
                    await b.done_writing()
                    return [r async for r in b]

            res = await asyncio.gather(*(one(i) for i in range(1000)))
            assert res == [[i, i + 1] for i in range(1000)]

            # cancel from the client; the connection goes on
            call = c.bidi("sum", timeout=10)
            await call.send(5)
            assert await call.recv() == 5
            call.cancel()
            with pytest.raises(udskit.UdskitError) as ei:
                await call.recv()
            assert ei.value.code == "canceled"
            assert await call.send(1) is False

            # the server ends the call (an item that is not a number): sends after it say False
            call = c.bidi("sum", timeout=10)
            await call.send("x")
            with pytest.raises(udskit.UdskitError) as ei:
                await call.recv()
            assert ei.value.code == "invalid_argument"
            assert await call.send(1) is False

            # deadline: no item and no end; the deadline ends both directions
            call = c.bidi("sum", timeout=0.3)
            with pytest.raises(udskit.UdskitError) as ei:
                async for _ in call:
                    pass
            assert ei.value.code == "deadline_exceeded"

            # client-streaming: one response after the last item
            up = c.client_stream("total", timeout=10)
            for x in (1, 2, 4.5):
                await up.send(x)
            assert await up.done_writing() == 7.5
            up = c.client_stream("total", timeout=10)
            await up.send(True)
            with pytest.raises(udskit.UdskitError) as ei:
                await up.done_writing()
            assert ei.value.code == "invalid_argument"

            await stalled_direction(c)
            assert await c.call("echo", b"still") == b"still"

    asyncio.run(main())


async def stalled_direction(c: udskit.AsyncClient) -> None:
    """The client stops reading a call's responses while it keeps sending: the server's
    handler stops at the end of its stream credit, so stops reading, so the client's
    sends stop at the end of its request credit. Other calls on the connection flow
    meanwhile. Then the client reads: everything arrives, in order, nothing lost."""
    n = 100_000
    call = c.bidi("sum", timeout=120)
    sent = 0

    async def sender() -> None:
        nonlocal sent
        for _ in range(n):
            assert await call.send(UNIT)
            sent += 1
        await call.done_writing()

    task = asyncio.ensure_future(sender())
    last = -1
    while sent != last:  # until no send completes for 1.5 s (generous: a loaded machine)
        last = sent
        await asyncio.sleep(1.5)
    assert not task.done(), f"all {n} items went out while nobody read the answers"
    # 1 MiB of answers (~31 bytes a frame) stop the handler after ~34,000 items; the client
    # stops once its request credit (1 MiB, plus what the handler read and the server
    # granted back) is spent: from ~39,000 items (1 MiB of 27-byte frames) to ~60,000
    assert 35_000 < sent < 90_000, sent
    for i in range(20):
        async with c.bidi("sum", timeout=10) as other:
            await other.send(i)
            assert await other.recv() == i
    assert await c.call("echo", b"flows") == b"flows"
    k = 0
    async for total in call:
        k += 1
        assert total == k * UNIT
    assert k == n
    await task


def test_node_client(server: str, node_pkg: str) -> None:
    r = subprocess.run(["node", str(HERE / "bidi-client.mjs"), node_pkg, server], capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {
        "totals": [1, 3, 7.5],
        "after_end": True,
        "concurrent": 1000,
        "cancel": "canceled",
        "deadline": "deadline_exceeded",
        "server_error": "invalid_argument",
        "write_after_end": False,
        "total": 7.5,
        "echo": "still",
    }


def test_go_client(server: str, udskit_bin: str) -> None:
    r = subprocess.run([udskit_bin, "call", server, "sum"], input=b"1\n2\n4.5\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.split()] == [1, 3, 7.5]
    r = subprocess.run([udskit_bin, "call", server, "total"], input=b"1\n2\n4.5\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == 7.5
    r = subprocess.run([udskit_bin, "call", server, "sum"], input=b"1\n\"x\"\n", capture_output=True, timeout=60)
    assert r.returncode != 0 and b"invalid_argument" in r.stderr, r


def test_python_sync_client(server: str) -> None:
    with udskit.Client(server, timeout=10) as c:
        with c.bidi("sum", timeout=10) as call:
            out = []
            for x in (1, 2, 4.5):
                call.send(x)
                out.append(call.recv())
            call.done_writing()
            assert list(call) == []
        assert out == [1, 3, 7.5]
        up = c.client_stream("total", timeout=10)
        for x in (1, 2, 4.5):
            up.send(x)
        assert up.done_writing() == 7.5


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
