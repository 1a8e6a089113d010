"""Interceptors (middleware) around every call, as Go's rpc package has them (rpc/intercept.go):
for logging, metrics, tracing, authorization. The first in a list is the outermost.

Server (``serve(..., unary_interceptors=[...], stream_interceptors=[...])``)::

    async def auth(ctx, req, next):
        if ctx.metadata.get("token") != "ok":
            raise udskit.UdskitError("permission_denied", f"{ctx.method}: no token")
        return await next(ctx, req)

    async def count(ctx, req, next):          # an async generator: wraps a server stream
        async for item in next(ctx, req):
            yield item

An interceptor sees the method, metadata, deadline and peer on ``ctx``; it refuses the call by
raising UdskitError without calling next, or calls next (with a context or request of its own if
it likes) and sees the outcome. The standard methods (udskit.health) go through them too.

Client (``connect(..., unary_interceptors=[...], stream_interceptors=[...])``)::

    async def tag(call, next):
        return await next(call.replace(metadata={**call.metadata, "x-tag": "py"}))

Without interceptors nothing here runs: the server's method table holds the registered
functions themselves and the client's call takes its direct path (tests/test_intercept.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from ._handler import Context, Method

UnaryNext = Callable[[Context, Any], Awaitable[Any]]
#: ``async def ic(ctx, request, next) -> response``
UnaryServerInterceptor = Callable[[Context, Any, UnaryNext], Awaitable[Any]]
StreamNext = Callable[[Context, Any], AsyncIterator[Any]]
#: ``async def ic(ctx, request, next)`` that yields the items (an async generator)
StreamServerInterceptor = Callable[[Context, Any, StreamNext], AsyncIterator[Any]]

__all__ = [
    "ClientCall", "UnaryNext", "StreamNext", "UnaryServerInterceptor", "StreamServerInterceptor",
    "UnaryInvoker", "StreamOpener", "SyncInvoker", "SyncClientInterceptor", "UnaryClientInterceptor", "StreamClientInterceptor",
]


@dataclass(frozen=True)
class ClientCall:
    """A call as a client interceptor sees it; ``call.replace(...)`` makes a changed one."""

    method: str
    payload: Any
    #: seconds, or None (no deadline)
    timeout: float | None
    metadata: Mapping[str, str]
    #: the server's address (the peer)
    address: str
    #: "unary", "stream" (a server stream), "bidi" or "client_stream" (the stream interceptors
    #: see these at the open; payload is then None, the requests are sent later)
    kind: str = "unary"

    def replace(self, **changes: Any) -> ClientCall:
        return dataclasses.replace(self, **changes)


UnaryInvoker = Callable[[ClientCall], Awaitable[Any]]
#: ``async def ic(call, next) -> response``
UnaryClientInterceptor = Callable[[ClientCall, UnaryInvoker], Awaitable[Any]]
SyncInvoker = Callable[[ClientCall], Any]
#: ``def ic(call, next) -> response``: the blocking client's (udskit.Client)
SyncClientInterceptor = Callable[[ClientCall, SyncInvoker], Any]
StreamOpener = Callable[[ClientCall], AsyncIterator[Any]]
#: ``async def ic(call, next)`` that yields the items (an async generator)
StreamClientInterceptor = Callable[[ClientCall, StreamOpener], AsyncIterator[Any]]


def _unary_next(ic: UnaryServerInterceptor, inner: UnaryNext) -> UnaryNext:
    def run(ctx: Context, req: Any) -> Awaitable[Any]:
        return ic(ctx, req, inner)
    return run


def _stream_next(ic: StreamServerInterceptor, inner: StreamNext) -> StreamNext:
    def run(ctx: Context, req: Any) -> AsyncIterator[Any]:
        return ic(ctx, req, inner)
    return run


def _unary_handler(m: Method) -> UnaryNext:
    fn = m.fn
    if m.kind != "sync":
        async def run_async(ctx: Context, req: Any) -> Any:
            return await fn(ctx, req)
        return run_async

    async def run_sync(ctx: Context, req: Any) -> Any:
        return fn(ctx, req)
    return run_sync


def wrap_methods(methods: dict[str, Method], unary: Sequence[UnaryServerInterceptor] | None,
                 stream: Sequence[StreamServerInterceptor] | None) -> dict[str, Method]:
    """The method table with the interceptors around each handler (made once, here), or the
    table itself when there are none. Calls that answer once (unary; client streams, whose
    request is then the request items) go through the unary interceptors; calls that answer
    with items (server streams; bidi, whose request is the request items) through the stream
    interceptors."""
    u, s = list(unary or ()), list(stream or ())
    if not u and not s:
        return methods
    out: dict[str, Method] = {}
    for name, m in methods.items():
        if m.kind in ("sync", "async", "client_stream") and u:
            nxt = _unary_handler(m)
            for ic in reversed(u):
                nxt = _unary_next(ic, nxt)

            async def unary_fn(ctx: Context, req: Any, _n: UnaryNext = nxt) -> Any:
                return await _n(ctx, req)
            # a plain function now runs as a task (kind async); a client stream stays one
            out[name] = dataclasses.replace(m, fn=unary_fn, kind="client_stream" if m.kind == "client_stream" else "async")
        elif m.kind in ("stream", "bidi") and s:
            snxt: StreamNext = m.fn
            for sic in reversed(s):
                snxt = _stream_next(sic, snxt)
            out[name] = dataclasses.replace(m, fn=snxt)
        else:
            out[name] = m
    return out


def unary_client_chain(ics: Sequence[UnaryClientInterceptor] | None, send: UnaryInvoker) -> UnaryInvoker | None:
    """The client's unary chain around send, or None without interceptors."""
    if not ics:
        return None
    nxt = send
    for ic in reversed(ics):
        def run(call: ClientCall, _ic: UnaryClientInterceptor = ic, _n: UnaryInvoker = nxt) -> Awaitable[Any]:
            return _ic(call, _n)
        nxt = run
    return nxt


def stream_client_chain(ics: Sequence[StreamClientInterceptor] | None, open: StreamOpener) -> StreamOpener | None:
    """The client's stream chain around open, or None without interceptors."""
    if not ics:
        return None
    nxt = open
    for ic in reversed(ics):
        def run(call: ClientCall, _ic: StreamClientInterceptor = ic, _n: StreamOpener = nxt) -> AsyncIterator[Any]:
            return _ic(call, _n)
        nxt = run
    return nxt


def sync_client_chain(ics: Sequence[SyncClientInterceptor] | None, send: SyncInvoker) -> SyncInvoker | None:
    """The blocking client's chain around send, or None without interceptors."""
    if not ics:
        return None
    nxt = send
    for ic in reversed(ics):
        def run(call: ClientCall, _ic: SyncClientInterceptor = ic, _n: SyncInvoker = nxt) -> Any:
            return _ic(call, _n)
        nxt = run
    return nxt
