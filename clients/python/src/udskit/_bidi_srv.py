"""Client-streaming and bidirectional calls on the server (protocol/spec.md 4.3).

A handler is marked with ``udskit.bidi`` (an async generator
``async def h(ctx, requests)`` that yields the responses: stream_data each,
stream_end when it returns) or ``udskit.client_stream`` (a coroutine
``async def h(ctx, requests)`` whose return value is the one response).
``requests`` is an async iterator of the client's items (JSON values, or
bytes for a handler also marked ``udskit.raw``); it ends at the client's
request_end (or its EOF); cancel, the deadline and the connection's loss
cancel the handler's task.

Flow control (spec 4.3): each call's client starts with 1 MiB of request
credit; the items it sends wait in the call's queue until the handler takes
them, and what the handler took is granted back (request_credit) once half
the initial credit was taken since the last grant. A client that sends more
than granted + 1 MiB + max frame + 16 bytes of items is a protocol
violation, so a call never queues more than that: a handler that stops
reading stalls only its own call. Queued items count in the server's total
budget (Server.held), not the connection's own (as in Go), so one stalled
call does not stop its connection from being read.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import math
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, TypeVar

from ._conn import Call
from ._errors import INVALID_ARGUMENT, UNIMPLEMENTED, ProtocolError, UdskitError
from ._handler import Context, Method
from ._wire import FLAG_CLIENT_STREAM, FLAG_STREAM, HEADER, HEADER_SIZE, INITIAL_STREAM_CREDIT, T_REQUEST_CREDIT

if TYPE_CHECKING:
    from ._conn import ServerConn
    from ._framed import FramedSession

#: the method kinds whose calls carry request items
CLIENT_KINDS = frozenset({"bidi", "client_stream"})
#: request credit is granted back once the handler has taken this much since the last grant
GRANT_AT = INITIAL_STREAM_CREDIT // 2

F = TypeVar("F", bound=Callable[..., Any])

_pack = HEADER.pack


def bidi(fn: F) -> F:
    """Marks an async generator ``async def h(ctx, requests)`` as a bidirectional
    method: ``requests`` iterates the client's items, each yield is one response
    item. Combine with ``udskit.raw`` for bytes both ways."""
    if not inspect.isasyncgenfunction(fn):
        raise TypeError(f"udskit.bidi: {getattr(fn, '__name__', fn)!r} must be an async generator function (async def with yield)")
    fn.__udskit_kind__ = "bidi"  # type: ignore[attr-defined]
    return fn


def client_stream(fn: F) -> F:
    """Marks a coroutine ``async def h(ctx, requests)`` as a client-streaming
    method: ``requests`` iterates the client's items, the return value is the
    one response. Combine with ``udskit.raw`` for bytes both ways."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"udskit.client_stream: {getattr(fn, '__name__', fn)!r} must be an async def function returning the response")
    fn.__udskit_kind__ = "client_stream"  # type: ignore[attr-defined]
    return fn


def kind_name(kind: str) -> str:
    """A method kind in udskit.methods' words."""
    return kind if kind in ("stream", "bidi", "client_stream") else "unary"


_WORDS = {
    "unary": ("unary", "call()"),
    "stream": ("server-streaming", "stream()"),
    "bidi": ("a bidirectional stream", "bidi()"),
    "client_stream": ("a client stream", "client_stream()"),
}


def _kind_of_flags(flags: int) -> str:
    if flags & FLAG_CLIENT_STREAM:
        return "bidi" if flags & FLAG_STREAM else "client_stream"
    return "stream" if flags & FLAG_STREAM else "unary"


def mismatch_message(method: str, have: str, opened: str) -> str:
    if have == "unary":
        return f'method "{method}" is unary; call it with call(), not {_WORDS[opened][1]}'
    if have == "stream":
        # the Go server's words: `udskit call` looks for "server-streaming"
        return f'method "{method}" is server-streaming; call it with Stream'
    what, how = _WORDS[have]
    return f'method "{method}" is {what}; open it with {how}'


def ndjson_message(method: str, kind: str) -> str:
    what = "a bidirectional stream" if kind == "bidi" else "a client stream"
    return f'method "{method}" is {what}; NDJSON has no streams: use a udskit client'


class BidiCall(Call):
    """A client-stream call's server side: the request items not yet taken by its handler."""

    __slots__ = ("raw", "method", "items", "waiter", "ended", "received", "granted", "consumed", "queued")

    def __init__(self, conn: ServerConn, id: int, raw: bool, method: str) -> None:
        super().__init__(0)
        self.conn = conn
        self.id = id
        self.raw = raw
        self.method = method
        self.items: collections.deque[bytes] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.ended = False  # request_end (or the client's EOF) arrived
        self.received = 0  # item costs (payload + 16) received
        self.granted = INITIAL_STREAM_CREDIT  # credit given in all, the initial included
        self.consumed = 0  # item costs taken by the handler since the last grant
        self.queued = 0  # payload bytes queued (counted in the server's total)

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def push(self, payload: bytes) -> None:
        if self.ended:
            raise ProtocolError("protocol_violation", f"request_data after request_end on call {self.id}")
        self.received += len(payload) + HEADER_SIZE
        limit = self.granted + INITIAL_STREAM_CREDIT + self.conn.server.max_frame + HEADER_SIZE
        if self.received > limit:
            raise ProtocolError("protocol_violation", f"client sent {self.received} bytes of request items on call {self.id}, over the {self.granted} granted")
        self.items.append(payload)
        n = len(payload)
        self.queued += n
        self.conn.server.held += n
        self.wake()

    def end(self) -> None:
        self.ended = True
        self.wake()

    def take(self) -> bytes:
        b = self.items.popleft()
        n = len(b)
        self.queued -= n
        conn = self.conn
        conn.server.held -= n
        self.consumed += n + HEADER_SIZE
        if self.consumed >= GRANT_AT and not self.ended and not self.detached and not conn.closed:
            g = self.consumed
            self.consumed = 0
            self.granted += g
            conn.write(_pack(T_REQUEST_CREDIT, 0, 0, self.id, 0, g))
        return b

    def release(self) -> None:
        """The call ended: its queued items are dropped."""
        if self.queued:
            self.conn.server.held -= self.queued
            self.queued = 0
        self.items.clear()
        self.ended = True


