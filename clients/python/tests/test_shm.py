"""Shared memory (protocol/spec.md section 10): the Python asyncio client
against the vectors, the Go server, and hostile servers."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import json
import os
import pathlib
import signal
import socket
import struct
import threading
from typing import Any, Callable, Iterator

import pytest

import udskit
from udskit import _shm
from conftest import GoServer

pytestmark = pytest.mark.skipif(not _shm.supported(), reason="shared memory needs Linux memfd")

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "shm.json"
HDR = struct.Struct("<BBHIII")


def vectors() -> Any:
    return json.loads(VECTORS.read_text())


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- the vectors ---------------------------------------------------------------


def test_constants_match_vectors() -> None:
    v = vectors()
    assert (v["feature_flag"], v["desc_flag"], v["type_shm_offer"], v["type_shm_release"]) == (
        _shm.FEATURE_SHM, _shm.FLAG_SHM, _shm.T_SHM_OFFER, _shm.T_SHM_RELEASE)
    assert (v["min_region"], v["max_region"], v["region_multiple"]) == (_shm.MIN_REGION, _shm.MAX_REGION, _shm.REGION_MULTIPLE)
    assert v["seals"]["required"] == _shm.SEALS
    for n in v["negotiate"]:
        c, s = bytes.fromhex(n["client"]), bytes.fromhex(n["server"])
        assert bool(c[5] & s[5] & _shm.FEATURE_SHM) == n["shm"], n["name"]


def test_offer_and_answer_vectors() -> None:
    v = vectors()
    for o in v["offers"]["valid"]:
        assert _shm.offer_frame(o["size"]).hex() == o["hex"], o["name"]
    for o in v["offers"]["invalid"]:
        b = bytes.fromhex(o["hex"])
        if len(b) == 24 and b[0] == 14 and b[2:4] == b"\0\0" and b[4:8] == b"\0\0\0\0":
            with pytest.raises(ValueError):
                _shm.check_size(struct.unpack_from("<Q", b, 16)[0])
    for a in v["answers"]["valid"]:
        assert _shm.parse_answer(bytes.fromhex(a["hex"])) is a["accepted"], a["name"]
    for a in v["answers"]["invalid"]:
        with pytest.raises(udskit.ProtocolError) as ei:
            _shm.parse_answer(bytes.fromhex(a["hex"]))
        assert ei.value.name == a["error"], a["name"]


def _session(size: int, max_frame: int) -> _shm.ShmSession:
    return _shm.ShmSession(_shm.Region(size), max_frame)


def test_descriptor_vectors_server_side() -> None:
    """The client's checks of the server's descriptors (sender "server")."""
    v = vectors()["descriptors"]
    for d in v["entries"]:
        if d["sender"] != "server":
            continue
        b = bytes.fromhex(d["hex"])
        t, flags, hl, id, pl, aux = HDR.unpack_from(b)
        payload = b[16 + hl : 16 + hl + pl]
        s = _session(v["region_size"], v["max_frame"])
        try:
            s.pending = [(int(x[0]), int(x[1])) for x in d["outstanding"]]
            if d["ok"]:
                s.take(payload)
                assert s.pending[-1] == (d["offset"], d["length"]), d["name"]
            else:
                with pytest.raises(udskit.ProtocolError) as ei:
                    s.take(payload)
                assert ei.value.name == d["error"], d["name"]
                assert ei.value.code == "protocol_violation"
        finally:
            s.close()


def test_release_vectors() -> None:
    """The client's checks of the server's releases of request slots."""
    for r in vectors()["releases"]:
        b = bytes.fromhex(r["hex"])
        t, flags, hl, id, pl, aux = HDR.unpack_from(b)
        s = _session(1 << 20, 1 << 20)
        try:
            s.out = {o: n for o, n in r["handed_over"]}
            check = (lambda: s.on_release(b[16:])) if id == 0 else None
            if r["ok"]:
                assert check is not None
                check()
                assert all(o not in s.out for o, _ in r["released"]), r["name"]
            elif check is None:
                pass  # id != 0: the connection hook refuses it (test_hostile_release_with_id)
            else:
                with pytest.raises(udskit.ProtocolError) as ei:
                    check()
                assert ei.value.name == r["error"], r["name"]
        finally:
            s.close()


# --- the region ------------------------------------------------------------------


def test_region_is_sealed_anonymous_and_closed() -> None:
    r = _shm.Region(1 << 20)
    assert r.fd is not None
    assert fcntl.fcntl(r.fd, fcntl.F_GET_SEALS) & 7 == 7
    assert os.fstat(r.fd).st_size == 1 << 20
    target = os.readlink(f"/proc/self/fd/{r.fd}")
    assert target.startswith("/memfd:udskit-shm"), target
    with pytest.raises(OSError):
        os.ftruncate(r.fd, 2 << 20)  # sealed: cannot grow
    fd = r.fd
    r.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    assert not [f for f in os.listdir("/dev/shm") if "udskit" in f]


def test_allocator_first_fit_coalesces() -> None:
    s = _session(1 << 20, 1 << 20)
    try:
        descs = [s.try_place(b"x" * 1000) for _ in range(8)]
        assert all(d is not None for d in descs)
        offs = [struct.unpack("<II", d)[0] for d in descs if d is not None]
        assert offs == sorted(offs) and len(set(offs)) == 8 and all(o % 64 == 0 for o in offs)
        # release in a scrambled order, then the whole half is one run again
        order = [3, 0, 7, 1, 6, 2, 5, 4]
        s.on_release(b"".join(d for d in (descs[i] for i in order) if d is not None))
        assert s.free == [[0, s.half]] and not s.out
        assert s.try_place(b"y" * s.half) is not None  # the whole half fits once free
        assert s.try_place(b"z") is None
    finally:
        s.close()


# --- against the Go server -------------------------------------------------------


def _memfd_fds() -> int:
    n = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            if "memfd:udskit-shm" in os.readlink(f"/proc/self/fd/{f}"):
                n += 1
        except OSError:
            pass
    return n


def _memfd_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:udskit-shm" in line)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _held() -> tuple[int, int]:
    """The process's open fds and udskit memfd mappings once garbage is collected: what a
    leak check compares. An earlier test's objects may still hold an fd until a collection
    (or its thread's end), so a check asserts no growth, not equality: a leak of one per
    cycle shows as hundreds."""
    gc.collect()
    return _fds(), _memfd_maps()


SIZES = [1, 100, _shm.DEFAULT_THRESHOLD - 1, _shm.DEFAULT_THRESHOLD, _shm.DEFAULT_THRESHOLD + 1, 64 << 10, 1 << 20, 4 << 20]


def test_echo_through_the_region(go_server: GoServer) -> None:
    async def main() -> None:
        async with await udskit.connect(go_server.path, timeout=5) as c:
            conn = c._conn
            assert conn is not None and conn.shm is not None, "the Go server did not accept the region"
            shm = conn.shm
            # our fd was closed after the offer; Python's mmap object keeps one dup of its own
            assert _memfd_fds() == 1
            assert _memfd_maps() >= 1
            for n in SIZES:
                body = os.urandom(n)
                sent, got = shm.sent, shm.received
                assert await c.call("echo", body, timeout=10) == body, n
                big = n >= shm.threshold
                assert shm.sent - sent == (1 if big else 0), n
                assert shm.received - got == (1 if big else 0), n  # Go answers large responses in the region
            # 16 callers at once, every response checked
            bodies = [os.urandom(256 << 10) for _ in range(16)]
            outs = await asyncio.gather(*(c.call("echo", b, timeout=20) for b in bodies))
            assert outs == bodies
            await asyncio.sleep(0.05)
            assert shm.in_use() == 0, "every request slot released by the server"
        assert _memfd_maps() == 0 and _memfd_fds() == 0

    run(main())


def test_shm_off_and_json(go_server: GoServer) -> None:
    async def main() -> None:
        async with await udskit.connect(go_server.path, timeout=5, shm=False) as c:
            assert c._conn is not None and c._conn.shm is None
            assert await c.call("echo", b"a" * (1 << 20)) == b"a" * (1 << 20)
        async with await udskit.connect(go_server.path, timeout=5) as c:
            big = {"pad": "p" * (100 << 10), "n": [1, 2]}
            assert await c.call("echo", big) == big  # JSON payloads take the region too
            assert c._conn is not None and c._conn.shm is not None and c._conn.shm.sent == 1

    run(main())


def test_back_pressure_waits_within_deadline(go_server: GoServer) -> None:
    async def main() -> None:
        # the smallest region: 64 KiB per half; 12 calls of 40 KiB cannot all fit
        async with await udskit.connect(go_server.path, timeout=5, shm_size=_shm.MIN_REGION) as c:
            shm = c._conn.shm if c._conn is not None else None
            assert shm is not None
            bodies = [json.dumps({"ms": 50, "pad": str(i) * (40 << 10)}).encode() for i in range(12)]
            outs = await asyncio.gather(*(c.call("sleep", b, timeout=20) for b in bodies))
            assert all(json.loads(o) == {"slept_ms": 50} for o in outs)
            assert shm.waits > 0
            assert shm.in_use() == 0

    run(main())


def test_timed_out_call_keeps_its_slot_until_released(go_server: GoServer) -> None:
    async def main() -> None:
        async with await udskit.connect(go_server.path, timeout=5) as c:
            shm = c._conn.shm if c._conn is not None else None
            assert shm is not None
            req = json.dumps({"ms": 400, "pad": "x" * (32 << 10)}).encode()
            with pytest.raises(udskit.UdskitError) as ei:
                await c.call("sleep", req, timeout=0.1)
            assert ei.value.code == "deadline_exceeded"
            # the server's handler is cancelled by the deadline, then releases the slot
            for _ in range(100):
                if shm.in_use() == 0:
                    break
                await asyncio.sleep(0.02)
            assert shm.in_use() == 0 and shm.free == [[0, shm.half]]

    run(main())


def test_server_killed_mid_call(go_server: GoServer) -> None:
    async def main() -> None:
        c = await udskit.connect(go_server.path, timeout=5, reconnect=False)
        assert c._conn is not None and c._conn.shm is not None
        calls = [asyncio.ensure_future(c.call("sleep", json.dumps({"ms": 5000, "pad": "k" * (64 << 10)}).encode(), timeout=30)) for _ in range(4)]
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        go_server.kill(signal.SIGKILL)
        for f in calls:
            with pytest.raises(udskit.UdskitError) as ei:
                await f
            assert ei.value.code == "unavailable"
        assert loop.time() - t0 < 2
        assert _memfd_maps() == 0 and _memfd_fds() == 0
        await c.aclose()

    run(main())


def test_connect_close_cycles_leak_nothing(go_server: GoServer) -> None:
    async def main() -> None:
        async def cycle() -> None:
            async with await udskit.connect(go_server.path, timeout=5) as c:
                assert c._conn is not None and c._conn.shm is not None
        for _ in range(20):
            await cycle()
        fds, maps = _held()
        for _ in range(1000):
            await cycle()
        now_fds, now_maps = _held()
        assert now_fds <= fds and now_maps <= maps, f"fds {fds} -> {now_fds}, memfd maps {maps} -> {now_maps} after 1000 cycles"

    run(main())


# --- hostile servers -------------------------------------------------------------


class Hostile:
    """A server speaking just enough of the protocol to accept the region,
    then doing what ``act`` says with the first request."""

    def __init__(self, path: str, act: Callable[[socket.socket, int, bytes], None]) -> None:
        self.path = path
        self.ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ls.bind(path)
        self.ls.listen(4)
        self.act = act
        self.error: BaseException | None = None
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        try:
            s, _ = self.ls.accept()
            with s:
                s.settimeout(10)
                hello = s.recv(16, socket.MSG_WAITALL)
                assert hello[5] & _shm.FEATURE_SHM
                s.sendall(struct.pack("<4sBBHII", b"UDSK", 1, 5, 0, 1 << 24, 64))
                msg, fds, _, _ = socket.recv_fds(s, 24, 2, socket.MSG_WAITALL)
                assert len(msg) == 24 and len(fds) == 1 and msg[0] == _shm.T_SHM_OFFER
                size = struct.unpack_from("<Q", msg, 16)[0]
                os.close(fds[0])
                s.sendall(HDR.pack(_shm.T_SHM_OFFER, 0, 0, 0, 0, 1))
                h = s.recv(16, socket.MSG_WAITALL)
                t, flags, hl, id, pl, aux = HDR.unpack(h)
                rest = s.recv(hl + pl, socket.MSG_WAITALL)
                self.act(s, id, rest[hl:] if flags & _shm.FLAG_SHM else b"")
                s.recv(1 << 16)  # until the client closes
                del size
        except BaseException as e:  # reported by the test
            self.error = e

    def close(self) -> None:
        self.ls.close()
        self.t.join(5)


@pytest.fixture
def hostile_path(sdir: str) -> Iterator[str]:
    yield os.path.join(sdir, "hostile.sock")


def _desc(off: int, n: int) -> bytes:
    return struct.pack("<II", off, n)


HOSTILE: dict[str, Callable[[socket.socket, int, bytes], None]] = {
    # a response slot past the end of the region (64 MiB)
    "past the region": lambda s, id, d: s.sendall(HDR.pack(2, 4, 0, id, 8, 0) + _desc((64 << 20) - 10, 100)),
    # a response slot in the client's half
    "in the client half": lambda s, id, d: s.sendall(HDR.pack(2, 4, 0, id, 8, 0) + _desc(0, 100)),
    # a descriptor of the wrong size
    "short descriptor": lambda s, id, d: s.sendall(HDR.pack(2, 4, 0, id, 4, 0) + b"\0\0\0\0"),
    # release of a slot the client never handed over
    "release of an unknown slot": lambda s, id, d: s.sendall(HDR.pack(15, 0, 0, 0, 8, 0) + _desc(4096, 10)),
    # release of the request's slot twice
    "release twice": lambda s, id, d: s.sendall(HDR.pack(15, 0, 0, 0, 16, 0) + d + d),
    # a release with an id
    "release with an id": lambda s, id, d: s.sendall(HDR.pack(15, 0, 0, 7, 8, 0) + d),
    # a second offer answer
    "a second answer": lambda s, id, d: s.sendall(HDR.pack(14, 0, 0, 0, 0, 1)),
    # two overlapping stream items in one read (neither released yet)
    "overlapping slots": lambda s, id, d: s.sendall(
        HDR.pack(5, 4, 0, id, 8, 0) + _desc(40 << 20, 4096) + HDR.pack(5, 4, 0, id, 8, 0) + _desc((40 << 20) + 100, 4096)),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_server_fails_only_the_connection(hostile_path: str, name: str) -> None:
    h = Hostile(hostile_path, HOSTILE[name])

    async def main() -> None:
        c = await udskit.connect(hostile_path, timeout=5, reconnect=False)
        assert c._conn is not None and c._conn.shm is not None
        method = "stream" if name == "overlapping slots" else "echo"
        with pytest.raises(udskit.UdskitError) as ei:
            if method == "stream":
                async for _ in c.stream("stream", b"s" * (32 << 10), timeout=5):
                    pass
            else:
                await c.call("echo", b"q" * (32 << 10), timeout=5)
        assert ei.value.code in ("protocol_violation", "unavailable"), ei.value
        assert c._conn is None or c._conn.closed
        await c.aclose()
        assert _memfd_maps() == 0

    try:
        run(main())
    finally:
        h.close()
    assert h.error is None, h.error


def test_full_region_waits_then_deadline(hostile_path: str) -> None:
    """A server that never releases: the next call that needs the space waits
    within its deadline and fails with deadline_exceeded, sending nothing
    (never a silent fallback to the socket)."""
    more: list[bytes] = []

    def keep(s: socket.socket, id: int, d: bytes) -> None:
        s.sendall(HDR.pack(2, 0, 0, id, 2, 0) + b"ok")  # answered inline; the slot is never released
        s.settimeout(1.0)
        try:
            more.append(s.recv(1 << 16))
        except socket.timeout:
            pass

    h = Hostile(hostile_path, keep)

    async def main() -> None:
        c = await udskit.connect(hostile_path, timeout=5, reconnect=False, shm_size=_shm.MIN_REGION)
        shm = c._conn.shm if c._conn is not None else None
        assert shm is not None
        assert await c.call("echo", b"a" * (40 << 10), timeout=5) == b"ok"
        assert shm.in_use() == 40 << 10
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(udskit.UdskitError) as ei:
            await c.call("echo", b"b" * (40 << 10), timeout=0.3)
        assert ei.value.code == "deadline_exceeded"
        assert 0.25 < loop.time() - t0 < 1.0
        assert shm.waits == 1
        await asyncio.sleep(0.8)  # the server listens for 1 s after its answer
        await c.aclose()

    try:
        run(main())
    finally:
        h.close()
    assert h.error is None, h.error
    # the call that timed out waiting for space sent nothing at all
    assert more == [], more

