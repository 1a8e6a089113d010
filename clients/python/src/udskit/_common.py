"""Pieces both clients (async and sync) share: payload codecs, error frames,
deadlines, dialing, backoff and stream-credit accounting."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import socket
import time
from typing import Any, Generic, Protocol, TypeVar, Union

from ._addr import Address, split_ssh
from ._ssh import Forward, SSHConfig, ssh_forward
from ._tls import TLSConfig, check_spiffe, explain_tls
from ._errors import DEADLINE_EXCEEDED, PROTOCOL_VIOLATION, RESOURCE_EXHAUSTED, UNAVAILABLE, ProtocolError, UdskitError
from ._wire import (
    FLAG_REFUSED,
    HEADER,
    HEADER_SIZE,
    INITIAL_STREAM_CREDIT,
    T_CANCEL,
    T_ERROR,
    T_GOAWAY,
    T_PING,
    T_PONG,
    T_REQUEST,
    T_REQUEST_CREDIT,
    T_REQUEST_DATA,
    T_REQUEST_END,
    T_RESPONSE,
    T_STREAM_CREDIT,
    T_STREAM_DATA,
    T_STREAM_END,
    app_metadata,
    iter_metadata,
)

JSON = Any
Payload = Union[bytes, bytearray, memoryview, JSON]

MAX_AUX_TIMEOUT_US = 0xFFFFFFFF
MIN_BACKOFF = 0.010
MAX_BACKOFF = 1.0
HANDSHAKE_TIMEOUT = 10.0
WAITABLE_ERRNOS = frozenset({2, 111, 11})  # ENOENT, ECONNREFUSED, EAGAIN (backlog full)
# Grant credit back once this much of a stream was consumed (spec 4.1: half the initial credit).
CREDIT_GRANT_AT = INITIAL_STREAM_CREDIT // 2
# Payloads from this size are written apart from their frame header, not concatenated to it.
BIG_PAYLOAD = 64 << 10

#: compact JSON text (str) of a value, as every udskit peer writes it
json_text = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_loads = json.loads


def encode_payload(payload: Payload) -> tuple[bytes, bool]:
    """Returns the request bytes and whether the call is raw (bytes in, bytes out)."""
    if isinstance(payload, bytes):
        return payload, True
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload), True
    if payload is None:
        return b"", False
    return json_text(payload).encode(), False


def decode_payload(b: bytes, raw: bool) -> Any:
    if raw:
        return b
    if not b:
        return None
    try:
        return _loads(b)
    except ValueError as e:
        raise UdskitError("invalid_argument", f"response is not JSON ({e}); call with bytes for a raw response") from None


def timeout_aux(remaining: float | None) -> int:
    """A request's aux: the remaining time in µs, rounded up; 0 for none or too long."""
    if remaining is None:
        return 0
    us = math.ceil(remaining * 1e6)
    if us > MAX_AUX_TIMEOUT_US:
        return 0
    return max(us, 1)


def error_from_frame(flags: int, aux: int, head: bytes, payload: bytes) -> UdskitError:
    msg = head.decode("utf-8", "replace")
    return UdskitError(aux, msg, refused=bool(flags & FLAG_REFUSED), details=payload)


def arm(sock: Any, until: float) -> None:
    """Gives sock's next blocking step what is left until the absolute time until
    (time.monotonic()), raising socket.timeout once nothing is. A socket timeout is
    per call and restarts with every recv: re-armed before each one, a handshake
    keeps one deadline however its peer dribbles the bytes (a hello sent a byte
    every 0.15 s held a 0.5 s connect for 2.4 s, and it succeeded)."""
    left = until - time.monotonic()
    if left <= 0:
        raise socket.timeout("timed out")
    sock.settimeout(left)


def deadline_error(what: str = "deadline exceeded") -> UdskitError:
    return UdskitError(DEADLINE_EXCEEDED, what)


def too_large_error(n: int, max_frame: int) -> UdskitError:
    """A request body over the connection's max frame: refused before sending
    (the server would close the whole connection for it)."""
    return UdskitError(RESOURCE_EXHAUSTED, f"request of {n} bytes is over the connection's max frame {max_frame}")


def lost_error(why: str) -> UdskitError:
    return UdskitError(UNAVAILABLE, f"connection lost: {why}")


