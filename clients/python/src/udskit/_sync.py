"""The blocking client for scripts and threads: ``with udskit.Client(addr) as c``.

Design: leader/follower on one blocking socket per connection, no I/O thread.
A caller sends its request (under ``wlock``, only for the sendall), then waits
for its answer. If nobody is reading the socket, it takes the read role and
reads, dispatching every frame that arrives to the thread it belongs to
(releasing that thread's own pre-acquired lock, its "parker"), until its own
answer is in; then it gives the role up and wakes one waiting thread to take
it over. A lone caller therefore reads its own answer: a call costs a
sendall and a recv in the caller's thread, no thread switch. Many threads
share the connection; the reader among them changes as calls finish.

Lock order and invariants:
- ``wlock`` serialises sendall calls; nothing else is done under it, and it is
  never taken while ``mu`` is held.
- ``mu`` guards ``reading`` (someone holds the read role), ``waiting`` (the
  parkers of threads blocked for their answer), the ``unary``/``streams`` maps
  and every waiter's state. Nothing blocks while holding it.
- Whoever pops an id from ``unary``/``streams`` owns its completion: the
  reader (answer), a timed-out caller (cancel), or ``_fail`` (connection lost).
- Baton rule: whenever the read role is free and a thread is waiting, one
  waiting thread has been woken (``_pass_baton`` runs wherever the role is
  released or a waiter leaves), so no answer sits unread while someone waits.
- ``Client.lock`` guards which connection is current and is held while
  dialing, so one thread reconnects and the others wait for it (within their
  own deadline).

Every blocking step honours the caller's deadline: the dial and the hello
(the connect timeout, never more), taking ``wlock`` and writing (a request
is written with non-blocking sends and poll, so a server that stops reading
cannot hold a caller past its deadline; a request cut off half-written
fails the connection, since the stream would be corrupt), and the wait for
the answer (poll). Control frames (pong, cancel, stream credit) never block
the reader: what cannot be sent at once waits in ``pend`` (sent before the
next frame, or by the reader when the socket is writable again); a server
that lets more than PEND_MAX bytes of them pile up, reading nothing, loses
the connection, so a client's memory stays bounded whatever the server sends.

Shared memory (protocol/spec.md section 10; ``_shm``, shared with the asyncio
client): on a local unix socket the hello offers the ``shm`` flag; when the
server's hello sets it too, the sealed memfd goes out with the offer and the
answer is read before any call. ``shm_mu`` guards the ShmSession: callers
place requests under it, the reader takes responses and applies releases
under it. A caller that finds the client half full waits for a release as
it waits for an answer (a ``_SpaceWaiter``: it reads the socket itself when
nobody else does), within its deadline; it never falls back to the socket.
Releases of response slots go out as control frames after each read.
"""

from __future__ import annotations

import collections
import itertools
import select
import socket
import ssl
import threading
import time
from typing import Any, Iterator, Mapping, Sequence

from . import _shm
from ._addr import Address, as_address
from ._common import (
    HANDSHAKE_TIMEOUT,
    MAX_BACKOFF,
    BIG_PAYLOAD,
    MIN_BACKOFF,
    Payload,
    Backoff,
    ClientFrames,
    StreamCredit,
    arm,
    connect_error,
    deadline_error,
    decode_payload,
    encode_payload,
    fail_fast,
    foreign_hello,
    lost_error,
    refusal_error,
    new_socket,
    timeout_aux,
    too_large_error,
)
from ._errors import CANCELED, UNAVAILABLE, ProtocolError, UdskitError
from ._ssh import Forward, SSHConfig
from ._synctls import TLSSock, dial_ssh, dial_tls
from ._tls import TLSConfig, explain_tls
from ._intercept import ClientCall, SyncClientInterceptor, sync_client_chain
from .tracecontext import TraceContext, with_trace
from ._wire import (
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_IN_FLIGHT,
    FLAG_STREAM,
    HEADER,
    HELLO_SIZE,
    T_CANCEL,
    T_REQUEST,
    T_RESPONSE,
    T_STREAM_DATA,
    T_STREAM_CREDIT,
    FrameDecoder,
    Hello,
    check_hello_start,
    decode_hello,
    negotiate,
    request_head,
)

from typing import TYPE_CHECKING  # (apart from the imports above: the bidi types, for annotations)

if TYPE_CHECKING:
    from ._bidi_sync import SyncBidiCall, SyncClientStreamCall

_pack = HEADER.pack

