"""The Python server with Python clients: policy, drain, limits, credit, socket hygiene."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import time
from typing import Any, AsyncIterator

import pytest

import udskit
from udskit import _wire
from udskit._listen import listen
from udskit._addr import parse_addr


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_context_metadata_policy_callable(sdir: str) -> None:
    seen: list[udskit.PeerCred] = []

    def policy(cred: udskit.PeerCred) -> bool:
        seen.append(cred)
        return cred.pid == os.getpid()

    async def md(ctx: udskit.Context, req: Any) -> Any:
        ctx.response_metadata["served-by"] = "py"
        assert ctx.peer is not None
        return {"md": ctx.metadata, "uid": ctx.peer.uid, "left": ctx.time_remaining() is not None}

    async def main() -> None:
        async with await udskit.serve(os.path.join(sdir, "a.sock"), {"md": md}, policy=policy) as srv:
            async with await udskit.connect(str(srv.addr)) as c:
                out = await c.call("md", None, metadata={"trace": "t1"}, timeout=5)
                assert out == {"md": {"trace": "t1"}, "uid": os.getuid(), "left": True}
            assert seen and seen[0].pid == os.getpid()

    run(main())


def test_policy_on_tcp_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(udskit.ListenError) as ei:
            await udskit.serve("tcp:127.0.0.1:0", {}, policy=udskit.allow_same_user())
        assert ei.value.reason == "policy_on_tcp"
        async with await udskit.serve("tcp:127.0.0.1:0", {"whoami": udskit.demo.whoami}) as srv:
            async with await udskit.connect(str(srv.addr)) as c:
                with pytest.raises(udskit.UdskitError) as e2:
                    await c.call("whoami")
                assert e2.value.code == "failed_precondition"

    run(main())


def test_abstract_address() -> None:
    name = f"@udskit-py-test-{os.getpid()}"

    async def main() -> None:
        async with await udskit.serve(name, udskit.demo.handlers()):
            async with await udskit.connect(name) as c:
                assert await c.call("echo", [1]) == [1]
            with pytest.raises(udskit.ListenError) as ei:
                await udskit.serve(name, {})
            assert ei.value.reason == "in_use" and ei.value.pid == os.getpid()

    run(main())


def test_graceful_drain(sdir: str) -> None:
    """shutdown: goaway; calls in flight are answered; calls sent after it are
    refused unprocessed and the client resends them (here to a new server)."""

    async def main() -> None:
        path = os.path.join(sdir, "d.sock")
        srv = await udskit.serve(path, udskit.demo.handlers())
        c = await udskit.connect(path, max_backoff=0.05)
        slow = [asyncio.ensure_future(c.call("sleep", {"ms": 300}, timeout=5)) for _ in range(3)]
        await asyncio.sleep(0.1)
        drain = asyncio.ensure_future(srv.shutdown(grace=5))
        await asyncio.sleep(0.05)
        assert not os.path.exists(path)  # no new connections
        srv2 = await udskit.serve(path, udskit.demo.handlers())  # a successor takes the path
        assert await c.call("echo", "after", timeout=5) == "after"  # goes to the new server
        assert await asyncio.gather(*slow) == [{"slept_ms": 300}] * 3
        await asyncio.wait_for(drain, 5)
        assert srv.connections == 0
        await c.aclose()
        await srv2.shutdown()

    run(main())


def test_refused_request_is_resent(sdir: str) -> None:
    """A request that crosses the goaway is refused (flag) and the client resends it."""

    async def main() -> None:
        path = os.path.join(sdir, "r.sock")
        srv = await udskit.serve(path, udskit.demo.handlers())
        c = await udskit.connect(path)
        assert c._conn is not None
        conn = c._conn
        # make the server drain, but keep our client from seeing the goaway before it sends
        for sc in list(srv._conns):
            sc.draining = True
        srv2_path = path  # the path stays: the old listener still owns it
        fut = asyncio.ensure_future(c.call("echo", "x", timeout=3))
        await asyncio.sleep(0.1)
        # the refused call was resent on a new connection to the same (still listening) server,
        # which served it on the fresh connection
        assert await fut == "x"
        assert conn is not c._conn and c._conn is not None
        await c.aclose()
        await srv.shutdown()
        assert srv2_path

    run(main())


def test_in_flight_limit_and_client_respects_it(sdir: str) -> None:
    async def main() -> None:
        path = os.path.join(sdir, "l.sock")
        async with await udskit.serve(path, udskit.demo.handlers(), max_in_flight=4):
            c = await udskit.connect(path)
            outs = await asyncio.gather(*[c.call("sleep", {"ms": 20}, timeout=10) for _ in range(40)])
            assert len(outs) == 40  # the client queued past the server's 4
            await c.aclose()
            # a raw client that ignores the limit loses its connection
            r, w = await asyncio.open_unix_connection(path)
            w.write(_wire.Hello().encode())
            head = _wire.method_head("sleep")
            body = b'{"ms":500}'
            for i in range(1, 6):
                w.write(_wire.frame(1, 0, i, 0, head, body))
            data = await asyncio.wait_for(r.read(), 5)
            f, _ = _wire.decode_frame(data[16:], 1 << 24)
            assert (f.type, f.id, f.aux) == (3, 0, 8) and b"in flight" in f.head
            w.close()

    run(main())


def test_server_applies_stream_credit(sdir: str) -> None:
    """A client that grants nothing receives the initial 1 MiB (plus one item), then nothing."""

    async def many(ctx: udskit.Context, req: Any) -> AsyncIterator[bytes]:
        for _ in range(10000):
            yield b"x" * 1000

    async def main() -> None:
        path = os.path.join(sdir, "c.sock")
        async with await udskit.serve(path, {"many": udskit.raw(many)}):
            r, w = await asyncio.open_unix_connection(path)
            w.write(_wire.Hello().encode())
            w.write(_wire.frame(1, 1, 7, 0, _wire.method_head("many"), b""))
            got = b""
            try:
                while True:
                    got += await asyncio.wait_for(r.read(1 << 20), 0.5)
            except asyncio.TimeoutError:
                pass
            items = (len(got) - 16) // 1016
            assert items * 1016 == len(got) - 16
            assert items == -(-(1 << 20) // 1016)  # sends while credit > 0
            w.write(_wire.frame(10, 0, 7, 100 * 1016))  # 100 more
            await asyncio.sleep(0.3)
            more = await asyncio.wait_for(r.read(1 << 20), 1)
            assert len(more) // 1016 in (100, 101)
            w.write(_wire.frame(4, 0, 7, 1))  # cancel
            w.close()

    run(main())


def test_handler_errors(sdir: str) -> None:
    async def boom(ctx: udskit.Context, req: Any) -> Any:
        raise KeyError("k")

    async def bad_raw(ctx: udskit.Context, req: bytes) -> Any:
        return "not bytes"

    def coded(ctx: udskit.Context, req: Any) -> Any:
        raise udskit.UdskitError("already_exists", "dup", details=b'{"id":1}')

    # plain (inline) handlers whose result cannot be sent answer with an error too,
    # over udskit and NDJSON alike, and the connection stays up
    def bad_raw_sync(ctx: udskit.Context, req: bytes) -> Any:
        return "not bytes"

    def not_json(ctx: udskit.Context, req: Any) -> Any:
        return {1, 2}

    handlers = {"boom": boom, "bad_raw": udskit.raw(bad_raw), "coded": coded, "bad_raw_sync": udskit.raw(bad_raw_sync), "not_json": not_json}

    async def main() -> None:
        path = os.path.join(sdir, "e.sock")
        async with await udskit.serve(path, handlers):
            r, w = await asyncio.open_unix_connection(path)
            w.write(b'{"id":1,"func":"not_json"}\n{"id":2,"func":"bad_raw_sync"}\n')
            assert await r.readline() == b'{"id":1,"error":"TypeError: Object of type set is not JSON serializable","code":"unknown"}\n'
            assert await r.readline() == b'{"id":2,"error":"raw handler bad_raw_sync returned str, not bytes","code":"internal"}\n'
            w.close()
            async with await udskit.connect(path) as c:
                for m in ("bad_raw_sync", "not_json", "bad_raw_sync"):
                    with pytest.raises(udskit.UdskitError) as ei:
                        await c.call(m, b"" if m.startswith("bad") else None)
                    assert ei.value.code == ("internal" if m.startswith("bad") else "unknown"), ei.value
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("boom")
                assert ei.value.code == "unknown" and "KeyError" in ei.value.message
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("bad_raw", b"")
                assert ei.value.code == "internal"
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("coded")
                assert (ei.value.code, ei.value.message, ei.value.details) == ("already_exists", "dup", b'{"id":1}')
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("boom", b"not json")
                assert ei.value.code == "invalid_argument"

    run(main())


def test_socket_hygiene(sdir: str) -> None:
    path = os.path.join(sdir, "sub", "h.sock")
    # missing parent dirs are created 0700, the socket is 0600 whatever the umask
    old = os.umask(0)
    try:
        l1 = listen(parse_addr(path))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    # a live server at the path: in_use with our pid
    with pytest.raises(udskit.ListenError) as ei:
        listen(parse_addr(path))
    assert ei.value.reason == "in_use" and ei.value.pid == os.getpid()
    # a stale socket (nobody listens) is replaced
    l1.sock.close()
    l2 = listen(parse_addr(path))
    # close removes only our own file: another server's socket at the path stays
    os.unlink(path)
    other = socket.socket(socket.AF_UNIX)
    other.bind(path)
    l2.close()
    assert os.path.exists(path)
    other.close()
    os.unlink(path)
    # never removes what is not a socket
    with open(path, "w") as f:
        f.write("precious")
    with pytest.raises(udskit.ListenError) as ei:
        listen(parse_addr(path))
    assert ei.value.reason == "not_socket" and open(path).read() == "precious"
    os.unlink(path)
    os.symlink("/etc/passwd", path)
    with pytest.raises(udskit.ListenError) as ei:
        listen(parse_addr(path))
    assert ei.value.reason == "not_socket" and "symlink" in str(ei.value)
    os.unlink(path)
    # mode asked is exact; too long a path fails before any syscall
    l3 = listen(parse_addr(path), mode=0o660)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o660
    l3.close()
    assert not os.path.exists(path) and not os.path.exists(path + ".lock")
    with pytest.raises(udskit.ListenError) as ei:
        listen(parse_addr("/tmp/" + "x" * 120 + ".sock"))
    assert ei.value.reason == "path_too_long"


def test_fchmod_before_bind_has_no_window(sdir: str) -> None:
    """Linux creates the socket file with the mode fchmod set on the socket (less the umask)."""
    path = os.path.join(sdir, "w.sock")
    s = socket.socket(socket.AF_UNIX)
    old = os.umask(0)
    try:
        os.fchmod(s.fileno(), 0o600)
        s.bind(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600  # without fchmod it would be 0777
    s.close()


def test_sync_client_reconnects_after_restart(sdir: str) -> None:
    from conftest import ThreadServer

    path = os.path.join(sdir, "s.sock")
    s = ThreadServer(path)
    c = udskit.Client(path, max_backoff=0.05)
    try:
        assert c.call("echo", 1) == 1
        s.stop()
        t0 = time.monotonic()
        with pytest.raises(udskit.UdskitError) as ei:
            c.call("echo", 2, timeout=0.3)
        assert ei.value.code in ("deadline_exceeded", "unavailable") and time.monotonic() - t0 < 1.5
        s = ThreadServer(path)
        assert c.call("echo", 3, timeout=5) == 3
    finally:
        c.close()
        s.stop()


def test_client_does_not_buffer_without_bound(sdir: str) -> None:
    """A server that never reads: the client's write buffer stays under one frame past the mark."""
    path = os.path.join(sdir, "nr.sock")
    lsock = socket.socket(socket.AF_UNIX)
    lsock.bind(path)
    lsock.listen(1)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        accepted: list[socket.socket] = []

        def accept() -> None:
            conn, _ = lsock.accept()
            conn.recv(16)
            conn.sendall(_wire.Hello(max_in_flight=4096).encode())  # then never reads again
            accepted.append(conn)

        fut = loop.run_in_executor(None, accept)
        c = await udskit.connect(path)
        await fut
        assert c._conn is not None and c._conn.transport is not None
        tr = c._conn.transport
        big = b"x" * (1 << 20)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            for _ in range(60):
                peak = max(peak, tr.get_write_buffer_size())
                await asyncio.sleep(0.01)

        calls = [c.call("echo", big, timeout=0.5) for _ in range(30)]
        res = await asyncio.gather(watch(), *calls, return_exceptions=True)
        assert all(isinstance(r, udskit.UdskitError) and r.code == "deadline_exceeded" for r in res[1:]), res[1:]
        assert 0 < peak < (1 << 20) + (64 << 10) + 64, peak  # not 30 MiB
        await c.aclose()
        for s in accepted:
            s.close()

    try:
        run(main())
    finally:
        lsock.close()


