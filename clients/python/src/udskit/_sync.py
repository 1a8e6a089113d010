"""The blocking client for scripts and threads: ``with udskit.Client(addr) as c``.

Design: one blocking socket per connection, a lock around writes, and one
reader thread per connection that decodes frames and hands each result to
the thread waiting for it. Many threads share the connection: a caller takes
the write lock only for its own sendall, then blocks on its own waiter (a
pre-acquired threading.Lock the reader releases), so a slow caller never
holds up the others, and no caller needs an event loop.

Lock order and invariants:
- ``_SyncConn.wlock`` serialises sendall calls; nothing else is done under it.
- ``_SyncConn.unary``/``streams`` are dicts mutated with single dict
  operations (insert, pop), which are atomic in CPython; the reader pops an id
  to complete it, a timed-out caller pops it to abandon it: whoever pops it
  owns it, so a result is delivered or abandoned exactly once.
- ``Client.lock`` guards which connection is current and is held while
  dialing, so one thread reconnects and the others wait for it (within their
  own deadline).
"""

from __future__ import annotations

import collections
import itertools
import socket
import threading
import time
from typing import Any, Iterator, Mapping

from ._addr import Address, as_address
from ._common import (
    HANDSHAKE_TIMEOUT,
    MAX_BACKOFF,
    MIN_BACKOFF,
    Payload,
    Backoff,
    ClientFrames,
    StreamCredit,
    connect_error,
    deadline_error,
    decode_payload,
    encode_payload,
    lost_error,
    new_socket,
    timeout_aux,
)
from ._errors import CANCELED, UNAVAILABLE, ProtocolError, UdskitError
from ._wire import (
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_IN_FLIGHT,
    FLAG_STREAM,
    HEADER,
    HELLO_SIZE,
    T_CANCEL,
    T_REQUEST,
    T_STREAM_CREDIT,
    FrameDecoder,
    Hello,
    decode_hello,
    negotiate,
    request_head,
)

_pack = HEADER.pack


class _Waiter:
    __slots__ = ("lock", "result", "error")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.result = b""
        self.error: UdskitError | None = None


class _SyncStream:
    __slots__ = ("cv", "items", "done", "error", "credit", "trailer")

    def __init__(self, max_frame: int) -> None:
        self.cv = threading.Condition(threading.Lock())
        self.items: collections.deque[bytes] = collections.deque()
        self.done = False
        self.error: UdskitError | None = None
        self.credit = StreamCredit(max_frame)
        self.trailer: dict[str, str] = {}