def parse_md(head: bytes) -> dict[str, str]:
    """Response or stream-end metadata as the application sees it: reserved keys
    (':pad', or any other starting with ':') dropped (spec 3.1)."""
    return app_metadata(iter_metadata(head)) if head else {}


class Backoff:
    """Capped exponential backoff with jitter for dialing: each delay is drawn
    from [b/2, b], b doubling from min_backoff up to max_backoff."""

    def __init__(self, min_backoff: float = MIN_BACKOFF, max_backoff: float = MAX_BACKOFF) -> None:
        self.b = min_backoff
        self.max = max_backoff

    def next(self) -> float:
        b = self.b
        self.b = min(2 * b, self.max)
        return b / 2 + random.random() * b / 2

    def after(self, e: UdskitError, now: float, deadline: float | None) -> float:
        """The delay before dialing again after e while waiting for a server; raises e
        when it is not a wait-able error (the socket is missing, refuses or its backlog
        is full) and deadline_exceeded when the deadline is (all but) reached. The delay
        is at most half of what is left: the server may come meanwhile and the attempt
        after it needs time too (a whole backoff that would cross the deadline gave up
        that early: up to max_backoff, 1 s, before it)."""
        c = e.__cause__
        if not (isinstance(c, OSError) and c.errno in WAITABLE_ERRNOS):
            raise e
        d = self.next()
        if deadline is not None:
            d = min(d, (deadline - now) / 2)
            if d < 0.005:
                raise UdskitError("deadline_exceeded", f"{e.message}; gave up waiting") from c
        return d


def new_socket(addr: Address) -> socket.socket:
    if addr.kind == "tcp":
        host = addr.host_port()[0]
        fam = socket.AF_INET6 if ":" in str(host) else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s
    return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)


async def open_connection(
    loop: asyncio.AbstractEventLoop, addr: Address, protocol: asyncio.Protocol, tls: TLSConfig | None = None, ssh: SSHConfig | None = None
) -> None:
    """Connects to addr and runs protocol on the connection. A failed connect
    raises connect_error's UdskitError (its __cause__ the OSError)."""
    if addr.kind == "tls":
        await _open_tls(loop, addr, protocol, tls)
        return
    if addr.kind == "ssh":
        await _open_ssh(loop, addr, protocol, ssh or SSHConfig())
        return
    sock = new_socket(addr)
    try:
        sock.setblocking(False)
        if sock.family == socket.AF_UNIX:
            await _unix_connect(sock, addr.sockaddr())
        else:
            await loop.sock_connect(sock, addr.sockaddr())
    except OSError as e:
        sock.close()
        raise connect_error(addr, e) from e
    except BaseException:
        sock.close()
        raise
    if addr.kind == "tcp":
        await loop.create_connection(lambda: protocol, sock=sock)
    else:
        await loop.create_unix_connection(lambda: protocol, sock=sock)


async def _unix_connect(sock: socket.socket, sockaddr: Any) -> None:
    """A non-blocking unix connect. A full backlog gives EAGAIN, which (unlike
    TCP's EINPROGRESS) means "not connected, try again": loop.sock_connect
    takes it for a connect in progress and reports success on a socket that
    is not connected. Retried here with a short backoff; the caller's timeout
    bounds it."""
    delay = 0.001
    while True:
        try:
            sock.connect(sockaddr)
            return
        except BlockingIOError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)


def refusal_error(buf: bytes) -> UdskitError | None | str:
    """Spec 5.4: a server that refuses the connection sends one connection-level
    error frame in place of its hello. Returns its error (permanent for
    permission_denied), None when buf does not start with one, "partial" while
    it is incomplete."""
    if not buf or buf[0] != 3:
        return None
    if len(buf) < 16:
        return "partial"
    head_len = int.from_bytes(buf[2:4], "little")
    code = int.from_bytes(buf[12:16], "little")
    if int.from_bytes(buf[4:8], "little") != 0 or head_len > 16384 or code == 0:
        return None  # not a refusal: the hello check reports bad_magic
    if len(buf) < 16 + head_len:
        return "partial"
    return UdskitError(code, "refused by the server: " + buf[16 : 16 + head_len].decode("utf-8", "replace"))


