"""Client-streaming and bidirectional calls, blocking client (protocol/spec.md 4.3).

``with client.bidi("sum", timeout=5) as call``: ``call.send(item)`` (blocks
while the call has no request credit, within the deadline),
``call.done_writing()``, ``for resp in call``. One thread may send while
another iterates. ``client.client_stream(...)``: ``call.done_writing()``
returns the one response. The call opens on first use; leaving ``with``
before it ended cancels it; ``send`` returns False once the call has ended
(its outcome is on the reading side).

Waiting for credit uses the connection's leader/follower read role (see
_sync.py): the sender is a parker woken by the request_credit frame; a sender
that is not the reader also looks again every CREDIT_POLL seconds, so that
it sees the call's end (which wakes only the call's reader) without a hook
in the reader.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

from ._bidi import NO_CLIENT_STREAMS, item_bytes
from ._common import deadline_error, decode_payload, timeout_aux, too_large_error
from ._errors import CANCELED, UNAVAILABLE, UNIMPLEMENTED, UdskitError
from ._sync import Client, _Parker, _remaining, _SyncConn, _SyncStream, _Waiter
from ._wire import FEATURE_CLIENT_STREAM, FLAG_CLIENT_STREAM, FLAG_STREAM, HEADER, HEADER_SIZE, INITIAL_STREAM_CREDIT, T_REQUEST, T_REQUEST_DATA, T_REQUEST_END, request_head

_pack = HEADER.pack

#: a sender waiting for credit looks at its call's end at least this often
CREDIT_POLL = 0.05


class _Sender(_Parker):
    __slots__ = ("conn", "credit", "call")

    def __init__(self, conn: _SyncConn, call: _SyncCallBase) -> None:
        super().__init__()
        self.conn = conn
        self.call = call
        self.credit = INITIAL_STREAM_CREDIT  # (under conn.mu)

    def ready(self) -> bool:
        return self.credit > 0 or self.call._ended() or self.conn.closed

    def lost(self, err: UdskitError) -> None:
        pass  # the call's own waiter carries the error

    def add_credit(self, n: int) -> None:  # run by the reader
        with self.conn.mu:
            self.credit += n
            self.conn._unpark(self)


class _SyncCallBase:
    _flags = 0

    def __init__(self, client: Client, method: str, timeout: float | None, metadata: Mapping[str, str] | None, raw: bool) -> None:
        self._client = client
        self._method = method
        self._head = request_head(method, metadata)
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._raw = raw
        self._conn: _SyncConn | None = None
        self._id = 0
        self._sender: _Sender | None = None
        self._sent_end = False
        self._canceled: UdskitError | None = None
        self.trailer: dict[str, str] = {}

    def _new_waiter(self, conn: _SyncConn) -> _Parker:
        raise NotImplementedError

    def _ended(self) -> bool:
        raise NotImplementedError

    def _end_with(self, err: UdskitError) -> None:
        raise NotImplementedError

    def _open(self) -> _SyncConn:
        if self._conn is not None:
            return self._conn
        if self._canceled is not None:
            raise self._canceled
        for _ in range(4):
            conn = self._client._get_conn(self._deadline)
            if not conn.server_flags & FEATURE_CLIENT_STREAM:
                raise UdskitError(UNIMPLEMENTED, NO_CLIENT_STREAMS)
            if not conn.slots.acquire(timeout=_remaining(self._deadline)):
                raise deadline_error()
            w = self._new_waiter(conn)
            id = conn.new_id()
            try:
                conn.register(id, w)
            except UdskitError:
                continue
            self._conn, self._id = conn, id
            s = self._sender = _Sender(conn, self)
            conn.senders[id] = s
            aux = 0 if self._deadline is None else timeout_aux(self._deadline - time.monotonic())
            try:
                conn.write(_pack(T_REQUEST, self._flags, len(self._head), id, 0, aux) + self._head, self._deadline)
            except UdskitError:
                self._forget()
                raise
            except (OSError, ValueError) as e:
                self._forget()
                conn._fail(UdskitError(UNAVAILABLE, f"connection lost: {e}"))
                raise UdskitError(UNAVAILABLE, f"connection lost: {e}") from e
            return conn
        raise UdskitError(UNAVAILABLE, "no usable connection to open the call on")

    def _forget(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.senders.pop(self._id, None)
            conn.forget(self._id)

    def _done_sending(self) -> None:
        conn = self._conn
        if conn is not None and conn.senders.get(self._id) is self._sender:
            del conn.senders[self._id]

    def send(self, item: Any) -> bool:
        """Sends one request item (JSON value, or bytes for raw=True), blocking while
        the call has no request credit (within the deadline). Returns False,
        sending nothing, if the call has already ended."""
        if self._sent_end:
            raise RuntimeError(f"{self._method}: send after done_writing")
        body = item_bytes(item, self._raw)
        conn = self._open()
        s = self._sender
        assert s is not None
        if len(body) > conn.max_frame:
            raise too_large_error(len(body), conn.max_frame)
        while True:
            if self._ended() or conn.closed:
                self._done_sending()
                return False
            with conn.mu:
                if s.credit > 0:
                    s.credit -= len(body) + HEADER_SIZE
                    break
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._expire()
                return False
            until = time.monotonic() + CREDIT_POLL
            if self._deadline is not None:
                until = min(until, self._deadline)
            conn.wait(s, until)
        try:
            conn.write(_pack(T_REQUEST_DATA, 0, 0, self._id, len(body), 0) + body, self._deadline)
        except UdskitError as e:
            if e.code == "deadline_exceeded":
                self._expire()
                return False
            raise
        except (OSError, ValueError):
            return False  # the connection failed: the reading side reports it
        return True

    def _end_writing(self) -> None:
        conn = self._open()
        if self._sent_end:
            return
        self._sent_end = True
        self._done_sending()
        if not self._ended() and not conn.closed:
            conn._send(_pack(T_REQUEST_END, 0, 0, self._id, 0, 0))

    def _expire(self) -> None:
        if self._conn is not None and not self._ended() and self._conn.cancel(self._id, 4):
            self._end_with(deadline_error())
        self._done_sending()

    def cancel(self) -> None:
        """Cancels the call in both directions if it has not ended."""
        err = UdskitError(CANCELED, "call canceled by the caller")
        if self._conn is None:
            self._canceled = err
            return
        if not self._ended() and self._conn.cancel(self._id, 1):
            self._end_with(err)
        self._done_sending()

    close = cancel

    def __enter__(self) -> Any:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class SyncBidiCall(_SyncCallBase):
    """One bidirectional call of the blocking client: ``send``, ``done_writing``,
    ``for resp in call``, ``cancel``."""

    _flags = FLAG_STREAM | FLAG_CLIENT_STREAM

    def __init__(self, client: Client, method: str, timeout: float | None, metadata: Mapping[str, str] | None, raw: bool) -> None:
        super().__init__(client, method, timeout, metadata, raw)
        self._st: _SyncStream | None = None

    def _new_waiter(self, conn: _SyncConn) -> _Parker:
        self._st = _SyncStream(conn.max_frame)
        return self._st

    def _ended(self) -> bool:
        return self._st is not None and self._st.done

    def _end_with(self, err: UdskitError) -> None:
        st, conn = self._st, self._conn
        if st is not None and conn is not None:
            with conn.mu:
                if not st.done:
                    st.done, st.error = True, err
                    conn._unpark(st)

    def done_writing(self) -> None:
        """Ends the client's direction (request_end); the server keeps sending."""
        self._end_writing()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        conn = self._open()
        st = self._st
        assert st is not None
        while True:
            with conn.mu:
                item = st.items.popleft() if st.items else None
                done, err = st.done, st.error
            if item is not None:
                g = st.credit.take(len(item))
                if g:
                    conn.grant(self._id, g)
                return item if self._raw else decode_payload(item, False)
            if done:
                self._done_sending()
                if err is not None:
                    raise err
                self.trailer = st.trailer
                raise StopIteration
            if not conn.wait(st, self._deadline):
                self._expire()
                if not st.done:
                    conn.wait(st, None)  # it ended meanwhile: the reader is handing it over

    def recv(self) -> Any:
        """The next response item; StopIteration once the server ended the stream."""
        return self.__next__()