class _SyncConn(ClientFrames[_Waiter, _SyncStream]):
    def __init__(self, sock: socket.socket, max_frame: int) -> None:
        self.sock = sock
        self.wlock = threading.Lock()
        self.unary: dict[int, _Waiter] = {}
        self.streams: dict[int, _SyncStream] = {}
        self.ids = itertools.count(1)
        self.closed = False
        self.draining = False
        self.close_error: UdskitError | None = None
        self.slots = threading.Semaphore(DEFAULT_MAX_IN_FLIGHT)
        self.max_frame = max_frame
        self._handshake(max_frame)
        self.decoder = FrameDecoder(self._on_frame, self.max_frame)
        self.reader = threading.Thread(target=self._read_loop, name="udskit-reader", daemon=True)
        self.reader.start()

    def _handshake(self, max_frame: int) -> None:
        mine = Hello(max_frame=max_frame)
        self.sock.settimeout(HANDSHAKE_TIMEOUT)
        try:
            self.sock.sendall(mine.encode())
            buf = b""
            while len(buf) < HELLO_SIZE:
                b = self.sock.recv(HELLO_SIZE - len(buf))
                if not b:
                    raise lost_error("the server closed the connection during the hello")
                buf += b
                decode_hello(buf) if len(buf) < HELLO_SIZE else None
        except socket.timeout:
            raise UdskitError(UNAVAILABLE, f"no hello from the server within {HANDSHAKE_TIMEOUT}s") from None
        except OSError as e:
            raise lost_error(str(e)) from e
        n = negotiate(mine, decode_hello(buf))
        self.max_frame = n.max_frame
        mif = n.max_in_flight or DEFAULT_MAX_IN_FLIGHT
        self.slots = threading.Semaphore(mif)
        self.sock.settimeout(None)

    @property
    def usable(self) -> bool:
        return not self.closed and not self.draining

    def _read_loop(self) -> None:
        recv = self.sock.recv
        feed = self.decoder.feed
        why = "the server closed the connection"
        try:
            while True:
                data = recv(262144)
                if not data:
                    break
                feed(data)
        except ProtocolError as e:
            why = str(e)
        except OSError as e:
            why = str(e)
        except UdskitError as e:
            why = e.message
        self._fail(lost_error(why) if not isinstance(self.close_error, UdskitError) else self.close_error)

    # --- frames (dispatch: ClientFrames._on_frame) ---------------------------

    def _resolve(self, w: _Waiter, payload: bytes, err: UdskitError | None) -> None:
        w.result, w.error = payload, err
        w.lock.release()
        self._released()

    def _item(self, st: _SyncStream, payload: bytes) -> None:
        with st.cv:
            st.items.append(payload)
            st.cv.notify()

    def _end(self, st: _SyncStream, err: UdskitError | None, trailer: dict[str, str]) -> None:
        with st.cv:
            st.done, st.error, st.trailer = True, err, trailer
            st.cv.notify()
        self._released()

    def _conn_error(self, err: UdskitError) -> None:
        self.close_error = err
        raise err  # ends the read loop, which fails every call with it

    def _send(self, b: bytes) -> None:
        self.write(b)

    def _released(self) -> None:
        self.slots.release()
        if self.draining:
            self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self.draining and not self.unary and not self.streams:
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _fail(self, err: UdskitError) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_error = err
        while self.unary:
            try:
                _, w = self.unary.popitem()
            except KeyError:
                break
            w.error = err
            w.lock.release()
        while self.streams:
            try:
                _, st = self.streams.popitem()
            except KeyError:
                break
            with st.cv:
                st.done, st.error = True, err
                st.cv.notify()
        self._shutdown()
        self.sock.close()

    def write(self, b: bytes) -> None:
        with self.wlock:
            self.sock.sendall(b)

    def new_id(self) -> int:
        while True:
            i = next(self.ids) & 0xFFFFFFFF
            if i and i not in self.unary and i not in self.streams:
                return i

    def send_request(self, id: int, head: bytes, body: bytes, deadline: float | None, stream: bool) -> None:
        aux = 0 if deadline is None else timeout_aux(deadline - time.monotonic())
        hdr = _pack(T_REQUEST, FLAG_STREAM if stream else 0, len(head), id, len(body), aux)
        try:
            with self.wlock:
                if len(body) < 65536:
                    self.sock.sendall(hdr + head + body)
                else:
                    self.sock.sendall(hdr + head)
                    self.sock.sendall(body)
        except OSError as e:
            self._fail(lost_error(str(e)))
            raise

    def cancel(self, id: int, reason: int) -> bool:
        """Forgets call id (False if the reader already completed it)."""
        if self.unary.pop(id, None) is None and self.streams.pop(id, None) is None:
            return False
        try:
            self.write(_pack(T_CANCEL, 0, 0, id, 0, reason))
        except OSError:
            pass
        self._released()
        return True


def _remaining(deadline: float | None) -> float:
    if deadline is None:
        return -1
    left = deadline - time.monotonic()
    if left <= 0:
        raise deadline_error()
    return left


