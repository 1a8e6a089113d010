"""Shared memory (protocol/spec.md section 10) with the blocking client,
udskit.Client: the same negotiation and data path as the asyncio client
(udskit._shm), against the Go server and hostile servers."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import pytest

import udskit
from udskit import _shm
from conftest import GoServer
from test_shm import HOSTILE, SIZES, Hostile, _held, _memfd_fds, _memfd_maps, hostile_path  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not _shm.supported(), reason="shared memory needs Linux memfd")


def _session(c: udskit.Client) -> _shm.ShmSession:
    conn = c._conn
    assert conn is not None and conn.shm is not None, "the Go server did not accept the region"
    return conn.shm


def _eventually(ok: Any, what: str) -> None:
    for _ in range(500):
        if ok():
            return
        time.sleep(0.01)
    raise AssertionError("timed out waiting: " + what)


def test_sync_echo_through_the_region(go_server: GoServer) -> None:
    with udskit.Client(go_server.path, timeout=5) as c:
        shm = _session(c)
        assert _memfd_fds() == 1 and _memfd_maps() >= 1  # our fd closed after the offer; mmap keeps one dup
        big = 0
        for n in SIZES:
            body = os.urandom(n)
            sent, got = shm.sent, shm.received
            assert c.call("echo", body, timeout=10) == body, n
            used = n >= shm.threshold
            big += used
            assert (shm.sent - sent, shm.received - got) == ((1, 1) if used else (0, 0)), n
        # 16 threads at once on one connection, every response checked
        bodies = [os.urandom(256 << 10) for _ in range(16)]
        outs: list[Any] = [None] * 16

        def one(i: int) -> None:
            outs[i] = c.call("echo", bodies[i], timeout=20)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert outs == bodies
        # the server's view (udskit.stats): this connection's region, every request through it
        st = c.call("udskit.stats", timeout=5)
        assert st["shm"]["conns"] == 1 and st["shm"]["received"] == big + 16 and st["shm"]["sent"] == big + 16, st
        # a server stream's items come through the region too
        items = list(c.stream("stream", {"n": 3, "pad": "p" * (20 << 10)}, timeout=10))
        assert len(items) == 3
        _eventually(lambda: shm.in_use() == 0, "every request slot released by the server")
    assert _memfd_maps() == 0 and _memfd_fds() == 0


def test_sync_shm_off(go_server: GoServer) -> None:
    with udskit.Client(go_server.path, timeout=5, shm=False) as c:
        assert c._conn is not None and c._conn.shm is None
        assert c.call("echo", b"a" * (1 << 20)) == b"a" * (1 << 20)
        st = c.call("udskit.stats", timeout=5)
        assert st["shm"]["conns"] == 0 and st["shm"]["received"] == 0, st
    with udskit.Client(go_server.path, timeout=5) as c:
        pad = {"pad": "p" * (100 << 10), "n": [1, 2]}
        assert c.call("echo", pad) == pad  # JSON payloads take the region too
        assert _session(c).sent == 1


def test_sync_back_pressure_waits_within_deadline(go_server: GoServer) -> None:
    # the smallest region: 64 KiB per half; 12 threads' 40 KiB requests cannot all fit
    with udskit.Client(go_server.path, timeout=5, shm_size=_shm.MIN_REGION) as c:
        shm = _session(c)
        outs: list[Any] = [None] * 12
        errs: list[BaseException] = []

        def one(i: int) -> None:
            try:
                outs[i] = c.call("sleep", json.dumps({"ms": 50, "pad": str(i % 10) * (40 << 10)}).encode(), timeout=20)
            except BaseException as e:
                errs.append(e)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert not errs, errs
        assert all(json.loads(o) == {"slept_ms": 50} for o in outs)
        assert shm.waits > 0
        _eventually(lambda: shm.in_use() == 0, "every slot released")


def test_sync_full_region_waits_then_deadline(hostile_path: str) -> None:
    """A server that never releases: the next call that needs the space waits
    within its deadline and fails with deadline_exceeded, sending nothing."""
    more: list[bytes] = []

    def keep(s: Any, id: int, d: bytes) -> None:
        s.sendall(_shm._HEADER.pack(2, 0, 0, id, 2, 0) + b"ok")  # answered inline; the slot is never released
        s.settimeout(1.0)
        try:
            more.append(s.recv(1 << 16))
        except OSError:
            pass

    h = Hostile(hostile_path, keep)
    try:
        with udskit.Client(hostile_path, timeout=5, reconnect=False, shm_size=_shm.MIN_REGION) as c:
            shm = _session(c)
            assert c.call("echo", b"a" * (40 << 10), timeout=5) == b"ok"
            assert shm.in_use() == 40 << 10
            t0 = time.monotonic()
            with pytest.raises(udskit.UdskitError) as ei:
                c.call("echo", b"b" * (40 << 10), timeout=0.3)
            assert ei.value.code == "deadline_exceeded"
            assert 0.25 < time.monotonic() - t0 < 1.5
            assert shm.waits == 1
            time.sleep(0.8)  # the server listens for 1 s after its answer
    finally:
        h.close()
    assert h.error is None, h.error
    assert more in ([], [b""]), "the call that timed out sent nothing"


@pytest.mark.parametrize("name", list(HOSTILE))
def test_sync_hostile_server_fails_only_the_connection(hostile_path: str, name: str) -> None:
    h = Hostile(hostile_path, HOSTILE[name])
    try:
        c = udskit.Client(hostile_path, timeout=5, reconnect=False)
        _session(c)
        with pytest.raises(udskit.UdskitError) as ei:
            if name == "overlapping slots":
                for _ in c.stream("stream", b"s" * (32 << 10), timeout=5):
                    pass
            else:
                c.call("echo", b"q" * (32 << 10), timeout=5)
        assert ei.value.code in ("protocol_violation", "unavailable"), ei.value
        assert c._conn is None or c._conn.closed
        c.close()
        assert _memfd_maps() == 0
    finally:
        h.close()
    assert h.error is None, h.error


def test_sync_server_killed_mid_call(go_server: GoServer) -> None:
    c = udskit.Client(go_server.path, timeout=5, reconnect=False)
    _session(c)
    errs: list[udskit.UdskitError] = []

    def one() -> None:
        try:
            c.call("sleep", json.dumps({"ms": 5000, "pad": "k" * (64 << 10)}).encode(), timeout=30)
        except udskit.UdskitError as e:
            errs.append(e)

    ts = [threading.Thread(target=one) for _ in range(4)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    go_server.kill(signal.SIGKILL)
    for t in ts:
        t.join(10)
    assert time.monotonic() - t0 < 3
    assert [e.code for e in errs] == ["unavailable"] * 4, errs
    c.close()
    assert _memfd_maps() == 0 and _memfd_fds() == 0


def test_sync_connect_close_cycles_leak_nothing(go_server: GoServer) -> None:
    def cycle() -> None:
        with udskit.Client(go_server.path, timeout=5) as c:
            _session(c)

    for _ in range(20):
        cycle()
    fds, maps = _held()
    for _ in range(500):
        cycle()
    now_fds, now_maps = _held()
    assert now_fds <= fds and now_maps <= maps, f"fds {fds} -> {now_fds}, memfd maps {maps} -> {now_maps} after 500 cycles"