class Requests:
    """The client's request items, as a handler iterates them: ``async for x in
    requests`` (JSON values, or bytes for a raw handler); or ``await
    requests.recv()``, which raises StopAsyncIteration at the end."""

    __slots__ = ("_c",)

    def __init__(self, c: BidiCall) -> None:
        self._c = c

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        c = self._c
        while not c.items:
            if c.ended:
                raise StopAsyncIteration
            w = c.waiter = c.conn.loop.create_future()
            try:
                await w
            finally:
                c.waiter = None
        b = c.take()
        if c.raw:
            return b
        if not b:
            return None
        try:
            return json.loads(b)
        except RecursionError:
            raise UdskitError(INVALID_ARGUMENT, f"{c.method}: request item JSON is nested too deeply") from None
        except ValueError as e:
            raise UdskitError(INVALID_ARGUMENT, f"{c.method}: request item is not JSON: {e}") from None

    async def recv(self) -> Any:
        return await self.__anext__()


# --- the framed session's hooks ----------------------------------------------


def open_call(s: FramedSession, flags: int, id: int, aux: int, method: str, md: dict[str, str], payload: bytes, m: Method | None) -> None:
    """A request that opens a client-stream call, or one for a method of such a kind."""
    conn = s.conn
    if flags & FLAG_CLIENT_STREAM and payload:
        raise ProtocolError("protocol_violation", f"client-stream request {id} carries a {len(payload)}-byte payload; it must be empty")
    if m is None:
        s.error(id, UNIMPLEMENTED, f'unknown method "{method}"')
        return
    opened, have = _kind_of_flags(flags), kind_name(m.kind)
    if opened != have:
        s.error(id, UNIMPLEMENTED, mismatch_message(method, have, opened))
        return
    loop = conn.loop
    deadline = loop.time() + aux / 1e6 if aux else None
    ctx = Context(method, conn.peer, md, deadline, loop)
    c = BidiCall(conn, id, m.raw, method)
    conn.add_call(id, c)
    reqs = Requests(c)
    if have == "bidi":
        c.credit_ev = asyncio.Event()
        c.task = loop.create_task(_run_bidi(s, id, c, m, ctx, reqs))
    else:
        c.task = loop.create_task(_run_client_stream(conn, id, c, m, ctx, reqs))
    if deadline is not None:
        conn.set_deadline(c, deadline)


async def _run_bidi(s: FramedSession, id: int, c: BidiCall, m: Method, ctx: Context, reqs: Requests) -> None:
    try:
        await s._run_stream(id, c, m, ctx, reqs)
    finally:
        c.release()


async def _run_client_stream(conn: ServerConn, id: int, c: BidiCall, m: Method, ctx: Context, reqs: Requests) -> None:
    try:
        await conn.run(id, c, m, ctx, reqs)
    finally:
        c.release()


def _client_call(conn: ServerConn, id: int, what: str) -> BidiCall | None:
    c = conn.calls.get(id)
    if c is None:
        return None  # the call ended (or never was): the frame raced with its end
    if not isinstance(c, BidiCall):
        raise ProtocolError("protocol_violation", f"{what} for call {id}, which was not opened as a client stream")
    return c


def on_request_data(conn: ServerConn, id: int, payload: bytes) -> None:
    c = _client_call(conn, id, "request_data")
    if c is not None:
        c.push(payload)


def on_request_end(conn: ServerConn, id: int) -> None:
    c = _client_call(conn, id, "request_end")
    if c is not None:
        if c.ended:
            raise ProtocolError("protocol_violation", f"a second request_end on call {id}")
        c.end()


def on_eof(conn: ServerConn) -> None:
    """The client shut down its sending side: no more items on any call (spec 4.3)."""
    for c in list(conn.calls.values()):
        if isinstance(c, BidiCall) and not c.ended:
            c.end()


def sum_handler() -> Callable[..., Any]:
    """The demo method ``sum`` (JSON, bidi): answers each number with the running total."""

    @bidi
    async def sum(ctx: Context, requests: Requests) -> AsyncIterator[Any]:
        total: int | float = 0
        async for n in requests:
            total += _number("sum", n)
            yield shortest(total)

    return sum


def total_handler() -> Callable[..., Any]:
    """The demo method ``total`` (JSON, client-streaming): the sum of the numbers, once at the end."""

    @client_stream
    async def total(ctx: Context, requests: Requests) -> Any:
        t: int | float = 0
        async for n in requests:
            t += _number("total", n)
        return shortest(t)

    return total


def _number(method: str, n: Any) -> int | float:
    if not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n):
        raise UdskitError(INVALID_ARGUMENT, f"{method}: item {json.dumps(n)[:64]} is not a JSON number")
    return n


def shortest(x: int | float) -> int | float:
    """A number as JSON's shortest form would print it: 3.0 as 3 (as Go and Node do)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**53:
        return int(x)
    return x
