"""One accepted server connection (an asyncio.Protocol): what framed and
NDJSON connections share. The protocol itself is spoken by a session,
chosen by the first byte: _framed.FramedSession or _ndjson_srv.NDJSONSession.

Peer policy before any byte is read: asyncio's selector transport calls
``connection_made`` first and registers the socket for reading only after it
(both are queued with call_soon, in that order). connection_made reads
SO_PEERCRED and applies the policy (and max_conns) there; a refused peer's
transport is aborted at once, so no recv() is ever made on its socket.

The connection's states are the table in _state.py.

Memory budget (the same rules as Go's rpc/budget.go). A connection holds:
the request payloads of its calls in flight (plus CALL_OVERHEAD each, as Go
counts 3 KiB per call), the bytes of a partial frame (or of frames read and
held back: FrameDecoder.hold) or
line, and answers not yet written (our coalescing buffer plus the
transport's). When that is over max_conn_bytes (a quarter of it for NDJSON)
and the connection holds something besides the frame now arriving (the
answers of this loop iteration, written at its end, do not count there),
reading stops (Pause.BUDGET) until calls finish or the client reads; the same
while the server's total is over max_server_bytes. A connection holding nothing
but its partial frame is always read, so every connection makes progress
(frame_timeout bounds how long a frame may take). Stream handlers wait
before queueing an item while the connection or the server is over budget.

Timeouts (handshake, frame, write, idle) are applied by the server's
sweeper (Server._sweep), not by a timer per read; see sweep() below.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import logging
import select
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Protocol

from ._errors import DEADLINE_EXCEEDED, PERMISSION_DENIED, RESOURCE_EXHAUSTED, UNAVAILABLE, ProtocolError
from ._handler import Context, Method, Peer, PeerCred, body_of, error_of
from ._listen import peer_cred
from ._tls import remote_peer
from ._state import SERVING, Event, Mode, Pause, next_mode
from ._wire import HEADER, INITIAL_STREAM_CREDIT, T_ERROR

if TYPE_CHECKING:
    from ._server import Server

log = logging.getLogger("udskit")

#: how often a connection whose client sent EOF with calls in flight checks
#: whether the client is gone entirely (then its calls are cancelled)
HANGUP_POLL = 0.02
#: a draining NDJSON connection with no line in flight closes after this long
#: with nothing arriving (Go: the same 20 ms)
NDJSON_QUIET = 0.02
#: what a call in flight costs besides its request bytes (its task, context
#: and frames), counted in the server's total as Go counts 3 KiB per call
#: (callCost): four connections' worth of max_in_flight (4 x 4,096) then fit
#: the default 64 MiB total, so connections going past their limit reach it
#: and are closed at once; at 4 KiB they filled it and were held while their
#: calls slept (test_past_max_in_flight_is_closed_not_just_paused: 1.6-2.9 s)
CALL_OVERHEAD = 3 << 10
#: what one read may bring (asyncio's own read size)
READ_SIZE = 256 << 10
#: what the reads of one event-loop iteration may bring in all before each
#: further read is cut to SMALL_READ: 400 clients sending 1 MiB requests got
#: 256 KiB each per iteration, so one iteration copied and parsed up to
#: 100 MiB while a good client's small request waited behind it (p99 40-57 ms
#: quiet, over 100 ms loaded)
ITER_READ = 1 << 20
#: a read once ITER_READ has come in this iteration (what an iteration costs
#: is then about ITER_READ plus this much per ready connection)
SMALL_READ = 8 << 10
#: a partial frame up to this size never waits for the server's total budget
SMALL_FRAME = 64 << 10


# The deadline timers run ServerConn._expire_due, which reads no context
# variable: one shared empty context instead of a copy per timer (call_at
# copies the current context otherwise).
_TIMER_CTX = contextvars.Context()


def _ignore_data(data: bytes) -> None:
    pass


class Call:
    __slots__ = ("task", "deadline", "armed", "reason", "credit", "credit_ev", "cost", "detached", "conn", "id", "m", "ctx", "coro")

    def __init__(self, cost: int = 0) -> None:
        self.task: asyncio.Task[Any] | None = None
        # the caller's deadline (loop time) while the call is in its connection's
        # deadline heap (ServerConn.set_deadline); armed: still to be expired there
        self.deadline = 0.0
        self.armed = False
        self.reason = 0  # why it was cancelled: 0 shutdown, 1 caller/connection gone, 4 deadline
        self.credit = INITIAL_STREAM_CREDIT
        self.credit_ev: asyncio.Event | None = None
        self.cost = cost  # request bytes held until the call ends
        # cancelled by the client: out of the in-flight count at once, and never
        # answered (spec 4: the id may be reused by the next request)
        self.detached = False
        # set for a unary call run by ServerConn.start (the call is then its
        # task's coroutine, driving the handler's: see send)
        self.conn: ServerConn
        self.id = 0
        self.m: Method | None = None
        self.ctx: Context | None = None
        self.coro: Coroutine[Any, Any, Any] | None = None

    def __lt__(self, other: Call) -> bool:  # (the deadline heap's order)
        return self.deadline < other.deadline

    # A unary call is the coroutine its task runs (ServerConn.start): each step
    # is passed to the handler's coroutine, and its end (a return, an
    # exception, a cancel) is answered within that same step, as a wrapper
    # coroutine (``await handler(ctx, req)``) did, without being one more
    # GC-tracked object per call in flight (issue 25). The task ends with None
    # and no exception, as it did.

    def send(self, v: Any) -> Any:
        coro = self.coro
        assert coro is not None
        try:
            return coro.send(v)
        except StopIteration as e:
            self._end(e.value, None)
        except (asyncio.CancelledError, Exception) as e:
            self._end(None, e)
        raise StopIteration

    def throw(self, *exc: Any) -> Any:
        coro = self.coro
        assert coro is not None
        try:
            return coro.throw(*exc)
        except StopIteration as e:
            self._end(e.value, None)
        except (asyncio.CancelledError, Exception) as e:
            self._end(None, e)
        finally:
            # the exception's traceback holds this frame, and this frame the
            # exception: a cycle per cancelled call for the cyclic GC otherwise
            del exc
        raise StopIteration

    def close(self) -> None:
        if self.coro is not None:
            self.coro.close()

    def __await__(self) -> Any:  # (what makes it a Coroutine for asyncio)
        return self

    @property
    def __name__(self) -> str:  # (how asyncio names the task's coroutine: the handler's)
        return str(getattr(self.coro, "__qualname__", "udskit call"))

    def _end(self, result: Any, e: BaseException | None) -> None:
        conn, m, ctx, id = self.conn, self.m, self.ctx, self.id
        # (the task holds the call as its coroutine: the call lets go of the
        # task, so no reference cycle is left for the cyclic GC)
        self.coro = self.m = self.ctx = self.task = None
        assert m is not None and ctx is not None
        try:
            if e is None:
                body = body_of(m, ctx, result)
                if not self.detached:
                    assert conn.session is not None
                    conn.session.answer(id, ctx, body)
            else:
                conn.failed(id, self, e)
        except Exception as e2:  # (body_of: a raw handler's result that is not bytes, JSON that will not encode)
            conn.failed(id, self, e2)
        finally:
            conn.finish(id, self)


class Session(Protocol):
    """What a connection's protocol (framed or NDJSON) provides."""

    def feed(self, data: bytes) -> None: ...

    def buffered(self) -> int: ...

    def mid_frame(self) -> bool: ...

    def holding(self) -> bool: ...

    def answer(self, id: int, ctx: Context, body: bytes) -> None: ...

    def error(self, id: int, code: int, msg: str, details: bytes = b"", flags: int = 0) -> None: ...

    def start_drain(self) -> None: ...

    def hold(self, on: bool) -> None: ...

    def idle_close(self) -> None: ...

    def on_eof(self) -> None: ...

    def release(self) -> None: ...


