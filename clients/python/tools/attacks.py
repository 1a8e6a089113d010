"""A few of issue 25's attacks against the Python server, bounded, with its
peak RSS: ``python clients/python/tools/attacks.py [--only NAME]``.

A quick check for this package's server (the full soak, all three servers
side by side, is tools/soak with -server python). The server is
``python -m udskit.demo`` (default limits) in a child process; a good client (its own process)
calls echo throughout (failures, p99). For each attack: the server's peak
RSS (VmHWM, reset before each attack), its RSS after the attack ended, how
many hostile connections were closed by the server and when.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable

import udskit
from udskit import _wire

HELLO = _wire.Hello().encode()
MiB = 1 << 20


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of pid in bytes."""
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                got[k] = int(v.split()[0]) * 1024
    return got["VmRSS"], got["VmHWM"]


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def req(id: int, method: str, payload: bytes = b"", flags: int = 0) -> bytes:
    return _wire.frame(_wire.T_REQUEST, flags, id, 0, _wire.method_head(method), payload)


async def hostile_conn(path: str, hello: bool = True) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    while True:  # (a full backlog: EAGAIN, try again; see udskit._common._unix_connect)
        try:
            s.connect(path)
            break
        except BlockingIOError:
            await asyncio.sleep(0.005)
    if hello:
        await loop.sock_sendall(s, HELLO)
    return s


def is_closed(s: socket.socket) -> bool:
    """Whether the server closed its end (POLLHUP), whatever is still unread."""
    p = select.poll()
    try:
        p.register(s.fileno(), 0)
    except (ValueError, OSError):
        return True
    return any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in p.poll(0))


async def push(socks: list[socket.socket], make: Callable[[int], bytes], seconds: float, count: int = 1 << 30) -> None:
    """Sends make(1), make(2), ... (at most count) on every socket as fast as
    each takes them, for seconds; never reads."""
    end = time.monotonic() + seconds
    nth = {s: 1 for s in socks}
    views = {s: memoryview(make(1)) for s in socks}
    while time.monotonic() < end:
        moved = False
        for s in socks:
            v = views[s]
            if not v:
                continue
            try:
                n = s.send(v, socket.MSG_DONTWAIT)
            except (BlockingIOError, OSError):
                continue
            moved = True
            v = v[n:]
            if not v and nth[s] < count:
                nth[s] += 1
                v = memoryview(make(nth[s]))
            views[s] = v
        if not moved:
            await asyncio.sleep(0.01)


async def neverread_sleep(path: str) -> list[socket.socket]:
    s = await hostile_conn(path)
    body = json.dumps({"ms": 30000, "pad": "x" * MiB}).encode()
    await push([s], lambda i: req(i, "sleep", body), 8)
    return [s]


async def neverread_echo_400(path: str) -> list[socket.socket]:
    socks = [await hostile_conn(path) for _ in range(400)]
    body = json.dumps("e" * MiB).encode()
    await push(socks, lambda i: req(i, "echo", body), 8)
    return socks


async def streams_1024(path: str) -> list[socket.socket]:
    s = await hostile_conn(path)
    body = json.dumps({"n": 100000}).encode()
    await push([s], lambda i: req(i, "stream", body, _wire.FLAG_STREAM), 2, 1024)
    await asyncio.sleep(10)
    return [s]


async def many_in_flight(path: str) -> list[socket.socket]:
    socks = [await hostile_conn(path) for _ in range(25)]
    body = json.dumps({"ms": 15000}).encode()
    await push(socks, lambda i: req(i, "sleep", body), 3, 4000)
    await asyncio.sleep(8)
    return socks


async def big_header_500(path: str) -> list[socket.socket]:
    socks = [await hostile_conn(path) for _ in range(500)]
    await push(socks, lambda i: _wire.HEADER.pack(_wire.T_REQUEST, 0, 6, 1, 16 * MiB, 0) + _wire.method_head("echo"), 0.5, 1)
    return socks