def _what_is_at(path: str) -> str:
    """What is at a unix socket path, in words, for an ECONNREFUSED."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return "nothing is there any more"
    if stat.S_ISSOCK(st.st_mode):
        return f"{path} is a socket file, but nothing listens on it (the server stopped or crashed without removing it): start the server"
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory, not a socket: point the client at the server's socket file"
    if stat.S_ISREG(st.st_mode):
        return f"{path} is a regular file, not a socket: point the client at the server's socket file"
    return f"{path} is not a socket"


def foreign_hello(buf: bytes, e: ProtocolError) -> ProtocolError:
    """A hello that is not one: quote what the server said (another protocol)."""
    return ProtocolError(e.name, f"the server does not speak udskit: it answered the hello with {bytes(buf[:40])!r} ({e.message})")


def fail_fast(addr: Address, err: UdskitError) -> UdskitError:
    """The error of a call that found no connection after a reconnect attempt
    failed (spec 4.2): a refusal as it is (permanent), else unavailable."""
    if not err.retryable:
        return err
    e = UdskitError(UNAVAILABLE, f"no connection to {addr}: reconnecting failed: {err.message} "
                    "(calls fail fast; pass wait_for_ready=True to wait for the server)")
    e.__cause__ = err.__cause__ or err
    return e


async def _open_ssh(loop: asyncio.AbstractEventLoop, addr: Address, protocol: asyncio.Protocol, cfg: SSHConfig) -> None:
    t = split_ssh(addr.name)
    try:
        fwd = await ssh_forward(t.user, t.host, t.port, t.path, cfg, 20.0)
    except RuntimeError as e:
        raise UdskitError(UNAVAILABLE, f"connect {addr}: {e}") from e
    try:
        # ssh -L outlives the one connection it carries: _SSHEnd ends it with the connection.
        await loop.create_unix_connection(lambda: _SSHEnd(protocol, fwd, addr), fwd.local)
    except OSError as e:
        fwd.stop()
        raise connect_error(addr, e) from e


class _SSHEnd(asyncio.Protocol):
    """Forwards to the client's protocol; stops the ssh forwarder when the connection is lost.
    A connection that ends before a byte came back is explained by ssh's stderr when ssh says
    the remote socket could not be opened."""

    def __init__(self, inner: asyncio.Protocol, fwd: Forward, addr: Address) -> None:
        self.inner, self.fwd, self.addr = inner, fwd, addr
        self.got = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.got = True
        self.inner.data_received(data)

    def _remote_missing(self) -> bool:
        why = None if self.got else self.fwd.remote_socket_error()
        if why is None:
            return False
        self.got = True  # said once
        self.inner.connection_lost(SSHRemoteSocketError(f"connect {self.addr}: {why}"))
        return True

    def eof_received(self) -> bool | None:
        if self._remote_missing():
            return None
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        missing = self._remote_missing()  # reads ssh's stderr: before stop() closes it
        self.fwd.stop()
        if not missing:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class SSHRemoteSocketError(ConnectionError):
    """ssh got through, but the remote socket could not be opened (missing, or not allowed)."""


async def _open_tls(loop: asyncio.AbstractEventLoop, addr: Address, protocol: asyncio.Protocol, tls: TLSConfig | None) -> None:
    if tls is None:
        raise UdskitError("failed_precondition", f"connect {addr}: a tls: address needs tls=TLSConfig(...) (CA bundle, client certificate); there is no plaintext fallback")
    host, port = addr.host_port()
    ctx = tls.context()
    name = None if tls.server_spiffe_id is not None else (tls.server_name or (host if host else "localhost"))
    try:
        transport, _ = await loop.create_connection(lambda: protocol, host, port, ssl=ctx, server_hostname=name or host)
    except OSError as e:
        why = explain_tls(e)
        if why is not None:
            raise UdskitError("unauthenticated", f"connect {addr}: {why}") from e
        raise connect_error(addr, e) from e
    if tls.server_spiffe_id is not None:
        why = check_spiffe(transport.get_extra_info("peercert"), tls.server_spiffe_id)
        if why is not None:
            transport.abort()
            raise UdskitError("unauthenticated", f"connect {addr}: {why}")


def connect_error(addr: Address, e: OSError) -> UdskitError:
    hint = ""
    if e.errno == 2:
        hint = f" (no socket at {addr.name}: is the server running, and is this where it listens? connect(wait=True) waits for it)"
    elif e.errno == 111 and addr.kind == "unix":
        hint = f" ({_what_is_at(addr.name)})"
    elif e.errno == 111:
        hint = " (nothing listens on that port: is the server running?)"
    elif e.errno == 13:
        hint = " (permission denied: the socket's mode or its directory keeps you out)"
    err = UdskitError(UNAVAILABLE, f"connect {addr}: {e.strerror or e}{hint}")
    err.__cause__ = e
    return err


class StreamCredit:
    """Client-side credit accounting for one server stream (spec 4.1).

    ``received`` counts item costs (payload + 16) the server sent beyond what
    it was granted in total; ``consumed`` what the application took since the
    last grant. grant() returns the bytes to grant now, or 0."""

    __slots__ = ("granted", "received", "consumed", "max_frame")

    def __init__(self, max_frame: int) -> None:
        self.granted = INITIAL_STREAM_CREDIT
        self.received = 0
        self.consumed = 0
        self.max_frame = max_frame

    def on_item(self, n: int) -> None:
        self.received += n + HEADER_SIZE
        if self.received > self.granted + self.max_frame + HEADER_SIZE:
            raise ProtocolError(
                "protocol_violation",
                f"server sent {self.received} bytes of stream items, over the {self.granted} granted",
                PROTOCOL_VIOLATION,
            )

    def take(self, n: int) -> int:
        self.consumed += n + HEADER_SIZE
        if self.consumed >= CREDIT_GRANT_AT:
            g = self.consumed
            self.consumed = 0
            self.granted += g
            return g
        return 0


class _HasCredit(Protocol):
    credit: StreamCredit


W = TypeVar("W")  # what waits for a unary result
S = TypeVar("S", bound=_HasCredit)  # a stream's client-side state


class ClientFrames(Generic[W, S]):
    """Frame dispatch shared by the async and the sync client connection.

    ``unary`` and ``streams`` map call ids to what waits for them; whoever pops
    an id owns its completion. Subclasses say how a result reaches its waiter
    (a future, or a lock a thread blocks on)."""

    unary: dict[int, W]
    streams: dict[int, S]
    draining: bool
    senders: dict[int, Any]  # client-stream calls: their sending side (add_credit)

    def _resolve(self, w: W, payload: bytes, err: UdskitError | None) -> None:
        raise NotImplementedError

    def _item(self, st: S, payload: bytes) -> None:
        raise NotImplementedError

    def _end(self, st: S, err: UdskitError | None, trailer: dict[str, str]) -> None:
        raise NotImplementedError

    def _conn_error(self, err: UdskitError) -> None:
        raise NotImplementedError

    def _send(self, b: bytes) -> None:
        raise NotImplementedError

    def _close_if_drained(self) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        """No new calls here (goaway, or a call refused unprocessed): the
        connection closes once its last call ends."""
        self.draining = True
        self._close_if_drained()

    def _on_frame(self, t: int, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
        if t == T_RESPONSE:
            w = self.unary.pop(id, None)
            if w is not None:
                self._resolve(w, payload, None)
            return
        if t == T_STREAM_DATA:
            st = self.streams.get(id)
            if st is not None:
                st.credit.on_item(len(payload))
                self._item(st, payload)
            return
        if t == T_ERROR:
            err = error_from_frame(flags, aux, head, payload)
            if id == 0:
                self._conn_error(UdskitError(err.number, f"server closed the connection: {err.message}"))
                return
            w = self.unary.pop(id, None)
            if w is not None:
                self._resolve(w, b"", err)
                return
            st = self.streams.pop(id, None)
            if st is not None:
                self._end(st, err, {})
            return
        if t == T_STREAM_END:
            st = self.streams.pop(id, None)
            if st is not None:
                self._end(st, None, parse_md(head))
            return
        if t == T_GOAWAY:
            self.drain()
            return
        if t == T_PING:
            self._send(HEADER.pack(T_PONG, 0, 0, 0, len(payload), aux) + payload)
            return
        if t == T_REQUEST_CREDIT:
            s = self.senders.get(id)
            if s is not None:  # (else the call ended: ignored, spec 4.3)
                s.add_credit(aux)
            return
        if t in (T_REQUEST, T_CANCEL, T_STREAM_CREDIT, T_REQUEST_DATA, T_REQUEST_END):
            raise ProtocolError("protocol_violation", f"server sent a client frame (type {t})")
        # pong and unknown types are skipped
