"""Python clients (async, sync, NDJSON) against the Go `udskit serve`."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest

import udskit
from conftest import GoServer


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_every_method_async(go_server: GoServer) -> None:
    async def main() -> None:
        async with await udskit.connect(go_server.path, timeout=5) as c:
            assert await c.call("echo", {"hello": "world", "n": [1, 2.5, None]}) == {"hello": "world", "n": [1, 2.5, None]}
            assert await c.call("echo", b"\x00raw\xff") == b"\x00raw\xff"
            assert await c.call("echo", b"") == b""
            assert await c.call("sleep", {"ms": 20}, timeout=5) == {"slept_ms": 20}
            who = await c.call("whoami")
            assert who == {"pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid()}
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("fail", {"code": "not_found", "message": "no such user"})
            assert (ei.value.code, ei.value.number, ei.value.message, ei.value.retryable) == ("not_found", 5, "no such user", False)
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("fail", {"code": "unavailable"})
            assert ei.value.retryable and not ei.value.refused
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("nope")
            assert ei.value.code == "unimplemented"
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("stream", {"n": 1})  # a stream method called unary
            assert ei.value.code == "unimplemented"
            items = [x async for x in c.stream("stream", {"n": 3, "interval_ms": 5})]
            assert items == [{"i": i, "n": 3} for i in range(3)]
            with pytest.raises(udskit.UdskitError) as ei:
                async for _ in c.stream("stream", {"n": -1}):
                    pass
            assert ei.value.code == "invalid_argument"
            assert 0 <= await c.ping() < 5  # the Go server answers pings
            # metadata goes out (the demo ignores it, but the request must parse)
            assert await c.call("echo", {"m": 1}, metadata={"trace": "abc", "tenant": ""}) == {"m": 1}

    run(main())


def test_deadlines(go_server: GoServer) -> None:
    async def main() -> None:
        c = await udskit.connect(go_server.path)
        t0 = time.monotonic()
        with pytest.raises(udskit.UdskitError) as ei:
            await c.call("sleep", {"ms": 5000}, timeout=0.1)
        el = time.monotonic() - t0
        assert ei.value.code == "deadline_exceeded" and 0.09 <= el < 1.0, el
        # the connection is fine afterwards, and a stream's deadline ends it
        assert await c.call("echo", 1) == 1
        with pytest.raises(udskit.UdskitError) as ei:
            async for _ in c.stream("stream", {"n": 100, "interval_ms": 50}, timeout=0.2):
                pass
        assert ei.value.code == "deadline_exceeded"
        # a task cancelled from outside cancels its call
        task = asyncio.ensure_future(c.call("sleep", {"ms": 5000}))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c._conn is not None and not c._conn.unary
        await c.aclose()

    run(main())


def test_large_payloads_and_1000_concurrent(go_server: GoServer) -> None:
    async def main() -> None:
        c = await udskit.connect(go_server.path)
        big = os.urandom(1 << 20)
        assert await c.call("echo", big, timeout=10) == big
        outs = await asyncio.gather(*[c.call("echo", big, timeout=20) for _ in range(8)])
        assert all(o == big for o in outs)
        outs = await asyncio.gather(*[c.call("echo", {"i": i}, timeout=20) for i in range(1000)])
        assert outs == [{"i": i} for i in range(1000)]
        # over the negotiated max frame: refused locally, before sending
        with pytest.raises(udskit.UdskitError) as ei:
            await c.call("echo", b"x" * ((16 << 20) + 1))
        assert ei.value.code == "resource_exhausted"
        with pytest.raises(udskit.UdskitError) as ei:
            async for _ in c.stream("stream", b"x" * ((16 << 20) + 1)):
                pass
        assert ei.value.code == "resource_exhausted"
        assert await c.call("echo", {"still": "up"}) == {"still": "up"}
        await c.aclose()

    run(main())


def test_stream_credit_unread_stream_does_not_block_others(go_server: GoServer) -> None:
    """A stream nobody reads holds at most its credit; other calls go on."""

    async def main() -> None:
        c = await udskit.connect(go_server.path)
        s = c.stream("echo_never", None)  # warm-up: make sure unknown streams error
        with pytest.raises(udskit.UdskitError):
            await s.__anext__()
        st = c.stream("stream", {"n": 100000})
        first = await st.__anext__()
        assert first == {"i": 0, "n": 100000}
        state = st._st
        assert state is not None
        # wait until the server has run out of credit: nothing more arrives
        last, end = -1, time.monotonic() + 10
        while time.monotonic() < end:
            await asyncio.sleep(0.2)
            if len(state.items) == last:
                break
            last = len(state.items)
        sent = sum(len(x) + 16 for x in state.items) + len(b'{"i":0,"n":100000}') + 16
        assert (1 << 20) <= sent <= (1 << 20) + 64, sent  # exactly the initial credit, plus at most one item
        for i in range(50):
            assert await c.call("echo", {"i": i}, timeout=2) == {"i": i}
        # reading on grants credit: the whole stream arrives
        n = 1
        async for item in st:
            assert item["i"] == n
            n += 1
        assert n == 100000
        await c.aclose()

    run(main())


def test_sync_client(go_server: GoServer) -> None:
    with udskit.Client(go_server.path) as c:
        assert c.call("echo", {"a": 1}, timeout=2) == {"a": 1}
        assert c.call("echo", b"\x01\x02") == b"\x01\x02"
        assert c.call("whoami")["pid"] == os.getpid()
        with pytest.raises(udskit.UdskitError) as ei:
            c.call("sleep", {"ms": 3000}, timeout=0.1)
        assert ei.value.code == "deadline_exceeded"
        assert list(c.stream("stream", {"n": 4})) == [{"i": i, "n": 4} for i in range(4)]
        n = sum(1 for _ in c.stream("stream", {"n": 30000}))
        assert n == 30000
        big = os.urandom(1 << 20)
        assert c.call("echo", big, timeout=10) == big
        errors: list[BaseException] = []

        def worker(k: int) -> None:
            try:
                for i in range(200):
                    assert c.call("echo", {"k": k, "i": i}, timeout=10) == {"k": k, "i": i}
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not errors, errors


def test_ndjson_client_against_go(go_server: GoServer) -> None:
    async def main() -> None:
        async with await udskit.connect_ndjson(go_server.path) as c:
            assert await c.call("echo", {"hi": 1}) == {"hi": 1}
            assert await c.call("sleep", {"ms": 10}) == {"slept_ms": 10}
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("fail", {"code": "permission_denied", "message": "no"})
            assert ei.value.code == "permission_denied" and ei.value.message == "no"
            outs = await asyncio.gather(*[c.call("echo", i) for i in range(100)])
            assert outs == list(range(100))

    run(main())


def test_wait_for_socket(udskit_bin: str, sdir: str) -> None:
    path = os.path.join(sdir, "late.sock")
    s = GoServer(udskit_bin, path)

    async def main() -> None:
        with pytest.raises(udskit.UdskitError) as ei:
            await udskit.connect(path)
        assert ei.value.code == "unavailable" and "wait=True" in ei.value.message
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, s.start)
        t0 = time.monotonic()
        c = await udskit.connect(path, wait=True, timeout=10)
        assert time.monotonic() - t0 >= 0.25
        assert await c.call("echo", 5) == 5
        await c.aclose()
        with pytest.raises(udskit.UdskitError) as ei:
            await udskit.connect(os.path.join(sdir, "never.sock"), wait=True, timeout=0.3)
        assert ei.value.code == "deadline_exceeded"

    try:
        run(main())
    finally:
        s.stop()


def test_drain_goaway(go_server: GoServer) -> None:
    """SIGTERM: calls in flight finish; the client is told to go away."""

    async def main() -> None:
        c = await udskit.connect(go_server.path)
        calls = [asyncio.ensure_future(c.call("sleep", {"ms": 300}, timeout=5)) for _ in range(5)]
        await asyncio.sleep(0.1)
        assert go_server.proc is not None
        go_server.proc.send_signal(signal.SIGTERM)
        outs = await asyncio.gather(*calls)
        assert outs == [{"slept_ms": 300}] * 5
        # the server exits once we have no calls; later calls fail retryably within their timeout
        with pytest.raises(udskit.UdskitError) as ei:
            await c.call("echo", 1, timeout=0.5)
        assert ei.value.code in ("deadline_exceeded", "unavailable")
        await c.aclose()

    run(main())
    assert go_server.proc is not None
    assert go_server.proc.wait(10) == 0


def test_server_killed_and_restarted_mid_load(go_server: GoServer) -> None:
    """kill -9 mid-load: in-flight calls fail fast and retryably, no call outlives its
    timeout, and calls succeed again once the server is back."""
    timeout = 1.0

    async def main() -> None:
        c = await udskit.connect(go_server.path, max_backoff=0.1)
        results: list[tuple[str, float]] = []
        stop = time.monotonic() + 2.5

        async def caller(k: int) -> None:
            i = 0
            while time.monotonic() < stop:
                t0 = time.monotonic()
                try:
                    await c.call("sleep" if i % 3 == 0 else "echo", {"ms": 20} if i % 3 == 0 else {"k": k}, timeout=timeout)
                    results.append(("ok", time.monotonic() - t0))
                except udskit.UdskitError as e:
                    results.append((e.code if e.code != "unavailable" or e.retryable else "bad", time.monotonic() - t0))
                    await asyncio.sleep(0.01)
                i += 1

        async def chaos() -> None:
            await asyncio.sleep(0.6)
            go_server.kill(signal.SIGKILL)
            await asyncio.sleep(0.4)
            go_server.start()

        await asyncio.gather(chaos(), *[caller(k) for k in range(16)])
        await c.aclose()
        kinds = {k for k, _ in results}
        worst = max(el for _, el in results)
        assert worst < timeout + 0.5, worst  # slack: scheduling on a loaded 2-core machine
        assert "bad" not in kinds
        assert "unavailable" in kinds, kinds  # the kill was seen
        late_ok = [r for r in results[-50:] if r[0] == "ok"]
        assert len(late_ok) == 50, results[-50:]

    run(main())
