"""protocol/errors.json: every condition set up for real, and what the Python
clients (asyncio and sync) report: code, retryable, and the words that say what
was found, as Go and Node do. Also the refusal vectors (spec 5.4) and fail fast
(spec 4.2)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator

import pytest

import udskit
import udskit._client
import udskit._sync
from udskit._common import refusal_error

from conftest import PROTOCOL, GoServer

CONDITIONS: list[dict[str, Any]] = json.loads((PROTOCOL / "errors.json").read_text())["conditions"]


@pytest.fixture
def redis_sock(sdir: str) -> Iterator[str]:
    """redis-server on a unix socket (no TCP, no persistence)."""
    sock = os.path.join(sdir, "redis.sock")
    exe = shutil.which("redis-server")
    assert exe, "redis-server is not installed (scripts/install-deps.sh installs it)"
    p = subprocess.Popen([exe, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
                          "--appendonly", "no", "--dir", sdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(400):  # ready once it accepts
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
            break
        except OSError:
            time.sleep(0.025)
    yield sock
    p.kill()
    p.wait(timeout=10)


def foreign_server(path: str) -> socket.socket:
    """A listener that answers anything with a Redis-style error line, then closes."""
    ls = socket.socket(socket.AF_UNIX)
    ls.bind(path)
    ls.listen(8)

    def serve() -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            try:
                c.recv(64)
                c.sendall(b"-ERR unknown command 'UDSK'\r\n")
            finally:
                c.close()

    threading.Thread(target=serve, daemon=True).start()
    return ls


def _setup(name: str, sdir: str, udskit_bin: str, redis: str, sync: bool, servers: list[GoServer]) -> Callable[[], Any]:
    """Returns a function that makes the condition's failure happen (raises)."""
    p = os.path.join(sdir, name + ".sock")

    def dial(addr: str) -> Callable[[], Any]:
        if sync:
            return lambda: udskit.Client(addr, timeout=10)
        return lambda: asyncio.run(udskit.connect(addr, timeout=10))

    if name == "no_socket":
        return dial(p)
    if name == "stale_socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(p)
        s.close()  # the file stays, nothing listens
        return dial(p)
    if name == "regular_file":
        with open(p, "w") as f:
            f.write("x")
        return dial(p)
    if name == "directory":
        os.mkdir(p)
        return dial(p)
    if name == "silent_server":
        return dial(redis)
    if name == "foreign_server":
        foreign_server(p)
        return dial(p)
    if name == "policy_refused":
        g = GoServer(udskit_bin, p, "--allow-uid", "4242")
        servers.append(g)
        g.start()
        return dial(p)
    if name == "server_gone":
        g = GoServer(udskit_bin, p)
        servers.append(g)
        g.start()
        if sync:
            def gone_sync() -> Any:
                with udskit.Client(p) as c:
                    c.call("echo", {"a": 1}, timeout=5)
                    g.kill()
                    last: Exception | None = None
                    for _ in range(3):  # a call may meet the broken connection itself first
                        t0 = time.monotonic()
                        try:
                            c.call("echo", {"a": 1})  # no timeout: must not block
                        except udskit.UdskitError as e:
                            assert time.monotonic() - t0 < 5
                            last = e
                            if "fail fast" in e.message:
                                break
                    assert last is not None
                    raise last
            return gone_sync

        async def gone() -> Any:
            c = await udskit.connect(p, min_backoff=0.01, max_backoff=0.05)
            try:
                await c.call("echo", {"a": 1})
                g.kill()
                last: Exception | None = None
                for _ in range(3):
                    t0 = time.monotonic()
                    try:
                        await c.call("echo", {"a": 1})  # no timeout: must not block
                    except udskit.UdskitError as e:
                        assert time.monotonic() - t0 < 5
                        last = e
                        if "fail fast" in e.message:
                            break
                assert last is not None
                raise last
            finally:
                await c.aclose()
        return lambda: asyncio.run(gone())
    raise AssertionError(f"protocol/errors.json has {name}, which this test does not set up")


