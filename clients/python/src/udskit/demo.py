"""The demo methods of ``udskit serve`` (Go package demo), in Python: echo,
sleep, fail, stream, whoami, sum (bidirectional: each JSON number in, the
running total out) and total (client-streaming: JSON numbers in, their sum
out once at the end). ``python -m udskit.demo ADDR [--allow-uid N]``
serves them (prints "listening on ADDR" when ready; SIGTERM drains)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, AsyncIterator

from ._bidi_srv import sum_handler, total_handler
from ._errors import CODES, UdskitError
from ._server import Context, Handler, allow_uids, raw, serve

MAX_SLEEP_MS = 60000
MAX_STREAM = 100000
MAX_INTERVAL_MS = 10000


def _obj(method: str, req: Any) -> dict[str, Any]:
    if req is None:
        return {}
    if not isinstance(req, dict):
        raise UdskitError("invalid_argument", f"{method}: request is not the expected JSON object")
    return req


def _int(method: str, d: dict[str, Any], key: str, hi: int) -> int:
    v = d.get(key, 0)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= hi:
        raise UdskitError("invalid_argument", f"{method}: {key} {v!r} out of range 0..{hi}")
    return v


@raw
def echo(ctx: Context, req: bytes) -> bytes:
    return req


async def sleep(ctx: Context, req: Any) -> Any:
    ms = _int("sleep", _obj("sleep", req), "ms", MAX_SLEEP_MS)
    await asyncio.sleep(ms / 1000)
    return {"slept_ms": ms}


def fail(ctx: Context, req: Any) -> Any:
    d = _obj("fail", req)
    code: Any = d.get("code") or "failed_precondition"
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if (isinstance(code, str) and code not in CODES) or code in ("ok", 0) or not isinstance(code, (str, int)):
        raise UdskitError("invalid_argument", f"fail: unknown or ok code {code!r}")
    raise UdskitError(code, d.get("message") or "fail always fails (that is its job)")


async def stream(ctx: Context, req: Any) -> AsyncIterator[Any]:
    d = _obj("stream", req)
    n = _int("stream", d, "n", MAX_STREAM)
    iv = _int("stream", d, "interval_ms", MAX_INTERVAL_MS)
    for i in range(n):
        if i and iv:
            await asyncio.sleep(iv / 1000)
        yield {"i": i, "n": n}


def whoami(ctx: Context, req: Any) -> Any:
    p = ctx.peer
    if p is not None and p.cred is not None:
        return {"pid": p.cred.pid, "uid": p.cred.uid, "gid": p.cred.gid}
    if p is not None and p.remote is not None:
        r = p.remote
        out: dict[str, Any] = {"subject": r.subject}  # the fields of Go's demo.RemoteWhoAmI
        if r.spiffe_id:
            out["spiffe_id"] = r.spiffe_id
        if r.dns_names:
            out["dns_names"] = list(r.dns_names)
        if r.uris:
            out["uris"] = list(r.uris)
        return out
    raise UdskitError("failed_precondition", "whoami: the caller has no identity: it is not on a unix socket (kernel credentials) nor a mutual tls: connection")


def handlers() -> dict[str, Handler]:
    return {"echo": echo, "sleep": sleep, "fail": fail, "stream": stream, "whoami": whoami, "sum": sum_handler(), "total": total_handler()}


async def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m udskit.demo", description=__doc__)
    p.add_argument("addr")
    p.add_argument("--mode", default="0600", help="socket file mode (octal)")
    p.add_argument("--allow-uid", action="append", type=int, default=[], help="only admit peers with this uid")
    p.add_argument("--drain", choices=("goaway", "linger"), default="goaway", help="drain mode on SIGTERM (a second one cuts)")
    p.add_argument("--drain-min-grace", type=float, default=0.0, help="linger: serve at least this long (seconds)")
    p.add_argument("--drain-timeout", "--grace", type=float, default=10.0, help="drain deadline (seconds)")
    a = p.parse_args(argv)
    policy = allow_uids(a.allow_uid) if a.allow_uid else None
    srv = await serve(a.addr, handlers(), mode=int(a.mode, 8), policy=policy)
    print(f"listening on {srv.addr}", flush=True)
    await srv.serve_forever(grace=a.drain_timeout, mode=a.drain, min_grace=a.drain_min_grace)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
