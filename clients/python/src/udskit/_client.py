"""The asyncio client: ``await udskit.connect(addr)``.

One connection is an asyncio.Protocol (_Conn). Frames are decoded in
data_received and complete their call's future there: a unary call costs one
header pack, one write, one header unpack and one payload slice.

States of a _Conn: handshaking (hello sent, ``ready`` pending) -> open ->
draining (goaway received: no new calls; closed when its last call ends) ->
closed (every call in flight failed with a retryable unavailable error).
The AsyncClient holds the one open connection; when it is lost, the next call
starts a background redial (capped exponential backoff with jitter) and every
call waits for it within its own deadline.
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any, AsyncIterator, Awaitable, Mapping, Sequence

from ._addr import Address, as_address
from ._ssh import SSHConfig
from ._tls import TLSConfig, explain_tls
from ._common import (
    HANDSHAKE_TIMEOUT,
    MAX_BACKOFF,
    BIG_PAYLOAD,
    MIN_BACKOFF,
    Payload,
    Backoff,
    ClientFrames,
    StreamCredit,
    deadline_error,
    decode_payload,
    encode_payload,
    lost_error,
    fail_fast,
    foreign_hello,
    refusal_error,
    open_connection,
    timeout_aux,
    too_large_error,
)
from ._intercept import (
    ClientCall,
    StreamClientInterceptor,
    StreamOpener,
    UnaryClientInterceptor,
    stream_client_chain,
    unary_client_chain,
)
from .tracecontext import TraceContext, with_trace
from ._errors import CANCELED, UNAVAILABLE, ProtocolError, UdskitError
from . import _shm
from ._wire import (
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_IN_FLIGHT,
    FEATURE_CLIENT_STREAM,
    FEATURE_STREAM_CREDIT,
    FLAG_STREAM,
    HEADER,
    HELLO_SIZE,
    T_CANCEL,
    T_PING,
    T_PONG,
    T_REQUEST,
    T_RESPONSE,
    T_STREAM_CREDIT,
    T_STREAM_DATA,
    FrameDecoder,
    Hello,
    check_hello_start,
    decode_hello,
    _method_heads,
    negotiate,
    request_head,
)

from typing import TYPE_CHECKING  # (apart from the imports above: the bidi types, for annotations)

if TYPE_CHECKING:
    from ._bidi import BidiCall, ClientStreamCall

_pack = HEADER.pack
_decode = json.JSONDecoder().decode


class _StreamState:
    __slots__ = ("items", "waiter", "done", "error", "credit", "trailer")

    def __init__(self, max_frame: int) -> None:
        self.items: collections.deque[bytes] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.done = False
        self.error: BaseException | None = None
        self.credit = StreamCredit(max_frame)
        self.trailer: dict[str, str] = {}

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class _Conn(asyncio.Protocol, ClientFrames["asyncio.Future[bytes]", _StreamState]):
    def __init__(self, loop: asyncio.AbstractEventLoop, max_frame: int, region: _shm.Region | None = None,
                 shm_threshold: int = _shm.DEFAULT_THRESHOLD) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = loop.create_future()
        # shared memory (spec 10): a region to offer, then the session once accepted
        self.region = region
        self.shm: _shm.ShmSession | None = None
        self.shm_threshold = shm_threshold
        self.hello = Hello(flags=FEATURE_STREAM_CREDIT | FEATURE_CLIENT_STREAM | (_shm.FEATURE_SHM if region is not None else 0), max_frame=max_frame)
        self.hello_buf = b""
        self.decoder = FrameDecoder(self._on_frame, max_frame)
        self.max_frame = max_frame
        self.max_in_flight = DEFAULT_MAX_IN_FLIGHT
        self.unary: dict[int, asyncio.Future[bytes]] = {}
        self.streams: dict[int, _StreamState] = {}
        self.next_id = 0
        self.closed = False
        self.draining = False
        self.close_error: UdskitError | None = None
        self.slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.write_paused = False
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.pongs_dropped = 0
        self._data = self._on_hello_bytes
        self.server_flags = 0  # the server's hello flags (client_stream: spec 4.3)
        self.senders: dict[int, Any] = {}  # client-stream calls by id: their sending side (_bidi)

    # --- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.hello.encode())

    def data_received(self, data: bytes) -> None:
        try:
            self._data(data)
        except ProtocolError as e:
            self._fail(e, abort=True)
            return
        shm = self.shm
        if shm is not None and shm.pending:
            self._send(shm.flush())

    def eof_received(self) -> bool | None:
        self._fail(lost_error("the server closed the connection"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        why = explain_tls(exc) if exc is not None else None
        if why is not None:
            # TLS 1.3: a server refuses a client certificate after the handshake.
            self._fail(UdskitError("unauthenticated", why))
            return
        self._fail(lost_error(str(exc) if exc else "closed"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        ws, self.drain_waiters = self.drain_waiters, []
        for w in ws:
            if not w.done():
                w.set_result(None)

    # --- hello --------------------------------------------------------------

    def _on_hello_bytes(self, data: bytes) -> None:
        buf = self.hello_buf + data
        refused = refusal_error(buf)
        if refused == "partial":
            self.hello_buf = buf
            return
        if isinstance(refused, UdskitError):
            self._fail(refused, abort=True)
            return
        try:
            if len(buf) < HELLO_SIZE:
                check_hello_start(buf)
                self.hello_buf = buf
                return
            server = decode_hello(buf[:HELLO_SIZE])
        except ProtocolError as e:
            raise foreign_hello(buf, e) from None
        n = negotiate(self.hello, server)
        self.server_flags = server.flags
        self.max_frame = self.decoder.max_frame = n.max_frame
        self.max_in_flight = n.max_in_flight or DEFAULT_MAX_IN_FLIGHT
        rest = buf[HELLO_SIZE:]
        if self.region is not None:
            if n.features & _shm.FEATURE_SHM:
                # spec 10.1: the offer, then the server's answer before any call
                assert self.transport is not None
                self.region.offer(self.transport.get_extra_info("socket"))
                self.hello_buf = b""
                self._data = self._on_shm_answer
                if rest:
                    self._on_shm_answer(rest)
                return
            self.region.close()
            self.region = None
        self._opened(rest)

    def _opened(self, rest: bytes) -> None:
        self._data = self.decoder.feed
        if not self.ready.done():
            self.ready.set_result(None)
        if rest:
            self.decoder.feed(rest)

    def _on_shm_answer(self, data: bytes) -> None:
        buf = self.hello_buf + data
        if len(buf) < 16:
            self.hello_buf = buf
            return
        self.hello_buf = b""
        region = self.region
        assert region is not None
        if buf[0] == 3:
            # a connection error in place of the answer: the decoder reports it
            self._opened(buf)
            return
        if _shm.parse_answer(buf[:16]):
            self.shm = _shm.ShmSession(region, self.max_frame, self.shm_threshold)
            self.decoder.on_frame = self._on_shm_frame
        else:
            region.close()
            self.region = None
        self._opened(buf[16:])

    def _on_shm_frame(self, t: int, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
        shm = self.shm
        assert shm is not None
        if flags & _shm.FLAG_SHM and (t == T_RESPONSE or t == T_STREAM_DATA):
            payload = shm.take(payload, id in self.unary or id in self.streams)
        elif t == _shm.T_SHM_RELEASE:
            if id:
                raise _shm.violation("bad_release", f"shm_release with id {id}, want 0")
            shm.on_release(payload)
            return
        elif t == _shm.T_SHM_OFFER:
            raise _shm.violation("bad_offer", "a second shm_offer from the server")
        self._on_frame(t, flags, id, aux, head, payload)

    # --- frames (dispatch: ClientFrames._on_frame) ---------------------------

    def _resolve(self, w: asyncio.Future[bytes], payload: bytes, err: UdskitError | None) -> None:
        if not w.done():
            if err is None:
                w.set_result(payload)
            else:
                w.set_exception(err)
        self._released()

    def _item(self, st: _StreamState, payload: bytes) -> None:
        st.items.append(payload)
        st.wake()

    def _end(self, st: _StreamState, err: UdskitError | None, trailer: dict[str, str]) -> None:
        st.done, st.error, st.trailer = True, err, trailer
        st.wake()
        self._released()

    def _conn_error(self, err: UdskitError) -> None:
        self._fail(err, abort=True)

    def _released(self) -> None:
        sw = self.slot_waiters
        while sw:
            w = sw.popleft()
            if not w.done():
                w.set_result(None)
                break
        if self.draining:
            self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self.draining and not self.unary and not self.streams and self.transport is not None:
            self.transport.close()

    def _send(self, b: bytes) -> None:
        t = self.transport
        if t is not None and not self.closed:
            if b[0] == T_PONG and self.write_paused:
                # a server that sends pings and reads nothing: its pongs are
                # dropped rather than buffered without bound (memory stays
                # under the write buffer's high-water mark plus one pong)
                self.pongs_dropped += 1
                return
            t.write(b)

    def _fail(self, err: UdskitError, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_error = err
        if self.shm is not None:
            self.shm.close()
        elif self.region is not None:
            self.region.close()
        if not self.ready.done():
            self.ready.set_exception(err)
            self.ready.exception()  # handled by the dialer; never "never retrieved"
        unary, self.unary = self.unary, {}
        for fut in unary.values():
            if not fut.done():
                fut.set_exception(err)
        streams, self.streams = self.streams, {}
        for st in streams.values():
            st.done, st.error = True, err
            st.wake()
        for w in self.slot_waiters:
            if not w.done():
                w.set_result(None)
        self.resume_writing()
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    # --- calls --------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self.closed and not self.draining

    def in_flight(self) -> int:
        return len(self.unary) + len(self.streams)

    def _new_id(self) -> int:
        i = self.next_id
        unary, streams = self.unary, self.streams
        while True:
            i = i + 1 if i < 0xFFFFFFFF else 1
            if i not in unary and i not in streams:
                self.next_id = i
                return i

    async def drained(self, deadline: float | None) -> None:
        """Waits until the transport's write buffer is under its high-water mark."""
        while self.write_paused and not self.closed:
            w = self.loop.create_future()
            self.drain_waiters.append(w)
            await _wait(w, deadline, self.loop)

    async def wait_slot(self, deadline: float | None) -> None:
        while self.in_flight() >= self.max_in_flight and self.usable:
            w = self.loop.create_future()
            self.slot_waiters.append(w)
            await _wait(w, deadline, self.loop)

    def start(self, head: bytes, body: bytes, deadline: float | None, stream: bool) -> int:
        """Sends a request; returns its id. The caller registered nothing yet."""
        if self.closed:
            raise self.close_error or lost_error("closed")
        id = self._new_id()
        aux = 0 if deadline is None else timeout_aux(deadline - self.loop.time())
        hdr = _pack(T_REQUEST, FLAG_STREAM if stream else 0, len(head), id, len(body), aux)
        t = self.transport
        assert t is not None
        if len(body) < BIG_PAYLOAD:
            t.write(hdr + head + body)
        else:
            t.write(hdr + head)
            t.write(body)
        return id

    def cancel(self, id: int, reason: int) -> None:
        """Forgets call id and tells the server (reason 1 canceled, 4 deadline)."""
        if self.unary.pop(id, None) is not None or self.streams.pop(id, None) is not None:
            self._send(_pack(T_CANCEL, 0, 0, id, 0, reason))
            self._released()

    def grant(self, id: int, n: int) -> None:
        if id in self.streams:
            self._send(_pack(T_STREAM_CREDIT, 0, 0, id, 0, n))


