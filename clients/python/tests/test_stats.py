"""udskit.stats (spec 9.3) on the Python server: it answers the connections it serves and no
shared memory, and the Go CLI's `udskit ls --stats` and `udskit doctor` show it (before, they said
"no statistics": the method was unknown)."""

from __future__ import annotations

import json
import subprocess
from typing import Any, Callable

import udskit
from udskit import _wire
from conftest import PROTOCOL, ThreadServer
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