#: control frames (pongs, cancels, credit) waiting for a server that reads
#: nothing may hold at most this many bytes; past it the connection fails
PEND_MAX = 1 << 20


class _Parker:
    """What a waiting thread blocks on: a lock held until someone releases it."""

    __slots__ = ("lock", "signaled")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.signaled = False  # released and not yet consumed (under _SyncConn.mu)

    def ready(self) -> bool:
        raise NotImplementedError

    def lost(self, err: UdskitError) -> None:
        raise NotImplementedError


class _Waiter(_Parker):
    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        super().__init__()
        self.done = False
        self.result = b""
        self.error: UdskitError | None = None

    def ready(self) -> bool:
        return self.done

    def lost(self, err: UdskitError) -> None:
        self.done, self.error = True, err


class _SyncStream(_Parker):
    __slots__ = ("items", "done", "error", "credit", "trailer")

    def __init__(self, max_frame: int) -> None:
        super().__init__()
        self.items: collections.deque[bytes] = collections.deque()
        self.done = False
        self.error: UdskitError | None = None
        self.credit = StreamCredit(max_frame)
        self.trailer: dict[str, str] = {}

    def ready(self) -> bool:
        return self.done or bool(self.items)

    def lost(self, err: UdskitError) -> None:
        self.done, self.error = True, err


class _SpaceWaiter(_Parker):
    """A caller waiting for room in the client half: ready once a release
    arrived since it looked (or the connection is gone)."""

    __slots__ = ("conn", "seen")

    def __init__(self, conn: _SyncConn) -> None:
        super().__init__()
        self.conn = conn
        self.seen = conn.shm_releases

    def ready(self) -> bool:
        return self.conn.closed or self.conn.shm_releases != self.seen

    def lost(self, err: UdskitError) -> None:
        pass


