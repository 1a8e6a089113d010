"""The asyncio server: ``srv = await udskit.serve(addr, handlers)``.

Each accepted connection is one _ServerConn (an asyncio.Protocol).

Peer policy before any byte is read: asyncio's selector transport calls
``connection_made`` first and registers the socket for reading only after it
(both are queued with call_soon, in that order). _ServerConn.connection_made
reads SO_PEERCRED and applies the policy there; a refused peer's transport is
aborted at once, so no recv() is ever made on its socket and none of its bytes
reach the protocol (``Server.stats["refused"]`` counts them).

States of a connection: sniffing (first byte: 'U' udskit, '{' NDJSON, else
closed) -> hello (udskit: 16 bytes, within HELLO_TIMEOUT) -> open ->
draining (goaway sent: new requests refused unprocessed; closed once no call
is in flight and the client closed, or when the shutdown grace ends).

Bounded memory: a connection has at most max_in_flight calls (a udskit
client past it gets a resource_exhausted connection error; NDJSON lines are
simply not read meanwhile); the decoder holds at most one partial frame of at
most 16 + 16 KiB + max_frame bytes; and when the transport's write buffer
passes its high-water mark (a client that does not read its responses),
reading from that client pauses until it drains, and stream handlers wait.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import signal
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, NamedTuple

from ._addr import Address, as_address
from ._common import BIG_PAYLOAD, encode_payload
from ._errors import (
    CODE_NAMES,
    DEADLINE_EXCEEDED,
    INTERNAL,
    INVALID_ARGUMENT,
    PROTOCOL_VIOLATION,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    UNIMPLEMENTED,
    UNKNOWN,
    ListenError,
    ProtocolError,
    UdskitError,
)
from ._listen import Listener, listen, peer_cred
from ._tls import RemotePeer, ServerTLSConfig, remote_peer
from ._ndjson import NDJSONRequest, ndjson_error_line, ndjson_response_line, parse_ndjson_request
from ._wire import (
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_IN_FLIGHT,
    FLAG_REFUSED,
    FLAG_STREAM,
    HEADER,
    HELLO_SIZE,
    INITIAL_STREAM_CREDIT,
    MAX_HEAD,
    T_CANCEL,
    T_ERROR,
    T_GOAWAY,
    T_PING,
    T_PONG,
    T_REQUEST,
    T_RESPONSE,
    T_STREAM_CREDIT,
    T_STREAM_DATA,
    T_STREAM_END,
    FrameDecoder,
    Hello,
    check_hello_start,
    decode_hello,
    encode_metadata,
    negotiate,
    parse_request,
    reserved_key,
    reserved_key_message,
)

log = logging.getLogger("udskit")
_pack = HEADER.pack
HELLO_TIMEOUT = 5.0


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
    import os

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

    def time_remaining(self) -> float | None:
        """Seconds left until the caller's deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - self._loop.time()


Handler = Callable[[Context, Any], Any]


def raw(fn: Handler) -> Handler:
    """Marks a handler as raw: it gets the request bytes and returns bytes."""
    fn.__udskit_raw__ = True  # type: ignore[attr-defined]
    return fn


@dataclass(frozen=True)
class _Method:
    fn: Handler
    kind: str  # "sync", "async", "stream"
    raw: bool


def _methods(handlers: Mapping[str, Handler]) -> dict[str, _Method]:
    out = {}
    for name, fn in handlers.items():
        if not name or len(name.encode()) > MAX_HEAD - 2:
            raise ValueError(f"method name {name!r}: want 1..{MAX_HEAD - 2} bytes")
        if inspect.isasyncgenfunction(fn):
            kind = "stream"
        elif inspect.iscoroutinefunction(fn):
            kind = "async"
        else:
            kind = "sync"
        out[name] = _Method(fn, kind, bool(getattr(fn, "__udskit_raw__", False)))
    return out


