"""The soak's Python server (tools/soak, -server python): the demo methods of
udskit.demo (echo, sleep, stream, ...) and _stats, with the soak's timeouts
passed under every keyword serve() takes of those the issue asks for (the
same names as Go's where the language allows).

Usage: python3 server_python.py SOCK TIMEOUT_S   (PYTHONPATH: clients/python/src)
Prints "ready" once listening; SIGTERM drains."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import sys
from typing import Any

from udskit import demo
from udskit import _server
from udskit._server import serve


async def main(sock: str, t: float) -> int:
    handlers: dict[str, Any] = dict(demo.handlers())

    def stats(ctx: Any, req: Any) -> Any:
        if isinstance(req, dict) and req.get("free"):
            # What the Go server's _stats does with debug.FreeOSMemory: collect,
            # then give the C heap's free pages back (glibc's malloc_trim).
            gc.collect()
            _server._malloc_trim()
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
    print("ready", flush=True)
    print(f"soak python server: timeouts set: {sorted(opts) or 'none (serve() takes none)'}", file=sys.stderr, flush=True)
    await srv.serve_forever(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], float(sys.argv[2]))))