class _SyncConn(ClientFrames[_Waiter, _SyncStream]):
    def __init__(self, sock: socket.socket | TLSSock, max_frame: int, deadline: float | None = None, fwd: Forward | None = None,
                 region: _shm.Region | None = None, shm_threshold: int = _shm.DEFAULT_THRESHOLD) -> None:
        self.sock = sock
        #: the TLS layer of a tls: connection (its ciphertext not yet sent counts as pending)
        self.tls = sock if isinstance(sock, TLSSock) else None
        #: the ssh forwarder of an ssh:// connection, stopped with it
        self.fwd = fwd
        self.wlock = threading.Lock()
        self.pend = bytearray()  # control frames not yet written (under wlock, or plock to append)
        self.plock = threading.Lock()
        self.mu = threading.Lock()
        self.reading = False
        self.waiting: dict[_Parker, None] = {}
        self.unary: dict[int, _Waiter] = {}
        self.streams: dict[int, _SyncStream] = {}
        self.ids = itertools.count(1)
        self.closed = False
        self.draining = False
        self.close_error: UdskitError | None = None
        self.max_frame = max_frame
        self.slots = threading.Semaphore(DEFAULT_MAX_IN_FLIGHT)
        self.senders: dict[int, Any] = {}  # client-stream calls by id: their sending side (_bidi_sync)
        self.server_flags = 0  # the server's hello flags (client_stream: spec 4.3)
        #: the shared-memory session (None: every payload on the socket), under shm_mu
        self.shm: _shm.ShmSession | None = None
        self.shm_mu = threading.Lock()
        self.shm_releases = 0  # shm_release frames seen (under mu): wakes _SpaceWaiters
        try:
            self._handshake(max_frame, deadline, region, shm_threshold)
        except BaseException:
            if region is not None:
                region.close()
            raise
        self.decoder = FrameDecoder(self._on_shm_frame if self.shm is not None else self._on_frame, self.max_frame)
        self.poller = select.poll()
        self.poller.register(sock.fileno(), select.POLLIN)
        self.wpoller = select.poll()
        self.wpoller.register(sock.fileno(), select.POLLOUT)

    def _recv_by(self, n: int, until: float) -> bytes:
        """A blocking recv of at most n bytes (b"" at the end of the stream) that ends by
        until (socket.timeout past it), for the handshake: each read of the TCP socket
        gets only what is left (a TLS record dribbled in pieces included)."""
        while True:
            arm(self.sock, until)
            if self.tls is None:
                return self.sock.recv(n)
            b = self.tls.recv_some(n)
            if b is not None:
                return b

    def _handshake(self, max_frame: int, deadline: float | None, region: _shm.Region | None, shm_threshold: int) -> None:
        mine = Hello(max_frame=max_frame)
        if region is not None:
            mine = Hello(flags=mine.flags | _shm.FEATURE_SHM, max_frame=max_frame)
        # One absolute deadline for the whole handshake (hello, then the shm offer's answer):
        # the caller's, or HANDSHAKE_TIMEOUT from now, whichever comes first.
        until = time.monotonic() + HANDSHAKE_TIMEOUT
        if deadline is not None:
            until = min(until, deadline)
        buf = b""
        try:
            arm(self.sock, until)
            self.sock.sendall(mine.encode())
            while len(buf) < HELLO_SIZE:
                b = self._recv_by(HELLO_SIZE - len(buf), until)
                if not b:
                    why = self.fwd.remote_socket_error() if self.fwd is not None else None
                    if why is not None:
                        raise UdskitError(UNAVAILABLE, why)
                    raise lost_error("the server closed the connection during the hello")
                buf += b
                if buf[0] == 3:  # spec 5.4: an error frame in place of the hello
                    refused = refusal_error(buf)
                    while refused == "partial":
                        b = self._recv_by(16 + 16384 - len(buf), until)
                        if not b:
                            break
                        buf += b
                        refused = refusal_error(buf)
                    if isinstance(refused, UdskitError):
                        raise refused
                try:
                    check_hello_start(buf)
                except ProtocolError as e:
                    try:
                        self.sock.settimeout(0.05)
                        buf += self.sock.recv(64)  # more of what it said, for the message
                    except OSError:
                        pass
                    raise foreign_hello(buf, e) from None
        except socket.timeout:
            got = f" (it sent {len(buf)} of its {HELLO_SIZE} bytes)" if buf else ""
            if deadline is not None and until >= deadline:
                raise deadline_error("connected, but the server's hello did not come within the connect timeout"
                                     f"{got}: it is stuck or slow, or does not speak udskit; give connect a longer timeout "
                                     "if it is only slow") from None
            raise UdskitError(UNAVAILABLE, f"connected, but no udskit hello came back within {HANDSHAKE_TIMEOUT}s{got}: "
                              "the server does not speak udskit (a Redis or HTTP socket?), or it is stuck") from None
        except ssl.SSLError as e:
            # TLS 1.3: a server refuses a client certificate after the handshake, in place of its hello.
            raise UdskitError("unauthenticated", explain_tls(e) or f"TLS failed: {e}") from e
        except OSError as e:
            why = self.fwd.remote_socket_error() if self.fwd is not None and not buf else None
            if why is not None:
                raise UdskitError(UNAVAILABLE, why) from e
            raise lost_error(str(e)) from e
        try:
            server = decode_hello(buf)
        except ProtocolError as e:
            raise foreign_hello(buf, e) from None
        n = negotiate(mine, server)
        self.server_flags = server.flags
        self.max_frame = n.max_frame
        self.slots = threading.Semaphore(n.max_in_flight or DEFAULT_MAX_IN_FLIGHT)
        if region is not None:
            if n.features & _shm.FEATURE_SHM:
                self._offer_shm(region, shm_threshold, deadline, until)
            else:
                region.close()
        self.sock.settimeout(None)  # blocking from here on; deadlines use poll

    def _offer_shm(self, region: _shm.Region, threshold: int, deadline: float | None, until: float) -> None:
        """Spec 10.2: the offer with the memfd, then the server's 16-byte
        answer (or a connection error in its place) before any call, by the
        handshake's deadline until."""
        assert isinstance(self.sock, socket.socket)
        try:
            arm(self.sock, until)
            region.offer(self.sock)  # may make the socket blocking: each recv below re-arms it
            buf = b""
            while len(buf) < 16:
                b = self._recv_by(16 - len(buf), until)
                if not b:
                    raise lost_error("the server closed the connection before answering the shared-memory offer")
                buf += b
            if buf[0] == 3:  # a connection error in place of the answer
                head_len = int.from_bytes(buf[2:4], "little")
                msg = b""
                while len(msg) < min(head_len, 16384):
                    b = self._recv_by(min(head_len, 16384) - len(msg), until)
                    if not b:
                        break
                    msg += b
                raise UdskitError(int.from_bytes(buf[12:16], "little") or UNAVAILABLE,
                                  "server refused the shared-memory offer: " + msg.decode("utf-8", "replace"))
        except socket.timeout:
            if deadline is not None and until >= deadline:
                raise deadline_error("no answer to the shared-memory offer within the connect timeout") from None
            raise UdskitError(UNAVAILABLE, f"no answer to the shared-memory offer within {HANDSHAKE_TIMEOUT}s") from None
        except OSError as e:
            raise lost_error(str(e)) from e
        if _shm.parse_answer(buf):
            self.shm = _shm.ShmSession(region, self.max_frame, threshold)
        else:
            region.close()

    @property
    def usable(self) -> bool:
        return not self.closed and not self.draining

    # --- waiting and the read role ---------------------------------------------

    def _unpark(self, p: _Parker) -> None:  # mu held
        if not p.signaled:
            p.signaled = True
            p.lock.release()

    def _pass_baton(self) -> None:  # mu held
        if not self.reading:
            for q in self.waiting:
                if not q.signaled:
                    self._unpark(q)
                    return

    def wait(self, p: _Parker, deadline: float | None) -> bool:
        """Blocks until p is ready (True) or the deadline passes (False),
        reading the socket itself whenever nobody else does."""
        mu = self.mu
        while True:
            with mu:
                if self.closed and not p.ready():
                    p.lost(self.close_error or lost_error("closed"))
                if p.ready():
                    self._pass_baton()
                    return True
                lead = not self.reading
                if lead:
                    self.reading = True
                else:
                    self.waiting[p] = None
            if lead:
                try:
                    self._read_until(p, deadline)
                finally:
                    with mu:
                        self.reading = False
                        self._pass_baton()
                if not p.ready() and not self.closed and deadline is not None and time.monotonic() >= deadline:
                    return False
                continue
            if deadline is None:
                ok = p.lock.acquire()
            else:
                ok = p.lock.acquire(timeout=max(deadline - time.monotonic(), 0))
            with mu:
                self.waiting.pop(p, None)
                if ok:
                    p.signaled = False
                elif p.signaled:  # released just after the timeout: consume it
                    p.lock.acquire(False)
                    p.signaled = False
                if p.ready():
                    self._pass_baton()
                    return True
                if not ok:
                    self._pass_baton()
                    return False
            # woken to take the read role: loop

    def _has_pend(self) -> bool:
        return bool(self.pend) or (self.tls is not None and self.tls.unsent)

    def _read_until(self, p: _Parker, deadline: float | None) -> None:
        recv = self.sock.recv if self.tls is None else self.tls.recv_some
        feed = self.decoder.feed
        fd = self.sock.fileno()
        try:
            while not p.ready() and not self.closed:
                if self._has_pend():
                    self._flush_pend()
                pend = self._has_pend()
                # TLS: plaintext already decrypted is read before polling the socket (a
                # read can decrypt more than one recv returns; the server may send no more)
                if (deadline is not None or pend) and not (self.tls is not None and self.tls.rbuf):
                    ms = -1.0 if deadline is None else (deadline - time.monotonic()) * 1000
                    if deadline is not None and ms <= 0:
                        return
                    if pend:  # also wake when the socket takes what is pending
                        self.poller.modify(fd, select.POLLIN | select.POLLOUT)
                    try:
                        evs = self.poller.poll(ms if ms < 0 else max(ms, 1))
                    finally:
                        if pend:
                            self.poller.modify(fd, select.POLLIN)
                    if not evs or not any(ev & ~select.POLLOUT for _, ev in evs):
                        continue  # the deadline (checked above), or writable only
                data = recv(262144)
                if data is None:
                    continue  # TLS: part of a record; poll again
                if not data:
                    self._fail(lost_error("the server closed the connection"))
                    return
                feed(data)
                if self.shm is not None:
                    self._flush_releases()
        except UdskitError as e:  # a protocol error, or the server's connection error
            self._fail(self.close_error or lost_error(str(e)))
        except ssl.SSLError as e:
            why = explain_tls(e)
            self._fail(UdskitError("unauthenticated", why) if why else lost_error(f"TLS: {e}"))
        except (OSError, ValueError) as e:  # ValueError: the socket was closed under us
            self._fail(lost_error(str(e)))

    # --- frames (dispatch: ClientFrames._on_frame, run by the reader) -----------

    def _on_shm_frame(self, t: int, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
        """Frames of a connection with shared memory: descriptors are checked
        and copied out once (their release goes out after this read), the
        server's releases free request slots and wake callers waiting for room."""
        shm = self.shm
        assert shm is not None
        if flags & _shm.FLAG_SHM and (t == T_RESPONSE or t == T_STREAM_DATA):
            with self.shm_mu:
                payload = shm.take(payload)
        elif t == _shm.T_SHM_RELEASE:
            if id:
                raise _shm.violation("bad_release", f"shm_release with id {id}, want 0")
            with self.shm_mu:
                shm.on_release(payload)
            with self.mu:
                self.shm_releases += 1
                for q in self.waiting:
                    if isinstance(q, _SpaceWaiter):
                        self._unpark(q)
            return
        elif t == _shm.T_SHM_OFFER:
            raise _shm.violation("bad_offer", "a second shm_offer from the server")
        self._on_frame(t, flags, id, aux, head, payload)

    def _flush_releases(self) -> None:
        """Sends the release of the response slots read since the last flush."""
        shm = self.shm
        if shm is not None and shm.pending:
            with self.shm_mu:
                rel = shm.flush()
            if rel:
                self._send(rel)

    def _place(self, body: bytes, deadline: float | None) -> bytes:
        """Copies body into a slot of the client half and returns its
        descriptor, waiting for releases within the deadline (spec 10.6)."""
        shm = self.shm
        assert shm is not None
        waited = False
        while True:
            w = _SpaceWaiter(self)  # before looking: a release after this wakes it
            with self.shm_mu:
                if self.closed:
                    raise self.close_error or lost_error("closed")
                d = shm.try_place(body)
                if d is None and not waited:
                    shm.waits += 1
                    waited = True
            if d is not None:
                return d
            if not self.wait(w, deadline):
                raise deadline_error("waiting for shared memory: deadline exceeded (the server has not released the region's space)")
            if self.closed:
                raise self.close_error or lost_error("closed")

    def _unplace(self, desc: bytes) -> None:
        if self.shm is not None:
            with self.shm_mu:
                self.shm.unplace(desc)

    def _resolve(self, w: _Waiter, payload: bytes, err: UdskitError | None) -> None:
        with self.mu:
            w.result, w.error, w.done = payload, err, True
            self._unpark(w)
        self._released()

    def _item(self, st: _SyncStream, payload: bytes) -> None:
        with self.mu:
            st.items.append(payload)
            self._unpark(st)

    def _end(self, st: _SyncStream, err: UdskitError | None, trailer: dict[str, str]) -> None:
        with self.mu:
            st.done, st.error, st.trailer = True, err, trailer
            self._unpark(st)
        self._released()

    def _conn_error(self, err: UdskitError) -> None:
        self.close_error = err
        raise err  # stops the decoder; _read_until fails every call with it

    def _send(self, b: bytes) -> None:
        """Sends a control frame without blocking: what does not fit in the
        socket now waits in pend (bounded: PEND_MAX)."""
        with self.plock:
            if len(self.pend) + len(b) > PEND_MAX and self.pend:
                over = True
            else:
                over = False
                self.pend += b
        if over:
            self._fail(lost_error(f"the server reads nothing: over {PEND_MAX} bytes of control frames (pongs) could not be sent"))
            return
        self._flush_pend()

    def _flush_pend(self) -> None:
        """Sends what pend holds, as far as the socket takes it now (if no
        writer holds wlock: that one sends pend before its own frame)."""
        if not self.wlock.acquire(blocking=False):
            return
        try:
            self._send_pend_nowait()
        finally:
            self.wlock.release()

    def _send_pend_nowait(self) -> None:  # wlock held
        if self.tls is not None:
            try:
                self.tls.flush_nowait()  # ciphertext made earlier goes first
            except (OSError, ValueError):
                pass  # the connection is failing; the reader sees it
        with self.plock:
            if not self.pend:
                return
            try:
                n = self.sock.send(self.pend, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except (OSError, ValueError):
                n = len(self.pend)  # the connection is failing; the reader sees it
            del self.pend[:n]

    def _send_all(self, data: bytes | memoryview, deadline: float | None) -> int:
        """Sends data (pend first) without blocking past deadline. Returns the
        bytes of data sent: less than all of it only when the deadline passed."""
        view = memoryview(data)
        sent = 0
        while True:
            self._send_pend_nowait()
            if not self.pend:
                while sent < len(view):
                    try:
                        sent += self.sock.send(view[sent:], socket.MSG_DONTWAIT)
                    except (BlockingIOError, InterruptedError):
                        break
                if sent == len(view) and not (self.tls is not None and self.tls.unsent):
                    return sent
            ms = -1 if deadline is None else (deadline - time.monotonic()) * 1000
            if deadline is not None and ms <= 0:
                return sent
            self.wpoller.poll(ms if ms < 0 else max(ms, 1))

    def _released(self) -> None:
        self.slots.release()
        if self.draining:
            self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self.draining and not self.unary and not self.streams:
            self._fail(UdskitError(UNAVAILABLE, "connection drained (goaway)"))

    def _fail(self, err: UdskitError) -> None:
        with self.mu:
            if self.closed:
                return
            self.closed = True
            self.close_error = err
            for w in self.unary.values():
                w.lost(err)
                self._unpark(w)
            for st in self.streams.values():
                st.lost(err)
                self._unpark(st)
            self.unary.clear()
            self.streams.clear()
            for q in self.waiting:  # everyone re-checks: their calls are over
                self._unpark(q)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        except OSError:
            pass
        self.sock.close()
        if self.fwd is not None:
            self.fwd.stop()
        if self.shm is not None:
            with self.shm_mu:
                self.shm.close()

    # --- calls ------------------------------------------------------------------

    def register(self, id: int, p: _Parker) -> None:
        with self.mu:
            if self.closed:
                raise self.close_error or lost_error("closed")
            if isinstance(p, _Waiter):
                self.unary[id] = p
            else:
                assert isinstance(p, _SyncStream)
                self.streams[id] = p

    def write(self, b: bytes, deadline: float | None = None, tail: bytes = b"") -> None:
        """Writes one whole frame (b, then tail) by the deadline
        (deadline_exceeded if not a byte of it went out; a frame cut off
        fails the connection)."""
        if deadline is None:
            ok = self.wlock.acquire()
        else:
            ok = self.wlock.acquire(timeout=max(deadline - time.monotonic(), 0))
        if not ok:
            raise deadline_error("deadline exceeded waiting to write (another call is blocked writing: the server reads nothing)")
        try:
            n = self._send_all(b, deadline)
            if tail and n == len(b):
                n += self._send_all(tail, deadline)
        finally:
            self.wlock.release()
        if n == len(b) + len(tail):
            return
        if n:
            self._fail(lost_error("a request could not be written within its deadline (the server reads nothing); connection closed"))
        raise deadline_error("deadline exceeded writing the request (the server reads nothing)")

    def new_id(self) -> int:
        while True:
            i = next(self.ids) & 0xFFFFFFFF
            if i and i not in self.unary and i not in self.streams:
                return i

    def send_request(self, id: int, head: bytes, body: bytes, deadline: float | None, stream: bool) -> None:
        shm = self.shm
        if shm is not None and shm.fits(len(body)):
            self._send_shm_request(id, head, body, deadline, stream)
            return
        aux = 0 if deadline is None else timeout_aux(deadline - time.monotonic())
        hdr = _pack(T_REQUEST, FLAG_STREAM if stream else 0, len(head), id, len(body), aux)
        try:
            if len(body) < BIG_PAYLOAD:
                self.write(hdr + head + body, deadline)
            else:
                self.write(hdr + head, deadline, body)
        except UdskitError:
            self.forget(id)
            raise
        except (OSError, ValueError) as e:
            self._fail(lost_error(str(e)))
            raise OSError(str(e)) from e

    def _send_shm_request(self, id: int, head: bytes, body: bytes, deadline: float | None, stream: bool) -> None:
        """A request whose payload travels in the region: the frame carries
        its 8-byte descriptor. A slot never handed over is freed again."""
        try:
            desc = self._place(body, deadline)
        except UdskitError:
            self.forget(id)
            raise
        aux = 0 if deadline is None else timeout_aux(deadline - time.monotonic())
        flags = _shm.FLAG_SHM | (FLAG_STREAM if stream else 0)
        try:
            self.write(_pack(T_REQUEST, flags, len(head), id, 8, aux) + head + desc, deadline)
        except UdskitError:
            self._unplace(desc)  # nothing went out (or the connection failed: the region is gone)
            self.forget(id)
            raise
        except (OSError, ValueError) as e:
            self._fail(lost_error(str(e)))
            raise OSError(str(e)) from e

    def forget(self, id: int) -> None:
        """Drops call id that was never sent (nothing to tell the server)."""
        with self.mu:
            gone = self.unary.pop(id, None) is not None or self.streams.pop(id, None) is not None
        if gone:
            self._released()

    def cancel(self, id: int, reason: int) -> bool:
        """Forgets call id (False if it was completed or failed already)."""
        with self.mu:
            if self.unary.pop(id, None) is None and self.streams.pop(id, None) is None:
                return False
        self._send(_pack(T_CANCEL, 0, 0, id, 0, reason))
        self._released()
        return True

    def grant(self, id: int, n: int) -> None:
        if id in self.streams:
            self._send(_pack(T_STREAM_CREDIT, 0, 0, id, 0, n))


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

    wait=True waits (within timeout) for the server's socket to appear.

    A ``tls:HOST:PORT`` address needs ``tls=TLSConfig(...)`` (no plaintext
    fallback; a refused certificate is code unauthenticated, with the reason);
    an ``ssh://[user@]host[:port]/path`` address runs the system's ssh
    (``ssh=SSHConfig(args=...)``) once per connection, as the async client does.

    shm (on by default): on a local unix socket whose server offers it (a Go
    server), payloads of shm_threshold bytes or more travel through a sealed
    shared-memory region of shm_size bytes (spec 10) instead of the socket,
    as with the asyncio client; shm=False keeps the socket."""

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
        wait_for_ready: bool = False,
        tls: TLSConfig | None = None,
        ssh: SSHConfig | None = None,
        interceptors: Sequence[SyncClientInterceptor] | None = None,
        shm: bool = True,
        shm_size: int = _shm.DEFAULT_REGION,
        shm_threshold: int = _shm.DEFAULT_THRESHOLD,
    ) -> None:
        self.addr = as_address(addr)
        # Spec 10, as the asyncio client: on a local unix socket whose server
        # offers it, payloads of shm_threshold bytes or more travel through a
        # sealed memfd region of shm_size bytes; shm=False keeps the socket.
        _shm.check_size(shm_size)
        self.shm = shm and _shm.supported() and self.addr.kind in ("unix", "abstract")
        self.shm_size = shm_size
        self.shm_threshold = shm_threshold
        #: the unary interceptor chain (see udskit._intercept); None: calls take the direct path
        self._unary = sync_client_chain(interceptors, self._invoke)
        #: how tls: addresses are dialed (required for them: no plaintext fallback)
        self.tls = tls
        #: how ssh:// addresses are reached (the system's ssh, with these arguments)
        self.ssh = ssh
        self.max_frame = max_frame
        self.reconnect = reconnect
        # Spec 4.2: a call that finds no connection makes one reconnect attempt
        # and fails fast if it fails; wait_for_ready retries within its timeout.
        self.wait_for_ready = wait_for_ready
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.lock = threading.Lock()
        self._closed = False
        self._old: list[_SyncConn] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        self._conn: _SyncConn | None = self._dial(deadline, wait)

    def _dial_once(self, deadline: float | None) -> _SyncConn:
        if self.addr.kind == "tls":
            ts = dial_tls(self.addr, self.tls, deadline)
            try:
                return _SyncConn(ts, self.max_frame, deadline)
            except BaseException:
                ts.close()
                raise
        if self.addr.kind == "ssh":
            s, fwd = dial_ssh(self.addr, self.ssh, deadline)
            try:
                return _SyncConn(s, self.max_frame, deadline, fwd)
            except BaseException:
                s.close()
                fwd.stop()
                raise
        sock = new_socket(self.addr)
        try:
            if deadline is not None:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(self.addr.sockaddr())
            sock.settimeout(None)
            region = _shm.Region(self.shm_size) if self.shm else None
            return _SyncConn(sock, self.max_frame, deadline, region=region, shm_threshold=self.shm_threshold)
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
            try:
                self._conn = self._dial(deadline, self.wait_for_ready)
            except UdskitError as e:
                if e.code == "deadline_exceeded":
                    raise
                raise fail_fast(self.addr, e) from (e.__cause__ or e)
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
        trace: TraceContext | None = None,
        _direct: bool = False,
    ) -> Any:
        """Calls method; returns the decoded JSON response, or bytes when payload is bytes.
        trace: the call carries a child of it as traceparent/tracestate metadata."""
        metadata = with_trace(metadata, trace)
        if self._unary is not None and not _direct:
            return self._unary(ClientCall(method, payload, timeout, metadata or {}, str(self.addr)))
        deadline = None if timeout is None else time.monotonic() + timeout  # (encoding counts in it)
        body, raw = encode_payload(payload)
        head = request_head(method, metadata)
        last = UdskitError(UNAVAILABLE, "no connection")
        for attempt in range(4):
            conn = self._get_conn(deadline)
            if len(body) > conn.max_frame:
                raise too_large_error(len(body), conn.max_frame)
            if not conn.slots.acquire(timeout=_remaining(deadline)):
                raise deadline_error()
            w = _Waiter()
            id = conn.new_id()
            try:
                conn.register(id, w)
                conn.send_request(id, head, body, deadline, False)
            except (OSError, UdskitError) as e:
                if isinstance(e, UdskitError) and e.code == "deadline_exceeded":
                    raise
                last = e if isinstance(e, UdskitError) else lost_error(str(e))
                continue
            if not conn.wait(w, deadline):
                if conn.cancel(id, 4):
                    raise deadline_error()
                conn.wait(w, None)  # answered meanwhile: the reader is handing it over
            if w.error is not None:
                if w.error.refused and attempt < 3:
                    conn.drain()  # resend on a new connection
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
        trace: TraceContext | None = None,
    ) -> SyncStream:
        """A server stream: ``for item in c.stream(...)``; close() cancels it."""
        metadata = with_trace(metadata, trace)
        return SyncStream(self, method, payload, timeout, metadata)

    def _invoke(self, call: ClientCall) -> Any:
        return self.call(call.method, call.payload, timeout=call.timeout, metadata=call.metadata or None, _direct=True)

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

    # --- client-streaming and bidirectional calls (spec 4.3; _bidi_sync.py) ---

    def bidi(
        self,
        method: str,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
        raw: bool = False,
        trace: TraceContext | None = None,
    ) -> SyncBidiCall:
        """A bidirectional call (spec 4.3): ``with c.bidi("sum") as call``, ``call.send(1)``,
        ``call.done_writing()``, ``for r in call``. Items are JSON values, or bytes with raw=True.
        trace (a handler's ``ctx.trace``, or your own): the call carries a child of
        it as traceparent/tracestate metadata."""
        metadata = with_trace(metadata, trace)
        from ._bidi_sync import SyncBidiCall

        return SyncBidiCall(self, method, timeout, metadata, raw)

    def client_stream(
        self,
        method: str,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
        raw: bool = False,
        trace: TraceContext | None = None,
    ) -> SyncClientStreamCall:
        """A client-streaming call: ``call.send(x)`` for each item, then
        ``call.done_writing()`` returns the one response.
        trace (a handler's ``ctx.trace``, or your own): the call carries a child of
        it as traceparent/tracestate metadata."""
        metadata = with_trace(metadata, trace)
        from ._bidi_sync import SyncClientStreamCall

        return SyncClientStreamCall(self, method, timeout, metadata, raw)


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

    def _start(self) -> tuple[_SyncConn, _SyncStream]:
        for _ in range(4):
            conn = self._client._get_conn(self._deadline)
            if len(self._body) > conn.max_frame:
                raise too_large_error(len(self._body), conn.max_frame)
            if not conn.slots.acquire(timeout=_remaining(self._deadline)):
                raise deadline_error()
            st = _SyncStream(conn.max_frame)
            id = conn.new_id()
            try:
                conn.register(id, st)
                conn.send_request(id, self._head, self._body, self._deadline, True)
            except (OSError, UdskitError) as e:
                if isinstance(e, UdskitError) and e.code == "deadline_exceeded":
                    raise
                continue
            self._conn, self._id, self._st = conn, id, st
            return conn, st
        raise UdskitError(UNAVAILABLE, "could not start the stream")

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        st, conn = self._st, self._conn
        if st is None or conn is None:
            conn, st = self._start()
        while True:
            with conn.mu:
                item = st.items.popleft() if st.items else None
                done, err = st.done, st.error
            if item is None and not done:
                if conn.wait(st, self._deadline):
                    continue
            if item is not None:
                g = st.credit.take(len(item))
                if g:
                    conn.grant(self._id, g)
                return item if self._raw else decode_payload(item, False)
            if not done:
                if conn.cancel(self._id, 4):
                    raise deadline_error()
                conn.wait(st, None)  # it ended meanwhile: the reader is handing it over
                continue
            if err is not None:
                if err.refused and st.credit.received == 0:
                    conn.drain()  # start over on a new connection
                    conn, st = self._start()
                    continue
                raise err
            self.trailer = st.trailer
            raise StopIteration

    def close(self) -> None:
        st = self._st
        if st is not None and not st.done and self._conn is not None:
            self._conn.cancel(self._id, 1)
            with self._conn.mu:
                st.done, st.error = True, UdskitError(CANCELED, "stream closed by the caller")

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