def test_client_against_hostile_server(sdir: str) -> None:
    """A server sending a frame over the limit: the client's calls fail with the
    protocol error named, at once, and nothing of the frame is buffered."""
    path = os.path.join(sdir, "hs.sock")

    async def main() -> None:
        async def hostile(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readexactly(16)
            w.write(_wire.Hello(max_in_flight=16).encode())
            await r.readexactly(16 + 6 + 1)  # the request: header, head "echo", payload "1"
            w.write(bytes.fromhex("0200000001000000ffffffff00000000"))  # a 4 GiB response
            await w.drain()
            await asyncio.sleep(1)
            w.close()

        srv = await asyncio.start_unix_server(hostile, path)
        c = await udskit.connect(path, reconnect=False)
        t0 = time.monotonic()
        with pytest.raises(udskit.UdskitError) as ei:
            await c.call("echo", 1, timeout=5)
        assert ei.value.code == "protocol_violation" and "frame_too_large" in ei.value.message
        assert time.monotonic() - t0 < 0.9
        await c.aclose()
        srv.close()

    run(main())


def test_hellos_in_pieces(sdir: str) -> None:
    """A hello may arrive in pieces (the socket is a byte stream): the server and
    both clients wait for all 16 bytes instead of failing with truncated."""
    path = os.path.join(sdir, "hp.sock")
    peer = os.path.join(sdir, "peer.sock")

    async def echo(ctx: udskit.Context, req: Any) -> Any:
        return req

    async def piecewise(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readexactly(16)
        h = _wire.Hello().encode()
        for a, b in ((0, 3), (3, 9), (9, 16)):
            w.write(h[a:b])
            await w.drain()
            await asyncio.sleep(0.02)
        _, _, hl, id, pl, _ = _wire.HEADER.unpack(await r.readexactly(16))
        await r.readexactly(hl + pl)
        w.write(_wire.frame(_wire.T_RESPONSE, 0, id, 0, b"", b'"ok"'))
        await w.drain()
        await r.read()
        w.close()

    async def main() -> None:
        async with await udskit.serve(path, {"echo": echo}):
            r, w = await asyncio.open_unix_connection(path)
            for i in range(16):
                w.write(_wire.Hello().encode()[i : i + 1])
                await w.drain()
                await asyncio.sleep(0.005)
            w.write(_wire.frame(_wire.T_REQUEST, 0, 1, 0, _wire.request_head("echo", None), b"[1]"))
            await r.readexactly(16)  # the server's hello
            f, _ = _wire.decode_frame(await r.readexactly(16 + 3), 1 << 20)
            assert (f.type, f.id, f.payload) == (_wire.T_RESPONSE, 1, b"[1]")
            w.close()
        srv = await asyncio.start_unix_server(piecewise, peer)
        async with await udskit.connect(peer) as c:
            assert await c.call("x", timeout=5) == "ok"
        sc = await asyncio.to_thread(udskit.Client, peer)
        assert await asyncio.to_thread(sc.call, "x", None, timeout=5) == "ok"
        sc.close()
        srv.close()

    run(main())


# --- reserved metadata keys (spec 3.1) ----------------------------------------------


def _check_reserved_error(e: udskit.UdskitError, code: str, key: str) -> None:
    assert e.code == code, e
    assert repr(key) in e.message and "keys starting with ':' are reserved for the protocol" in e.message, e


async def _recording_peer(path: str, got: list[tuple[int, int, bytes]]) -> asyncio.AbstractServer:
    """A hand-written udskit server that records every frame (type, flags, head) a
    client sends; it answers unary requests with "ok" and stream requests with a
    stream end whose head carries ':pad' and an unknown reserved key."""

    async def conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readexactly(16)
        w.write(_wire.Hello(max_in_flight=16).encode())
        try:
            while True:
                t, flags, hl, id, pl, _ = _wire.HEADER.unpack(await r.readexactly(16))
                head = await r.readexactly(hl)
                await r.readexactly(pl)
                got.append((t, flags, head))
                if t == _wire.T_REQUEST and flags & _wire.FLAG_STREAM:
                    trailer = _wire.encode_entries([("k", "v"), (":future", "1"), (":pad", "\0" * 8)])
                    w.write(_wire.frame(_wire.T_STREAM_END, 0, id, 0, trailer))
                elif t == _wire.T_REQUEST:
                    w.write(_wire.frame(_wire.T_RESPONSE, 0, id, 0, b"", b'"ok"'))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        w.close()

    return await asyncio.start_unix_server(conn, path)


def test_reserved_metadata_refused_before_sending(sdir: str) -> None:
    """Application metadata with a key starting with ':' fails with invalid_argument
    and nothing is written: the server sees only the calls made without one (async
    and sync clients, calls and streams)."""
    path = os.path.join(sdir, "rec.sock")
    got: list[tuple[int, int, bytes]] = []

    async def main() -> None:
        srv = await _recording_peer(path, got)
        async with await udskit.connect(path, timeout=5) as c:
            for md, key in (({":x": "1"}, ":x"), ({"ok": "1", ":pad": ""}, ":pad")):
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("m", None, metadata=md, timeout=5)
                _check_reserved_error(ei.value, "invalid_argument", key)
            with pytest.raises(udskit.UdskitError) as ei:
                async for _ in c.stream("s", None, metadata={":x": "1"}):
                    pass
            _check_reserved_error(ei.value, "invalid_argument", ":x")
            assert await c.call("m", None, metadata={"trace": "a"}, timeout=5) == "ok"
        sc = await asyncio.to_thread(udskit.Client, path)
        try:
            with pytest.raises(udskit.UdskitError) as ei:
                await asyncio.to_thread(lambda: sc.call("m", None, metadata={":x": "1"}, timeout=5))
            _check_reserved_error(ei.value, "invalid_argument", ":x")
            with pytest.raises(udskit.UdskitError) as ei:
                await asyncio.to_thread(lambda: list(sc.stream("s", None, metadata={":x": "1"})))
            _check_reserved_error(ei.value, "invalid_argument", ":x")
            assert await asyncio.to_thread(lambda: sc.call("m", None, metadata={"trace": "b"}, timeout=5)) == "ok"
        finally:
            sc.close()
        srv.close()
        await srv.wait_closed()

    run(main())
    requests = [_wire.parse_request_head(head) for t, _, head in got if t == _wire.T_REQUEST]
    assert requests == [("m", [("trace", "a")]), ("m", [("trace", "b")])]


def test_reserved_keys_hidden_from_client_trailer(sdir: str) -> None:
    """A stream end whose head carries ':pad' and an unknown ':future': both clients'
    trailer holds only the application's keys."""
    path = os.path.join(sdir, "rec.sock")
    got: list[tuple[int, int, bytes]] = []

    async def main() -> None:
        srv = await _recording_peer(path, got)
        async with await udskit.connect(path, timeout=5) as c:
            s = c.stream("s", None, timeout=5)
            assert [x async for x in s] == []
            assert s.trailer == {"k": "v"}
        sc = await asyncio.to_thread(udskit.Client, path)
        try:
            ss = sc.stream("s", None, timeout=5)
            assert await asyncio.to_thread(lambda: list(ss)) == []
            assert ss.trailer == {"k": "v"}
        finally:
            sc.close()
        srv.close()
        await srv.wait_closed()

    run(main())
    # the peer did send the reserved keys
    assert sum(1 for t, flags, _ in got if t == _wire.T_REQUEST and flags & _wire.FLAG_STREAM) == 2


def test_handler_reserved_response_metadata_is_internal(sdir: str) -> None:
    """A handler whose answer carries a key starting with ':' (response or stream
    end; async, plain and streaming handlers) gets its call answered with an
    internal error naming the key; the connection stays up (also after a plain
    handler's metadata over the head limit, which used to close it)."""

    async def unary(ctx: udskit.Context, req: Any) -> Any:
        ctx.response_metadata[":x"] = "1"
        return "unary"

    def plain(ctx: udskit.Context, req: Any) -> Any:
        ctx.response_metadata.update({"ok": "1", ":pad": ""})
        return "plain"

    async def stream(ctx: udskit.Context, req: Any) -> AsyncIterator[Any]:
        yield 1
        ctx.response_metadata[":x"] = "1"

    async def stream_ok(ctx: udskit.Context, req: Any) -> AsyncIterator[Any]:
        yield 1
        ctx.response_metadata["k"] = "v"

    def too_big(ctx: udskit.Context, req: Any) -> Any:
        ctx.response_metadata["k"] = "x" * _wire.MAX_HEAD
        return "too_big"

    async def echo(ctx: udskit.Context, req: Any) -> Any:
        return req

    handlers = {"unary": unary, "plain": plain, "stream": stream, "stream_ok": stream_ok, "too_big": too_big, "echo": echo}

    async def main() -> None:
        async with await udskit.serve(os.path.join(sdir, "rk.sock"), handlers):
            async with await udskit.connect(os.path.join(sdir, "rk.sock"), timeout=5) as c:
                for m, key in (("unary", ":x"), ("plain", ":pad")):
                    with pytest.raises(udskit.UdskitError) as ei:
                        await c.call(m, None, timeout=5)
                    _check_reserved_error(ei.value, "internal", key)
                    assert f"handler {m} " in ei.value.message
                items: list[Any] = []
                with pytest.raises(udskit.UdskitError) as ei:
                    async for x in c.stream("stream", None, timeout=5):
                        items.append(x)
                assert items == [1]
                _check_reserved_error(ei.value, "internal", ":x")
                s = c.stream("stream_ok", None, timeout=5)
                assert [x async for x in s] == [1] and s.trailer == {"k": "v"}
                # metadata over the head limit from a plain handler: answered as other handler errors
                with pytest.raises(udskit.UdskitError) as ei:
                    await c.call("too_big", None, timeout=5)
                assert ei.value.code == "unknown" and "head limit" in ei.value.message, ei.value
                assert await c.call("echo", [1], timeout=5) == [1]

    run(main())


def test_pad_on_the_wire_is_hidden_from_handler(sdir: str) -> None:
    """A request whose head carries ':pad' (last, aligning the payload to byte 64, as
    the Go client pads) and an unknown reserved key: the handler's ctx.metadata has
    neither."""

    @udskit.raw
    async def md(ctx: udskit.Context, req: bytes) -> bytes:
        return json.dumps({"md": ctx.metadata, "req": req.decode()}).encode()

    async def main() -> None:
        path = os.path.join(sdir, "pad.sock")
        async with await udskit.serve(path, {"md": md}):
            r, w = await asyncio.open_unix_connection(path)
            w.write(_wire.Hello().encode())
            await r.readexactly(16)
            entries = [("trace", "t1"), (":future", "1")]
            head = _wire.method_head("md") + _wire.encode_entries(entries)
            pad = 64 - 16 - len(head)  # header + head end on byte 64
            head += _wire.encode_entries([(":pad", "\0" * (pad - 8))])
            assert 16 + len(head) == 64 and head.endswith(bytes.fromhex("04003a706164") + (pad - 8).to_bytes(2, "little") + bytes(pad - 8))
            w.write(_wire.frame(_wire.T_REQUEST, 0, 7, 0, head, b"aligned"))
            t, _, hl, id, pl, _ = _wire.HEADER.unpack(await r.readexactly(16))
            body = (await r.readexactly(hl + pl))[hl:]
            assert (t, id) == (_wire.T_RESPONSE, 7), body
            assert json.loads(body) == {"md": {"trace": "t1"}, "req": "aligned"}
            w.close()

    run(main())