def _refuse_tls(transport: asyncio.Transport, why: str) -> None:
    """Spec 5.4 on a tls: connection: the reason as an error frame in place of the hello,
    then close. TLS's own close (close_notify, reading until the client's) drains what the
    client sent, so no TCP reset overtakes the frame; the application reads none of it."""
    head = (why + "; retrying will not help").encode()[:16384]
    transport.write(HEADER.pack(T_ERROR, 0, len(head), 0, 0, PERMISSION_DENIED) + head)
    transport.close()


class ServerConn(asyncio.BufferedProtocol):
    """One connection. A BufferedProtocol so that the server, not asyncio,
    chooses how much one read takes (get_buffer): READ_SIZE until ITER_READ
    bytes came in this loop iteration, SMALL_READ after."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server._loop
        self.transport: asyncio.Transport | None = None
        #: the caller: Peer(cred=...) on a unix socket, Peer(remote=...) on tls:, None on tcp:
        self.peer: Peer | None = None
        self.mode = Mode.SNIFF
        self.closed = False  # mode is CLOSED or REFUSED (kept by to())
        self.session: Session | None = None
        self.draining = False
        self.peer_eof = False
        self.pause = Pause.NONE
        self.limit = server.max_conn_bytes  # this connection's budget (NDJSON: a quarter, set at sniff)
        self.calls: dict[int, Call] = {}
        self.out = bytearray()  # frames of this loop iteration, not yet written (see write)
        self.room_waiters: list[asyncio.Future[None]] = []
        # accounting (budget and sweeper)
        self.held = 0  # request bytes of calls in flight
        self.accounted = 0  # what this connection last added to server.held
        self.rx = 0  # bytes received
        self.boundary = 0  # rx when the session was last between two frames/lines
        self.tx = 0  # bytes handed to the transport
        self.born = self.loop.time()
        self.sw_mid_since = 0.0
        self.sw_mid_bd = -1
        self.sw_sent = -1
        self.sw_write_since = 0.0
        self.sw_idle_bd = -1
        self.sw_idle_since = 0.0
        self.hangup_timer: asyncio.TimerHandle | None = None
        # what takes the bytes read: the session's feed, then (frames flowing)
        # the frame decoder's, without a hop
        self.feed: Callable[[bytes], None] = _ignore_data
        self.nd_quiet: asyncio.TimerHandle | None = None
        self.partial_wait = False  # paused only for its large partial frame (the total is over)
        self.cancelled = False  # its calls were handed to Server._cancel_calls
        # The deadlines of its calls: one heap (of Calls, by deadline) and one
        # timer, set for the earliest, instead of a TimerHandle per call (with
        # its callback and arguments: three GC-tracked objects per call in
        # flight, which every full collection walks; issue 25, "100k ids").
        # A call that ends stays in the heap, disarmed, until its deadline
        # comes or the heap is rebuilt (dl_dead: how many such).
        self.deadlines: list[Call] = []
        self.dl_dead = 0
        self.dl_timer: asyncio.TimerHandle | None = None
        self.dl_at = 0.0  # when dl_timer fires

    def to(self, event: Event) -> None:
        self.mode = next_mode(self.mode, event)
        # (a plain attribute, not a property: it is read on every frame)
        self.closed = self.mode is Mode.CLOSED or self.mode is Mode.REFUSED

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
            self.peer = Peer(cred=PeerCred(*c)) if c else None
        if srv.max_conns and len(srv._conns) >= srv.max_conns:
            # Over the cap (it keeps fds for the rest of the process): closed
            # before the transport starts reading.
            self.to(Event.REJECT)
            srv._note_rejected()
            transport.abort()
            return
        if srv.tls is not None:
            # asyncio calls connection_made after the TLS handshake: the
            # client's chain is verified; the rules run before any read.
            remote = remote_peer(transport.get_extra_info("peercert"))
            self.peer = None if remote is None else Peer(remote=remote)
            why = srv.tls.refusal(remote)
            if why is None and srv.policy is not None and remote is None:
                why = "no client certificate: this server requires mutual TLS (give the client a certificate from a CA it trusts)"
            if why is not None:
                self.to(Event.REFUSE)
                srv.stats["refused"] += 1
                log.warning("udskit: TLS peer refused: %s", why)
                _refuse_tls(transport, why)
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
                self.to(Event.REFUSE)
                srv._note_refused(self.peer)
                if srv.tls is not None:
                    pol = getattr(srv.policy, "__name__", "the server's policy")
                    _refuse_tls(transport, f"peer refused by policy: {self.peer} is not admitted by {pol}")
                else:
                    transport.abort()
                return
        srv._conn_added(self)
        log.debug("udskit: connect %s", self.peer)
        transport.set_write_buffer_limits(high=srv.write_high_water)

    def get_buffer(self, sizehint: int) -> memoryview:
        # One scratch buffer for the whole server: buffer_updated copies what
        # came out of it before anything else runs on the loop.
        srv = self.server
        left = ITER_READ - srv.iter_read
        if left >= READ_SIZE:
            return srv._read_view
        return srv._read_view[: max(SMALL_READ, left)]

    def buffer_updated(self, nbytes: int) -> None:
        srv = self.server
        if srv.iter_read == 0:
            # (call_soon from a callback runs in the next iteration)
            self.loop.call_soon(srv._new_iteration)
        srv.iter_read += nbytes
        self.data_received(bytes(srv._read_view[:nbytes]))

    def data_received(self, data: bytes) -> None:
        # (once the session is chosen, data_received is received)
        if self.mode is Mode.SNIFF:
            self.rx += len(data)
            self._sniff(data)
            self.after_read()
        elif self.mode is Mode.REFUSED:
            self.server.stats["refused_bytes_read"] += len(data)

    def received(self, data: bytes) -> None:
        self.rx += len(data)
        try:
            self.feed(data)
        except ProtocolError as e:
            self.conn_error(e.number, e.message)
        self.after_read()

    def resume_held(self) -> None:
        """Takes the frames held back while over budget (FramedSession.hold)."""
        if not self.closed and not (self.pause & Pause.BUDGET) and self.mode is Mode.FRAMES:
            self.received(b"")
            if self.peer_eof:
                self.maybe_close()  # (the frames held at EOF are served: maybe_close waited)

    def after_read(self) -> None:
        s = self.session
        partial = s.buffered() if s is not None else 0
        self.boundary = self.rx - partial
        self.check_budget(partial)

    def eof_received(self) -> bool | None:
        self.peer_eof = True
        if self.session is not None:
            self.session.on_eof()
        if self.calls and not self.closed and self.hangup_timer is None:
            self.hangup_timer = self.loop.call_later(HANGUP_POLL, self._hangup_check)
        self.maybe_close()
        return True  # keep writing the answers of calls in flight

    def connection_lost(self, exc: Exception | None) -> None:
        was = self.closed
        if not was:
            self.to(Event.CLOSE)
        # Free the buffers now and break the reference cycles (a bound method
        # stored on its own object, the decoder's callback): memory must not
        # wait for the cyclic GC after an attack.
        if self.session is not None:
            self.session.release()
        self.feed = _ignore_data
        self.__dict__.pop("data_received", None)
        self._cancel_all()
        self.held = 0
        self.out = bytearray()
        if self.hangup_timer is not None:
            self.hangup_timer.cancel()
        self._drop_deadlines()
        if self.nd_quiet is not None:
            self.nd_quiet.cancel()
        self.pause = Pause.NONE
        self._wake_room()
        srv = self.server
        srv._conn_gone(self)
        if not was:
            log.debug("udskit: disconnect %s", self.peer)

    def pause_writing(self) -> None:
        # The client does not read its answers: stop reading its requests.
        self.set_pause(Pause.WRITES, True)

    def resume_writing(self) -> None:
        self.set_pause(Pause.WRITES, False)
        self.check_budget()

    # --- reading, paused for reasons (Pause) ---------------------------------

    def set_pause(self, reason: int, on: bool) -> None:
        before = self.pause
        self.pause = before | reason if on else before & ~reason
        if self.closed or self.transport is None or bool(before) == bool(self.pause):
            return
        if self.pause:
            self.transport.pause_reading()
        else:
            try:
                self.transport.resume_reading()
            except RuntimeError:
                pass

    # --- memory budget ---------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        """(bytes held in all, of which by the frame or line now arriving)."""
        t = self.transport
        s = self.session
        partial = s.buffered() if s is not None else 0
        wb = t.get_write_buffer_size() if t is not None and not self.closed else 0
        return self.held + partial + len(self.out) + wb, partial

    def check_budget(self, partial: int = -1) -> None:
        """Recounts what this connection holds, pauses or resumes reading it, and
        wakes stream handlers waiting for room (partial: the bytes of the frame
        arriving, if the caller knows them)."""
        if self.closed:
            return
        srv = self.server
        if partial < 0:
            s = self.session
            partial = s.buffered() if s is not None else 0
        t = self.transport
        u = self.held + partial + len(self.out) + (t.get_write_buffer_size() if t is not None else 0)
        held = srv.held = srv.held + u - self.accounted
        self.accounted = u
        limit = self.limit
        # The per-call overhead counts in the server's total only (as Go): the
        # connection's own budget is its bytes, so max_in_flight stays reachable
        # (a client past it is closed, not just paused).
        own = u - len(self.calls) * CALL_OVERHEAD
        if not self.pause and own <= limit and held <= srv.max_server_bytes:
            # the common case: under every limit, reading
            self.partial_wait = False
            if self.room_waiters:
                self._wake_room()
            return
        # Held besides the frame arriving; answers of this loop iteration not
        # yet handed to the transport (out, flushed at its end) do not count
        # here: with them, a good client whose answer was just made was paused
        # while the total was over (hostile connections' bytes) and waited for
        # the next budget poll, 10-20 ms a call. Those the client does not read
        # stay in the transport's buffer and count.
        other = u - partial - len(self.out)
        # The server's total: a connection reading goes on while the total is
        # under; one paused resumes only when a read's worth fits, and the
        # paused ones resume a few at a time (Server._recheck_budget), so that
        # hundreds of them do not all read at once the moment it dips under.
        paused = bool(self.pause & Pause.BUDGET)
        total_over = srv.held + (srv.resumed + READ_SIZE if paused else 0) > srv.max_server_bytes
        if other > 0:
            over = own > limit or total_over
            self.partial_wait = False
        else:
            # Holding only a frame that is arriving: it always fits its own
            # connection's budget (max_frame), but a large one waits while the
            # server's total is over (frame_timeout keeps running meanwhile: a
            # total held by half-sent frames ends with them), as in Go.
            over = partial > SMALL_FRAME and total_over
            self.partial_wait = over
        if paused and not over:
            srv.resumed += READ_SIZE
        if over != bool(self.pause & Pause.BUDGET):
            self.set_pause(Pause.BUDGET, over)
            if self.session is not None:
                self.session.hold(over)
            if over:
                srv._budget_wait(self)
        if self.room_waiters and self.has_room():
            self._wake_room()

    def has_room(self) -> bool:
        """Whether a stream handler may queue another item now."""
        if self.closed:
            return True
        srv = self.server
        u = self.accounted
        limit = self.limit
        return not (self.pause & Pause.WRITES) and (u == 0 or (u <= limit and srv.held <= srv.max_server_bytes))

    async def wait_room(self) -> None:
        while not self.has_room():
            w = self.loop.create_future()
            self.room_waiters.append(w)
            self.server._budget_wait(self)
            await w

    def _wake_room(self) -> None:
        ws, self.room_waiters = self.room_waiters, []
        for w in ws:
            if not w.done():
                w.set_result(None)

    # --- connection start ----------------------------------------------------

    def _sniff(self, data: bytes) -> None:
        first = data[:1]
        if first == b"U":
            from ._framed import FramedSession

            self.to(Event.BYTE_U)
            self.session = FramedSession(self)
        elif first == b"{" and not self.server.disable_ndjson:
            from ._ndjson_srv import NDJSONSession

            self.to(Event.BYTE_BRACE)
            self.session = NDJSONSession(self)
            # An NDJSON byte costs about three (the line, its data, the reply
            # line) and a parse: a quarter of the budget holds as much (Go).
            self.limit = self.server.max_conn_bytes // 4
        else:
            self.server.stats["protocol_errors"] += 1
            self.server._log_limited(
                "protocol", "udskit: %s sent first byte %r: neither udskit ('U') nor NDJSON ('{'); closing", self.peer, first
            )
            self.close(abort=True)
            return
        self.feed = self.session.feed
        self.data_received = self.received  # type: ignore[method-assign]
        try:
            self.session.feed(data)
        except ProtocolError as e:
            self.conn_error(e.number, e.message)

    # --- calls ------------------------------------------------------------------

    def add_call(self, id: int, c: Call) -> None:
        self.calls[id] = c
        c.cost += CALL_OVERHEAD
        self.held += c.cost

    def cancel_call(self, id: int, reason: int) -> None:
        """The client cancelled id: it stops counting at once and is never answered."""
        c = self.calls.pop(id, None)
        if c is None:
            return
        c.detached = True
        c.reason = reason
        self._release(c)
        self.disarm(c)
        if c.task is not None and not c.task.done():
            c.task.cancel()
        if c.credit_ev is not None:
            c.credit_ev.set()

    def _release(self, c: Call) -> None:
        if c.cost:
            self.held -= c.cost
            c.cost = 0

    def finish(self, id: int, c: Call) -> None:
        self.disarm(c)
        self._release(c)
        if self.calls.get(id) is c:
            del self.calls[id]
        self.on_call_done()

    def on_call_done(self) -> None:
        """A call ended: room for more (budget, NDJSON in-flight) and perhaps the end."""
        if self.closed:
            return
        if self.pause & Pause.IN_FLIGHT and len(self.calls) < self.server.max_in_flight:
            self.set_pause(Pause.IN_FLIGHT, False)
        self.check_budget()
        self.maybe_close()

    def expire(self, c: Call) -> None:
        if c.task is not None and not c.task.done():
            c.reason = 4
            c.task.cancel()

    # --- deadlines: one heap and one timer per connection -----------------------

    def set_deadline(self, c: Call, deadline: float) -> None:
        """c is cancelled (reason 4: answered deadline_exceeded) at deadline, loop time."""
        c.deadline = deadline
        c.armed = True
        heapq.heappush(self.deadlines, c)
        if self.dl_timer is None or deadline < self.dl_at:
            self._arm(deadline)

    def disarm(self, c: Call) -> None:
        """c ended: its deadline no longer matters. It leaves the heap when its
        deadline comes, or at the next rebuild, once most of the heap has ended
        (so ended calls are never kept in numbers beyond the live ones)."""
        if not c.armed:
            return
        c.armed = False
        self.dl_dead += 1
        h = self.deadlines
        if self.dl_dead > 64 and self.dl_dead * 2 > len(h):
            live = [x for x in h if x.armed]
            heapq.heapify(live)
            self.deadlines = live
            self.dl_dead = 0
            if not live and self.dl_timer is not None:
                self.dl_timer.cancel()
                self.dl_timer = None

    def _arm(self, when: float) -> None:
        if self.dl_timer is not None:
            self.dl_timer.cancel()
        self.dl_at = when
        self.dl_timer = self.loop.call_at(when, self._expire_due, context=_TIMER_CTX)

    def _expire_due(self) -> None:
        """The timer came: every call whose deadline has passed is cancelled."""
        self.dl_timer = None
        h = self.deadlines
        now = max(self.loop.time(), self.dl_at)
        while h and h[0].deadline <= now:
            c = heapq.heappop(h)
            if c.armed:
                c.armed = False
                self.expire(c)
            else:
                self.dl_dead -= 1
        if h:
            self._arm(h[0].deadline)

    def _drop_deadlines(self) -> None:
        if self.dl_timer is not None:
            self.dl_timer.cancel()
            self.dl_timer = None
        for c in self.deadlines:
            c.armed = False
        self.deadlines = []
        self.dl_dead = 0

    def failed(self, id: int, c: Call, e: BaseException) -> None:
        if c.detached or self.closed:
            return
        if isinstance(e, asyncio.CancelledError):
            if c.reason == 4:
                self.session_error(id, DEADLINE_EXCEEDED, "deadline exceeded")
            elif c.reason == 0:  # shutdown's grace ended
                self.session_error(id, UNAVAILABLE, "server shut down before the call finished")
            # reason 1: the caller canceled or went away; no answer (spec 4)
        else:
            self.session_error(id, *error_of(e))

    def session_error(self, id: int, code: int, msg: str, details: bytes = b"", flags: int = 0) -> None:
        assert self.session is not None
        self.session.error(id, code, msg, details, flags)

    async def run(self, id: int, c: Call, m: Method, ctx: Context, req: Any, aw: Any = None) -> None:
        """Runs a handler (or awaits aw, what it returned) and answers (client-stream calls)."""
        try:
            body = body_of(m, ctx, await (m.fn(ctx, req) if aw is None else aw))
            if not c.detached:
                assert self.session is not None
                self.session.answer(id, ctx, body)
        except (asyncio.CancelledError, Exception) as e:
            self.failed(id, c, e)
        finally:
            self.finish(id, c)

    def start(self, id: int, c: Call, m: Method, ctx: Context, req: Any) -> None:
        """Runs an async unary handler: a task whose coroutine is the call itself,
        driving the handler's own (Call.send). The task has its own copy of the
        context, as before."""
        try:
            coro = m.fn(ctx, req)
        except Exception as e:  # (a handler that cannot be called with (ctx, req))
            self.failed(id, c, e)
            self.finish(id, c)
            return
        if not asyncio.iscoroutine(coro):  # another awaitable: awaited by run
            c.task = self.loop.create_task(self.run(id, c, m, ctx, req, coro))
            return
        c.conn, c.id, c.m, c.ctx, c.coro = self, id, m, ctx, coro
        c.task = self.loop.create_task(c)  # (a Coroutine by its methods)

    def run_sync(self, id: int, m: Method, ctx: Context, req: Any) -> None:
        """Runs a plain-function handler inline and answers (udskit or NDJSON)."""
        assert self.session is not None
        try:
            body = body_of(m, ctx, m.fn(ctx, req))
        except Exception as e:
            self.session.error(id, *error_of(e))
            return
        self.session.answer(id, ctx, body)

    def _cancel_all(self, reason: int = 1) -> None:
        """The connection is closed: every call of it is cancelled, through the
        server's queue (Server._cancel_calls: CANCEL_BATCH calls now, the rest
        a batch per loop iteration), once (close, then connection_lost)."""
        if self.cancelled or not self.calls:
            return
        self.cancelled = True
        calls = list(self.calls.values())
        for c in calls:
            c.reason = reason
        self.server._cancel_calls(calls)

    def _hangup_check(self) -> None:
        """After the client's EOF with calls in flight: cancel them all at once if
        the client is gone entirely (closed or reset), not just done sending."""
        self.hangup_timer = None
        if self.closed or not self.calls:
            return
        if self.peer_gone():
            self.close(abort=True)
        else:
            self.hangup_timer = self.loop.call_later(HANGUP_POLL, self._hangup_check)

    def peer_gone(self) -> bool:
        """Whether the client closed or reset its socket entirely (a half-close
        is not that). Asks poll(2) for no event: only POLLHUP/POLLERR come back."""
        t = self.transport
        sock = t.get_extra_info("socket") if t is not None else None
        if sock is None:
            return True
        try:
            p = select.poll()
            p.register(sock.fileno(), 0)
            return any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in p.poll(0))
        except (OSError, ValueError):
            return True

    # --- writing ----------------------------------------------------------------

    # Writes are coalesced: frames produced in one event-loop iteration go out
    # as one transport.write at the end of it (flush, scheduled with
    # call_soon). Fewer send() calls under load, and the transport's buffer
    # holds a few large chunks rather than one per frame: Python 3.12+ sums its
    # chunk list on every write, which is quadratic with many small frames.

    def write(self, b: bytes) -> None:
        if self.closed:
            return
        if not self.out:
            self.loop.call_soon(self.flush)
        self.out += b

    def write_big(self, hdr: bytes, body: bytes) -> None:
        """A large frame: written without copying its body into the coalescing buffer."""
        if self.closed:
            return
        self.flush()
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(hdr)
            t.write(body)
            self.tx += len(hdr) + len(body)

    def flush(self) -> None:
        out = self.out
        if not out:
            return
        self.out = bytearray()
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(bytes(out))
            self.tx += len(out)

    # --- the end ------------------------------------------------------------------

    def conn_error(self, code: int, msg: str) -> None:
        srv = self.server
        srv.stats["protocol_errors"] += 1
        srv._log_limited("protocol", "udskit: closing the connection of %s: %s", self.peer, msg)
        if self.mode is Mode.FRAMES or self.mode is Mode.HELLO:
            from ._framed import connection_error_frame

            self.write(connection_error_frame(code, msg))
        self.close()

    def close(self, abort: bool = False) -> None:
        t = self.transport
        if t is None or self.closed:
            return
        if not abort:
            self.flush()
        self.to(Event.CLOSE)
        self._cancel_all()
        self._drop_deadlines()  # (its calls are cancelled through the server's queue)
        self.check_budget_closed()
        if abort:
            t.abort()
        else:
            t.close()

    def check_budget_closed(self) -> None:
        # (connection_lost recounts too; the calls' bytes are free once cancelled)
        self.server.held -= self.accounted
        self.accounted = 0
        self._wake_room()

    def maybe_close(self) -> None:
        if self.calls or self.closed or self.mode not in SERVING:
            return
        s = self.session
        assert s is not None
        if self.peer_eof:
            # frames or lines read before the EOF and held for the next loop
            # iteration are served first (a client sending 5,000 requests, then
            # EOF, got 4,096 answers)
            if not s.holding():
                self.close()
        elif self.draining and self.mode is Mode.NDJSON and not s.buffered() and self.nd_quiet is None:
            # No line in flight: close once nothing has arrived for NDJSON_QUIET
            # either (a line the client sent as we decided would be lost).
            self.nd_quiet = self.loop.call_later(NDJSON_QUIET, self._nd_quiet_check, self.rx)

    def _nd_quiet_check(self, rx: int) -> None:
        self.nd_quiet = None
        if self.closed or self.calls:
            return
        s = self.session
        if self.rx == rx and (s is None or not s.buffered()):
            self.close()
        else:
            self.maybe_close()

    def start_drain(self) -> None:
        if self.draining or self.closed:
            return
        self.draining = True
        if self.session is None or self.mode is Mode.HELLO and not self.calls:
            # nothing spoken yet: nobody to tell
            self.close()
            return
        self.session.start_drain()
        self.maybe_close()

    def cut(self) -> None:
        """Shutdown's grace ended: calls still running are cancelled (answered
        unavailable) and the connection closes."""
        for c in list(self.calls.values()):
            if c.task is not None and not c.task.done():
                c.reason = 0
                c.task.cancel()

    # --- timeouts (called by Server._sweep) --------------------------------------

    def sweep(self, now: float) -> None:
        srv = self.server
        if self.closed:
            return
        if self.mode is Mode.SNIFF or self.mode is Mode.HELLO:
            if srv.handshake_timeout and now - self.born > srv.handshake_timeout:
                srv._log_limited("handshake", "udskit: no hello from %s within %ss; closing", self.peer, srv.handshake_timeout)
                self.close(abort=True)
            return
        if self.pause and self.peer_gone():
            # not read (its own backpressure), so its EOF is not seen: a client
            # gone entirely must not keep its calls and bytes
            self.close(abort=True)
            return
        rx, bd = self.rx, self.boundary
        started = rx > bd
        ours = self.pause & (Pause.IN_FLIGHT | Pause.WRITES | Pause.LINES) or (
            self.pause & Pause.BUDGET and not self.partial_wait and not self._total_mid_frame()
        )
        if srv.frame_timeout and started and not ours:
            if self.sw_mid_bd != bd:
                self.sw_mid_bd, self.sw_mid_since = bd, now
            elif now - self.sw_mid_since > srv.frame_timeout:
                srv._log_limited("frame", "udskit: closing the connection of %s: frame not finished within %ss", self.peer, srv.frame_timeout)
                self.close(abort=True)
                return
        else:
            self.sw_mid_bd = -1
        if srv.write_timeout:
            t = self.transport
            wb = t.get_write_buffer_size() if t is not None else 0
            sent = self.tx - wb
            if not wb or sent != self.sw_sent:
                self.sw_sent, self.sw_write_since = sent, now
            elif now - self.sw_write_since > srv.write_timeout:
                srv._log_limited("write", "udskit: closing the connection of %s: it read nothing within %ss", self.peer, srv.write_timeout)
                self.close(abort=True)
                return
        if srv.idle_timeout:
            if self.calls or self.draining or started or bd != self.sw_idle_bd:
                self.sw_idle_bd, self.sw_idle_since = bd, now
            elif now - self.sw_idle_since > srv.idle_timeout:
                log.debug("udskit: closing idle connection of %s", self.peer)
                assert self.session is not None
                self.session.idle_close()

    def _total_mid_frame(self) -> bool:
        """Paused at the server's total (its own budget is not over) with a frame
        started, its header in: the frame timer runs, as in Go (reserve waits for
        the total with FrameTimeout running; only a wait for the connection's own
        budget, or before the next frame, is ours). partial_wait covers a
        connection holding nothing else; this one has calls in flight, and its
        started frame was never timed while the total stayed over."""
        s = self.session
        if s is None or not s.mid_frame():
            return False
        u, _ = self.usage()
        return u - len(self.calls) * CALL_OVERHEAD <= self.limit


def too_many_error(max_in_flight: int) -> ProtocolError:
    return ProtocolError("resource_exhausted", f"more than {max_in_flight} calls in flight", RESOURCE_EXHAUSTED)


def cancel_call_now(c: Call) -> None:
    """Cancels what a call runs: its task, a stream handler waiting for credit
    (Server._cancel_batch). (Its deadline went with its connection's heap.)"""
    c.armed = False
    t = c.task
    if t is not None and not t.done():
        t.cancel()
    if c.credit_ev is not None:
        c.credit_ev.set()
