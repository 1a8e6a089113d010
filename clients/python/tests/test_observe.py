"""udskit.peercred (SO_PEERCRED for plain asyncio servers) and udskit.tracecontext (W3C trace
context in call metadata, no dependency)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

import udskit
from udskit import peercred
from udskit.tracecontext import (
    TraceContext,
    child_of,
    format_traceparent,
    new_trace,
    parse_traceparent,
    trace_from_metadata,
    trace_metadata,
)

from conftest import short_dir

NOBODY = 65534


def test_traceparent_parsing() -> None:
    v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    tc = parse_traceparent(v)
    assert tc == TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    assert format_traceparent(tc) == v
    for bad in [
        None, "", "garbage", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "x" * 1000,
    ]:
        assert parse_traceparent(bad) is None, bad
    later = parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more")
    assert later is not None and later.flags == 0
    a = new_trace()
    b = child_of(TraceContext(a.trace_id, a.span_id, a.flags, "vendor=x"))
    assert b.trace_id == a.trace_id and b.span_id != a.span_id
    assert trace_metadata(b) == {"traceparent": format_traceparent(b), "tracestate": "vendor=x"}
    assert child_of(None).trace_id != a.trace_id


def test_trace_crosses_a_call() -> None:
    async def main() -> None:
        seen: list[TraceContext | None] = []

        async def who(ctx: udskit.Context, req: Any) -> Any:
            seen.append(trace_from_metadata(ctx.metadata))
            return {"ok": True}

        path = os.path.join(short_dir(), "trace.sock")
        srv = await udskit.serve(path, {"who": who})
        try:
            c = await udskit.connect(path)
            try:
                app = new_trace()
                call = child_of(TraceContext(app.trace_id, app.span_id, 1, "vendor=x"))
                await c.call("who", {}, metadata=trace_metadata(call))
                await c.call("who", {})
            finally:
                await c.aclose()
        finally:
            await srv.shutdown()
        assert seen == [TraceContext(app.trace_id, call.span_id, 1, "vendor=x"), None]

    asyncio.run(main())


def test_peercred_plain_asyncio_server() -> None:
    async def main() -> None:
        d = short_dir(0o755)
        path = os.path.join(d, "plain.sock")
        results: list[Any] = []
        got = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                results.append(peercred.peer_cred(writer))
                try:
                    peercred.require(writer, udskit.allow_uids(os.getuid()))
                    writer.write(b"welcome\n")
                except PermissionError as e:
                    results.append(str(e))
                    writer.write(b"refused\n")
                await writer.drain()
            finally:
                writer.close()
                got.set()

        srv = await asyncio.start_unix_server(handle, path)
        os.chmod(path, 0o666)
        try:
            reader, writer = await asyncio.open_unix_connection(path)
            assert await reader.readline() == b"welcome\n"
            writer.close()
            await got.wait()
            assert results[0] == udskit.PeerCred(os.getpid(), os.getuid(), os.getgid())

            # Another process, as nobody: its real pid and uid, refused by the policy.
            if os.geteuid() != 0:
                pytest.skip("needs root to run a client as nobody (tests run as root in CI)")
            setpriv = shutil.which("setpriv")
            assert setpriv, "setpriv (util-linux) is needed: scripts/install-deps.sh installs it"
            results.clear()
            got.clear()
            code = ("import os,socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
                    "print(os.getpid(), os.getuid(), s.makefile().readline().strip())")
            proc = await asyncio.create_subprocess_exec(
                setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", code, path,
                stdout=subprocess.PIPE, cwd="/")
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
            await got.wait()
            pid, uid, answer = out.decode().split()
            assert (int(pid), int(uid), answer) == (proc.pid, NOBODY, "refused")
            assert results[0] == udskit.PeerCred(proc.pid, NOBODY, NOBODY)
            assert "refused by policy" in results[1] and f"uid={NOBODY}" in results[1]
        finally:
            srv.close()
            await srv.wait_closed()

    asyncio.run(main())


def test_peercred_tcp_has_none() -> None:
    async def main() -> None:
        done = asyncio.Event()
        out: list[Any] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            out.append(peercred.peer_cred(writer))
            try:
                peercred.require(writer, udskit.allow_same_user())
            except PermissionError as e:
                out.append(str(e))
            writer.close()
            done.set()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        _, w = await asyncio.open_connection("127.0.0.1", port)
        await done.wait()
        w.close()
        srv.close()
        await srv.wait_closed()
        assert out[0] is None and "no kernel credentials" in out[1]

    asyncio.run(main())
