"""udskit.stats (spec 9.3) on the Python server: it answers the connections it serves and no
shared memory, and the Go CLI's `udskit ls --stats` and `udskit doctor` show it (before, they said
"no statistics": the method was unknown)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
from typing import Any, Callable

import pytest

import udskit
from udskit import _wire
from conftest import PROTOCOL, GoServer, ThreadServer
from test_bidi_wire import Wire

STATS = json.loads((PROTOCOL / "vectors/stats.json").read_text())


def test_stats_method_and_the_go_tools(py_server: Callable[..., ThreadServer], udskit_bin: str) -> None:
    s = py_server({"echo": udskit.raw(lambda ctx, req: req)})
    with udskit.Client(s.path) as a, udskit.Client(s.path) as b:
        assert a.call("echo", b"x") == b"x" and b.call("echo", b"y") == b"y"
        got: Any = a.call("udskit.stats", {})
        assert got == {"conns": 2}, got
        out = subprocess.run([udskit_bin, "ls", "--stats", "--json", s.path], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        rows = rows if isinstance(rows, list) else rows.get("sockets", rows)
        mine = [r for r in rows if s.path in json.dumps(r)]
        assert mine, out.stdout
        stats = json.dumps(mine[0])
        assert '"conns": 3' in stats, stats  # a, b and the probe's own connection
        assert "shm off" in out.stdout or '"enabled": false' in stats, stats
        doc = subprocess.run([udskit_bin, "doctor", "--probe", "udskit", s.path], capture_output=True, text=True, timeout=60)
        shm = [line for line in doc.stdout.splitlines() if line.split()[1:2] == ["shm"]]
        assert shm and shm[0].startswith("PASS") and "shared memory is off" in shm[0], doc.stdout


def test_stats_vectors(py_server: Callable[..., ThreadServer]) -> None:
    """protocol/vectors/stats.json: the Python server answers the request bytes with a response of
    that id carrying an integer conns (and no shm: it takes no offers)."""
    s = py_server({})
    c = Wire(s.path)
    try:
        c.s.sendall(bytes.fromhex(STATS["request_hex"]))
        f = c.frame()
        assert (f.type, f.id) == (_wire.T_RESPONSE, STATS["request_id"]), f
        ans = json.loads(f.payload)
        assert isinstance(ans["conns"], int) and ans["conns"] >= 1 and "shm" not in ans, ans
    finally:
        c.close()


def test_parse_stats_vectors() -> None:
    """Every answer of stats.json reads as listed through parse_stats (stalled included;
    a missing shm or field reads as 0, unknown fields are ignored)."""
    fields = {f.name for f in dataclasses.fields(udskit.ShmServerStats)}
    assert fields == set(STATS["shm_fields"]) and "stalled" in fields
    assert any(a["shm"]["stalled"] for a in STATS["answers"]), "a vector with stalled answers"
    assert any(a["shm"]["slot_calls"] and a["shm"]["area_sent_bytes"] for a in STATS["answers"]), "a vector with call slots"
    for a in STATS["answers"]:
        got = udskit.parse_stats(json.loads(a["payload"]))
        assert got == udskit.ServerStats(conns=a["conns"], shm=udskit.ShmServerStats(**a["shm"])), a["name"]
        cap = a["shm"]["capacity"]
        assert got.shm.fill == (a["shm"]["in_use"] / cap if cap else 0.0), a["name"]
    with pytest.raises(udskit.UdskitError) as e:
        udskit.parse_stats([1])
    assert e.value.code == "internal"


def test_fetch_stats_go_and_python_servers(go_server: GoServer, py_server: Callable[..., ThreadServer]) -> None:
    """fetch_stats (sync) and afetch_stats (asyncio) read a Go server's shared-memory
    path, which this client's 64 KiB echo went through (one region, nothing stalled),
    and a Python server's answer as shared memory off."""
    body = b"s" * (64 << 10)
    with udskit.Client(go_server.path) as c:
        assert c.call("echo", body) == body
        st = udskit.fetch_stats(c, timeout=10)
    sh = st.shm
    assert st.conns >= 1 and sh.enabled and sh.conns == 1 and sh.sent >= 1 and sh.received >= 1, st
    assert sh.stalled == 0 and sh.waits == 0 and sh.capacity > 0 and sh.fill == sh.in_use / sh.capacity, st

    async def go_async() -> udskit.ServerStats:
        ac = await udskit.connect(go_server.path)
        try:
            return await udskit.afetch_stats(ac, timeout=10)
        finally:
            await ac.aclose()

    ast = asyncio.run(go_async())
    assert ast.shm.enabled and ast.shm.received >= 1 and ast.shm.stalled == 0, ast
    s = py_server({})
    with udskit.Client(s.path) as c:
        assert udskit.fetch_stats(c) == udskit.ServerStats(conns=1)