async def half_header_2000(path: str) -> list[socket.socket]:
    socks = [await hostile_conn(path) for _ in range(1000)]
    socks += [await hostile_conn(path, hello=False) for _ in range(1000)]
    for i, s in enumerate(socks):
        try:
            s.send(b"{" if i >= 1000 else _wire.HEADER.pack(_wire.T_REQUEST, 0, 6, 1, 10, 0)[:8])
        except OSError:
            pass
    return socks


ATTACKS: dict[str, Callable[[str], Awaitable[list[socket.socket]]]] = {
    "neverread-sleep-1MiB": neverread_sleep,
    "neverread-echo-400x1MiB": neverread_echo_400,
    "streams-1024-unread": streams_1024,
    "inflight-25x4000": many_in_flight,
    "header-16MiB-500": big_header_500,
    "half-header-or-brace-2000": half_header_2000,
}


GOOD = """
import asyncio, json, sys, time
import udskit

async def main(path):
    c = await udskit.connect(path, wait=True, timeout=10)
    lat, fails = [], []
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_reader(sys.stdin.fileno(), lambda: stop.done() or stop.set_result(None))
    while not stop.done():
        t0 = time.perf_counter()
        try:
            await c.call("echo", b"good", timeout=2)
            lat.append(time.perf_counter() - t0)
        except udskit.UdskitError as e:
            fails.append(str(e))
        await asyncio.sleep(0.005)
    await c.aclose()
    lat.sort()
    p99 = lat[int(len(lat) * 0.99)] * 1000 if lat else -1
    print(json.dumps({"calls": len(lat), "failed": len(fails), "p99_ms": round(p99, 1), "errors": fails[:3]}))

asyncio.run(main(sys.argv[1]))
"""


def good_client(path: str) -> subprocess.Popen[bytes]:
    """The good client, in its own process (the attack's loop must not delay it)."""
    return subprocess.Popen([sys.executable, "-c", GOOD, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


async def run_attack(name: str, path: str, pid: int, wait_closed: float) -> dict[str, Any]:
    reset_peak(pid)
    good = good_client(path)
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    socks = await ATTACKS[name](path)
    closed_at = None
    while time.monotonic() - t0 < wait_closed:
        if all(is_closed(s) for s in socks):
            closed_at = time.monotonic() - t0
            break
        await asyncio.sleep(0.25)
    n_closed = sum(is_closed(s) for s in socks)
    _, peak = rss(pid)
    for s in socks:
        s.close()
    await asyncio.sleep(2)
    after, _ = rss(pid)
    out, _ = good.communicate(b"stop\n", timeout=30)
    g = json.loads(out)
    if g["errors"]:
        print(f"{name}: good client errors: {g['errors']}", file=sys.stderr, flush=True)
    return {
        "attack": name,
        "peak_rss_mib": round(peak / MiB),
        "rss_after_mib": round(after / MiB),
        "closed": f"{n_closed}/{len(socks)}" + (f" at {closed_at:.1f}s" if closed_at is not None else ""),
        "good_calls": g["calls"],
        "good_failed": g["failed"],
        "good_p99_ms": g["p99_ms"],
    }


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run only attacks whose name contains this")
    ap.add_argument("--wait-closed", type=float, default=40.0, help="how long to wait for the server to close hostile connections")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="udsatk", dir="/tmp")
    path = os.path.join(d, "s.sock")
    p = subprocess.Popen([sys.executable, "-m", "udskit.demo", path], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and b"listening" in p.stdout.readline()
        print("| attack | peak RSS MiB | RSS after MiB | hostile closed | good calls | failed | p99 ms |")
        print("|---|---:|---:|---|---:|---:|---:|")
        for name in ATTACKS:
            if a.only and a.only not in name:
                continue
            r = await run_attack(name, path, p.pid, a.wait_closed)
            print(
                f"| {r['attack']} | {r['peak_rss_mib']} | {r['rss_after_mib']} | {r['closed']} | "
                f"{r['good_calls']} | {r['good_failed']} | {r['good_p99_ms']} |",
                flush=True,
            )
    finally:
        p.terminate()
        p.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
