"""How the Python server runs an async unary handler (issue 25, "100k ids"): a
task on the handler's own coroutine, answered by the task's done callback
(ServerConn.start / task_done) instead of a wrapper coroutine per call. What a
handler and its caller see must not change: the answer or error of every
outcome, a copy of the context per call, interceptors, cancel, deadline and the
"unavailable" answer of calls cut by a shutdown. Raw frames, so that no client
retry hides an answer."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
from typing import Any

import udskit
from udskit import _wire
from udskit._errors import CANCELED, DEADLINE_EXCEEDED, INTERNAL, INVALID_ARGUMENT, UNAVAILABLE, UNKNOWN
from udskit._handler import Method

HELLO = _wire.Hello().encode()

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


def req(id: int, method: str, payload: bytes = b"", aux: int = 0) -> bytes:
    return _wire.frame(_wire.T_REQUEST, 0, id, aux, _wire.method_head(method), payload)


async def raw_conn(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_unix_connection(path)
    w.write(HELLO)
    await w.drain()
    assert (await r.readexactly(16))[:4] == b"UDSK"
    return r, w


async def read_frame(r: asyncio.StreamReader) -> _wire.Frame:
    h = await asyncio.wait_for(r.readexactly(16), 5)
    t, flags, hl, id, pl, aux = _wire.HEADER.unpack(h)
    rest = await r.readexactly(hl + pl)
    return _wire.Frame(t, flags, id, aux, rest[:hl], rest[hl:])


async def read_frames(r: asyncio.StreamReader, n: int) -> dict[int, _wire.Frame]:
    out = {}
    for _ in range(n):
        f = await read_frame(r)
        out[f.id] = f
    return out


def test_every_outcome_of_an_async_handler_is_answered_as_before(sdir: str) -> None:
    async def ok(ctx: udskit.Context, r: Any) -> Any:
        await asyncio.sleep(0)
        ctx.response_metadata["k"] = "v"
        return {"got": r}

    async def fails_udskit(ctx: udskit.Context, r: Any) -> Any:
        await asyncio.sleep(0)
        raise udskit.UdskitError(INVALID_ARGUMENT, "no thanks")

    async def fails_other(ctx: udskit.Context, r: Any) -> Any:
        raise ValueError("boom")  # before its first await

    @udskit.raw
    async def raw_str(ctx: udskit.Context, r: bytes) -> Any:
        return "not bytes"

    async def cancels_itself(ctx: udskit.Context, r: Any) -> Any:
        raise asyncio.CancelledError()

    async def bad_metadata(ctx: udskit.Context, r: Any) -> Any:
        ctx.response_metadata[":reserved"] = "x"
        return 1

    async def main() -> None:
        path = os.path.join(sdir, "out.sock")
        srv = await udskit.serve(path, {"ok": ok, "fu": fails_udskit, "fo": fails_other, "rs": raw_str, "ci": cancels_itself, "bm": bad_metadata})
        fut_loop = asyncio.get_running_loop()

        def returns_future(ctx: udskit.Context, r: Any) -> Any:
            f = fut_loop.create_future()
            fut_loop.call_later(0.01, f.set_result, {"future": True})
            return f

        # an "async" method whose function returns another awaitable than a coroutine
        srv._methods["fut"] = Method(returns_future, "async", False)
        try:
            r, w = await raw_conn(path)
            w.write(req(1, "ok", b'"x"') + req(2, "fu") + req(3, "fo") + req(4, "rs") + req(5, "ci") + req(6, "bm") + req(7, "fut"))
            got = await read_frames(r, 7)
            assert got[1].type == _wire.T_RESPONSE and json.loads(got[1].payload) == {"got": "x"}
            assert dict(_wire.iter_metadata(got[1].head)) == {"k": "v"}
            assert (got[2].type, got[2].aux, got[2].head) == (_wire.T_ERROR, INVALID_ARGUMENT, b"no thanks")
            assert (got[3].type, got[3].aux, got[3].head) == (_wire.T_ERROR, UNKNOWN, b"ValueError: boom")
            assert (got[4].type, got[4].aux) == (_wire.T_ERROR, INTERNAL) and b"not bytes" in got[4].head
            assert (got[6].type, got[6].aux) == (_wire.T_ERROR, INTERNAL) and b"reserved" in got[6].head
            assert got[7].type == _wire.T_RESPONSE and json.loads(got[7].payload) == {"future": True}
            # a handler raising CancelledError itself (no cancel from anyone) is answered an error
            assert got[5].type == _wire.T_ERROR, got[5]
            conn = next(iter(srv._conns))
            assert not conn.calls and conn.held == 0
            w.close()
        finally:
            await srv.close()

    asyncio.run(main())


def test_each_call_has_its_own_context_and_interceptors_share_it(sdir: str) -> None:
    async def setv(ctx: udskit.Context, r: Any) -> Any:
        seen = var.get()
        var.set(r)
        await asyncio.sleep(0.01)  # the other calls run meanwhile
        return [seen, var.get()]

    async def tag(ctx: udskit.Context, r: Any, nxt: Any) -> Any:
        if r == "tagged":
            var.set("by the interceptor")
        return await nxt(ctx, r)

    async def main() -> None:
        path = os.path.join(sdir, "ctx.sock")
        var.set("server's own")
        srv = await udskit.serve(path, {"setv": setv}, unary_interceptors=[tag])
        try:
            r, w = await raw_conn(path)
            w.write(b"".join(req(i, "setv", json.dumps(f"v{i}").encode()) for i in range(1, 21)) + req(21, "setv", b'"tagged"'))
            got = await read_frames(r, 21)
            for i in range(1, 21):
                # each call starts from a copy of the server's context and keeps what it set
                assert json.loads(got[i].payload) == ["server's own", f"v{i}"], (i, got[i])
            assert json.loads(got[21].payload) == ["by the interceptor", "tagged"]
            assert var.get() == "server's own"
            w.close()
        finally:
            await srv.close()

    asyncio.run(main())


def test_cancel_deadline_and_shutdown_cut_are_answered_as_before(sdir: str) -> None:
    async def sleeper(ctx: udskit.Context, r: Any) -> Any:
        await asyncio.sleep(30)

    async def main() -> None:
        path = os.path.join(sdir, "cut.sock")
        srv = await udskit.serve(path, {"sleep": sleeper})
        r, w = await raw_conn(path)
        conn = next(iter(srv._conns))
        # 1: cancelled by the client (never answered, the id free at once); 2: a 100 ms deadline
        w.write(req(1, "sleep") + req(2, "sleep", aux=100_000) + req(3, "sleep") + req(4, "sleep"))
        await w.drain()
        while len(conn.calls) < 4:
            await asyncio.sleep(0.01)
        w.write(_wire.frame(_wire.T_CANCEL, 0, 1, CANCELED, b"", b""))
        f = await read_frame(r)
        assert (f.type, f.id, f.aux) == (_wire.T_ERROR, 2, DEADLINE_EXCEEDED), f
        assert set(conn.calls) == {3, 4}
        # the shutdown's deadline cuts 3 and 4: each is answered "unavailable" before the close
        await asyncio.wait_for(srv.shutdown(timeout=0.2), 5)
        frames = []
        while True:
            try:
                frames.append(await read_frame(r))
            except asyncio.IncompleteReadError:
                break
        errs = {f.id: f for f in frames if f.type == _wire.T_ERROR}
        assert set(errs) == {3, 4}, frames
        for f in errs.values():
            assert f.aux == UNAVAILABLE and f.head == b"server shut down before the call finished", f
        w.close()

    asyncio.run(main())


def test_calls_cancelled_or_answered_leave_no_garbage_for_the_cyclic_gc(sdir: str) -> None:
    """Every call of the 100k-ids attack ends cancelled: a reference cycle per
    call (an exception's traceback holding the frame that holds it, a task and
    its call holding each other) would be left for the cyclic GC, whose full
    collections are what the good client waits on. None is left: everything a
    call made is freed by reference counting when it ends."""
    import gc

    async def sleeper(ctx: udskit.Context, r: Any) -> Any:
        await asyncio.sleep(30)

    async def quick(ctx: udskit.Context, r: Any) -> Any:
        await asyncio.sleep(0)
        return r

    async def main() -> None:
        path = os.path.join(sdir, "gcc.sock")
        srv = await udskit.serve(path, {"sleep": sleeper, "quick": quick})
        try:
            r, w = await raw_conn(path)
            conn = next(iter(srv._conns))
            n = 50
            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                w.write(b"".join(req(i, "sleep", aux=60_000_000 if i % 2 else 0) for i in range(1, n + 1)))
                w.write(b"".join(req(i, "quick", b"1") for i in range(n + 1, 2 * n + 1)))
                await w.drain()
                await read_frames(r, n)  # the quick ones
                while len(conn.calls) < n:
                    await asyncio.sleep(0.01)
                # cancelled by the client, by a shutdown-like cut, by a deadline
                w.write(b"".join(_wire.frame(_wire.T_CANCEL, 0, i, CANCELED, b"", b"") for i in range(1, n // 2 + 1)))
                await w.drain()
                while len(conn.calls) > n // 2:
                    await asyncio.sleep(0.01)
                for i in range(n // 2 + 1, n + 1):
                    conn.expire(conn.calls[i])
                await read_frames(r, n - n // 2)
                assert not conn.calls
                await asyncio.sleep(0.05)
                gc.collect()
                left = [type(o).__name__ for o in gc.garbage]
                assert len(left) < 10, f"{len(left)} objects in reference cycles after {2 * n} calls: {sorted(set(left))}"
            finally:
                gc.garbage.clear()
                gc.set_debug(0)
                gc.enable()
            w.close()
        finally:
            await srv.close()

    asyncio.run(main())
