"""What handlers see and are: Context, PeerCred, peer policies, and the
method table a server dispatches on (shared by the framed and NDJSON
connection code)."""

from __future__ import annotations

import asyncio
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from ._common import encode_payload
from ._errors import INTERNAL, UNKNOWN, UdskitError
from ._tls import RemotePeer
from ._wire import MAX_HEAD, encode_metadata, reserved_key, reserved_key_message
from .tracecontext import TraceContext, trace_from_metadata

#: method names starting with this are the protocol's standard methods
#: (udskit.health, ...): built into every server, not registrable.
STANDARD_PREFIX = "udskit."


class PeerCred(NamedTuple):
    """The peer's credentials as the kernel reported them at connect (SO_PEERCRED)."""

    pid: int
    uid: int
    gid: int


Policy = Callable[[PeerCred], bool]


def allow_uids(*uids: int | Iterable[int]) -> Policy:
    """A policy admitting peers whose uid is listed: allow_uids(0, 1000) or allow_uids([0])."""
    allowed: set[int] = set()
    for u in uids:
        if isinstance(u, int):
            allowed.add(u)
        else:
            allowed.update(u)
    frozen = frozenset(allowed)

    def policy(cred: PeerCred) -> bool:
        return cred.uid in frozen

    policy.__name__ = f"allow_uids({sorted(frozen)})"
    return policy


def allow_same_user() -> Policy:
    """A policy admitting peers running as this process's effective uid."""
    me = os.geteuid()

    def policy(cred: PeerCred) -> bool:
        return cred.uid == me

    policy.__name__ = f"allow_same_user(uid {me})"
    return policy


class Context:
    """What a handler knows about its call."""

    __slots__ = ("method", "peer", "remote", "metadata", "deadline", "response_metadata", "_loop")

    def __init__(
        self, method: str, peer: PeerCred | None, metadata: dict[str, str], deadline: float | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.method = method
        #: SO_PEERCRED of the connection (None over TCP and TLS).
        self.peer = peer
        #: on a tls: listener, the caller's verified certificate identity (SPIFFE ID, names); else None.
        self.remote: RemotePeer | None = None
        #: request metadata (the last value of a repeated key wins; keys reserved
        #: for the protocol, starting with ':', are not here)
        self.metadata = metadata
        #: the caller's deadline in loop.time() terms, or None
        self.deadline = deadline
        #: metadata sent back with a response or stream end (a key starting with
        #: ':' is reserved: the call is answered with an internal error instead)
        self.response_metadata: dict[str, str] = {}
        self._loop = loop

    @property
    def trace(self) -> TraceContext | None:
        """The W3C trace context the caller sent (traceparent/tracestate metadata), or None.
        Pass it on: ``await client.call(method, req, trace=ctx.trace)`` sends a child of it."""
        return trace_from_metadata(self.metadata)

    def time_remaining(self) -> float | None:
        """Seconds left until the caller's deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - self._loop.time()


Handler = Callable[[Context, Any], Any]


def raw(fn: Handler) -> Handler:
    """Marks a handler as raw: it gets the request bytes and returns bytes."""
    fn.__udskit_raw__ = True  # type: ignore[attr-defined]
    return fn


@dataclass(frozen=True)
class Method:
    fn: Handler
    kind: str  # "sync", "async", "stream"
    raw: bool


def methods_of(handlers: Mapping[str, Handler], standard: Mapping[str, Handler] | None = None) -> dict[str, Method]:
    """The method table: handlers by name, plus the standard methods (whose
    names, starting with "udskit.", an application may not register)."""
    out = {}
    for name, fn in handlers.items():
        if not name or len(name.encode()) > MAX_HEAD - 2:
            raise ValueError(f"method name {name!r}: want 1..{MAX_HEAD - 2} bytes")
        if name.startswith(STANDARD_PREFIX):
            raise ValueError(f"method name {name!r}: names starting with {STANDARD_PREFIX!r} are reserved for the standard methods")
        if inspect.isasyncgenfunction(fn):
            kind = "stream"
        elif inspect.iscoroutinefunction(fn):
            kind = "async"
        else:
            kind = "sync"
        out[name] = Method(fn, kind, bool(getattr(fn, "__udskit_raw__", False)))
    for name, fn in (standard or {}).items():
        out[name] = Method(fn, "sync", False)
    return out


def body_of(m: Method, ctx: Context, out: Any) -> bytes:
    """What a handler returned (or a stream handler yielded) as the bytes to send:
    JSON for a JSON handler (None: empty), the bytes themselves for a raw one."""
    if not m.raw:
        return encode_payload(out)[0]
    if not isinstance(out, (bytes, bytearray, memoryview)):
        what = "stream handler {} yielded" if m.kind == "stream" else "handler {} returned"
        raise UdskitError(INTERNAL, f"raw {what.format(ctx.method)} {type(out).__name__}, not bytes")
    return bytes(out)


def answer_head(ctx: Context) -> bytes:
    """The head of a response or stream end: the handler's response metadata.
    A key reserved for the protocol is an internal error (spec 3.1)."""
    md = ctx.response_metadata
    if not md:
        return b""
    k = reserved_key(md)
    if k is not None:
        raise UdskitError(INTERNAL, f"handler {ctx.method} answered with {reserved_key_message(k)}")
    return encode_metadata(md)


def error_of(e: BaseException) -> tuple[int, str, bytes]:
    if isinstance(e, UdskitError):
        return e.number, e.message, e.details
    return UNKNOWN, f"{type(e).__name__}: {e}", b""


