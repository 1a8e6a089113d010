"""The soak's "100k ids in flight" replayed in one process, measured in CPU time
(issue 25): ``python clients/python/tools/bench_inflight.py SRC [SRC...] [--rounds N]``

(A tool beside the package, not installed with it.) Each SRC is a directory
holding a ``udskit`` package (``clients/python/src``, or a copy of another
commit's); each round runs every SRC once, each in its own process, interleaved.

An attacker process opens 4 connections, each sending a hello then 100,000
``sleep`` requests (3 s, no deadline), as tools/soak does; the server (the demo
handlers) closes each connection once it is past max_in_flight and cancels its
calls. Measured in the server's thread CPU time (time.thread_time), so that a
loaded machine's waits count less than wall time would: the CPU of the whole
attack, the garbage collector's (full collections: count and longest), and the
longest event-loop iteration, which is what a good client's call waits for.
Prints one line per run and the medians per SRC.

``--gc-threshold2 N`` runs with gc.set_threshold(700, 10, N) (CPython's third
threshold; a process-wide setting for an application to choose, not the
library).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from typing import Any

_CHILD = r"""
import asyncio, gc, os, socket, subprocess, sys, tempfile, threading, time
sys.path.insert(0, sys.argv[1])
import udskit
from udskit import _wire, demo

thr2 = int(sys.argv[2])
gcs = {"n2": 0, "cpu": 0.0, "max": 0.0, "t0": 0.0}

def on_gc(phase, info):
    if phase == "start":
        gcs["t0"] = time.thread_time()
    else:
        d = time.thread_time() - gcs["t0"]
        gcs["cpu"] += d
        if info["generation"] == 2:
            gcs["n2"] += 1
            gcs["max"] = max(gcs["max"], d)

ATTACKER = '''
import socket, sys, threading
data = open(sys.argv[1], "rb").read()
def one():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[2])
    threading.Thread(target=s.sendall, args=(data,), daemon=True).start()
    try:
        while s.recv(1 << 16):
            pass
    except OSError:
        pass
ts = [threading.Thread(target=one) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
'''

async def main():
    d = tempfile.mkdtemp(prefix="udsbench", dir="/tmp")
    path = os.path.join(d, "s")
    srv = await udskit.serve(path, demo.handlers())
    if thr2:
        gc.set_threshold(700, 10, thr2)
    head, body = _wire.method_head("sleep"), b'{"ms":3000}'
    blob = os.path.join(d, "ids")
    with open(blob, "wb") as f:
        f.write(_wire.Hello().encode())
        f.write(b"".join(_wire.HEADER.pack(_wire.T_REQUEST, 0, len(head), i, len(body), 0) + head + body for i in range(1, 100_001)))
    gc.callbacks.append(on_gc)
    loop = asyncio.get_running_loop()
    worst = [0.0]
    run_once = loop._run_once
    def timed():
        t = time.thread_time()
        run_once()
        worst[0] = max(worst[0], time.thread_time() - t)
    loop._run_once = timed
    c0 = time.thread_time()
    child = subprocess.Popen([sys.executable, "-c", ATTACKER, blob, path])
    while child.poll() is None:
        await asyncio.sleep(0.01)
    while any(c.calls for c in srv._conns) or srv._cancelq:
        await asyncio.sleep(0.01)
    cpu = time.thread_time() - c0
    loop._run_once = run_once
    gc.callbacks.remove(on_gc)
    print(f"{cpu * 1000:.0f} {gcs['cpu'] * 1000:.0f} {gcs['n2']} {gcs['max'] * 1000:.1f} {worst[0] * 1000:.1f}")
    await srv.close()
    os.unlink(blob)

import logging
logging.disable(logging.WARNING)
asyncio.run(main())
"""

FIELDS = ("cpu ms", "gc cpu ms", "full gcs", "longest full gc ms", "longest iteration ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", nargs="+", help="a directory holding a udskit package (e.g. clients/python/src)")
    ap.add_argument("--rounds", type=int, default=5, help="runs per SRC, interleaved (default 5)")
    ap.add_argument("--gc-threshold2", type=int, default=0, help="gc.set_threshold(700, 10, N) in the server (default: CPython's)")
    a = ap.parse_args()
    got: dict[str, list[list[float]]] = {s: [] for s in a.src}
    for r in range(a.rounds):
        for s in a.src:
            out = subprocess.run([sys.executable, "-c", _CHILD, s, str(a.gc_threshold2)], capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
            vals = [float(x) for x in out.stdout.split()]
            got[s].append(vals)
            print(f"round {r + 1} {s}: " + ", ".join(f"{n} {v:g}" for n, v in zip(FIELDS, vals)), flush=True)
    print("\nmedians:")
    for s, runs in got.items():
        med: list[Any] = [statistics.median(col) for col in zip(*runs)]
        print(f"  {s}: " + ", ".join(f"{n} {v:g}" for n, v in zip(FIELDS, med)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
