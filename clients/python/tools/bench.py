"""Side-by-side benchmark against the Go server: ``python clients/python/tools/bench.py --json FILE``

(A tool beside the package, not installed with it; it imports the installed ``udskit``.).

Clients, each calling an echo method over a unix socket:

- ``udskit-async``: this package's asyncio client (JSON values, or raw bytes: ``-raw``);
  ``udskit-async-raw-socket`` is the raw client with shared memory off (``shm=False``),
  so the same payloads go through the socket (spec section 10; the Go server offers it)
- ``udskit-sync``: this package's blocking client, from N threads;
  ``udskit-sync-socket`` the same with shared memory off (``shm=False``)
- ``udskit-async-bidi`` / ``udskit-sync-bidi``: a ping-pong on one
  bidirectional call per caller (spec 4.3): each round sends one item of the
  Go demo's ``sum`` (the number 0, so the running total stays 0) and reads its
  answer; the size column does not apply (items are 1 byte each way). Its
  target: a round trip at least as fast as a unary call (udskit-async 1x64)
- ``ndjson-asyncio``: a minimal hand-written asyncio newline-JSON client (an
  asyncio.Protocol, one dict of futures by id) against the same Go server
- ``grpcio-aio``: grpcio's asyncio API calling grpc-go's echo service
  (tools/grpcecho, raw bytes, no protobuf)

Every cell runs in its own process; cells are interleaved round by round
(A B C ... A B C ...) and the tables show medians over the rounds.
The Go binaries come from --udskit/--grpc-echo, $UDSKIT_BIN/$UDSKIT_GRPC_ECHO, or
are built with ``go build`` from the repository holding the current directory.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import importlib
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

# (client, concurrency, size); the first two are the targets.
DEFAULT_CELLS: list[tuple[str, int, int]] = [
    ("udskit-async", 1, 64),
    ("ndjson-asyncio", 1, 64),
    ("udskit-async-raw", 1, 64),
    ("udskit-sync", 1, 64),
    ("grpcio-aio", 1, 64),
    ("udskit-async-raw", 16, 1024),
    ("grpcio-aio", 16, 1024),
    ("ndjson-asyncio", 16, 1024),
    ("udskit-sync", 8, 1024),
    ("udskit-sync", 8, 64),
    ("udskit-async-bidi", 1, 64),
    ("udskit-sync-bidi", 1, 64),
]


# --- the measured loops (run in a child process) -----------------------------


class Recorder:
    def __init__(self, duration: float, warmup: float) -> None:
        self.duration = duration
        self.warmup = warmup
        self.lat: list[int] = []
        self.start = 0.0
        self.stop = 0.0

    def begin(self) -> None:
        now = time.perf_counter()
        self.start = now + self.warmup
        self.stop = self.start + self.duration


def json_payload(size: int) -> str:
    return "x" * (size - 2)  # a JSON string that encodes to size bytes


async def _async_loop(rec: Recorder, conc: int, one: Callable[[], Any]) -> None:
    pc = time.perf_counter
    lat = rec.lat

    async def worker() -> None:
        while True:
            t0 = pc()
            if t0 >= rec.stop:
                return
            await one()
            t1 = pc()
            if t0 >= rec.start:
                lat.append(int((t1 - t0) * 1e9))

    rec.begin()
    await asyncio.gather(*[worker() for _ in range(conc)])


async def run_udskit_async(addr: str, rec: Recorder, conc: int, size: int, raw: bool, shm: bool = True) -> None:
    from udskit import connect

    c = await connect(addr, shm=shm)
    payload: Any = b"x" * size if raw else json_payload(size)
    want = payload
    if await c.call("echo", payload) != want:
        raise SystemExit("udskit echo returned something else")
    call = c.call

    async def one() -> None:
        await call("echo", payload)

    await _async_loop(rec, conc, one)
    await c.aclose()


async def run_udskit_async_bidi(addr: str, rec: Recorder, conc: int) -> None:
    from udskit import connect

    c = await connect(addr)
    free: collections.deque[Any] = collections.deque()
    for _ in range(conc):  # one open call per caller, opened before the clock starts
        call = c.bidi("sum")
        await call.send(0)
        if await call.recv() != 0:
            raise SystemExit("udskit sum returned something else")
        free.append(call)

    async def one() -> None:
        call = free.popleft()
        await call.send(0)
        await call.recv()
        free.append(call)

    await _async_loop(rec, conc, one)
    for call in free:
        await call.done_writing()
    await c.aclose()


def run_udskit_sync_bidi(addr: str, rec: Recorder) -> None:
    from udskit import Client

    c = Client(addr)
    call = c.bidi("sum")
    call.send(0)
    if call.recv() != 0:
        raise SystemExit("udskit sum returned something else")
    pc = time.perf_counter
    send, recv = call.send, call.recv
    rec.begin()
    while True:
        t0 = pc()
        if t0 >= rec.stop:
            break
        send(0)
        recv()
        t1 = pc()
        if t0 >= rec.start:
            rec.lat.append(int((t1 - t0) * 1e9))
    call.done_writing()
    c.close()


class _NDProto(asyncio.Protocol):
    """The hand-written baseline: newline-JSON over an asyncio.Protocol."""

    def __init__(self) -> None:
        self.buf = b""
        self.waiters: dict[int, asyncio.Future[Any]] = {}
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        lines = buf.split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            msg = json.loads(line)
            fut = self.waiters.pop(msg["id"], None)
            if fut is not None:
                fut.set_result(msg.get("data"))


async def run_ndjson(addr: str, rec: Recorder, conc: int, size: int) -> None:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_unix_connection(_NDProto, addr)
    payload = json_payload(size)
    next_id = 0

    async def one() -> Any:
        nonlocal next_id
        next_id += 1
        i = next_id
        fut = loop.create_future()
        proto.waiters[i] = fut
        assert proto.transport is not None
        proto.transport.write(json.dumps({"id": i, "func": "echo", "data": payload}).encode() + b"\n")
        return await fut

    if await one() != payload:
        raise SystemExit("ndjson echo returned something else")
    await _async_loop(rec, conc, one)
    assert proto.transport is not None
    proto.transport.close()


async def run_grpcio(addr: str, rec: Recorder, conc: int, size: int) -> None:
    grpc_aio: Any = importlib.import_module("grpc.aio")
    ch = grpc_aio.insecure_channel("unix:" + addr)
    call = ch.unary_unary("/udskit.bench.Echo/Echo")
    payload = b"x" * size
    if await call(payload) != payload:
        raise SystemExit("grpc echo returned something else")

    async def one() -> None:
        await call(payload)

    await _async_loop(rec, conc, one)
    await ch.close()


def run_udskit_sync(addr: str, rec: Recorder, conc: int, size: int, shm: bool = True) -> None:
    from udskit import Client

    c = Client(addr, shm=shm)
    payload = b"x" * size
    lat: list[list[int]] = [[] for _ in range(conc)]
    rec.begin()
    pc = time.perf_counter

    def worker(mine: list[int]) -> None:
        call = c.call
        while True:
            t0 = pc()
            if t0 >= rec.stop:
                return
            call("echo", payload)
            t1 = pc()
            if t0 >= rec.start:
                mine.append(int((t1 - t0) * 1e9))

    if conc == 1:
        worker(lat[0])  # a lone caller: in this thread, as a script would call
    else:
        ts = [threading.Thread(target=worker, args=(lat[i],)) for i in range(conc)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    for x in lat:
        rec.lat.extend(x)
    c.close()


def run_cell(client: str, addr: str, conc: int, size: int, duration: float, warmup: float, profile: bool) -> dict[str, Any]:
    rec = Recorder(duration, warmup)
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    if client == "udskit-async":
        asyncio.run(run_udskit_async(addr, rec, conc, size, raw=False))
    elif client == "udskit-async-raw":
        asyncio.run(run_udskit_async(addr, rec, conc, size, raw=True))
    elif client == "udskit-async-raw-socket":
        asyncio.run(run_udskit_async(addr, rec, conc, size, raw=True, shm=False))
    elif client == "ndjson-asyncio":
        asyncio.run(run_ndjson(addr, rec, conc, size))
    elif client == "grpcio-aio":
        asyncio.run(run_grpcio(addr, rec, conc, size))
    elif client == "udskit-sync":
        run_udskit_sync(addr, rec, conc, size)
    elif client == "udskit-sync-socket":
        run_udskit_sync(addr, rec, conc, size, shm=False)
    elif client == "udskit-async-bidi":
        asyncio.run(run_udskit_async_bidi(addr, rec, conc))
    elif client == "udskit-sync-bidi":
        run_udskit_sync_bidi(addr, rec)
    else:
        raise SystemExit(f"unknown client {client}")
    if prof:
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    lat = sorted(rec.lat)
    n = len(lat)
    if n == 0:
        raise SystemExit(f"{client}: no calls measured")
    return {
        "requests": n,
        "rps": n / duration,
        "p50_us": lat[n // 2] / 1e3,
        "p99_us": lat[min(n - 1, int(n * 0.99))] / 1e3,
    }


# --- the parent: servers, rounds, table ----------------------------------------


def find_repo() -> Path | None:
    p = Path.cwd().resolve()
    for d in (p, *p.parents):
        gm = d / "go.mod"
        if gm.is_file() and "module github.com/udskit/udskit" in gm.read_text():
            return d
    return None


def go_binaries(args: argparse.Namespace, tmp: str) -> tuple[str, str]:
    ud = args.udskit or os.environ.get("UDSKIT_BIN", "")
    ge = args.grpc_echo or os.environ.get("UDSKIT_GRPC_ECHO", "")
    if ud and ge:
        return ud, ge
    repo = find_repo()
    if repo is None or not shutil.which("go"):
        raise SystemExit("bench: give --udskit and --grpc-echo (or run inside the udskit repository with go installed)")
    if not ud:
        ud = os.path.join(tmp, "udskit")
        subprocess.run(["go", "build", "-o", ud, "./cmd/udskit"], cwd=repo, check=True)
    if not ge:
        ge = os.path.join(tmp, "grpcecho")
        subprocess.run(["go", "build", "-o", ge, "./tools/grpcecho"], cwd=repo, check=True)
    return ud, ge


def start(cmd: list[str], ready: bytes) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout is not None
    line = p.stdout.readline()
    if ready not in line:
        p.kill()
        raise SystemExit(f"bench: {cmd[0]} did not start: {line!r}")
    return p


def cpu_info() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "model": model, "python": sys.version.split()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON here")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=1.0, help="seconds measured per cell and round")
    ap.add_argument("--warmup", type=float, default=0.2)
    ap.add_argument("--cells", help="comma-separated client:conc:size list (default: the issue's set)")
    ap.add_argument("--udskit", help="udskit binary (default $UDSKIT_BIN, else go build)")
    ap.add_argument("--grpc-echo", help="grpc-go echo server binary (default $UDSKIT_GRPC_ECHO, else go build)")
    ap.add_argument("--profile", action="store_true", help="cProfile the udskit-async 1x64 cell (to stderr)")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--cell", nargs=4, metavar=("CLIENT", "ADDR", "CONC", "SIZE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.cell:
        client, addr, conc, size = a.cell
        out = run_cell(client, addr, int(conc), int(size), a.duration, a.warmup, a.profile)
        print(json.dumps(out))
        return 0

    cells = DEFAULT_CELLS
    if a.cells:
        cells = [(c.split(":")[0], int(c.split(":")[1]), int(c.split(":")[2])) for c in a.cells.split(",")]
    tmp = tempfile.mkdtemp(prefix="udsbench", dir="/tmp")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ud, ge = go_binaries(a, tmp)
        uaddr = os.path.join(tmp, "u.sock")
        gaddr = os.path.join(tmp, "g.sock")
        procs.append(start([ud, "serve", uaddr, "-q"], b"listening"))
        if any(c[0] == "grpcio-aio" for c in cells):
            procs.append(start([ge, "--addr", gaddr], b"READY"))
        results: dict[tuple[str, int, int], list[dict[str, Any]]] = {c: [] for c in cells}
        load_before = os.getloadavg()
        t0 = time.time()
        for r in range(a.rounds):
            for c in cells:
                client, conc, size = c
                addr = gaddr if client == "grpcio-aio" else uaddr
                cmd = [sys.executable, os.path.abspath(__file__), "--duration", str(a.duration), "--warmup", str(a.warmup)]
                if a.profile and r == 0 and c == ("udskit-async", 1, 64):
                    cmd.append("--profile")
                cmd += ["--cell", client, addr, str(conc), str(size)]
                cp = subprocess.run(cmd, capture_output=True, timeout=120)
                if cp.returncode != 0:
                    raise SystemExit(f"bench: cell {c} failed: {cp.stderr.decode()[-2000:]}")
                if a.profile and "--profile" in cmd:
                    sys.stderr.write(cp.stderr.decode())
                results[c].append(json.loads(cp.stdout.splitlines()[-1]))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
        rows = []
        for c, rs in results.items():
            rows.append(
                {
                    "client": c[0],
                    "conc": c[1],
                    "size": c[2],
                    "rps": statistics.median(x["rps"] for x in rs),
                    "p50_us": statistics.median(x["p50_us"] for x in rs),
                    "p99_us": statistics.median(x["p99_us"] for x in rs),
                    "rounds": rs,
                }
            )
        doc = {
            "command": "python clients/python/tools/bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
            "machine": cpu_info(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "rounds": a.rounds,
            "duration_s": a.duration,
            "rows": rows,
            "targets": targets(rows),
        }
        print_markdown(doc) if a.markdown else print_table(doc)
        if a.json:
            Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _row(rows: list[dict[str, Any]], client: str, conc: int, size: int) -> dict[str, Any] | None:
    for r in rows:
        if (r["client"], r["conc"], r["size"]) == (client, conc, size):
            return r
    return None


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    a, n = _row(rows, "udskit-async", 1, 64), _row(rows, "ndjson-asyncio", 1, 64)
    if a and n:
        ratio = a["p50_us"] / n["p50_us"]
        out["p50_1x64_udskit_vs_ndjson"] = {"ratio": round(ratio, 3), "target": "<= 1.0", "met": ratio <= 1.0}
    u, g = _row(rows, "udskit-async-raw", 16, 1024), _row(rows, "grpcio-aio", 16, 1024)
    if u and g:
        ratio = u["rps"] / g["rps"]
        out["rps_16x1k_udskit_vs_grpcio"] = {"ratio": round(ratio, 2), "target": ">= 4.0", "met": ratio >= 4.0}
    b = _row(rows, "udskit-async-bidi", 1, 64)
    if a and b:
        ratio = b["p50_us"] / a["p50_us"]
        out["p50_1x_bidi_round_vs_unary"] = {"ratio": round(ratio, 3), "target": "<= 1.0", "met": ratio <= 1.0}
    for conc in (1, 16):
        m, k = _row(rows, "udskit-async-raw", conc, 1 << 20), _row(rows, "udskit-async-raw-socket", conc, 1 << 20)
        if m and k:
            ratio = m["rps"] / k["rps"]
            out[f"rps_{conc}x1m_shm_vs_socket"] = {"ratio": round(ratio, 2), "target": ">= 2.0", "met": ratio >= 2.0}
    return out


def print_table(doc: dict[str, Any]) -> None:
    print(f"{'client':>18} {'conc':>4} {'size':>5} {'req/s':>9} {'p50 µs':>8} {'p99 µs':>8}")
    for r in doc["rows"]:
        print(f"{r['client']:>18} {r['conc']:>4} {r['size']:>5} {r['rps']:>9,.0f} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f}")
    for k, v in doc["targets"].items():
        print(f"{k}: {v['ratio']} (target {v['target']}: {'met' if v['met'] else 'MISSED'})")
    print(f"load average before {doc['loadavg_before'][0]:.2f}, after {doc['loadavg_after'][0]:.2f} on {doc['machine']['cpus']} CPUs")


def print_markdown(doc: dict[str, Any]) -> None:
    print("| client | callers | size | req/s | p50 µs | p99 µs |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in doc["rows"]:
        print(f"| {r['client']} | {r['conc']} | {r['size']} B | {r['rps']:,.0f} | {r['p50_us']:.1f} | {r['p99_us']:.1f} |")
    print()
    for k, v in doc["targets"].items():
        print(f"- `{k}`: **{v['ratio']}** (target {v['target']}: {'met' if v['met'] else 'missed'})")
    la, lb = doc["loadavg_before"][0], doc["loadavg_after"][0]
    m = doc["machine"]
    print(f"- {doc['when']}, {m['cpus']} CPUs ({m['model']}), Python {m['python']}, {doc['rounds']} rounds x {doc['duration_s']} s; load average {la:.1f} before, {lb:.1f} after")


if __name__ == "__main__":
    sys.exit(main())
