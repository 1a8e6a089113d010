"""The soak's Python server (tools/soak, -server python): the demo methods of
udskit.demo (echo, sleep, stream, ...) and _stats, with the soak's timeouts
passed under every keyword serve() takes of those the issue asks for (the
same names as Go's where the language allows).

Usage: python3 server_python.py SOCK TIMEOUT_S   (PYTHONPATH: clients/python/src)
Prints "ready" once listening; SIGTERM drains."""

from __future__ import annotations

import asyncio
import collections
import gc
import inspect
import logging
import os
import sys
import time
from typing import Any

from udskit import demo
from udskit import _server
from udskit._server import serve


def _probe_iterations(limit: float, dest: str | None) -> None:
    """Diagnosis (UDSKIT_SOAK_ITER_MS=N, not used by the soak itself): log every
    event-loop iteration whose callbacks took more than N ms in all, with the
    callbacks that took most of it (by function, count and ms), and every
    garbage collection over 2 ms. A good client's call waits for whole
    iterations: thousands of short callbacks (task steps, resumes) add up where
    UDSKIT_SOAK_SLOW_MS, one callback at a time, sees nothing."""
    out = open(dest, "a") if dest else sys.stderr
    loop = asyncio.get_running_loop()
    spent: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()

    def name(h: asyncio.Handle) -> str:
        cb = getattr(h, "_callback", None)
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, asyncio.Task):
            return "task " + getattr(owner.get_coro(), "__qualname__", "?")
        return str(getattr(cb, "__qualname__", cb))

    run_handle = asyncio.Handle._run

    def timed_run(h: asyncio.Handle) -> None:
        k = name(h)
        t0 = time.perf_counter()
        run_handle(h)
        spent[k] += time.perf_counter() - t0
        count[k] += 1

    run_once = loop._run_once  # type: ignore[attr-defined]

    def timed_run_once() -> None:
        spent.clear()
        count.clear()
        run_once()
        total = sum(spent.values())
        if total > limit:
            top = ", ".join(f"{k} {count[k]}x {v * 1000:.1f} ms" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])[:4])
            print(f"{time.time():.3f} iteration {total * 1000:.1f} ms: {top}", file=out, flush=True)

    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        elif (d := time.perf_counter() - gc_start[0]) > 0.002:
            print(f"{time.time():.3f} gc generation {info['generation']}: {d * 1000:.1f} ms", file=out, flush=True)

    asyncio.Handle._run = timed_run  # type: ignore[method-assign, assignment]
    loop._run_once = timed_run_once  # type: ignore[attr-defined]
    gc.callbacks.append(on_gc)


#: an address range (1 MiB) with fewer small objects than this is listed by _log_memory
SPARSE = 2000


def _log_memory(dest: str) -> None:
    """Diagnosis (UDSKIT_SOAK_MEM_LOG=FILE, not used by the soak itself): at
    start and after each attack's "free", append to FILE the RSS, the most
    common GC-tracked types, the sparsely used 1 MiB address ranges with the
    objects in them (what keeps a pymalloc arena from being freed: one live
    block in any of its pools is enough) and pymalloc's own account
    (sys._debugmallocstats, which writes to fd 2: arenas allocated, reclaimed,
    current; blocks in use per size class)."""
    with open(dest, "a") as out:
        rss = 0
        with open("/proc/self/status") as st:
            for line in st:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) >> 10
        objs = gc.get_objects()
        types = collections.Counter(type(o).__qualname__ for o in objs)
        print(f"\n=== {time.time():.3f} RSS {rss} MiB, {sum(types.values())} GC-tracked objects: {types.most_common(12)}", file=out, flush=True)
        # Who pins pymalloc's 1 MiB arenas: every object reachable from the GC's
        # list (and its untracked referents) of at most 512 bytes, bucketed by
        # address >> 20; the sparsely used buckets, with what is in them.
        seen: dict[int, Any] = {}
        for o in objs:
            seen[id(o)] = o
            for r in gc.get_referents(o):
                if not gc.is_tracked(r):
                    seen.setdefault(id(r), r)
        buckets: dict[int, list[Any]] = collections.defaultdict(list)
        for a, o in seen.items():
            try:
                small = sys.getsizeof(o) <= 512
            except Exception:
                small = False
            if small:
                buckets[a >> 20].append(o)
        print(f"{len(buckets)} MiB-buckets with small objects; the sparse ones:", file=out)
        for b, os_ in sorted(buckets.items()):
            if len(os_) < SPARSE:
                kinds = collections.Counter(type(o).__qualname__ for o in os_)
                print(f"  {b:#x}: {len(os_)} {kinds.most_common(6)}", file=out)
                for o in os_[:4]:
                    print("     ", type(o).__qualname__, repr(o)[:120], file=out)
        del objs, seen, buckets
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


async def main(sock: str, t: float) -> int:
    handlers: dict[str, Any] = dict(demo.handlers())
    mem_log = os.environ.get("UDSKIT_SOAK_MEM_LOG")

    def stats(ctx: Any, req: Any) -> Any:
        if isinstance(req, dict) and req.get("free"):
            # What the Go server's _stats does with debug.FreeOSMemory: collect,
            # then give the C heap's free pages back (glibc's malloc_trim).
            gc.collect()
            _server._malloc_trim()
            if mem_log:
                _log_memory(mem_log)
        return {"goroutines": len(asyncio.all_tasks()), "conns": -1}

    handlers["_stats"] = stats
    params = inspect.signature(serve).parameters
    # (Any: the keywords are only those serve() takes, all timeouts in seconds)
    opts: dict[str, Any] = {k: t for k in ("hello_timeout", "handshake_timeout", "frame_timeout", "stall_timeout", "write_timeout", "idle_timeout") if k in params}
    srv = await serve(sock, handlers, **opts)
    slow = os.environ.get("UDSKIT_SOAK_SLOW_MS")
    if slow:
        # Diagnosis (not used by the soak itself): log every event-loop
        # callback that ran longer than this many ms, with what it was, to
        # UDSKIT_SOAK_SLOW_LOG (default: stderr, the soak's server log).
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = float(slow) / 1000
        dest = os.environ.get("UDSKIT_SOAK_SLOW_LOG")
        h: logging.Handler = logging.FileHandler(dest) if dest else logging.StreamHandler()
        logging.getLogger("asyncio").addHandler(h)
        logging.getLogger("asyncio").setLevel(logging.WARNING)
    iter_ms = os.environ.get("UDSKIT_SOAK_ITER_MS")
    if iter_ms:
        _probe_iterations(float(iter_ms) / 1000, os.environ.get("UDSKIT_SOAK_SLOW_LOG"))
    if mem_log:
        gc.collect()
        _log_memory(mem_log)
    print("ready", flush=True)
    print(f"soak python server: timeouts set: {sorted(opts) or 'none (serve() takes none)'}", file=sys.stderr, flush=True)
    await srv.serve_forever(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], float(sys.argv[2]))))
