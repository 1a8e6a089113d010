"""Client-streaming and bidirectional calls, asyncio client (protocol/spec.md 4.3).

``call = client.bidi("sum")``: ``await call.send(item)`` sends one request
item (waiting for request credit: the server grants what its handler has
read), ``await call.done_writing()`` ends the client's direction
(request_end), ``async for resp in call`` iterates the server's items (with
stream credit, as a server stream). ``client.client_stream(...)`` is the same
with one response: ``await call.done_writing()`` returns it.

The call is opened (its request frame sent) by the first of ``async with``,
send, done_writing or iteration. It ends in both directions when the server
sends its final frame, at the deadline (``timeout=``, counted from the open),
on ``cancel()``, on leaving ``async with`` before it ended, and when the task
awaiting send, done_writing or the next response is cancelled.

``send`` returns False, sending nothing, once the call has ended (the server
finished first, the deadline passed, the connection was lost): the outcome is
on the reading side (the iteration, or done_writing of a client stream).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Mapping

from ._common import deadline_error, decode_payload, json_text, timeout_aux, too_large_error

_json_text = json_text
from ._errors import CANCELED, INTERNAL, UNAVAILABLE, UNIMPLEMENTED, UdskitError
from ._intercept import ClientCall, stream_client_chain
from ._wire import (
    FEATURE_CLIENT_STREAM,
    FLAG_CLIENT_STREAM,
    FLAG_STREAM,
    HEADER,
    HEADER_SIZE,
    INITIAL_STREAM_CREDIT,
    T_REQUEST,
    T_REQUEST_DATA,
    T_REQUEST_END,
    request_head,
)

from ._client import AsyncClient, _Conn, _StreamState

_pack = HEADER.pack
_decode = json.JSONDecoder().decode

#: the message of a call opened towards a server whose hello lacks the flag (spec 4.3)
NO_CLIENT_STREAMS = (
    "server does not support client or bidirectional streams (its hello lacks the client_stream flag); upgrade the server"
)


def item_bytes(item: Any, raw: bool) -> bytes:
    """One request item as sent: the bytes themselves (raw call) or compact JSON."""
    if raw:
        if not isinstance(item, (bytes, bytearray, memoryview)):
            raise TypeError(f"a raw call sends bytes, not {type(item).__name__} (open it with raw=False for JSON items)")
        return bytes(item)
    return json_text(item).encode()


class _CallBase:
    _flags = 0

    def __init__(self, client: AsyncClient, method: str, timeout: float | None, metadata: Mapping[str, str] | None, raw: bool) -> None:
        self._client = client
        self._method = method
        self._head = request_head(method, metadata)
        self._timeout = timeout
        self._raw = raw
        self._conn: _Conn | None = None
        self._id = 0
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._credit = INITIAL_STREAM_CREDIT
        self._credit_w: asyncio.Future[None] | None = None
        self._sent_end = False
        self._canceled: UdskitError | None = None
        self._opening: asyncio.Future[None] | None = None
        self._metadata = metadata
        #: with client stream interceptors: what their chain returned, and its first item read
        #: at the open (an async generator interceptor opens the call only when iterated)
        self._ic_it: AsyncIterator[Any] | None = None
        self._ic_first: asyncio.Future[Any] | None = None
        #: a bidi call's stream_end metadata, once it ended (a client stream's response
        #: metadata is not kept, as for unary calls)
        self.trailer: dict[str, str] = {}

    # --- opening ------------------------------------------------------------------

    async def _open(self) -> _Conn:
        if self._conn is not None:
            return self._conn
        if self._canceled is not None:
            raise self._canceled
        if self._opening is not None:  # another task is opening it
            await asyncio.shield(self._opening)
            assert self._conn is not None
            return self._conn
        loop = self._client._loop
        self._opening = loop.create_future()
        try:
            conn = await (self._open_conn() if self._client._stream_ics is None else self._open_intercepted())
        except BaseException as e:
            self._opening.set_exception(e if isinstance(e, Exception) else UdskitError(CANCELED, "opening the call was cancelled"))
            self._opening.exception()
            self._opening = None
            raise
        self._opening.set_result(None)
        return conn

    async def _open_conn(self) -> _Conn:
        c = self._client
        loop = c._loop
        if self._timeout is not None:
            self._deadline = loop.time() + self._timeout
        deadline = self._deadline
        for _ in range(4):
            conn = await c._get_conn(deadline)
            if not conn.server_flags & FEATURE_CLIENT_STREAM:
                raise UdskitError(UNIMPLEMENTED, NO_CLIENT_STREAMS)
            if conn.in_flight() >= conn.max_in_flight:
                await conn.wait_slot(deadline)
                if not conn.usable:
                    continue
            if conn.write_paused:
                await conn.drained(deadline)
            if not conn.usable:
                continue
            if self._canceled is not None:
                raise self._canceled
            id = conn._new_id()
            aux = 0 if deadline is None else timeout_aux(deadline - loop.time())
            if deadline is not None and deadline <= loop.time():
                raise deadline_error()
            assert conn.transport is not None
            conn.transport.write(_pack(T_REQUEST, self._flags, len(self._head), id, 0, aux) + self._head)
            self._conn, self._id = conn, id
            self._register(conn, id)
            conn.senders[id] = self
            if deadline is not None:
                self._timer = loop.call_at(deadline, self._expire)
            return conn
        raise UdskitError(UNAVAILABLE, "no usable connection to open the call on")

    def _register(self, conn: _Conn, id: int) -> None:
        raise NotImplementedError

    _kind = ""

    def _responses(self) -> AsyncIterator[Any]:
        raise NotImplementedError

    async def _open_intercepted(self) -> _Conn:
        """Opens the call through the client's stream interceptors (as Go's client does): they
        see a ClientCall of kind "bidi" or "client_stream", may change its metadata and timeout
        and pass it to next, or raise to refuse; next opens the call and yields its responses."""
        c = self._client
        loop = c._loop
        opened: asyncio.Future[_Conn] = loop.create_future()

        async def open_(call: ClientCall) -> AsyncIterator[Any]:
            self._method, self._timeout = call.method, call.timeout
            self._head = request_head(call.method, call.metadata or None)
            try:
                conn = await self._open_conn()
            except BaseException as e:
                if not opened.done():
                    opened.set_exception(e if isinstance(e, Exception) else UdskitError(CANCELED, "opening the call was cancelled"))
                    opened.exception()
                raise
            opened.set_result(conn)
            async for x in self._responses():
                yield x

        chain = stream_client_chain(c._stream_ics, open_)
        assert chain is not None
        call = ClientCall(self._method, None, self._timeout, self._metadata or {}, str(c.addr), self._kind)
        try:
            it = chain(call).__aiter__()
        except UdskitError as e:  # refused before next: the call is over, not opened again
            self._canceled = e
            raise
        first: asyncio.Future[Any] = asyncio.ensure_future(it.__anext__())
        first.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        self._ic_it, self._ic_first = it, first
        try:
            await asyncio.wait({first, opened}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            first.cancel()
            raise
        if not opened.done():  # the chain ended before it opened the call: refused
            exc = first.exception()
            err = exc if isinstance(exc, UdskitError) else UdskitError(
                INTERNAL, f"{self._method}: a stream interceptor did not open the call" + (f": {exc!r}" if exc else ""))
            self._canceled = err
            self._ic_it = self._ic_first = None
            raise err
        return opened.result()

    async def _ic_next(self) -> Any:
        """The next item of the interceptors' chain."""
        f, self._ic_first = self._ic_first, None
        if f is not None:
            return await f
        assert self._ic_it is not None
        return await self._ic_it.__anext__()

    def _ended(self) -> bool:
        raise NotImplementedError

    def _end_with(self, err: UdskitError) -> None:
        """Ends the call locally with err (deadline, cancel)."""
        raise NotImplementedError

    # --- the end --------------------------------------------------------------------

    def _on_end(self) -> None:
        """The call ended (final frame, deadline, cancel, connection lost)."""
        conn = self._conn
        if conn is not None and conn.senders.get(self._id) is self:
            del conn.senders[self._id]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake_sender()

    def _expire(self) -> None:
        self._timer = None
        if not self._ended() and self._conn is not None:
            self._conn.cancel(self._id, 4)
            self._end_with(deadline_error())

    def cancel(self) -> None:
        """Cancels the call in both directions if it has not ended (sends cancel)."""
        err = UdskitError(CANCELED, "call canceled by the caller")
        if self._conn is None:
            self._canceled = err
            return
        if not self._ended():
            self._conn.cancel(self._id, 1)
            self._end_with(err)

    # --- sending ----------------------------------------------------------------------

    def add_credit(self, n: int) -> None:
        """A request_credit frame for this call."""
        self._credit += n
        self._wake_sender()

    def _wake_sender(self) -> None:
        w = self._credit_w
        if w is not None and not w.done():
            w.set_result(None)

    async def send(self, item: Any) -> bool:
        """Sends one request item (JSON value, or bytes for raw=True), waiting while
        the call has no request credit or the connection's write buffer is full.
        Returns False, sending nothing, if the call has already ended."""
        if self._sent_end:
            raise RuntimeError(f"{self._method}: send after done_writing")
        if self._raw:
            body = item_bytes(item, True)
        else:
            body = _json_text(item).encode()
        conn = self._conn
        if conn is None:
            conn = await self._open()
        n = len(body)
        if n > conn.max_frame:
            raise too_large_error(n, conn.max_frame)
        t = conn.transport
        if self._credit > 0 and not conn.write_paused and not conn.closed and t is not None and not self._ended():
            # the common case: credit, room, the call open
            self._credit -= n + HEADER_SIZE
            t.write(_pack(T_REQUEST_DATA, 0, 0, self._id, n, 0) + body)
            return True
        try:
            while True:
                if self._ended() or conn.closed:
                    return False
                if conn.write_paused:
                    try:
                        await conn.drained(self._deadline)
                    except UdskitError:
                        return False  # the deadline: the call's timer ends it
                    continue
                if self._credit > 0:
                    break
                w = self._credit_w = conn.loop.create_future()
                try:
                    await w
                finally:
                    self._credit_w = None
        except asyncio.CancelledError:
            self.cancel()
            raise
        if self._sent_end:
            raise RuntimeError(f"{self._method}: send after done_writing")
        self._credit -= len(body) + HEADER_SIZE
        assert conn.transport is not None
        conn.transport.write(_pack(T_REQUEST_DATA, 0, 0, self._id, len(body), 0) + body)
        return True

    async def _end_writing(self) -> None:
        conn = await self._open()
        if not self._sent_end:
            self._sent_end = True
            if not self._ended() and not conn.closed:
                conn._send(_pack(T_REQUEST_END, 0, 0, self._id, 0, 0))

    async def __aenter__(self) -> Any:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class BidiCall(_CallBase):
    """One bidirectional call (``client.bidi(method)``): ``await send(item)``,
    ``await done_writing()``, ``async for resp in call``, ``cancel()``."""

    _flags = FLAG_STREAM | FLAG_CLIENT_STREAM

    def __init__(self, client: AsyncClient, method: str, timeout: float | None, metadata: Mapping[str, str] | None, raw: bool) -> None:
        super().__init__(client, method, timeout, metadata, raw)
        self._st: _BidiState | None = None

    def _register(self, conn: _Conn, id: int) -> None:
        st = _BidiState(conn.max_frame, self)
        conn.streams[id] = st
        self._st = st

    def _ended(self) -> bool:
        return self._st is not None and self._st.done

    def _end_with(self, err: UdskitError) -> None:
        st = self._st
        if st is not None and not st.done:
            st.done, st.error = True, err
            st.wake()

    async def done_writing(self) -> None:
        """Ends the client's direction (request_end); the server keeps sending."""
        await self._end_writing()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    _kind = "bidi"

    async def __anext__(self) -> Any:
        if self._conn is None:
            await self._open()
        if self._ic_it is not None:
            return await self._ic_next()
        return await self._next_response()

    async def _responses(self) -> AsyncIterator[Any]:
        while True:
            try:
                x = await self._next_response()
            except StopAsyncIteration:
                return
            yield x

    async def _next_response(self) -> Any:
        conn = self._conn
        assert conn is not None
        st = self._st
        assert st is not None
        while True:
            if st.items:
                item = st.items.popleft()
                g = st.credit.take(len(item))
                if g:
                    conn.grant(self._id, g)
                if self._raw:
                    return item
                if not item:
                    return None
                try:
                    return _decode(item.decode())
                except ValueError:
                    return decode_payload(item, False)  # raises the explanatory error
            if st.done:
                if st.error is not None:
                    raise st.error
                self.trailer = st.trailer
                raise StopAsyncIteration
            w = st.waiter = conn.loop.create_future()
            try:
                await w
            except asyncio.CancelledError:
                self.cancel()
                raise
            finally:
                st.waiter = None

    #: ``await call.recv()``: the next response item; StopAsyncIteration once the
    #: server ended the stream
    recv = __anext__


