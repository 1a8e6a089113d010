"""Client-streaming and bidirectional calls (spec 4.3), Python client x Python server:
the sum demo, client streams, half-close, 1,000 concurrent calls on one connection,
cancel from either side, deadlines, a direction that stops being read, kind
mismatches, an old server, NDJSON, udskit.methods, and the sync client."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from typing import Any, AsyncIterator, Callable

import pytest

import udskit
from conftest import ThreadServer, wait_for
from udskit import demo

BIG = 64 << 10


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Probe:
    """What handlers saw, for the tests to look at."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.taken: dict[str, int] = {}
        self.started = asyncio.Event()


def handlers(p: Probe) -> dict[str, Any]:
    h: dict[str, Any] = demo.handlers()

    @udskit.client_stream
    async def count(ctx: udskit.Context, requests: udskit.Requests) -> Any:
        n = 0
        async for _ in requests:
            n += 1
        ctx.response_metadata["items"] = str(n)
        return {"count": n}

    @udskit.raw
    @udskit.bidi
    async def upper(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[bytes]:
        async for b in requests:
            yield b.upper()
        # half-close: the client is done, the server keeps sending
        for i in range(3):
            yield b"after-end-%d" % i
        ctx.response_metadata["done"] = "yes"

    @udskit.bidi
    async def hold(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
        # reads nothing until cancelled: its client's request credit runs out
        p.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            p.cancelled.append(ctx.method)
            raise
        yield None

    @udskit.bidi
    async def slowread(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
        # reads one item, then stalls; counts what it took
        p.taken["slowread"] = 0
        async for _ in requests:
            p.taken["slowread"] += 1
            p.started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                p.cancelled.append(ctx.method)
                raise
        yield None

    @udskit.bidi
    async def firehose(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
        # answers without reading: a client that reads nothing stalls only this call
        for i in range(100000):
            yield {"i": i, "pad": "x" * 1000}

    @udskit.bidi
    async def first(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
        # ends the call after one item, before the client is done sending
        async for x in requests:
            yield x
            return

    @udskit.client_stream
    async def early(ctx: udskit.Context, requests: udskit.Requests) -> Any:
        return {"first": await requests.recv()}

    @udskit.bidi
    async def boom(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
        async for x in requests:
            if x == "boom":
                raise udskit.UdskitError("failed_precondition", "went boom")
            yield x

    @udskit.bidi
    async def waits(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
        try:
            async for x in requests:
                yield x
        except asyncio.CancelledError:
            p.cancelled.append(ctx.method)
            raise

    h.update(count=count, upper=upper, hold=hold, slowread=slowread, firehose=firehose, first=first, early=early, boom=boom, waits=waits)
    return h


async def serve(sdir: str, p: Probe, **kw: Any) -> udskit.Server:
    return await udskit.serve(os.path.join(sdir, "bidi.sock"), handlers(p), **kw)


def test_sum_and_half_close(sdir: str) -> None:
    async def main() -> None:
        p = Probe()
        async with await serve(sdir, p) as srv:
            async with await udskit.connect(str(srv.addr)) as c:
                async with c.bidi("sum", timeout=10) as call:
                    got = []
                    for x in (1, 2, 4.5, -0.5):
                        assert await call.send(x) is True
                        got.append(await call.recv())
                    await call.done_writing()
                    assert [r async for r in call] == []
                assert got == [1, 3, 7.5, 7]
                # half-close first, then read: the server keeps sending after request_end
                call = c.bidi("upper", raw=True, timeout=10)
                for w in (b"a", b"bc"):
                    await call.send(w)
                await call.done_writing()
                assert [r async for r in call] == [b"A", b"BC", b"after-end-0", b"after-end-1", b"after-end-2"]
                assert call.trailer == {"done": "yes"}
                with pytest.raises(RuntimeError):
                    await call.send(b"late")
                # no items at all
                call = c.bidi("sum", timeout=10)
                await call.done_writing()
                assert [r async for r in call] == []
                # a non-number item fails the call with invalid_argument
                call = c.bidi("sum", timeout=10)
                await call.send("seven")
                with pytest.raises(udskit.UdskitError) as ei:
                    await call.recv()
                assert ei.value.code == "invalid_argument"
                # the connection is as good as before
                assert await c.call("echo", b"x") == b"x"

    run(main())


def test_client_stream(sdir: str) -> None:
    async def main() -> None:
        p = Probe()
        async with await serve(sdir, p) as srv, await udskit.connect(str(srv.addr)) as c:
            up = c.client_stream("count", timeout=10)
            # 3 MiB of items: past the 1 MiB initial credit, so request_credit must flow
            for i in range(3000):
                assert await up.send({"i": i, "pad": "y" * 1000})
            assert await up.done_writing() == {"count": 3000}
            up = c.client_stream("count", timeout=10)
            assert await up.done_writing() == {"count": 0}
            # the server answers before the client is done: later sends say False
            up = c.client_stream("early", timeout=10)
            await up.send("a")
            assert await up.response() == {"first": "a"}
            assert await up.send("b") is False
            assert await up.done_writing() == {"first": "a"}

    run(main())


def test_thousand_concurrent_calls_on_one_connection(sdir: str) -> None:
    async def main() -> None:
        p = Probe()
        async with await serve(sdir, p) as srv, await udskit.connect(str(srv.addr)) as c:

            async def one(i: int) -> list[Any]:
                async with c.bidi("sum", timeout=60) as call:
                    out = []
                    for x in (i, 1, 2):
                        await call.send(x)
                        out.append(await call.recv())
                    await call.done_writing()
                    out += [r async for r in call]
                    return out

            res = await asyncio.gather(*(one(i) for i in range(1000)))
            assert res == [[i, i + 1, i + 3] for i in range(1000)]
            assert len(srv._conns) == 1
            conn = c._conn
            assert conn is not None and not conn.streams and not conn.senders

    run(main())


def test_cancel_from_the_client(sdir: str) -> None:
    async def main() -> None:
        p = Probe()
        async with await serve(sdir, p) as srv, await udskit.connect(str(srv.addr)) as c:
            call = c.bidi("waits", timeout=30)
            await call.send(1)
            assert await call.recv() == 1
            call.cancel()
            assert await call.send(2) is False
            with pytest.raises(udskit.UdskitError) as ei:
                await call.recv()
            assert ei.value.code == "canceled"
            # cancelling the task that waits for a response cancels the call
            call2 = c.bidi("waits", timeout=30)
            await call2.send(1)
            assert await call2.recv() == 1
            t = asyncio.ensure_future(call2.recv())
            await asyncio.sleep(0.05)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            # leaving `async with` early cancels too
            async with c.bidi("waits", timeout=30) as call3:
                await call3.send(1)
                assert await call3.recv() == 1
            for _ in range(500):
                if p.cancelled.count("waits") == 3:
                    break
                await asyncio.sleep(0.01)
            assert p.cancelled == ["waits"] * 3
            assert not any(sc.calls for sc in srv._conns)
            assert await c.call("echo", b"ok") == b"ok"

    run(main())


def test_the_server_ends_the_call_first(sdir: str) -> None:
    async def main() -> None:
        p = Probe()
        async with await serve(sdir, p) as srv, await udskit.connect(str(srv.addr)) as c:
            call = c.bidi("first", timeout=10)
            await call.send("a")
            assert [r async for r in call] == ["a"]
            assert await call.send("b") is False  # dropped: the call is over
            call = c.bidi("boom", timeout=10)
            await call.send("x")
            assert await call.recv() == "x"
            await call.send("boom")
            with pytest.raises(udskit.UdskitError) as ei:
                await call.recv()
            assert (ei.value.code, ei.value.message) == ("failed_precondition", "went boom")
            assert await call.send("y") is False
            assert await c.call("echo", b"ok") == b"ok"

    run(main())


def test_deadline_ends_both_directions(sdir: str) -> None:
    async def main() -> None:
        p = Probe()
        async with await serve(sdir, p) as srv, await udskit.connect(str(srv.addr)) as c:
            call = c.bidi("hold", timeout=0.3)
            t0 = time.monotonic()
            # sends until the credit is gone, then waits: the deadline ends the wait
            sent = 0
            while await call.send("z" * 60000):
                sent += 1
            assert 0.25 < time.monotonic() - t0 < 10
            assert sent == 18  # 1 MiB of credit in 60 KiB items (the last one overdraws), then the wait
            with pytest.raises(udskit.UdskitError) as ei:
                await call.recv()
            assert ei.value.code == "deadline_exceeded"
            for _ in range(500):
                if "hold" in p.cancelled:
                    break
                await asyncio.sleep(0.01)
            assert p.cancelled == ["hold"]  # the handler's task was cancelled too
            up = c.client_stream("early", timeout=0.2)
            with pytest.raises(udskit.UdskitError) as ei:
                await up.response()  # no item, no end: the handler waits for one until the deadline
            assert ei.value.code == "deadline_exceeded"

    run(main())


def test_stalled_direction_stalls_only_its_call(sdir: str) -> None:
    """A handler that stops reading: its client's sends wait once the 1 MiB of credit is
    spent, the server holds no more than that, and other calls keep flowing. A client that
    stops reading responses: the handler waits for stream credit, others flow."""

    async def main() -> None:
        p = Probe()
        async with await serve(sdir, p) as srv, await udskit.connect(str(srv.addr)) as c:
            stalled = c.bidi("slowread", timeout=60)
            item = "q" * (BIG - 18)  # 64 KiB a frame: a JSON string of BIG - 18 bytes
            sent = 0
            while True:
                try:
                    ok = await asyncio.wait_for(stalled.send(item), 0.5)
                except asyncio.TimeoutError:
                    break  # (wait_for cancelled the send, which cancels the call: reopened below)
                assert ok
                sent += 1
                assert sent <= 40, "the client kept sending past its credit"
            assert 16 <= sent <= 17  # 1 MiB of credit in 64 KiB items
            # the server holds at most the credit for it
            assert srv.held <= (1 << 20) + (1 << 20)
            assert p.taken["slowread"] == 1
            # a new stalled call (the old one was cancelled with its send), and one that
            # floods a client reading nothing
            p.started.clear()
            stalled2 = c.bidi("slowread", timeout=60)
            await stalled2.send(item)
            await asyncio.wait_for(p.started.wait(), 10)
            hose = c.bidi("firehose", timeout=60)
            await hose.send(1)
            await asyncio.sleep(0.2)
            # others keep flowing on the same connection
            for i in range(50):
                async with c.bidi("sum", timeout=10) as call:
                    await call.send(i)
                    assert await call.recv() == i
            assert await c.call("echo", b"still") == b"still"
            # the firehose was stopped by stream credit, not buffered without bound
            conn = c._conn
            assert conn is not None
            st = conn.streams[hose._id]
            assert len(st.items) * 1016 <= (1 << 20) + (16 << 20)
            hose.cancel()
            stalled2.cancel()

    run(main())


def test_kind_mismatch(sdir: str) -> None:
    async def main() -> None:
        p = Probe()
        async with await serve(sdir, p) as srv, await udskit.connect(str(srv.addr)) as c:
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("sum", 1)
            assert ei.value.code == "unimplemented" and "bidirectional" in ei.value.message
            with pytest.raises(udskit.UdskitError) as ei:
                async for _ in c.stream("sum", 1):
                    pass
            assert ei.value.code == "unimplemented"
            call = c.bidi("echo", timeout=5)
            await call.send(1)  # ignored by the server: the id is unknown to it
            with pytest.raises(udskit.UdskitError) as ei:
                await call.recv()
            assert ei.value.code == "unimplemented" and "unary" in ei.value.message
            with pytest.raises(udskit.UdskitError) as ei:
                await c.client_stream("sum", timeout=5).done_writing()
            assert ei.value.code == "unimplemented"
            with pytest.raises(udskit.UdskitError) as ei:
                await c.bidi("count", timeout=5).recv()
            assert ei.value.code == "unimplemented" and "client stream" in ei.value.message
            with pytest.raises(udskit.UdskitError) as ei:
                await c.bidi("nope", timeout=5).recv()
            assert ei.value.code == "unimplemented"
            assert await c.call("echo", b"ok") == b"ok"
            ms = {m["name"]: m["kind"] for m in (await c.call("udskit.methods"))["methods"]}
            assert (ms["sum"], ms["count"], ms["upper"], ms["echo"], ms["stream"]) == ("bidi", "client_stream", "bidi", "unary", "stream")

    run(main())


def test_markers_check_the_function() -> None:
    with pytest.raises(TypeError):
        udskit.bidi(lambda ctx, r: None)

    async def coro(ctx: Any, r: Any) -> None:
        pass

    with pytest.raises(TypeError):
        udskit.bidi(coro)
    with pytest.raises(TypeError):
        udskit.client_stream(lambda ctx, r: None)


def test_register_on_a_running_server(sdir: str) -> None:
    async def main() -> None:
        async with await udskit.serve(os.path.join(sdir, "r.sock"), {}) as srv, await udskit.connect(str(srv.addr)) as c:

            @srv.bidi("twice")
            async def twice(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
                async for x in requests:
                    yield x * 2

            @srv.client_stream("total")
            async def total(ctx: udskit.Context, requests: udskit.Requests) -> Any:
                return sum([x async for x in requests])

            call = c.bidi("twice", timeout=5)
            await call.send(21)
            assert await call.recv() == 42
            up = c.client_stream("total", timeout=5)
            for x in (1, 2, 3):
                await up.send(x)
            assert await up.done_writing() == 6

    run(main())


def old_server(path: str, got: list[bytes], ready: threading.Event) -> None:
    """A server whose hello lacks client_stream (flags 0x01): records what it receives."""
    ls = socket.socket(socket.AF_UNIX)
    ls.bind(path)
    ls.listen(1)
    ready.set()
    s, _ = ls.accept()
    s.sendall(bytes.fromhex("5544534b010100000000000100100000"))
    s.settimeout(5)
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            got.append(b)
    except OSError:
        pass
    s.close()
    ls.close()


def test_old_server_fails_locally(sdir: str) -> None:
    path = os.path.join(sdir, "old.sock")
    got: list[bytes] = []
    ready = threading.Event()
    t = threading.Thread(target=old_server, args=(path, got, ready))
    t.start()
    ready.wait(5)

    async def main() -> None:
        async with await udskit.connect(path) as c:
            for call in (c.bidi("sum"), c.client_stream("count")):
                with pytest.raises(udskit.UdskitError) as ei:
                    await call.send(1)
                assert ei.value.code == "unimplemented"
                assert ei.value.message == (
                    "server does not support client or bidirectional streams (its hello lacks the client_stream flag); upgrade the server"
                )

    run(main())
    t.join(10)
    # our hello (it offers client_stream too), and nothing else
    sent = b"".join(got)
    assert len(sent) == 16 and sent[:5] == b"UDSK\x01" and sent[5] & 0x03 == 0x03, sent


def test_ndjson_gets_a_clear_error(py_server: Callable[..., ThreadServer]) -> None:
    s = py_server(handlers(Probe()))
    sk = socket.socket(socket.AF_UNIX)
    sk.settimeout(10)
    sk.connect(s.path)
    sk.sendall(b'{"id":1,"func":"sum","data":1}\n{"id":2,"func":"count"}\n{"id":3,"func":"echo","data":{"a":1}}\n')
    buf = b""
    while buf.count(b"\n") < 3:
        buf += sk.recv(4096)
    sk.close()
    lines = sorted(buf.decode().splitlines(), key=lambda x: json.loads(x)["id"])
    assert lines[0] == '{"id":1,"error":"method \\"sum\\" is a bidirectional stream; NDJSON has no streams: use a udskit client","code":"unimplemented"}'
    assert json.loads(lines[1]) == {"id": 2, "error": 'method "count" is a client stream; NDJSON has no streams: use a udskit client', "code": "unimplemented"}
    assert json.loads(lines[2])["data"] == {"a": 1}


def test_sync_client(py_server: Callable[..., ThreadServer]) -> None:
    p = Probe()
    s = py_server(handlers(p))
    with udskit.Client(s.path) as c:
        with c.bidi("sum", timeout=10) as call:
            assert [call.send(x) for x in (1, 2)] == [True, True]
            assert [call.recv(), call.recv()] == [1, 3]
            call.done_writing()
            assert list(call) == []
        up = c.client_stream("count", timeout=10)
        for i in range(3000):
            up.send({"i": i, "pad": "y" * 1000})
        assert up.done_writing() == {"count": 3000}
        # one thread sends while another reads
        call = c.bidi("sum", timeout=30)

        def writer() -> None:
            for _ in range(5000):
                call.send(1)
            call.done_writing()

        t = threading.Thread(target=writer)
        t.start()
        last = None
        for last in call:
            pass
        t.join(10)
        assert last == 5000
        # deadline: the sender blocks for credit, then the deadline ends the call
        call = c.bidi("hold", timeout=0.3)
        t0 = time.monotonic()
        n = 0
        while call.send("z" * 60000):
            n += 1
        assert 0.25 < time.monotonic() - t0 < 10 and n == 18  # 1 MiB of credit in 60 KiB items, then the wait
        with pytest.raises(udskit.UdskitError) as ei:
            next(call)
        assert ei.value.code == "deadline_exceeded"
        # cancel
        with c.bidi("waits", timeout=30) as call:
            call.send(7)
            assert call.recv() == 7
        wait_for(lambda: p.cancelled.count("waits") == 1)
        with pytest.raises(udskit.UdskitError) as ei:
            call.recv()
        assert ei.value.code == "canceled"
        assert call.send(1) is False
        with pytest.raises(udskit.UdskitError) as ei:
            c.call("sum", 1, timeout=5)
        assert ei.value.code == "unimplemented"
        assert c.call("echo", b"ok", timeout=5) == b"ok"


def test_sync_old_server(sdir: str) -> None:
    path = os.path.join(sdir, "old.sock")
    got: list[bytes] = []
    ready = threading.Event()
    t = threading.Thread(target=old_server, args=(path, got, ready))
    t.start()
    ready.wait(5)
    with udskit.Client(path) as c:
        with pytest.raises(udskit.UdskitError) as ei:
            c.bidi("sum").send(1)
        assert ei.value.code == "unimplemented" and "client_stream flag" in ei.value.message
    t.join(10)
    # our hello (client_stream, and shm on Linux: spec 10.1; the old server lacks it, so no offer follows), nothing else
    flags = 0x03 | (0x04 if udskit._shm.supported() else 0)
    assert b"".join(got) == bytes.fromhex(f"5544534b01{flags:02x}00000000000100000000")


def test_drain_lets_a_bidi_call_finish_and_cuts_one_at_the_deadline(sdir: str) -> None:
    async def main() -> None:
        p = Probe()
        srv = await serve(sdir, p)
        async with await udskit.connect(str(srv.addr)) as c:
            call = c.bidi("sum", timeout=30)
            await call.send(1)
            assert await call.recv() == 1
            stuck = c.bidi("waits", timeout=30)
            await stuck.send(1)
            assert await stuck.recv() == 1
            t0 = time.monotonic()
            down = asyncio.ensure_future(srv.shutdown(timeout=1.0))
            await asyncio.sleep(0.1)
            # goaway: the call in flight goes on, both ways
            await call.send(2)
            assert await call.recv() == 3
            await call.done_writing()
            assert [r async for r in call] == []
            # the other never ends: cut at the drain's deadline
            with pytest.raises(udskit.UdskitError) as ei:
                await stuck.recv()
            assert ei.value.code == "unavailable"
            await down
            assert 0.9 < time.monotonic() - t0 < 10
            assert p.cancelled == ["waits"]

    run(main())


def test_sync_stalled_sender_stalls_only_its_call(py_server: Callable[..., ThreadServer]) -> None:
    p = Probe()
    s = py_server(handlers(p))
    with udskit.Client(s.path) as c:
        stalled = c.bidi("slowread", timeout=60)
        sent = [0]
        item = "q" * (BIG - 18)

        def sender() -> None:
            while stalled.send(item):
                sent[0] += 1

        t = threading.Thread(target=sender)
        t.start()
        wait_for(lambda: sent[0] >= 16)
        time.sleep(0.5)
        assert sent[0] in (16, 17) and t.is_alive()  # 1 MiB of credit, then it waits
        # the connection serves others meanwhile, from this thread
        with c.bidi("sum", timeout=10) as call:
            call.send(5)
            assert call.recv() == 5
        assert c.call("echo", b"flows", timeout=5) == b"flows"
        stalled.cancel()  # the waiting sender sees the end and returns False
        t.join(10)
        assert not t.is_alive() and sent[0] in (16, 17)
    wait_for(lambda: "slowread" in p.cancelled)


def test_interceptors_see_client_stream_and_bidi_calls(sdir: str) -> None:
    """Bidi calls go through the stream interceptors and client streams through the unary ones
    (their request: the request items), registered up front or on the running server."""
    seen: list[tuple[str, str]] = []

    async def unary_ic(ctx: udskit.Context, req: Any, nxt: Any) -> Any:
        seen.append(("unary", ctx.method))
        if ctx.metadata.get("deny"):
            raise udskit.UdskitError("permission_denied", "no")
        return await nxt(ctx, req)

    async def stream_ic(ctx: udskit.Context, req: Any, nxt: Any) -> AsyncIterator[Any]:
        seen.append(("stream", ctx.method))
        async for item in nxt(ctx, req):
            yield {"wrapped": item}

    async def main() -> None:
        p = Probe()
        async with await udskit.serve(
            os.path.join(sdir, "ic.sock"), handlers(p), unary_interceptors=[unary_ic], stream_interceptors=[stream_ic]
        ) as srv, await udskit.connect(str(srv.addr)) as c:

            @srv.bidi("late")
            async def late(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
                async for x in requests:
                    yield x

            for m in ("sum", "late"):
                call = c.bidi(m, timeout=5)
                await call.send(2)
                assert await call.recv() == {"wrapped": 2}
                await call.done_writing()
                assert [r async for r in call] == []
            up = c.client_stream("total", timeout=5)
            await up.send(3)
            assert await up.done_writing() == 3
            with pytest.raises(udskit.UdskitError) as ei:
                await c.client_stream("total", timeout=5, metadata={"deny": "1"}).done_writing()
            assert ei.value.code == "permission_denied"
            assert seen == [("stream", "sum"), ("stream", "late"), ("unary", "total"), ("unary", "total")]

    run(main())


def test_client_stream_interceptors_see_bidi_and_client_stream_opens(sdir: str) -> None:
    """The async client's stream interceptors run at a bidi() or client_stream() open (as Go's
    client does): they see the kind, method, metadata and timeout, add metadata (the handler
    sees it), refuse with a code (the call is never sent), and see the responses."""
    calls: list[udskit.ClientCall] = []
    got: list[Any] = []

    def tag(call: udskit.ClientCall, nxt: Callable[[udskit.ClientCall], AsyncIterator[Any]]) -> AsyncIterator[Any]:
        calls.append(call)
        if call.metadata.get("deny") == "1":
            raise udskit.UdskitError("permission_denied", f"{call.method}: denied by a client interceptor")
        return nxt(call.replace(metadata={**call.metadata, "x-tag": call.kind}))

    async def tap(call: udskit.ClientCall, nxt: Callable[[udskit.ClientCall], AsyncIterator[Any]]) -> AsyncIterator[Any]:
        if call.metadata.get("deny") == "2":
            raise udskit.UdskitError("unauthenticated", "denied in a generator")
        async for item in nxt(call):
            got.append(item)
            yield item

    async def main() -> None:
        p = Probe()
        async with await udskit.serve(os.path.join(sdir, "cic.sock"), handlers(p)) as srv, \
                await udskit.connect(str(srv.addr), stream_interceptors=[tag, tap]) as c:

            @srv.bidi("md_bidi")
            async def md_bidi(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
                async for x in requests:
                    yield [x, ctx.metadata.get("x-tag"), ctx.deadline is not None]

            @srv.client_stream("md_total")
            async def md_total(ctx: udskit.Context, requests: udskit.Requests) -> Any:
                n = 0
                async for x in requests:
                    n += x
                return [n, ctx.metadata.get("x-tag"), ctx.deadline is not None]

            b = c.bidi("md_bidi", timeout=20)
            assert await asyncio.wait_for(b.send(1), 10)  # sent before anything is read
            await b.send(2)
            await b.done_writing()
            assert [r async for r in b] == [[1, "bidi", True], [2, "bidi", True]]
            assert got == [[1, "bidi", True], [2, "bidi", True]]
            assert (calls[0].kind, calls[0].method, calls[0].timeout, calls[0].payload) == ("bidi", "md_bidi", 20, None)
            assert calls[0].address == str(c.addr)

            t = c.client_stream("md_total", metadata={"a": "1"})
            await t.send(3)
            await t.send(4)
            assert await t.done_writing() == [7, "client_stream", False]
            assert await t.response() == [7, "client_stream", False]
            assert (calls[1].kind, dict(calls[1].metadata)) == ("client_stream", {"a": "1"})
            assert got[-1] == [7, "client_stream", False]

            for deny, code in (("1", "permission_denied"), ("2", "unauthenticated")):
                rb = c.bidi("md_bidi", metadata={"deny": deny})
                with pytest.raises(udskit.UdskitError) as ei:
                    await rb.send(1)
                assert ei.value.code == code
                with pytest.raises(udskit.UdskitError) as ei:
                    await rb.recv()
                assert ei.value.code == code
                rt = c.client_stream("md_total", metadata={"deny": deny})
                with pytest.raises(udskit.UdskitError) as ei:
                    await rt.done_writing()
                assert ei.value.code == code
            assert len(calls) == 6, "a refused call runs the chain once"

            # Without interceptors the open takes the direct path (no chain, no first-item task).
            async with await udskit.connect(str(srv.addr)) as plain:
                pb = plain.bidi("md_bidi")
                await pb.send(5)
                await pb.done_writing()
                assert [r async for r in pb] == [[5, None, False]]
                assert pb._ic_it is None and pb._ic_first is None

    run(main())


def trace_handlers() -> dict[str, Any]:
    """A bidi and a client-stream method that answer the trace id their call carried."""

    @udskit.bidi
    async def trace_bidi(ctx: udskit.Context, requests: udskit.Requests) -> AsyncIterator[Any]:
        async for _ in requests:
            yield None if ctx.trace is None else ctx.trace.trace_id

    @udskit.client_stream
    async def trace_up(ctx: udskit.Context, requests: udskit.Requests) -> Any:
        async for _ in requests:
            pass
        return None if ctx.trace is None else ctx.trace.trace_id

    return {"trace_bidi": trace_bidi, "trace_up": trace_up}


def test_trace_carried_by_stream_calls(sdir: str, py_server: Callable[..., ThreadServer]) -> None:
    """bidi() and client_stream(), async and sync, take trace= as call() does: the handler sees
    a child of it (same trace id, new span); without one, none is made up."""
    from udskit.tracecontext import new_trace

    root = new_trace()

    async def main() -> None:
        async with await udskit.serve(os.path.join(sdir, "trace.sock"), trace_handlers()) as srv:
            async with await udskit.connect(str(srv.addr)) as c:
                async with c.bidi("trace_bidi", timeout=10, trace=root) as call:
                    await call.send(1)
                    assert await call.recv() == root.trace_id
                    await call.done_writing()
                up = c.client_stream("trace_up", timeout=10, trace=root)
                await up.send(1)
                assert await up.done_writing() == root.trace_id
                async with c.bidi("trace_bidi", timeout=10) as call:
                    await call.send(1)
                    assert await call.recv() is None
                    await call.done_writing()

    run(main())
    s = py_server(trace_handlers())
    with udskit.Client(s.path) as sc:
        with sc.bidi("trace_bidi", timeout=10, trace=root) as scall:
            scall.send(1)
            assert scall.recv() == root.trace_id
            scall.done_writing()
        sup = sc.client_stream("trace_up", timeout=10, trace=root)
        sup.send(1)
        assert sup.done_writing() == root.trace_id