async def _wait(fut: asyncio.Future[Any], deadline: float | None, loop: asyncio.AbstractEventLoop) -> Any:
    if deadline is None:
        return await fut
    left = deadline - loop.time()
    if left <= 0:
        raise deadline_error()
    h = loop.call_at(deadline, _expire, fut)
    try:
        return await fut
    finally:
        h.cancel()


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(deadline_error())


def _expire_call(conn: _Conn, id: int, fut: asyncio.Future[bytes]) -> None:
    if not fut.done():
        conn.cancel(id, 4)
        fut.set_exception(deadline_error())


class AsyncClient:
    """An asyncio udskit client; create with ``await udskit.connect(addr)``.

    Calls from any number of tasks share one connection. ``call`` sends JSON
    values (``bytes`` for raw: bytes in, bytes out); ``stream`` iterates a
    server stream with flow control. Safe to use from one event loop only.
    """

    def __init__(
        self,
        addr: str | Address,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        reconnect: bool = True,
        min_backoff: float = MIN_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        wait_for_ready: bool = False,
        tls: TLSConfig | None = None,
        ssh: SSHConfig | None = None,
        shm: bool = True,
        shm_size: int = _shm.DEFAULT_REGION,
        shm_threshold: int = _shm.DEFAULT_THRESHOLD,
        unary_interceptors: Sequence[UnaryClientInterceptor] | None = None,
        stream_interceptors: Sequence[StreamClientInterceptor] | None = None,
    ) -> None:
        self.addr = as_address(addr)
        self.tls = tls
        self.ssh = ssh
        # Shared memory (spec 10) on local unix sockets where the server offers
        # it: payloads of shm_threshold bytes or more skip the socket's copies.
        _shm.check_size(shm_size)
        self.shm = shm and _shm.supported() and self.addr.kind in ("unix", "abstract")
        self.shm_size = shm_size
        self.shm_threshold = shm_threshold
        self.max_frame = max_frame
        self.reconnect = reconnect
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        # Spec 4.2: by default a call that finds no connection fails fast once a
        # reconnect attempt has failed; wait_for_ready waits (within its timeout).
        self.wait_for_ready = wait_for_ready
        self._dial_failure: UdskitError | None = None
        self._failed: asyncio.Future[None] | None = None
        # What the first connect was doing and its last failed attempt, for connect()'s
        # timeout error: "connect" (no connection yet) or "hello" (connected, waiting for it).
        self._dial_phase = "connect"
        self._dial_last: UdskitError | None = None
        self._loop = asyncio.get_running_loop()
        self._conn: _Conn | None = None
        self._old: set[_Conn] = set()
        self._redial: asyncio.Task[None] | None = None
        self._closed = False
        # The interceptor chains; None without interceptors (calls take the direct path).
        self._unary = unary_client_chain(unary_interceptors, self._invoke)
        self._stream = stream_client_chain(stream_interceptors, self._open)
        #: for bidi() and client_stream() opens (udskit._bidi), None without interceptors
        self._stream_ics = list(stream_interceptors) if stream_interceptors else None

    # --- connecting ---------------------------------------------------------

    async def _dial_once(self) -> _Conn:
        loop = self._loop
        addr = self.addr
        conn = _Conn(loop, self.max_frame, _shm.Region(self.shm_size) if self.shm else None, self.shm_threshold)
        self._dial_phase = "connect"
        try:
            await open_connection(loop, addr, conn, self.tls, self.ssh)
        except BaseException:
            if conn.region is not None:
                conn.region.close()
            raise
        self._dial_phase = "hello"
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready), HANDSHAKE_TIMEOUT)
        except asyncio.TimeoutError:
            conn._fail(UdskitError(UNAVAILABLE, f"connected to {addr}, but no udskit hello came back within {HANDSHAKE_TIMEOUT}s: "
                                   "the server does not speak udskit (a Redis or HTTP socket?), or it is stuck"), abort=True)
            raise conn.close_error from None  # type: ignore[misc]
        except BaseException:
            conn._fail(lost_error("dial abandoned"), abort=True)
            raise
        return conn

    async def _dial_wait(self, deadline: float | None) -> _Conn:
        """Dials until it works or the deadline passes (waiting for the socket)."""
        b = Backoff(self.min_backoff, self.max_backoff)
        while True:
            try:
                return await self._dial_once()
            except UdskitError as e:
                self._dial_last = e
                await asyncio.sleep(b.after(e, self._loop.time(), deadline))

    async def _redial_loop(self) -> None:
        b = Backoff(self.min_backoff, self.max_backoff)
        while not self._closed:
            try:
                conn = await self._dial_once()
            except UdskitError as e:
                self._dial_failure = e
                if self._failed is not None and not self._failed.done():
                    self._failed.set_result(None)
                await asyncio.sleep(b.next())
                continue
            self._dial_failure = None
            if self._closed:
                conn._fail(UdskitError(CANCELED, "client closed"))
            else:
                self._conn = conn
            return

    async def _get_conn(self, deadline: float | None) -> _Conn:
        while True:
            conn = self._conn
            if conn is not None:
                if conn.usable:
                    return conn
                self._retire(conn)
            if self._closed:
                raise UdskitError(CANCELED, "client is closed")
            if not self.reconnect:
                raise UdskitError(UNAVAILABLE, "connection lost and reconnect is off")
            r = self._redial
            if r is None or r.done():
                self._dial_failure = None
                self._failed = self._loop.create_future()
                r = self._redial = self._loop.create_task(self._redial_loop())
            failed = self._failed
            try:
                if self.wait_for_ready or failed is None:
                    await _wait(asyncio.shield(r), deadline, self._loop)
                else:
                    # Fail fast (spec 4.2): stop waiting once an attempt has failed.
                    w = self._loop.create_task(asyncio.wait([asyncio.shield(r), asyncio.shield(failed)], return_when=asyncio.FIRST_COMPLETED))
                    try:
                        await _wait(w, deadline, self._loop)
                    finally:
                        w.cancel()
                    if not r.done() and self._dial_failure is not None:
                        raise fail_fast(self.addr, self._dial_failure)
            except UdskitError as e:
                if e.code == "deadline_exceeded":
                    raise UdskitError("deadline_exceeded", f"waiting for reconnect to {self.addr}: deadline exceeded") from None
                raise

    def _retire(self, conn: _Conn) -> None:
        if self._conn is conn:
            self._conn = None
        if not conn.closed and conn.in_flight():
            self._old.add(conn)
        else:
            conn._close_if_drained()
        for c in list(self._old):
            if c.closed:
                self._old.discard(c)

    # --- calls --------------------------------------------------------------

    async def call(
        self,
        method: str,
        payload: Payload = None,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
        trace: TraceContext | None = None,
        _direct: bool = False,
    ) -> Any:
        """Calls method; returns the decoded JSON response, or bytes when payload is bytes.

        Raises UdskitError (``.code``, ``.retryable``, ``.refused``). A call the
        server refused unprocessed (draining) is resent on a new connection.
        trace (a handler's ``ctx.trace``, or your own): the call carries a child of
        it as traceparent/tracestate metadata."""
        metadata = with_trace(metadata, trace)
        if self._unary is not None and not _direct:
            return await self._unary(ClientCall(method, payload, timeout, metadata or {}, str(self.addr)))
        # The hot path: one header pack, one write, one future; no helper calls
        # for the common case (bytes or JSON, no metadata, id free).
        loop = self._loop
        # (from here: encoding the payload counts in the timeout)
        deadline = None if timeout is None else loop.time() + timeout
        if type(payload) is bytes:
            body, raw = payload, True
        else:
            body, raw = encode_payload(payload)
        head = _method_heads.get(method) if metadata is None else None
        if head is None:
            head = request_head(method, metadata)
        attempt = 0
        while True:
            conn = self._conn
            if conn is None or conn.closed or conn.draining:
                conn = await self._get_conn(deadline)
            n = len(body)
            if n > conn.max_frame:
                raise too_large_error(n, conn.max_frame)
            unary = conn.unary
            if len(unary) + len(conn.streams) >= conn.max_in_flight:
                await conn.wait_slot(deadline)
                if not conn.usable:
                    continue
            if conn.write_paused:
                # the server is not reading: wait rather than buffer without bound
                await conn.drained(deadline)
                if conn.closed or conn.draining:
                    continue
            if deadline is None:
                aux = 0
            else:
                left = deadline - loop.time()
                if left <= 0:
                    raise deadline_error()
                aux = timeout_aux(left)
            id = conn.next_id + 1
            if id > 0xFFFFFFFF or id in unary or id in conn.streams:
                id = conn._new_id()
            else:
                conn.next_id = id
            t = conn.transport
            assert t is not None
            shm = conn.shm
            if shm is not None and shm.fits(n):
                # spec 10: the payload goes through the region, the frame carries its slot
                desc = shm.try_place(body)
                if desc is None:
                    desc = await shm.place(body, deadline, loop)
                    if conn.closed or conn.draining or id in unary or id in conn.streams:
                        shm.unplace(desc)
                        continue
                    if deadline is not None:
                        aux = timeout_aux(max(deadline - loop.time(), 1e-6))
                t.write(_pack(T_REQUEST, _shm.FLAG_SHM, len(head), id, 8, aux) + head + desc)
            elif n < BIG_PAYLOAD:
                t.write(_pack(T_REQUEST, 0, len(head), id, n, aux) + head + body)
            else:
                t.write(_pack(T_REQUEST, 0, len(head), id, n, aux) + head)
                t.write(body)
            fut: asyncio.Future[bytes] = loop.create_future()
            unary[id] = fut
            h = None if deadline is None else loop.call_at(deadline, _expire_call, conn, id, fut)
            try:
                out = await fut
            except UdskitError as e:
                if e.refused and attempt < 3:
                    # the server drains: no new calls on this connection, resend on a new one
                    conn.drain()
                    attempt += 1
                    continue
                raise
            except asyncio.CancelledError:
                conn.cancel(id, 1)
                raise
            finally:
                if h is not None:
                    h.cancel()
            if raw:
                return out
            if not out:
                return None
            try:
                return _decode(out.decode())
            except ValueError:
                return decode_payload(out, False)  # raises the explanatory error

    def stream(
        self,
        method: str,
        payload: Payload = None,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
        trace: TraceContext | None = None,
    ) -> Stream:
        """A server stream: ``async for item in c.stream(...)``. Items are JSON
        values, or bytes when payload is bytes. The request is sent on the first
        iteration; leaving the loop early (or ``await s.aclose()``) cancels it."""
        metadata = with_trace(metadata, trace)
        if self._stream is not None:
            return _InterceptedStream(self, method, payload, timeout, metadata, self._stream)
        return Stream(self, method, payload, timeout, metadata)

    def _invoke(self, call: ClientCall) -> Awaitable[Any]:
        return self.call(call.method, call.payload, timeout=call.timeout, metadata=call.metadata or None, _direct=True)

    def _open(self, call: ClientCall) -> AsyncIterator[Any]:
        return Stream(self, call.method, call.payload, call.timeout, call.metadata or None)

    async def ping(self, timeout: float = 5.0) -> float:
        """Round-trip time of a ping frame, in seconds."""
        loop = self._loop
        deadline = loop.time() + timeout
        conn = await self._get_conn(deadline)
        t0 = loop.time()
        fut: asyncio.Future[None] = loop.create_future()
        prev = conn.decoder.on_frame

        def on_frame(t: int, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
            if t == T_PONG and payload == b"udskit-ping" and not fut.done():
                fut.set_result(None)
            prev(t, flags, id, aux, head, payload)

        conn.decoder.on_frame = on_frame
        try:
            conn._send(_pack(T_PING, 0, 0, 0, 11, 0) + b"udskit-ping")
            await _wait(fut, deadline, loop)
        finally:
            conn.decoder.on_frame = prev
        return loop.time() - t0

    async def aclose(self) -> None:
        """Closes the connections; calls in flight fail with canceled."""
        self._closed = True
        if self._redial is not None:
            self._redial.cancel()
        conns = list(self._old) + ([self._conn] if self._conn else [])
        self._conn = None
        self._old.clear()
        for c in conns:
            c._fail(UdskitError(CANCELED, "client closed"))
        await asyncio.sleep(0)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- client-streaming and bidirectional calls (spec 4.3; _bidi.py) --------

    def bidi(
        self,
        method: str,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
        raw: bool = False,
        trace: TraceContext | None = None,
    ) -> BidiCall:
        """A bidirectional call (spec 4.3): ``async with c.bidi("sum") as call``,
        ``await call.send(1)``, ``await call.done_writing()``, ``async for r in call``.
        Items are JSON values, or bytes both ways with raw=True. See udskit._bidi.
        trace (a handler's ``ctx.trace``, or your own): the call carries a child of
        it as traceparent/tracestate metadata."""
        metadata = with_trace(metadata, trace)
        from ._bidi import BidiCall

        return BidiCall(self, method, timeout, metadata, raw)

    def client_stream(
        self,
        method: str,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
        raw: bool = False,
        trace: TraceContext | None = None,
    ) -> ClientStreamCall:
        """A client-streaming call (spec 4.3): ``await call.send(x)`` for each item,
        then ``await call.done_writing()`` returns the one response.
        trace (a handler's ``ctx.trace``, or your own): the call carries a child of
        it as traceparent/tracestate metadata."""
        metadata = with_trace(metadata, trace)
        from ._bidi import ClientStreamCall

        return ClientStreamCall(self, method, timeout, metadata, raw)


class Stream:
    """One server-streaming call; an async iterator of items. ``trailer`` holds
    the stream_end metadata once the stream ended."""

    def __init__(
        self,
        client: AsyncClient,
        method: str,
        payload: Payload,
        timeout: float | None,
        metadata: Mapping[str, str] | None,
    ) -> None:
        self._client = client
        self._head = request_head(method, metadata)
        self._body, self._raw = encode_payload(payload)
        self._timeout = timeout
        self._conn: _Conn | None = None
        self._id = 0
        self._st: _StreamState | None = None
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.trailer: dict[str, str] = {}

    async def _start(self) -> _StreamState:
        c = self._client
        loop = c._loop
        if self._timeout is not None and self._deadline is None:
            self._deadline = loop.time() + self._timeout  # from the first iteration, kept across resends
        for attempt in range(4):
            conn = await c._get_conn(self._deadline)
            if len(self._body) > conn.max_frame:
                raise too_large_error(len(self._body), conn.max_frame)
            if conn.in_flight() >= conn.max_in_flight:
                await conn.wait_slot(self._deadline)
                if not conn.usable:
                    continue
            if conn.write_paused:
                await conn.drained(self._deadline)
            id = conn.start(self._head, self._body, self._deadline, True)
            st = _StreamState(conn.max_frame)
            conn.streams[id] = st
            self._conn, self._id, self._st = conn, id, st
            if self._deadline is not None:
                self._timer = loop.call_at(self._deadline, self._expire)
            return st
        raise UdskitError(UNAVAILABLE, "refused by every connection tried")

    def _expire(self) -> None:
        st = self._st
        if st is not None and not st.done:
            assert self._conn is not None
            self._conn.cancel(self._id, 4)
            st.done, st.error = True, deadline_error()
            st.wake()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        st = self._st
        if st is None:
            st = await self._start()
        while True:
            if st.items:
                item = st.items.popleft()
                g = st.credit.take(len(item))
                if g and self._conn is not None:
                    self._conn.grant(self._id, g)
                return item if self._raw else decode_payload(item, False)
            if st.done:
                self._finish()
                if st.error is not None:
                    err = st.error
                    if isinstance(err, UdskitError) and err.refused and st.credit.received == 0:
                        # refused unprocessed while draining: start over on a new connection
                        if self._conn is not None:
                            self._conn.drain()
                        self._st = None
                        st = await self._start()
                        continue
                    raise err
                self.trailer = st.trailer
                raise StopAsyncIteration
            w = st.waiter = self._client._loop.create_future()
            try:
                await w
            except asyncio.CancelledError:
                await self.aclose()
                raise
            finally:
                st.waiter = None

    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def aclose(self) -> None:
        """Cancels the stream if it is still running."""
        st = self._st
        self._finish()
        if st is not None and not st.done and self._conn is not None:
            self._conn.cancel(self._id, 1)
            st.done, st.error = True, UdskitError(CANCELED, "stream closed by the caller")

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def connect(
    addr: str | Address,
    wait: bool = False,
    timeout: float | None = 10.0,
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    reconnect: bool = True,
    min_backoff: float = MIN_BACKOFF,
    max_backoff: float = MAX_BACKOFF,
    wait_for_ready: bool = False,
    tls: TLSConfig | None = None,
    ssh: SSHConfig | None = None,
    shm: bool = True,
    shm_size: int = _shm.DEFAULT_REGION,
    shm_threshold: int = _shm.DEFAULT_THRESHOLD,
    unary_interceptors: Sequence[UnaryClientInterceptor] | None = None,
    stream_interceptors: Sequence[StreamClientInterceptor] | None = None,
) -> AsyncClient:
    """Connects to the udskit server at addr and exchanges hellos.

    wait=True waits (within timeout) for the socket to appear and accept,
    retrying with capped, jittered backoff; otherwise a missing or refusing
    server fails at once with UdskitError code unavailable. A tls:HOST:PORT
    address needs tls=TLSConfig(...); a refusal is code unauthenticated.
    wait_for_ready=True: calls wait for a lost server to come back (spec 4.2).
    shm (on by default): on a local unix socket whose server offers it, payloads
    of shm_threshold bytes or more travel through a sealed shared-memory region
    of shm_size bytes (spec 10) instead of the socket; shm=False keeps the socket.
    unary_interceptors, stream_interceptors: run around every call, the first
    outermost (see udskit._intercept)."""
    c = AsyncClient(addr, max_frame=max_frame, reconnect=reconnect, min_backoff=min_backoff, max_backoff=max_backoff, tls=tls,
                    ssh=ssh, wait_for_ready=wait_for_ready, shm=shm, shm_size=shm_size, shm_threshold=shm_threshold,
                    unary_interceptors=unary_interceptors, stream_interceptors=stream_interceptors)
    loop = c._loop
    deadline = None if timeout is None else loop.time() + timeout
    coro = c._dial_wait(deadline) if wait else c._dial_once()
    try:
        c._conn = await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        # (one deadline for every attempt and phase: wait_for cancels whichever is running)
        last = c._dial_last
        if c._dial_phase == "hello":
            what = (f"connected, but the server's hello did not come within the connect timeout ({timeout}s): "
                    "it is stuck or slow, or does not speak udskit (a Redis or HTTP socket?); give connect a longer timeout if it is only slow")
        else:
            what = f"no connection within the connect timeout ({timeout}s)"
            if last is not None:
                what += f"; the last attempt: {last.message}"
        raise UdskitError("deadline_exceeded", f"connect {c.addr}: {what}") from last
    return c



class _InterceptedStream(Stream):
    """A server stream through the client's stream interceptors: the chain runs at the first
    iteration; aclose closes what the chain returned."""

    def __init__(self, client: AsyncClient, method: str, payload: Payload, timeout: float | None,
                 metadata: Mapping[str, str] | None, chain: StreamOpener) -> None:
        super().__init__(client, method, payload, timeout, metadata)
        self._call = ClientCall(method, payload, timeout, metadata or {}, str(client.addr), "stream")
        self._chain = chain
        self._it: AsyncIterator[Any] | None = None
        self._stopped = False

    async def __anext__(self) -> Any:
        if self._stopped:
            raise StopAsyncIteration
        if self._it is None:
            self._it = self._chain(self._call).__aiter__()
        return await self._it.__anext__()

    async def aclose(self) -> None:
        self._stopped = True
        it, self._it = self._it, None
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()