@pytest.mark.parametrize("sync", [False, True], ids=["asyncio", "sync"])
@pytest.mark.parametrize("cond", CONDITIONS, ids=[c["name"] for c in CONDITIONS])
def test_error_table(cond: dict[str, Any], sync: bool, sdir: str, udskit_bin: str, redis_sock: str,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(udskit._client, "HANDSHAKE_TIMEOUT", 0.5)
    monkeypatch.setattr(udskit._sync, "HANDSHAKE_TIMEOUT", 0.5)
    servers: list[GoServer] = []
    try:
        run = _setup(cond["name"], sdir, udskit_bin, redis_sock, sync, servers)
        with pytest.raises(udskit.UdskitError) as ei:
            run()
    finally:
        for g in servers:  # (the policy_refused server was left running before)
            g.stop()
    e = ei.value
    assert e.code == cond["code"], e.message
    assert e.retryable == cond["retryable"], e.message
    for w in cond["says"]:
        assert w in e.message, f"message does not say {w!r}: {e.message}"


def test_refusal_vectors() -> None:
    v = json.loads((PROTOCOL / "vectors" / "refusal.json").read_text())
    for r in v["refusals"]:
        b = bytes.fromhex(r["hex"])
        for n in range(1, len(b)):
            assert refusal_error(b[:n]) == "partial", (r["name"], n)
        e = refusal_error(b)
        assert isinstance(e, udskit.UdskitError)
        assert e.number == r["code"]
        assert e.message.endswith(r["message"])
        if "code_name" in r:
            assert e.code == r["code_name"]
        assert e.retryable == r["retryable"]
    assert refusal_error(b"UDSK") is None


def test_wait_for_ready_waits(udskit_bin: str, sdir: str) -> None:
    p = os.path.join(sdir, "wfr.sock")
    g = GoServer(udskit_bin, p)
    g.start()

    async def main() -> None:
        c = await udskit.connect(p, min_backoff=0.01, max_backoff=0.05, wait_for_ready=True)
        try:
            await c.call("echo", 1)
            g.kill()
            try:
                await c.call("echo", 1, timeout=0.2)  # meets the broken connection
            except udskit.UdskitError:
                pass
            task = asyncio.ensure_future(c.call("echo", {"back": True}, timeout=20))
            await asyncio.sleep(0.3)
            assert not task.done()
            g.start()
            assert await task == {"back": True}
        finally:
            await c.aclose()

    try:
        asyncio.run(main())
    finally:
        g.stop()


def test_methods_listed(udskit_bin: str, sdir: str) -> None:
    """udskit.methods (spec 9.2) on the Python server; Go's call --list prints them."""
    p = os.path.join(sdir, "m.sock")

    async def alpha(ctx: udskit.Context, req: Any) -> AsyncIterator[int]:
        yield 1

    def zeta(ctx: udskit.Context, req: Any) -> int:
        return 1

    def blob(ctx: udskit.Context, req: bytes) -> bytes:
        return req

    async def main() -> None:
        srv = await udskit.serve(p, {"zeta": zeta, "alpha": alpha, "blob": udskit.raw(blob)})
        try:
            c = await udskit.connect(p)
            try:
                got = await c.call("udskit.methods", {})
            finally:
                await c.aclose()
            assert got == {"methods": [
                {"name": "alpha", "kind": "stream", "format": "json"},
                {"name": "blob", "kind": "unary", "format": "raw"},
                {"name": "zeta", "kind": "unary", "format": "json"},
            ]}
            r = await asyncio.to_thread(subprocess.run, [udskit_bin, "call", p, "--list"], capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            assert [line.split() for line in r.stdout.strip().splitlines()] == [
                ["alpha", "stream", "json"], ["blob", "unary", "raw"], ["zeta", "unary", "json"]]
        finally:
            await srv.shutdown(timeout=1)

    asyncio.run(main())
