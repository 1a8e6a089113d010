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


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of a connection, one model for local and remote peers:
    a local process (``cred``: pid/uid/gid from the kernel, SO_PEERCRED, on a unix
    socket) or a remote workload (``remote``: its verified X.509 certificate on a tls:
    listener: subject, DNS and URI SANs, the SPIFFE ID). Go's rpc.PeerFromContext
    and Node's ctx.peer carry the same."""

    cred: PeerCred | None = None
    remote: RemotePeer | None = None

    @property
    def is_local(self) -> bool:
        return self.cred is not None

    @property
    def is_remote(self) -> bool:
        return self.remote is not None

    # A local peer's kernel credentials (None for a remote peer): code written
    # for the PeerCred that ctx.peer used to be keeps reading ctx.peer.uid.
    @property
    def pid(self) -> int | None:
        return None if self.cred is None else self.cred.pid

    @property
    def uid(self) -> int | None:
        return None if self.cred is None else self.cred.uid

    @property
    def gid(self) -> int | None:
        return None if self.cred is None else self.cred.gid

    # A remote peer's certificate identity (None / empty for a local peer).
    @property
    def spiffe_id(self) -> str | None:
        return None if self.remote is None else self.remote.spiffe_id

    @property
    def subject(self) -> str | None:
        return None if self.remote is None else self.remote.subject

    @property
    def dns_names(self) -> tuple[str, ...]:
        return () if self.remote is None else self.remote.dns_names

    @property
    def uris(self) -> tuple[str, ...]:
        return () if self.remote is None else self.remote.uris

    def __str__(self) -> str:
        if self.cred is not None:
            return f"pid={self.cred.pid} uid={self.cred.uid} gid={self.cred.gid}"
        if self.remote is not None:
            return self.remote.spiffe_id or self.remote.subject or "remote peer"
        return "unknown peer"


#: A policy on kernel credentials (``allow_uids``, ``allow_same_user`` or your own
#: ``callable(cred) -> bool``). A server calls it with a Peer, whose pid/uid/gid are
#: those of a local peer (None for a remote one); the built-in policies take either.
Policy = Callable[[PeerCred], bool]
#: A policy on any peer, local or remote: ``allow_spiffe``, ``allow_dns``,
#: ``allow_any_verified``, ``any_peer``/``all_peers`` of other policies.
PeerPolicy = Callable[[Peer], bool]


def _cred(p: PeerCred | Peer) -> PeerCred | None:
    return p.cred if isinstance(p, Peer) else p


def _name(f: Callable[..., Any]) -> str:
    return getattr(f, "__name__", "policy")


def allow_uids(*uids: int | Iterable[int]) -> Callable[[PeerCred | Peer], bool]:
    """A policy admitting peers whose uid is listed: allow_uids(0, 1000) or allow_uids([0])."""
    allowed: set[int] = set()
    for u in uids:
        if isinstance(u, int):
            allowed.add(u)
        else:
            allowed.update(u)
    frozen = frozenset(allowed)

    def policy(p: PeerCred | Peer) -> bool:
        c = _cred(p)
        return c is not None and c.uid in frozen

    policy.__name__ = f"allow_uids({sorted(frozen)})"
    return policy


def allow_same_user() -> Callable[[PeerCred | Peer], bool]:
    """A policy admitting local peers running as this process's effective uid."""
    me = os.geteuid()

    def policy(p: PeerCred | Peer) -> bool:
        c = _cred(p)
        return c is not None and c.uid == me

    policy.__name__ = f"allow_same_user(uid {me})"
    return policy


def allow_spiffe(*ids: str) -> PeerPolicy:
    """Remote peers whose verified certificate carries one of these SPIFFE IDs; an ID ending
    in "/*" admits every ID under it (``spiffe://prod.example/*``: the trust domain)."""
    for i in ids:
        if not i.startswith("spiffe://"):
            raise ValueError(f"allow_spiffe: {i!r} is not a SPIFFE ID (spiffe://trust-domain/path)")
    exact = frozenset(i for i in ids if not i.endswith("/*"))
    prefixes = tuple(i[:-1] for i in ids if i.endswith("/*"))

    def policy(p: Peer) -> bool:
        sid = p.spiffe_id if isinstance(p, Peer) else None
        return sid is not None and (sid in exact or sid.startswith(prefixes))

    policy.__name__ = f"allow_spiffe({list(ids)})"
    return policy


def allow_dns(*names: str) -> PeerPolicy:
    """Remote peers whose verified certificate has one of these DNS SANs."""
    want = frozenset(names)

    def policy(p: Peer) -> bool:
        return isinstance(p, Peer) and any(n in want for n in p.dns_names)

    policy.__name__ = f"allow_dns({sorted(want)})"
    return policy


def allow_any_verified() -> PeerPolicy:
    """Any remote peer with a certificate that chains to the server's CA bundle."""

    def policy(p: Peer) -> bool:
        return isinstance(p, Peer) and p.remote is not None

    policy.__name__ = "allow_any_verified()"
    return policy


def any_peer(*policies: Callable[[Any], bool]) -> PeerPolicy:
    """Admits a peer any of policies admits: ``any_peer(allow_uids(1000),
    allow_spiffe("spiffe://prod.example/ns/app/sa/web"))`` is uid 1000 locally OR that
    workload remotely, the same policy object on a unix and a tls: listener."""

    def policy(p: Peer) -> bool:
        return any(f(p) for f in policies)

    policy.__name__ = "any_peer(" + ", ".join(_name(f) for f in policies) + ")"
    return policy


def all_peers(*policies: Callable[[Any], bool]) -> PeerPolicy:
    """Admits a peer every one of policies admits (none: everyone)."""

    def policy(p: Peer) -> bool:
        return all(f(p) for f in policies)

    policy.__name__ = "all_peers(" + ", ".join(_name(f) for f in policies) + ")"
    return policy


class Context:
    """What a handler knows about its call."""

    __slots__ = ("method", "peer", "metadata", "deadline", "response_metadata", "_loop")

    def __init__(
        self, method: str, peer: Peer | None, metadata: dict[str, str], deadline: float | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.method = method
        #: the caller: a local process (peer.cred, peer.uid...) on a unix socket, a remote
        #: workload (peer.remote, peer.spiffe_id...) on a tls: listener; None over plain TCP
        #: (or a unix socket where the platform reports no credentials)
        self.peer = peer
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
    def cred(self) -> PeerCred | None:
        """The caller's kernel credentials (SO_PEERCRED) when it is a local process, else None."""
        return None if self.peer is None else self.peer.cred

    @property
    def remote(self) -> RemotePeer | None:
        """Deprecated: use ctx.peer (ctx.peer.remote, ctx.peer.spiffe_id). The caller's verified
        certificate identity on a tls: listener, else None."""
        return None if self.peer is None else self.peer.remote

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
    kind: str  # "sync", "async", "stream", "bidi", "client_stream"
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
        marked = getattr(fn, "__udskit_kind__", None)  # udskit.bidi, udskit.client_stream
        if isinstance(marked, str):
            kind = marked
        elif inspect.isasyncgenfunction(fn):
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
        what = "stream handler {} yielded" if m.kind in ("stream", "bidi") else "handler {} returned"
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