class SyncClientStreamCall(_SyncCallBase):
    """One client-streaming call of the blocking client: ``send`` each item, then
    ``done_writing()`` returns the response."""

    _flags = FLAG_CLIENT_STREAM

    def __init__(self, client: Client, method: str, timeout: float | None, metadata: Mapping[str, str] | None, raw: bool) -> None:
        super().__init__(client, method, timeout, metadata, raw)
        self._w: _Waiter | None = None

    def _new_waiter(self, conn: _SyncConn) -> _Parker:
        self._w = _Waiter()
        return self._w

    def _ended(self) -> bool:
        return self._w is not None and self._w.done

    def _end_with(self, err: UdskitError) -> None:
        w, conn = self._w, self._conn
        if w is not None and conn is not None:
            with conn.mu:
                if not w.done:
                    w.done, w.error = True, err
                    conn._unpark(w)

    def done_writing(self) -> Any:
        """Ends the client's direction and returns the response (raises the call's error)."""
        self._end_writing()
        return self.response()

    def response(self) -> Any:
        """Waits for the response (the server may answer before request_end)."""
        conn = self._open()
        w = self._w
        assert w is not None
        if not conn.wait(w, self._deadline):
            self._expire()
            if not w.done:
                conn.wait(w, None)  # answered meanwhile: the reader is handing it over
        self._done_sending()
        if w.error is not None:
            raise w.error
        return w.result if self._raw else decode_payload(w.result, False)