def _body_of(m: _Method, ctx: Context, out: Any) -> bytes:
    """What a handler returned (or a stream handler yielded) as the bytes to send:
    JSON for a JSON handler (None: empty), the bytes themselves for a raw one."""
    if not m.raw:
        return encode_payload(out)[0]
    if not isinstance(out, (bytes, bytearray, memoryview)):
        what = "stream handler {} yielded" if m.kind == "stream" else "handler {} returned"
        raise UdskitError(INTERNAL, f"raw {what.format(ctx.method)} {type(out).__name__}, not bytes")
    return bytes(out)


def _answer_head(ctx: Context) -> bytes:
    """The head of a response or stream end: the handler's response metadata.
    A key reserved for the protocol is an internal error (spec 3.1)."""
    md = ctx.response_metadata
    if not md:
        return b""
    k = reserved_key(md)
    if k is not None:
        raise UdskitError(INTERNAL, f"handler {ctx.method} answered with {reserved_key_message(k)}")
    return encode_metadata(md)


def _error_of(e: BaseException) -> tuple[int, str, bytes]:
    if isinstance(e, UdskitError):
        return e.number, e.message, e.details
    return UNKNOWN, f"{type(e).__name__}: {e}", b""


class _Call:
    __slots__ = ("task", "timer", "reason", "credit", "credit_ev")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.reason = 0  # why it was cancelled: 1 caller, 4 deadline
        self.credit = INITIAL_STREAM_CREDIT
        self.credit_ev: asyncio.Event | None = None