class _BidiState(_StreamState):
    """A bidi call's response side; its end also ends the sending side."""

    __slots__ = ("call",)

    def __init__(self, max_frame: int, call: _CallBase) -> None:
        super().__init__(max_frame)
        self.call = call

    def wake(self) -> None:
        super().wake()
        if self.done:
            self.call._on_end()


class ClientStreamCall(_CallBase):
    """One client-streaming call (``client.client_stream(method)``): ``await
    send(item)``, then ``await done_writing()`` returns the one response."""

    _flags = FLAG_CLIENT_STREAM

    def __init__(self, client: AsyncClient, method: str, timeout: float | None, metadata: Mapping[str, str] | None, raw: bool) -> None:
        super().__init__(client, method, timeout, metadata, raw)
        self._fut: asyncio.Future[bytes] | None = None
        self._ic_resp: asyncio.Future[Any] | None = None

    _kind = "client_stream"

    def _register(self, conn: _Conn, id: int) -> None:
        fut: asyncio.Future[bytes] = conn.loop.create_future()
        fut.add_done_callback(lambda _: self._on_end())
        conn.unary[id] = fut
        self._fut = fut

    def _ended(self) -> bool:
        return self._fut is not None and self._fut.done()

    def _end_with(self, err: UdskitError) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_exception(err)

    async def done_writing(self) -> Any:
        """Ends the client's direction (request_end) and returns the response
        (JSON value, or bytes for raw=True); raises the call's error."""
        await self._end_writing()
        return await self.response()

    async def response(self) -> Any:
        """Waits for the response (the server may answer before request_end)."""
        await self._open()
        if self._ic_it is not None:
            # through the interceptors: the first item of their chain, read to its end
            if self._ic_resp is None:
                self._ic_resp = asyncio.ensure_future(self._ic_drain())
            return await asyncio.shield(self._ic_resp)
        return await self._own_response()

    async def _ic_drain(self) -> Any:
        got, first = False, None
        while True:
            try:
                x = await self._ic_next()
            except StopAsyncIteration:
                break
            if not got:
                got, first = True, x
        if not got:
            raise UdskitError(INTERNAL, f"{self._method}: a stream interceptor ended the client stream without its response")
        return first

    async def _responses(self) -> AsyncIterator[Any]:
        yield await self._own_response()

    async def _own_response(self) -> Any:
        fut = self._fut
        assert fut is not None
        try:
            out = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.done():
                self.cancel()
            raise
        return out if self._raw else decode_payload(out, False)
