"""Drain modes (issue 28: goaway and linger), the built-in udskit.health method,
and NDJSON clients in a drain (issue 25.3)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import pytest

import udskit


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def echo(ctx: udskit.Context, req: Any) -> Any:
    return req


async def nap(ctx: udskit.Context, req: Any) -> Any:
    await asyncio.sleep(float(req))
    return req


async def ndjson_conn(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(path)


async def nd_call(r: asyncio.StreamReader, w: asyncio.StreamWriter, id: int, func: str, data: Any) -> Any:
    w.write(json.dumps({"id": id, "func": func, "data": data}).encode() + b"\n")
    return json.loads(await asyncio.wait_for(r.readline(), 5))


def test_health_method(sdir: str) -> None:
    async def main() -> None:
        path = os.path.join(sdir, "h.sock")
        srv = await udskit.serve(path, {"echo": echo})
        try:
            async with await udskit.connect(path) as c:
                assert await c.call("udskit.health", {}) == {"status": "serving"}
                assert await c.call("udskit.health") == {"status": "serving"}
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("udskit.health", {"service": "db"})
                assert ei.value.code == "not_found"
                srv.set_health("db", "not_serving")
                assert await c.call("udskit.health", {"service": "db"}) == {"status": "not_serving"}
                srv.set_health("db", "serving")
                assert await c.call("udskit.health", {"service": "db"}) == {"status": "serving"}
                with pytest.raises(ValueError):
                    srv.set_health("db", "fine")
            r, w = await ndjson_conn(path)
            assert await nd_call(r, w, 1, "udskit.health", {}) == {"id": 1, "data": {"status": "serving"}}
            got = await nd_call(r, w, 2, "udskit.health", {"service": "nope"})
            assert got["code"] == "not_found"
            w.close()
        finally:
            await srv.close()

    run(main())
    with pytest.raises(ValueError, match="reserved"):
        run(udskit.serve(os.path.join(sdir, "r.sock"), {"udskit.health": echo}))


def test_linger_keeps_serving_and_accepting_until_the_last_client_leaves(sdir: str) -> None:
    async def main() -> None:
        path = os.path.join(sdir, "l.sock")
        srv = await udskit.serve(path, {"echo": echo, "nap": nap})
        a = await udskit.connect(path)
        t0 = time.monotonic()
        drain = asyncio.ensure_future(srv.shutdown(mode="linger", min_grace=0.2, timeout=10))
        await asyncio.sleep(0.3)  # past min_grace: still serving, a client is connected
        assert not drain.done()
        assert await a.call("udskit.health", {}) == {"status": "draining"}
        assert await a.call("echo", "still", timeout=1) == "still"  # not refused, no goaway
        b = await udskit.connect(path, timeout=1)  # still accepting (an app in shutdown reconnects)
        assert await b.call("nap", 0.2, timeout=2) == 0.2
        r, w = await ndjson_conn(path)
        assert (await nd_call(r, w, 1, "echo", 5))["data"] == 5
        w.close()
        await a.aclose()
        await asyncio.sleep(0.2)
        assert not drain.done()  # b is still there
        await b.aclose()
        left = time.monotonic()
        await asyncio.wait_for(drain, 2)
        assert time.monotonic() - left < 1.0  # exits soon after the last client leaves
        assert time.monotonic() - t0 < 5
        assert not os.path.exists(path)

    run(main())


def test_linger_waits_min_grace_then_the_deadline(sdir: str) -> None:
    async def main() -> None:
        path = os.path.join(sdir, "m.sock")
        srv = await udskit.serve(path, {"echo": echo})
        t0 = time.monotonic()
        await srv.shutdown(mode="linger", min_grace=0.5, timeout=5)  # nobody connected
        took = time.monotonic() - t0
        assert 0.5 <= took < 1.5, took
        # a client that never leaves: the deadline ends the linger, and its connection
        srv = await udskit.serve(path, {"echo": echo})
        r, w = await asyncio.open_unix_connection(path)
        w.write(udskit._wire.Hello().encode())
        await asyncio.sleep(0.1)  # accepted
        assert srv.connections == 1
        t0 = time.monotonic()
        await srv.shutdown(mode="linger", timeout=0.6)
        took = time.monotonic() - t0
        assert 0.6 <= took < 1.5, took
        assert len(await asyncio.wait_for(r.read(1 << 16), 2)) >= 16  # its hello, then EOF
        assert await asyncio.wait_for(r.read(1 << 16), 2) == b""
        w.close()

    run(main())


def test_a_second_shutdown_cuts_the_first(sdir: str) -> None:
    async def main() -> None:
        path = os.path.join(sdir, "c.sock")
        srv = await udskit.serve(path, {"echo": echo})
        c = await udskit.connect(path)
        drain = asyncio.ensure_future(srv.shutdown(mode="linger", timeout=30))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        await asyncio.wait_for(srv.close(), 2)
        await asyncio.wait_for(drain, 2)
        assert time.monotonic() - t0 < 1
        await c.aclose()

    run(main())


def test_serve_forever_signals_linger_then_cut(sdir: str) -> None:
    async def main() -> None:
        path = os.path.join(sdir, "s.sock")
        srv = await udskit.serve(path, {"echo": echo})
        c = await udskit.connect(path)
        forever = asyncio.ensure_future(srv.serve_forever(grace=30, mode="linger", min_grace=0))
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.2)
        assert srv.draining and not forever.done()
        assert await c.call("echo", 1, timeout=1) == 1  # lingering: still served
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal cuts
        await asyncio.wait_for(forever, 2)
        await c.aclose()

    run(main())


def test_goaway_drain_serves_ndjson_lines_already_read(sdir: str) -> None:
    """A draining server answers the NDJSON lines it reads (an NDJSON client
    cannot retry a refused call: main answered them 'unavailable') and closes
    the connection once none is in flight."""

    async def main() -> None:
        path = os.path.join(sdir, "n.sock")
        srv = await udskit.serve(path, {"nap": nap})
        r, w = await ndjson_conn(path)
        w.write(b'{"id":1,"func":"nap","data":0.4}\n')
        await w.drain()
        await asyncio.sleep(0.1)
        drain = asyncio.ensure_future(srv.shutdown(5))  # (the older signature: grace, the deadline)
        await asyncio.sleep(0.1)
        w.write(b'{"id":2,"func":"nap","data":0.1}\n')  # sent during the drain, on the open connection
        got = sorted([json.loads(await asyncio.wait_for(r.readline(), 3)) for _ in range(2)], key=lambda x: x["id"])
        assert got == [{"id": 1, "data": 0.4}, {"id": 2, "data": 0.1}], got
        assert await asyncio.wait_for(r.read(), 2) == b""  # then closed: nothing in flight
        await asyncio.wait_for(drain, 2)
        w.close()

    run(main())


def test_demo_process_lingers_on_sigterm_until_the_app_leaves(sdir: str) -> None:
    """A pod's shutdown: sidecar and app get SIGTERM together; the app keeps
    calling (reconnecting once) for a second of its own shutdown: 0 failed
    calls; the sidecar exits (0) soon after the app's last connection closes."""
    import subprocess
    import sys

    path = os.path.join(sdir, "pod.sock")
    p = subprocess.Popen(
        [sys.executable, "-m", "udskit.demo", path, "--drain", "linger", "--drain-timeout", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None and b"listening" in p.stdout.readline()
        with udskit.Client(path, timeout=5) as c:
            assert c.call("echo", 1, timeout=2) == 1
            p.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            n = 0
            while time.monotonic() - t0 < 1.0:
                assert c.call("echo", n, timeout=2) == n
                n += 1
            with udskit.Client(path, timeout=2) as c2:  # a new connection in the drain
                assert c2.call("udskit.health", {}, timeout=2) == {"status": "draining"}
        left = time.monotonic()
        assert p.wait(5) == 0
        assert time.monotonic() - left < 1.0
        assert n > 10 and not os.path.exists(path)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()


def test_udskit_health_cli_against_the_python_server(udskit_bin: str, sdir: str) -> None:
    """The Go CLI's probe reads the Python server's udskit.health: 0 serving,
    1 draining (a linger drain, still serving), 1 for an unknown service."""
    import subprocess

    from conftest import ThreadServer

    path = os.path.join(sdir, "probe.sock")
    ts = ThreadServer(path, {"echo": echo})
    try:

        def probe(*args: str) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run([udskit_bin, "health", path, "--timeout", "3s", *args], capture_output=True, timeout=20)

        r = probe()
        assert r.returncode == 0 and b"serving" in r.stdout, r
        ts.call_soon(lambda: ts.srv.set_health("db", "not_serving"))
        r = probe("--service", "db")
        assert r.returncode == 1, r
        r = probe("--service", "nope")
        assert r.returncode == 1, r
        drain = asyncio.run_coroutine_threadsafe(ts.srv.shutdown(mode="linger", timeout=10), ts.loop)
        time.sleep(0.2)
        r = probe()
        assert r.returncode == 1 and b"draining" in (r.stdout + r.stderr), r
        drain.result(5)  # the probe's connection was the last: the linger ends
    finally:
        ts.stop()
