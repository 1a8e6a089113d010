"""Interceptors (udskit._intercept) on the Python server and async client: what they see
(method, metadata, deadline, peer, the server's address), refusing with a code, wrapping a
handler or a call, streams; without any, the dispatch path is the plain one. And a trace passed
on through a handler (ctx.trace, call(..., trace=...))."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any, AsyncIterator

import pytest

import udskit
from udskit import ClientCall
from udskit._intercept import StreamNext, StreamOpener, UnaryInvoker, UnaryNext
from udskit.tracecontext import TraceContext, new_trace

from conftest import short_dir


def test_server_interceptors() -> None:
    async def main() -> None:
        d = short_dir()
        order: list[str] = []
        seen: list[tuple[str, dict[str, str], float | None, udskit.PeerCred | None]] = []
        handled = 0

        async def outer(ctx: udskit.Context, req: Any, nxt: UnaryNext) -> Any:
            order.append(f"outer:{ctx.method}")
            seen.append((ctx.method, dict(ctx.metadata), ctx.time_remaining(), ctx.cred))
            out = await nxt(ctx, req)
            order.append("outer:done")
            return out

        async def auth(ctx: udskit.Context, req: Any, nxt: UnaryNext) -> Any:
            order.append("auth")
            if ctx.metadata.get("token") != "ok":
                raise udskit.UdskitError("permission_denied", f"{ctx.method}: no token")
            if isinstance(req, bytes):
                return await nxt(ctx, req)
            return {"inner": await nxt(ctx, {**req, "wrapped": True}), "by": "auth"}

        items: list[int] = []

        async def counter(ctx: udskit.Context, req: Any, nxt: StreamNext) -> AsyncIterator[Any]:
            if ctx.metadata.get("token") != "ok":
                raise udskit.UdskitError("permission_denied", "stream: no token")
            async for it in nxt(ctx, req):
                items.append(it)
                yield it * 10

        def echo(ctx: udskit.Context, req: Any) -> Any:  # a plain function: run inline without interceptors
            nonlocal handled
            handled += 1
            return req

        async def count(ctx: udskit.Context, req: Any) -> AsyncIterator[int]:
            for i in range(1, req["n"] + 1):
                yield i

        @udskit.raw
        async def bang(ctx: udskit.Context, req: bytes) -> bytes:
            return req + b"!"

        srv = await udskit.serve(os.path.join(d, "s.sock"), {"echo": echo, "count": count, "bang": bang},
                                 unary_interceptors=[outer, auth], stream_interceptors=[counter])
        c = await udskit.connect(os.path.join(d, "s.sock"))
        try:
            got = await c.call("echo", {"a": 1}, metadata={"token": "ok"}, timeout=5)
            assert got == {"inner": {"a": 1, "wrapped": True}, "by": "auth"}
            assert order == ["outer:echo", "auth", "outer:done"]
            method, md, left, peer = seen[0]
            assert method == "echo" and md == {"token": "ok"}
            assert left is not None and 3 < left <= 5, left
            assert peer is not None and peer.pid == os.getpid() and peer.uid == os.getuid()

            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("echo", {"a": 2})
            assert ei.value.code == "permission_denied" and "no token" in ei.value.message
            assert handled == 1, "a refused call never reaches its handler"

            order.clear()
            assert await c.call("bang", b"x", metadata={"token": "ok"}) == b"x!"
            assert order == ["outer:bang", "auth", "outer:done"]

            order.clear()
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("udskit.health", {})
            assert ei.value.code == "permission_denied"
            assert order == ["outer:udskit.health", "auth"], "standard methods go through the interceptors"

            assert [x async for x in c.stream("count", {"n": 3}, metadata={"token": "ok"})] == [10, 20, 30]
            assert items == [1, 2, 3]
            with pytest.raises(udskit.UdskitError) as ei:
                [x async for x in c.stream("count", {"n": 3})]
            assert ei.value.code == "permission_denied"
            # udskit.methods still reports the kinds of the registered handlers.
            ms = (await c.call("udskit.methods", {}, metadata={"token": "ok"}))["inner"]["methods"]
            assert [(m["name"], m["kind"]) for m in ms] == [("bang", "unary"), ("count", "stream"), ("echo", "unary")]
        finally:
            await c.aclose()
            await srv.shutdown()
            shutil.rmtree(d, ignore_errors=True)

    asyncio.run(main())


def test_client_interceptors() -> None:
    async def main() -> None:
        d = short_dir()
        handled = 0

        async def md(ctx: udskit.Context, req: Any) -> Any:
            nonlocal handled
            handled += 1
            return {"md": ctx.metadata, "deadline": ctx.deadline is not None}

        async def count(ctx: udskit.Context, req: Any) -> AsyncIterator[int]:
            for i in range(1, req["n"] + 1):
                yield i

        calls: list[ClientCall] = []

        async def tag(call: ClientCall, nxt: UnaryInvoker) -> Any:
            calls.append(call)
            if call.method == "forbidden":
                raise udskit.UdskitError("permission_denied", "not from this client")
            return await nxt(call.replace(metadata={**call.metadata, "x-tag": "py"}))

        async def fallback(call: ClientCall, nxt: UnaryInvoker) -> Any:
            try:
                return await nxt(call)
            except udskit.UdskitError as e:
                if e.code == "unimplemented":
                    return {"fallback": call.method}
                raise

        got: list[Any] = []

        async def tap(call: ClientCall, nxt: StreamOpener) -> AsyncIterator[Any]:
            async for it in nxt(call):
                got.append(it)
                yield it

        sock = os.path.join(d, "c.sock")
        srv = await udskit.serve(sock, {"md": md, "count": count})
        c = await udskit.connect(sock, unary_interceptors=[tag, fallback], stream_interceptors=[tap])
        try:
            assert await c.call("md", {}, metadata={"a": "1"}, timeout=7) == {"md": {"a": "1", "x-tag": "py"}, "deadline": True}
            assert calls[0].method == "md" and calls[0].timeout == 7 and calls[0].address == f"unix:{sock}"
            assert await c.call("nosuch", {}) == {"fallback": "nosuch"}
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("forbidden", {})
            assert ei.value.code == "permission_denied"
            assert handled == 1
            assert [x async for x in c.stream("count", {"n": 4})] == [1, 2, 3, 4]
            assert got == [1, 2, 3, 4]
            s = c.stream("count", {"n": 100})
            async for v in s:
                if v == 2:
                    break
            await s.aclose()
            with pytest.raises(StopAsyncIteration):
                await s.__anext__()
        finally:
            await c.aclose()
            await srv.shutdown()
            shutil.rmtree(d, ignore_errors=True)

    asyncio.run(main())


def test_no_interceptors_is_the_plain_path() -> None:
    async def main() -> None:
        d = short_dir()

        def echo(ctx: udskit.Context, req: Any) -> Any:
            return req

        async def passthrough(ctx: udskit.Context, req: Any, nxt: UnaryNext) -> Any:
            return await nxt(ctx, req)

        plain = await udskit.serve(os.path.join(d, "p.sock"), {"echo": echo})
        wrapped = await udskit.serve(os.path.join(d, "w.sock"), {"echo": echo}, unary_interceptors=[passthrough])
        c = await udskit.connect(os.path.join(d, "p.sock"))
        try:
            # The dispatch table holds the registered function itself, still run inline (kind sync).
            assert plain._methods["echo"].fn is echo and plain._methods["echo"].kind == "sync"
            assert wrapped._methods["echo"].fn is not echo and wrapped._methods["echo"].kind == "async"
            assert c._unary is None and c._stream is None
            assert await c.call("echo", {"x": 1}) == {"x": 1}
        finally:
            await c.aclose()
            await plain.shutdown()
            await wrapped.shutdown()
            shutil.rmtree(d, ignore_errors=True)

    asyncio.run(main())


def test_trace_passed_on_through_a_handler() -> None:
    async def main() -> None:
        d = short_dir()
        back_seen: list[TraceContext | None] = []
        front_seen: list[TraceContext | None] = []

        async def leaf(ctx: udskit.Context, req: Any) -> Any:
            back_seen.append(ctx.trace)
            return None

        back = await udskit.serve(os.path.join(d, "b.sock"), {"leaf": leaf})
        to_back = await udskit.connect(os.path.join(d, "b.sock"))

        async def hop(ctx: udskit.Context, req: Any) -> Any:
            front_seen.append(ctx.trace)
            return await to_back.call("leaf", {}, trace=ctx.trace)

        front = await udskit.serve(os.path.join(d, "f.sock"), {"hop": hop})
        app = await udskit.connect(os.path.join(d, "f.sock"))
        try:
            root = TraceContext(new_trace().trace_id, new_trace().span_id, 1, "vendor=1")
            await app.call("hop", {}, trace=root)
            f, b = front_seen[0], back_seen[0]
            assert f is not None and b is not None
            assert f.trace_id == root.trace_id == b.trace_id, "one trace id across both hops"
            assert len({root.span_id, f.span_id, b.span_id}) == 3, "each call a new span"
            assert f.state == b.state == "vendor=1"
            await app.call("hop", {})
            assert front_seen[1] is None and back_seen[1] is None, "no trace is made up"
        finally:
            await app.aclose()
            await to_back.aclose()
            await front.shutdown()
            await back.shutdown()
            shutil.rmtree(d, ignore_errors=True)

    asyncio.run(main())


def test_sync_client_interceptors_and_trace() -> None:
    async def main() -> None:
        d = short_dir()
        sock = os.path.join(d, "s.sock")

        async def md(ctx: udskit.Context, req: Any) -> Any:
            t = ctx.trace
            return {"md": {k: v for k, v in ctx.metadata.items() if not k.startswith("trace")},
                    "trace": None if t is None else t.trace_id}

        srv = await udskit.serve(sock, {"md": md})
        calls: list[ClientCall] = []

        def tag(call: ClientCall, nxt: Any) -> Any:
            calls.append(call)
            if call.method == "forbidden":
                raise udskit.UdskitError("permission_denied", "not from this client")
            return nxt(call.replace(metadata={**call.metadata, "x-tag": "sync"}))

        def blocking() -> None:
            root = new_trace()
            with udskit.Client(sock, interceptors=[tag]) as c:
                assert c.call("md", {}, timeout=3, trace=root) == {"md": {"x-tag": "sync"}, "trace": root.trace_id}
                assert calls[0].timeout == 3 and calls[0].address == f"unix:{sock}"
                with pytest.raises(udskit.UdskitError) as ei:
                    c.call("forbidden", {})
                assert ei.value.code == "permission_denied"
                assert len(calls) == 2
            with udskit.Client(sock) as plain:
                assert plain._unary is None
                assert plain.call("md", {}) == {"md": {}, "trace": None}

        try:
            await asyncio.to_thread(blocking)
        finally:
            await srv.shutdown()
            shutil.rmtree(d, ignore_errors=True)

    asyncio.run(main())
