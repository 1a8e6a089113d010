"""What one NDJSON read may cost the Python server, and what a client's EOF may cut.

Lines count as frames: ITER_FRAMES per event-loop iteration over all connections, their
calls as framed calls (ITER_CALLS per iteration, the server's total), and none past
max_in_flight calls running (_ndjson_srv.py). Every request read before the
client's EOF is answered, for NDJSON lines and udskit frames alike. Every client here
is a raw socket."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import pytest

import udskit
from udskit import _framed, _ndjson_srv, _wire

from test_hardening import PerIteration, raw_echo, run


def lines(n: int, func: str = "echo", data: bytes = b"1") -> bytes:
    return b"".join(b'{"id":%d,"func":"%s","data":%s}\n' % (i + 1, func.encode(), data) for i in range(n))


async def send_eof_and_read_all(path: str, data: bytes) -> bytes:
    """Sends data, shuts down the sending side, reads until the server closes."""
    loop = asyncio.get_running_loop()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)

    def io() -> bytes:
        s.settimeout(20)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = bytearray()
        while True:
            b = s.recv(1 << 20)
            if not b:
                return bytes(got)
            got += b

    try:
        return await loop.run_in_executor(None, io)
    finally:
        s.close()


def test_one_loop_iteration_takes_a_bounded_number_of_ndjson_lines(sdir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 short lines written at once: a 256 KiB read holds 9,000 of them, all
    parsed and answered in that one callback while every other connection waited (the
    framed path has taken ITER_FRAMES per iteration since issue 25); now at most
    ITER_FRAMES lines per iteration, and every line is answered, in order."""
    taken = [0]
    real = _ndjson_srv.NDJSONSession._line

    def counting(self: _ndjson_srv.NDJSONSession, line: bytes) -> None:
        taken[0] += 1
        real(self, line)

    monkeypatch.setattr(_ndjson_srv.NDJSONSession, "_line", counting)

    async def main() -> None:
        path = os.path.join(sdir, "lines.sock")
        srv = await udskit.serve(path, {"echo": raw_echo})
        per = PerIteration(taken)
        try:
            r, w = await asyncio.open_unix_connection(path, limit=1 << 26)
            n = 20_000
            per.start()
            w.write(lines(n))
            got = []
            for _ in range(n):
                got.append(await asyncio.wait_for(r.readline(), 20))
            per.stop()
            assert got == [b'{"id":%d,"data":1}\n' % (i + 1) for i in range(n)]
            assert taken[0] == n
            assert per.most <= _framed.ITER_FRAMES, f"{per.most} lines taken in one loop iteration (bound {_framed.ITER_FRAMES})"
            w.close()
        finally:
            await srv.close()

    run(main())


def test_ndjson_lines_past_max_in_flight_wait_for_a_call_to_end(sdir: str) -> None:
    """max_in_flight 8 and 200 lines of a handler that sleeps, in one write: the lines of
    one read all started calls (200 in flight; pausing the socket stops only the next
    read). Now at most 8 run at once, and all 200 are answered (Go: the reader waits
    for a slot)."""
    running = [0, 0]  # now, most

    async def slow(ctx: udskit.Context, req: Any) -> Any:
        running[0] += 1
        running[1] = max(running[1], running[0])
        try:
            await asyncio.sleep(0.005)
        finally:
            running[0] -= 1
        return req

    async def main() -> None:
        path = os.path.join(sdir, "inflight.sock")
        srv = await udskit.serve(path, {"slow": slow}, max_in_flight=8)
        try:
            r, w = await asyncio.open_unix_connection(path, limit=1 << 26)
            n = 200
            w.write(lines(n, "slow"))
            ids = set()
            for _ in range(n):
                line = await asyncio.wait_for(r.readline(), 20)
                assert line.endswith(b',"data":1}\n'), line
                ids.add(line)
            assert len(ids) == n
            assert running[1] <= 8, f"{running[1]} calls ran at once on a connection with max_in_flight 8"
            w.close()
        finally:
            await srv.close()

    run(main())


@pytest.mark.parametrize("kind", ["framed", "ndjson"])
def test_every_request_sent_before_eof_is_answered(sdir: str, kind: str) -> None:
    """A client sends 20,000 requests (a plain-function handler) and shuts down its
    sending side: the server answers them all, then closes. The requests held for the
    next loop iteration (ITER_FRAMES) were dropped at the EOF: 8,192 answers."""

    async def main() -> None:
        path = os.path.join(sdir, "eof.sock")
        srv = await udskit.serve(path, {"echo": raw_echo})
        n = 20_000
        try:
            if kind == "framed":
                head = _wire.method_head("echo")
                data = _wire.Hello().encode() + b"".join(_wire.frame(_wire.T_REQUEST, 0, i + 1, 0, head, b"%d" % i) for i in range(n))
                got = await send_eof_and_read_all(path, data)
                ids = []
                off = 16  # (the server's hello)
                while off + 16 <= len(got):
                    t, _flags, hl, id, pl, _aux = _wire.HEADER.unpack_from(got, off)
                    assert t == _wire.T_RESPONSE and got[off + 16 + hl : off + 16 + hl + pl] == b"%d" % (id - 1), (t, id)
                    ids.append(id)
                    off += 16 + hl + pl
                assert off == len(got)
                assert sorted(ids) == list(range(1, n + 1)), f"{len(ids)} answers to {n} requests"
            else:
                got = await send_eof_and_read_all(path, lines(n))
                answers = got.splitlines(keepends=True)
                assert answers == [b'{"id":%d,"data":1}\n' % (i + 1) for i in range(n)], f"{len(answers)} answers to {n} lines"
        finally:
            await srv.close()

    run(main())


def test_ndjson_lines_of_one_read_wait_for_the_server_total_and_iter_calls(sdir: str) -> None:
    """3,000 lines in one write to a handler that blocks until released, with room for
    about 1,000 calls (3 KiB each) in the server's total: the calls started stay within
    it (checked every BUDGET_CHECK_EVERY calls, as frames), at most ITER_CALLS start per
    loop iteration, the rest wait unparsed in the buffer, and all 3,000 are answered
    once released, in order of start."""
    started: list[int] = []
    release: list[asyncio.Future[None]] = []
    per = PerIteration([0])

    async def block(ctx: udskit.Context, req: Any) -> Any:
        started.append(req)
        per.counter[0] += 1
        if not release[0].done():
            await release[0]
        return req

    async def main() -> None:
        path = os.path.join(sdir, "total.sock")
        release.append(asyncio.get_running_loop().create_future())
        srv = await udskit.serve(path, {"block": block}, max_server_bytes=3 << 20)
        try:
            r, w = await asyncio.open_unix_connection(path, limit=1 << 26)
            n = 3000
            per.start()
            w.write(b"".join(b'{"id":%d,"func":"block","data":%d}\n' % (i + 1, i + 1) for i in range(n)))
            for _ in range(400):
                if len(started) >= 900:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            held = len(started)
            per.stop()
            assert held <= 1024 + _framed.BUDGET_CHECK_EVERY, f"{held} calls started with room for about 1,000 in the server's total"
            assert per.most <= _framed.ITER_CALLS, f"{per.most} calls started in one loop iteration (bound {_framed.ITER_CALLS})"
            release[0].set_result(None)
            got = []
            for _ in range(n):
                got.append(await asyncio.wait_for(r.readline(), 20))
            assert sorted(got) == sorted(b'{"id":%d,"data":%d}\n' % (i + 1, i + 1) for i in range(n))
            assert started == list(range(1, n + 1)), "calls started in the order of their lines"
            w.close()
        finally:
            await srv.close()

    run(main())