class Client:
    """A blocking, thread-safe udskit client: ``with udskit.Client(addr) as c:
    c.call("echo", {"x": 1}, timeout=2)``. Threads share one connection.

    wait=True waits (within timeout) for the server's socket to appear."""

    def __init__(
        self,
        addr: str | Address,
        *,
        wait: bool = False,
        timeout: float | None = 10.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        reconnect: bool = True,
        min_backoff: float = MIN_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        self.addr = as_address(addr)
        self.max_frame = max_frame
        self.reconnect = reconnect
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.lock = threading.Lock()
        self._closed = False
        self._old: list[_SyncConn] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        self._conn: _SyncConn | None = self._dial(deadline, wait)

    def _dial_once(self, deadline: float | None) -> _SyncConn:
        sock = new_socket(self.addr)
        try:
            if deadline is not None:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(self.addr.sockaddr())
            sock.settimeout(None)
            return _SyncConn(sock, self.max_frame)
        except OSError as e:
            sock.close()
            raise connect_error(self.addr, e) from e
        except BaseException:
            sock.close()
            raise

    def _dial(self, deadline: float | None, wait: bool) -> _SyncConn:
        b = Backoff(self.min_backoff, self.max_backoff)
        while True:
            try:
                return self._dial_once(deadline)
            except UdskitError as e:
                if not wait:
                    raise
                time.sleep(b.after(e, time.monotonic(), deadline))

    def _get_conn(self, deadline: float | None) -> _SyncConn:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        if not self.lock.acquire(timeout=_remaining(deadline)):
            raise UdskitError("deadline_exceeded", f"waiting for reconnect to {self.addr}: deadline exceeded")
        try:
            conn = self._conn
            if conn is not None and conn.usable:
                return conn
            if self._closed:
                raise UdskitError(CANCELED, "client is closed")
            if conn is not None and not conn.closed:
                self._old.append(conn)  # draining: closes itself when its calls end
            self._old = [c for c in self._old if not c.closed]
            self._conn = None
            if not self.reconnect:
                raise UdskitError(UNAVAILABLE, "connection lost and reconnect is off")
            self._conn = self._dial(deadline, True)
            return self._conn
        finally:
            self.lock.release()

    def call(
        self,
        method: str,
        payload: Payload = None,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Any:
        """Calls method; returns the decoded JSON response, or bytes when payload is bytes."""
        body, raw = encode_payload(payload)
        head = request_head(method, metadata)
        deadline = None if timeout is None else time.monotonic() + timeout
        last = UdskitError(UNAVAILABLE, "no connection")
        for attempt in range(4):
            conn = self._get_conn(deadline)
            if not conn.slots.acquire(timeout=_remaining(deadline)):
                raise deadline_error()
            w = _Waiter()
            id = conn.new_id()
            conn.unary[id] = w
            try:
                conn.send_request(id, head, body, deadline, False)
            except OSError as e:
                last = lost_error(str(e))
                continue
            if not w.lock.acquire(timeout=-1 if deadline is None else max(deadline - time.monotonic(), 0)):
                if conn.cancel(id, 4):
                    raise deadline_error()
                w.lock.acquire()  # the reader completed it meanwhile
            if w.error is not None:
                if w.error.refused and attempt < 3:
                    conn.draining = True  # resend on a new connection
                    conn._close_if_drained()
                    last = w.error
                    continue
                raise w.error
            return w.result if raw else decode_payload(w.result, False)
        raise last

    def stream(
        self,
        method: str,
        payload: Payload = None,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> SyncStream:
        """A server stream: ``for item in c.stream(...)``; close() cancels it."""
        return SyncStream(self, method, payload, timeout, metadata)

    def close(self) -> None:
        with self.lock:
            self._closed = True
            conns = self._old + ([self._conn] if self._conn else [])
            self._conn = None
            self._old = []
        for c in conns:
            c._fail(UdskitError(CANCELED, "client closed"))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncStream:
    """One server-streaming call of the blocking client; an iterator of items."""

    def __init__(
        self, client: Client, method: str, payload: Payload, timeout: float | None, metadata: Mapping[str, str] | None
    ) -> None:
        self._client = client
        self._head = request_head(method, metadata)
        self._body, self._raw = encode_payload(payload)
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._conn: _SyncConn | None = None
        self._id = 0
        self._st: _SyncStream | None = None
        self.trailer: dict[str, str] = {}

    def _start(self) -> _SyncStream:
        for _ in range(4):
            conn = self._client._get_conn(self._deadline)
            if not conn.slots.acquire(timeout=_remaining(self._deadline)):
                raise deadline_error()
            st = _SyncStream(conn.max_frame)
            id = conn.new_id()
            conn.streams[id] = st
            try:
                conn.send_request(id, self._head, self._body, self._deadline, True)
            except OSError:
                continue
            self._conn, self._id, self._st = conn, id, st
            return st
        raise UdskitError(UNAVAILABLE, "could not start the stream")

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        st = self._st
        if st is None:
            st = self._start()
        while True:
            with st.cv:
                while not st.items and not st.done:
                    left = None if self._deadline is None else self._deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    st.cv.wait(left)
                item = st.items.popleft() if st.items else None
                done, err = st.done, st.error
            if item is not None:
                g = st.credit.take(len(item))
                if g and self._conn is not None and self._id in self._conn.streams:
                    try:
                        self._conn.write(_pack(T_STREAM_CREDIT, 0, 0, self._id, 0, g))
                    except OSError:
                        pass
                return item if self._raw else decode_payload(item, False)
            if not done:
                assert self._conn is not None
                self._conn.cancel(self._id, 4)
                raise deadline_error()
            if err is not None:
                if err.refused and st.credit.received == 0:
                    if self._conn is not None:
                        self._conn.draining = True
                    st = self._start()
                    continue
                raise err
            self.trailer = st.trailer
            raise StopIteration

    def close(self) -> None:
        st = self._st
        if st is not None and not st.done and self._conn is not None:
            self._conn.cancel(self._id, 1)
            with st.cv:
                st.done, st.error = True, UdskitError(CANCELED, "stream closed by the caller")

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