class _ServerConn(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server._loop
        self.transport: asyncio.Transport | None = None
        self.peer: PeerCred | None = None
        self.remote: RemotePeer | None = None
        self.calls: dict[int, _Call] = {}
        self.mode = ""  # "", "udskit", "ndjson", "refused"
        self.hello_buf = b""
        self.hello_ok = False  # udskit hellos exchanged: frames flow
        self.decoder = FrameDecoder(self._on_frame, server.max_frame)
        self.draining = False
        self.peer_eof = False
        self.closed = False
        self.paused_writes = False
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.hello_timer: asyncio.TimerHandle | None = None
        self.nd_buf = bytearray()
        self.nd_reading_paused = False
        self.out = bytearray()  # frames of this loop iteration, not yet written (see _write)
        self._nd_ids: dict[int, bytes] = {}

    # --- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        srv = self.server
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == 1:  # AF_UNIX
            try:
                c = peer_cred(sock)
            except OSError:
                c = None
            self.peer = PeerCred(*c) if c else None
        if srv.tls is not None:
            # The handshake is done (asyncio calls connection_made after it):
            # the client's chain is verified; the rules run before any read.
            self.remote = remote_peer(transport.get_extra_info("peercert"))
            why = srv.tls.refusal(self.remote)
            if why is not None:
                self.mode = "refused"
                srv.stats["refused"] += 1
                log.warning("udskit: TLS peer refused: %s", why)
                transport.abort()
                return
        if srv.policy is not None:
            ok = False
            if self.peer is not None:
                try:
                    ok = bool(srv.policy(self.peer))
                except Exception:
                    log.exception("udskit: policy raised; refusing the peer")
            if not ok:
                # Refused before the transport starts reading: no recv() is made.
                self.mode = "refused"
                srv.stats["refused"] += 1
                log.warning("udskit: refused peer %s by policy %s", self.peer, getattr(srv.policy, "__name__", "policy"))
                transport.abort()
                return
        srv._conns.add(self)
        srv.stats["connections"] += 1
        log.debug("udskit: connect %s", self.peer)
        self.hello_timer = self.loop.call_later(HELLO_TIMEOUT, self._hello_timeout)
        transport.set_write_buffer_limits(high=srv.write_high_water)

    def data_received(self, data: bytes) -> None:
        # (once the udskit hellos are exchanged, data_received is _feed)
        mode = self.mode
        try:
            if mode == "udskit":
                self._on_hello_bytes(data)  # the rest of a hello that came in pieces
            elif mode == "ndjson":
                self._nd_data(data)
            elif mode == "":
                self._sniff(data)
            else:
                self.server.stats["refused_bytes_read"] += len(data)
        except ProtocolError as e:
            self._conn_error(e.number, e.message, e.name)

    def eof_received(self) -> bool | None:
        self.peer_eof = True
        if self.mode == "ndjson":
            self.nd_buf.clear()  # a final line without a newline is not a request
        self._maybe_close()
        return True  # keep writing the answers of calls in flight

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        for c in list(self.calls.values()):
            if c.timer is not None:
                c.timer.cancel()
            if c.task is not None and not c.task.done():
                c.reason = 1
                c.task.cancel()
        self.calls.clear()
        self.resume_writing()
        srv = self.server
        if self in srv._conns:
            srv._conns.discard(self)
            log.debug("udskit: disconnect %s", self.peer)
            srv._conn_gone()

    def pause_writing(self) -> None:
        # The client does not read its answers: stop reading its requests.
        self.paused_writes = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused_writes = False
        if self.transport is not None and not self.closed and not self.nd_reading_paused:
            try:
                self.transport.resume_reading()
            except RuntimeError:
                pass
        ws, self.drain_waiters = self.drain_waiters, []
        for w in ws:
            if not w.done():
                w.set_result(None)

    async def _drain(self) -> None:
        if self.paused_writes and not self.closed:
            w = self.loop.create_future()
            self.drain_waiters.append(w)
            await w

    # --- connection start ----------------------------------------------------

    def _hello_timeout(self) -> None:
        if not self._hello_done() and not self.closed:
            log.warning("udskit: no hello from %s within %ss; closing", self.peer, HELLO_TIMEOUT)
            self._close(abort=True)

    def _hello_done(self) -> bool:
        return self.mode == "ndjson" or (self.mode == "udskit" and self.hello_ok)

    def _sniff(self, data: bytes) -> None:
        first = data[:1]
        if first == b"U":
            self.mode = "udskit"
            self._on_hello_bytes(data)
        elif first == b"{":
            self.mode = "ndjson"
            if self.hello_timer is not None:
                self.hello_timer.cancel()
            self._nd_data(data)
        else:
            self.server.stats["protocol_errors"] += 1
            log.warning("udskit: %s sent first byte %r: neither udskit ('U') nor NDJSON ('{'); closing", self.peer, first)
            self._close(abort=True)

    def _on_hello_bytes(self, data: bytes) -> None:
        buf = self.hello_buf + data
        srv = self.server
        mine = Hello(max_frame=srv.max_frame, max_in_flight=srv.max_in_flight)
        try:
            if len(buf) < HELLO_SIZE:
                check_hello_start(buf)
                self.hello_buf = buf
                return
            n = negotiate(decode_hello(buf[:HELLO_SIZE]), mine)
        except ProtocolError as e:
            assert self.transport is not None
            self.transport.write(mine.encode())
            self._conn_error(PROTOCOL_VIOLATION, e.message, e.name)
            return
        assert self.transport is not None
        self.transport.write(mine.encode())
        self.decoder.max_frame = n.max_frame
        self.hello_buf, self.hello_ok = b"", True
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        if self.draining:
            self._send_goaway()
        rest = buf[HELLO_SIZE:]
        self.data_received = self._feed  # type: ignore[method-assign]
        if rest:
            self._feed(rest)

    def _feed(self, data: bytes) -> None:
        try:
            self.decoder.feed(data)
        except ProtocolError as e:
            self._conn_error(e.number, e.message, e.name)

    # --- udskit frames ------------------------------------------------------

    def _on_frame(self, t: int, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
        if self.closed:
            return
        if t == T_REQUEST:
            self._on_request(flags, id, aux, head, payload)
        elif t == T_CANCEL:
            c = self.calls.get(id)
            if c is not None and c.task is not None and not c.task.done():
                c.reason = 4 if aux == 4 else 1
                c.task.cancel()
        elif t == T_STREAM_CREDIT:
            c = self.calls.get(id)
            if c is not None:
                c.credit += aux
                if c.credit > 0 and c.credit_ev is not None:
                    c.credit_ev.set()
        elif t == T_PING:
            self._write(_pack(T_PONG, 0, 0, 0, len(payload), aux) + payload)
        elif t in (T_RESPONSE, T_ERROR, T_STREAM_DATA, T_STREAM_END, T_GOAWAY):
            raise ProtocolError("protocol_violation", f"client sent a server frame (type {t})")
        # pong and unknown types are skipped

    def _on_request(self, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
        method, md = parse_request(head)
        if id in self.calls:
            raise ProtocolError("protocol_violation", f"request id {id} is already in flight")
        srv = self.server
        if len(self.calls) >= srv.max_in_flight:
            raise ProtocolError("resource_exhausted", f"more than {srv.max_in_flight} calls in flight", RESOURCE_EXHAUSTED)
        if self.draining:
            self._write_error(id, UNAVAILABLE, "server is shutting down; call not processed", flags=FLAG_REFUSED)
            return
        m = srv._methods.get(method)
        stream = bool(flags & FLAG_STREAM)
        if m is None:
            self._write_error(id, UNIMPLEMENTED, f'unknown method "{method}"')
            return
        if (m.kind == "stream") != stream:
            # the same words as the Go server: `udskit call` looks for "server-streaming"
            if stream:
                msg = f'method "{method}" is unary; call it with Call, not Stream'
            else:
                msg = f'method "{method}" is server-streaming; call it with Stream'
            self._write_error(id, UNIMPLEMENTED, msg)
            return
        loop = self.loop
        deadline = loop.time() + aux / 1e6 if aux else None
        ctx = Context(method, self.peer, md, deadline, loop)
        ctx.remote = self.remote
        if m.raw:
            req: Any = payload
        elif not payload:
            req = None
        else:
            try:
                req = json.loads(payload)
            except ValueError as e:
                self._write_error(id, INVALID_ARGUMENT, f"{method}: request is not JSON: {e}")
                return
        if m.kind == "sync":
            self._run_sync(id, m, ctx, req)
            return
        c = _Call()
        self.calls[id] = c
        if m.kind == "stream":
            c.credit_ev = asyncio.Event()
            c.task = loop.create_task(self._run_stream(id, c, m, ctx, req))
        else:
            c.task = loop.create_task(self._run(id, c, m, ctx, req))
        if deadline is not None:
            c.timer = loop.call_at(deadline, self._expire, c)

    def _run_sync(self, id: int, m: _Method, ctx: Context, req: Any) -> None:
        """Runs a plain-function handler inline and answers (udskit or NDJSON)."""
        try:
            body = _body_of(m, ctx, m.fn(ctx, req))
        except Exception as e:
            self._write_error(id, *_error_of(e))
            return
        self._write_response(id, ctx, body)

    def _expire(self, c: _Call) -> None:
        if c.task is not None and not c.task.done():
            c.reason = 4
            c.task.cancel()

    def _finish(self, id: int, c: _Call) -> None:
        if c.timer is not None:
            c.timer.cancel()
        if self.calls.get(id) is c:
            del self.calls[id]
        self._maybe_close()

    def _failed(self, id: int, c: _Call, e: BaseException) -> None:
        if isinstance(e, asyncio.CancelledError):
            self._cancelled(id, c)
        else:
            self._write_error(id, *_error_of(e))

    def _cancelled(self, id: int, c: _Call) -> None:
        if c.reason == 4:
            self._write_error(id, DEADLINE_EXCEEDED, "deadline exceeded")
        elif c.reason == 0:  # shutdown's grace ended
            self._write_error(id, UNAVAILABLE, "server shut down before the call finished")
        # reason 1: the caller canceled; no answer (spec 4)

    async def _run(self, id: int, c: _Call, m: _Method, ctx: Context, req: Any) -> None:
        try:
            self._write_response(id, ctx, _body_of(m, ctx, await m.fn(ctx, req)))
        except (asyncio.CancelledError, Exception) as e:
            self._failed(id, c, e)
        finally:
            self._finish(id, c)

    async def _run_stream(self, id: int, c: _Call, m: _Method, ctx: Context, req: Any) -> None:
        gen: AsyncIterator[Any] = m.fn(ctx, req)
        ev = c.credit_ev
        assert ev is not None
        try:
            async for item in gen:
                body = _body_of(m, ctx, item)
                while c.credit <= 0:
                    ev.clear()
                    await ev.wait()
                if self.paused_writes:
                    await self._drain()
                if self.closed:
                    return
                c.credit -= len(body) + 16
                self._write(_pack(T_STREAM_DATA, 0, 0, id, len(body), 0) + body)
            head = _answer_head(ctx)
            self._write(_pack(T_STREAM_END, 0, len(head), id, 0, 0) + head)
        except (asyncio.CancelledError, Exception) as e:
            self._failed(id, c, e)
        finally:
            aclose = getattr(gen, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except BaseException:
                    pass
            self._finish(id, c)

    # --- writing ----------------------------------------------------------------

    # Writes are coalesced: frames produced in one event-loop iteration go out
    # as one transport.write at the end of it (_flush, scheduled with
    # call_soon). Fewer send() calls under load, and the transport's buffer
    # holds a few large chunks rather than one per frame: Python 3.12+ sums its
    # chunk list on every write, which is quadratic with many small frames.

    def _write(self, b: bytes) -> None:
        if self.closed:
            return
        if not self.out:
            self.loop.call_soon(self._flush)
        self.out += b

    def _write_big(self, hdr: bytes, body: bytes) -> None:
        """A large frame: written without copying its body into the coalescing buffer."""
        if self.closed:
            return
        self._flush()
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(hdr)
            t.write(body)

    def _flush(self) -> None:
        out = self.out
        if not out:
            return
        self.out = bytearray()
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(bytes(out))

    def _write_response(self, id: int, ctx: Context, body: bytes) -> None:
        if self.mode == "ndjson":
            self._nd_answer(id, ctx, body)
            return
        try:
            head = _answer_head(ctx)
        except (UdskitError, ValueError) as e:  # a reserved key, metadata over the head limit
            self._write_error(id, *_error_of(e))
            return
        if len(body) > self.decoder.max_frame:
            self._write_error(id, RESOURCE_EXHAUSTED, f"response of {len(body)} bytes is over the max frame {self.decoder.max_frame}")
            return
        if len(body) < BIG_PAYLOAD:
            self._write(_pack(T_RESPONSE, 0, len(head), id, len(body), 0) + head + body)
        else:
            self._write_big(_pack(T_RESPONSE, 0, len(head), id, len(body), 0) + head, body)

    def _write_error(self, id: int, code: int, msg: str, details: bytes = b"", flags: int = 0) -> None:
        if self.mode == "ndjson":
            self._nd_error(id, code, msg)
            return
        hb = msg.encode()[:MAX_HEAD]
        if len(details) > self.decoder.max_frame:
            details = b""
        self._write(_pack(T_ERROR, flags, len(hb), id, len(details), code) + hb + details)

    def _conn_error(self, code: int, msg: str, name: str) -> None:
        self.server.stats["protocol_errors"] += 1
        log.warning("udskit: closing the connection of %s: %s", self.peer, msg)
        if self.mode == "udskit" and self.transport is not None and not self.closed:
            hb = msg.encode()[:MAX_HEAD]
            self._write(_pack(T_ERROR, 0, len(hb), 0, 0, code) + hb)
        self._close()

    def _send_goaway(self) -> None:
        reason = b"server is shutting down"
        self._write(_pack(T_GOAWAY, 0, len(reason), 0, 0, 0) + reason)

    def _close(self, abort: bool = False) -> None:
        t = self.transport
        if t is None or self.closed:
            return
        if not abort:
            self._flush()
        self.closed = True
        for c in list(self.calls.values()):
            if c.task is not None and not c.task.done():
                c.reason = 1
                c.task.cancel()
        if abort:
            t.abort()
        else:
            t.close()

    def _maybe_close(self) -> None:
        if self.calls or self.closed:
            return
        if self.mode == "ndjson" and self.nd_reading_paused:
            self.nd_reading_paused = False
            if self.transport is not None and not self.paused_writes:
                self.transport.resume_reading()
        if self.peer_eof or (self.draining and self.mode != "udskit"):
            self._close()

    def start_drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        if self.mode == "udskit" and self.hello_ok:
            self._send_goaway()
        elif self.mode in ("", "udskit") and not self.calls:
            self._close()
            return
        self._maybe_close()

    # --- NDJSON -------------------------------------------------------------

    def _nd_data(self, data: bytes) -> None:
        buf = self.nd_buf
        buf += data
        limit = self.server.max_frame
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = bytes(buf[start:nl])
            start = nl + 1
            if len(line) > limit:
                self._nd_too_long()
                return
            if line.strip():
                self._nd_line(line)
            if self.closed:
                return
        if start:
            del buf[:start]
        if len(buf) > limit:
            self._nd_too_long()

    def _nd_too_long(self) -> None:
        self.server.stats["protocol_errors"] += 1
        self._write(ndjson_error_line(b"null", f"line over the {self.server.max_frame}-byte limit", "resource_exhausted"))
        self._close()

    def _nd_line(self, line: bytes) -> None:
        try:
            req: NDJSONRequest = parse_ndjson_request(line)
        except ProtocolError as e:
            id_text = getattr(e, "id_text", b"null")
            self._write(ndjson_error_line(id_text, e.message, "invalid_argument"))
            return
        key = self.server._nd_next()
        self._nd_ids[key] = req.id_text
        if self.draining:
            self._nd_error(key, UNAVAILABLE, "server is shutting down")
            return
        m = self.server._methods.get(req.func)
        if m is None:
            self._nd_error(key, UNIMPLEMENTED, f'unknown method "{req.func}"')
            return
        if m.kind == "stream":
            self._nd_error(key, UNIMPLEMENTED, f"method {req.func} is a server stream; NDJSON has no streams")
            return
        ctx = Context(req.func, self.peer, {}, None, self.loop)
        ctx.remote = self.remote
        arg: Any = req.data_text if m.raw else (req.data if req.data_text else None)
        if m.kind == "sync":
            self._run_sync(key, m, ctx, arg)
            return
        c = _Call()
        self.calls[key] = c
        c.task = self.loop.create_task(self._run(key, c, m, ctx, arg))
        if len(self.calls) >= self.server.max_in_flight and self.transport is not None:
            self.nd_reading_paused = True
            self.transport.pause_reading()

    def _nd_answer(self, key: int, ctx: Context, body: bytes) -> None:
        id_text = self._nd_ids.pop(key, b"null")
        try:
            if body:
                json.loads(body)
        except ValueError:
            self._write(ndjson_error_line(id_text, f"handler {ctx.method} returned bytes that are not JSON", "internal"))
            return
        self._write(ndjson_response_line(id_text, body))

    def _nd_error(self, key: int, code: int, msg: str) -> None:
        id_text = self._nd_ids.pop(key, b"null")
        self._write(ndjson_error_line(id_text, msg, CODE_NAMES.get(code, "unknown")))


class Server:
    """A running udskit server. ``await srv.shutdown()`` drains it; ``async with``
    shuts it down on exit; ``await srv.serve_forever()`` runs until SIGTERM/SIGINT
    (when installed with ``handle_signals=True``) or shutdown."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        policy: Policy | None,
        max_frame: int,
        max_in_flight: int,
        write_high_water: int,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._methods = _methods(handlers)
        self.policy = policy
        self.tls: ServerTLSConfig | None = None
        self.max_frame = max_frame
        self.max_in_flight = max_in_flight
        self.write_high_water = write_high_water
        self._conns: set[_ServerConn] = set()
        self._listener: Listener | None = None
        self._aserver: asyncio.AbstractServer | None = None
        self._idle: asyncio.Event = asyncio.Event()
        self._idle.set()
        self._done: asyncio.Event = asyncio.Event()
        self._nd_counter = 0
        #: connections admitted, peers refused by the policy, bytes ever read from
        #: refused peers (0 by construction), connections closed for protocol errors
        self.stats: dict[str, int] = {"connections": 0, "refused": 0, "refused_bytes_read": 0, "protocol_errors": 0}
        self.addr: Address | None = None

    def _nd_next(self) -> int:
        # NDJSON calls get internal ids above the udskit id range
        self._nd_counter += 1
        return (1 << 32) + self._nd_counter

    def _conn_gone(self) -> None:
        if not self._conns:
            self._idle.set()

    async def _start(self, addr: Address, mode: int, dir_mode: int, backlog: int, tls: ServerTLSConfig | None = None) -> None:
        if addr.kind == "tls":
            if tls is None:
                raise ListenError("no_tls_config", f"{addr}: a tls: address needs tls=ServerTLSConfig(cert=..., key=...); there is no plaintext fallback")
            if self.policy is not None:
                raise ListenError("policy_on_tcp", f"a kernel-credential policy cannot apply to {addr}: use ServerTLSConfig(allow_spiffe=...)")
            ctx = tls.context()
            self.tls = tls
            self._listener = listen(Address("tcp", addr.name), mode=mode, dir_mode=dir_mode, backlog=backlog)
            self.addr = Address("tls", self._listener.addr.name)

            def tls_factory() -> asyncio.Protocol:
                self._idle.clear()
                return _ServerConn(self)

            self._aserver = await self._loop.create_server(tls_factory, sock=self._listener.sock, backlog=backlog, ssl=ctx, ssl_handshake_timeout=HELLO_TIMEOUT)
            return
        if self.policy is not None and addr.kind == "tcp":
            raise ListenError("policy_on_tcp", f"a peer policy needs a unix socket; {addr} is TCP, whose peers carry no kernel credentials")
        self._listener = listen(addr, mode=mode, dir_mode=dir_mode, backlog=backlog)
        self.addr = self._listener.addr

        def factory() -> asyncio.Protocol:
            self._idle.clear()
            return _ServerConn(self)

        sock = self._listener.sock
        if addr.kind == "tcp":
            self._aserver = await self._loop.create_server(factory, sock=sock, backlog=backlog)
        else:
            self._aserver = await self._loop.create_unix_server(factory, sock=sock, backlog=backlog)

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Graceful: stop accepting (removing the socket file if still ours), send
        goaway, let calls in flight finish and be answered; connections close when
        idle and their client has closed, or when grace ends (then what is left
        is cancelled and closed)."""
        if self._aserver is not None:
            self._aserver.close()
            self._aserver = None
        if self._listener is not None:
            self._listener.close()
        for c in list(self._conns):
            c.start_drain()
        if self._conns:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except asyncio.TimeoutError:
                pass
        for c in list(self._conns):
            for call in list(c.calls.values()):
                if call.task is not None and not call.task.done():
                    call.task.cancel()
            await asyncio.sleep(0)
            c._close()
        await asyncio.sleep(0)
        self._done.set()

    async def close(self) -> None:
        """Immediate: close the listener and every connection."""
        await self.shutdown(grace=0)

    async def serve_forever(self, handle_signals: bool = True, grace: float = 10.0) -> None:
        """Runs until shutdown; with handle_signals, SIGTERM/SIGINT start a graceful shutdown."""
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, lambda: self._loop.create_task(self.shutdown(grace)))
        try:
            await self._done.wait()
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()


async def serve(
    addr: str | Address,
    handlers: Mapping[str, Handler],
    mode: int = 0o600,
    policy: Policy | None = None,
    *,
    dir_mode: int = 0o700,
    max_frame: int = DEFAULT_MAX_FRAME,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    backlog: int = 512,
    write_high_water: int = 4 << 20,
    tls: ServerTLSConfig | None = None,
) -> Server:
    """Starts serving handlers on addr; returns the running Server.

    handlers maps method names to ``async def h(ctx, request)`` (JSON request,
    JSON-encodable result), plain ``def`` functions (run inline: keep them
    quick), async generators (server streams), or any of these wrapped in
    ``udskit.raw`` (bytes in, bytes out). Raise UdskitError to answer with a
    code; any other exception is answered as ``unknown``.

    policy (``allow_uids(...)``, ``allow_same_user()`` or any
    ``callable(PeerCred) -> bool``) is applied to each peer's SO_PEERCRED
    before any of its bytes is read."""
    srv = Server(handlers, policy=policy, max_frame=max_frame, max_in_flight=max_in_flight, write_high_water=write_high_water)
    await srv._start(as_address(addr), mode, dir_mode, backlog, tls)
    return srv

