"""The asyncio server: ``srv = await udskit.serve(addr, handlers)``.

Each accepted connection is a _conn.ServerConn (an asyncio.Protocol) whose
protocol, chosen by its first byte, is spoken by _framed.FramedSession
(udskit frames) or _ndjson_srv.NDJSONSession (newline JSON); the states a
connection goes through are the table in _state.py.

Limits, with the names and defaults of Go's rpc.ServerOptions (seconds
instead of durations; 0 turns a timeout off):

- max_frame, max_in_flight: per connection (a udskit client past
  max_in_flight gets a resource_exhausted connection error; NDJSON lines are
  simply not read meanwhile);
- max_conn_bytes (16 MiB, NDJSON a quarter) and max_server_bytes (64 MiB):
  bytes held (requests in flight, partial frames, answers not yet written);
  over them, reading stops (see _conn.py);
- handshake_timeout (10 s): the first bytes and the hello;
- frame_timeout (30 s): a frame or line that has started must be complete;
- write_timeout (30 s): a client that reads nothing of what is waiting for
  it is closed;
- idle_timeout (0: off): a connection with nothing in flight for that long
  is drained (goaway, then closed);
- max_conns (default: the open-file limit less 64): connections beyond it
  are closed at once, before a byte is read (counted in stats["rejected"],
  logged at most once a second).

Policy refusals and other per-connection problems are logged at most once a
second per kind, with the count of those not logged.

Shutdown has two modes (docs: "Drain modes"): goaway (stop accepting, goaway
to udskit clients, close what is left at the deadline) and linger (keep
serving and accepting until no client is connected, after min_grace, or the
deadline). The standard method ``udskit.health`` reports "draining" from the
moment either starts.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import resource
import signal
from typing import Any, Callable, Iterable, Mapping, Sequence

from ._addr import Address, as_address
from ._bidi_srv import bidi, client_stream, kind_name
from ._conn import READ_SIZE, Call, ServerConn, cancel_call_now
from ._errors import INVALID_ARGUMENT, NOT_FOUND, ListenError, UdskitError
from ._handler import (
    Context,
    Handler,
    Peer,
    PeerCred,
    PeerPolicy,
    Policy,
    all_peers,
    allow_any_verified,
    allow_dns,
    allow_same_user,
    allow_spiffe,
    allow_uids,
    any_peer,
    methods_of,
    raw,
)
from ._intercept import StreamServerInterceptor, UnaryServerInterceptor, wrap_methods
from ._listen import Listener, listen
from ._tls import ServerTLSConfig
from ._wire import DEFAULT_MAX_FRAME, DEFAULT_MAX_IN_FLIGHT

__all__ = [
    "Context", "Handler", "Peer", "PeerCred", "PeerPolicy", "Policy", "Server", "all_peers", "allow_any_verified",
    "allow_dns", "allow_same_user", "allow_spiffe", "allow_uids", "any_peer", "raw", "serve",
]  # fmt: skip

log = logging.getLogger("udskit")

#: fds kept free for the rest of the process when max_conns is derived from
#: the open-file limit
FD_RESERVE = 64
#: how often a connection waiting for the server's total budget looks again
BUDGET_POLL = 0.01
#: connections asyncio accepts per loop iteration (see Server._start)
ACCEPT_BATCH = 16
#: calls of closed connections cancelled per event-loop iteration: a client
#: gone with 4,000 calls in flight cancelled them all in one callback, and
#: their 4,000 task steps (CancelledError thrown into each handler) ran in the
#: next iteration, 20-80 ms while the good client's call waited
CANCEL_BATCH = 256
#: a connection's close that cancels this many calls or more drops the
#: loop's cancelled timers when the cancelling ends (see _drop_cancelled_timers)
BURST_TIMERS = 64
#: per-connection problems of one kind are logged at most this often
LOG_EVERY = 1.0

#: the server trims the C heap when it held at least this much and now holds
#: a sixteenth of it
TRIM_AFTER = 16 << 20


def _load_malloc_trim() -> Callable[[], None]:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]

    def run() -> None:
        trim(0)

    return run


_malloc_trim = _load_malloc_trim()


def _drop_cancelled_timers(loop: asyncio.AbstractEventLoop) -> None:
    """Takes the cancelled timers out of the loop's timer heap now (after a burst).

    asyncio keeps a cancelled TimerHandle in its heap until its time comes,
    unless cancelled ones are over half of a heap of over 100: after 100,000
    calls of a handler that awaited asyncio.sleep(20) were cancelled, about 100
    stayed (the last ones under that rule) for up to 20 s, each with its
    context copy and its time. Allocated while the burst's objects filled
    pymalloc's 1 MiB arenas, they were spread one to three per arena, and an
    arena is freed only when all of it is: 50 MiB of RSS kept (the soak's
    "25 conns x 4000 calls" row, RSS after 78 MiB against 26). The same
    removal as asyncio's own (BaseEventLoop._run_once), on the selector
    loop's attributes; another loop (uvloop) is left alone."""
    sched = getattr(loop, "_scheduled", None)
    if not isinstance(sched, list) or not isinstance(getattr(loop, "_timer_cancelled_count", None), int):
        return
    if not any(h.cancelled() for h in sched):
        return
    live = []
    for h in sched:
        if h.cancelled():
            h._scheduled = False
        else:
            live.append(h)
    heapq.heapify(live)
    sched[:] = live
    loop._timer_cancelled_count = 0  # type: ignore[attr-defined]


HEALTH_STATUSES = frozenset({"serving", "not_serving", "draining"})
DRAIN_MODES = ("goaway", "linger")


def default_max_conns() -> int:
    """The open-file limit less FD_RESERVE (at least 16), or 0 (no limit) when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 0
    return max(16, soft - FD_RESERVE)


def _timeout(name: str, v: float | None) -> float:
    if v is None:
        return 0.0
    if v < 0:
        raise ValueError(f"{name} must be >= 0 (0 or None: no limit), got {v}")
    return float(v)


class Server:
    """A running udskit server. ``await srv.shutdown()`` drains it; ``async with``
    shuts it down on exit; ``await srv.serve_forever()`` runs until SIGTERM/SIGINT
    (when installed with ``handle_signals=True``) or shutdown."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        policy: Policy | PeerPolicy | None,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        write_high_water: int = 4 << 20,
        handshake_timeout: float | None = 10.0,
        frame_timeout: float | None = 30.0,
        write_timeout: float | None = 30.0,
        idle_timeout: float | None = 0.0,
        max_conn_bytes: int = 16 << 20,
        max_server_bytes: int = 64 << 20,
        max_conns: int | None = None,
        disable_ndjson: bool = False,
        unary_interceptors: Sequence[UnaryServerInterceptor] | None = None,
        stream_interceptors: Sequence[StreamServerInterceptor] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._health: dict[str, str] = {"": "serving"}
        self._methods = methods_of(handlers, {"udskit.health": self._health_method, "udskit.methods": self._methods_method, "udskit.stats": self._stats_method})
        # Interceptors wrap each handler once, here; without any the table holds the handlers themselves.
        # A method registered later must go through wrap_methods(..., *self._interceptors) too.
        self._interceptors = (unary_interceptors, stream_interceptors)
        self._methods = wrap_methods(self._methods, unary_interceptors, stream_interceptors)
        #: runs on every peer (a Peer) before any of its bytes is read
        self.policy: Callable[[Any], bool] | None = policy
        self.tls: ServerTLSConfig | None = None
        self.max_frame = max_frame
        self.max_in_flight = max_in_flight
        self.write_high_water = write_high_water
        self.handshake_timeout = _timeout("handshake_timeout", handshake_timeout)
        self.frame_timeout = _timeout("frame_timeout", frame_timeout)
        self.write_timeout = _timeout("write_timeout", write_timeout)
        self.idle_timeout = _timeout("idle_timeout", idle_timeout)
        if max_conn_bytes <= 0 or max_server_bytes <= 0:
            raise ValueError("max_conn_bytes and max_server_bytes must be > 0")
        self.max_conn_bytes = max_conn_bytes
        self.max_server_bytes = max_server_bytes
        self.max_conns = default_max_conns() if max_conns is None else max(0, max_conns)
        self.disable_ndjson = disable_ndjson
        #: bytes held by all connections (see _conn.py)
        self.held = 0
        self.held_peak = 0  # the most held since memory was last trimmed
        # every connection's reads land here first (ServerConn.get_buffer)
        self._read_view = memoryview(bytearray(READ_SIZE))
        self.iter_read = 0  # bytes read in this event-loop iteration
        self.iter_calls = 0  # calls started in this event-loop iteration (_framed.ITER_CALLS)
        self.iter_frames = 0  # frames taken in this event-loop iteration (_framed.ITER_FRAMES)
        self.resumed = 0  # reads' worth let resume since the last budget poll (see _conn.py)
        self._conns: set[ServerConn] = set()
        self._listener: Listener | None = None
        self._aserver: asyncio.AbstractServer | None = None
        self._idle: asyncio.Event = asyncio.Event()
        self._idle.set()
        self._done: asyncio.Event = asyncio.Event()
        self._wake: asyncio.Event = asyncio.Event()
        self._draining = False
        self._shutting = False
        self._end = 0.0  # the drain's deadline (loop time)
        self._sweeper: asyncio.TimerHandle | None = None
        self._budget_waiters: dict[ServerConn, None] = {}  # (in order of waiting: fair resumption)
        self._budget_timer: asyncio.TimerHandle | None = None
        # calls of closed connections waiting to be cancelled (_cancel_calls)
        self._cancelq: collections.deque[Call] = collections.deque()
        self._burst = 0  # calls put in _cancelq since it was last empty
        self._cancel_h: asyncio.Handle | None = None
        self._log_last: dict[str, float] = {}
        self._log_skipped: dict[str, int] = {}
        #: connections admitted, peers refused by the policy, bytes ever read from
        #: refused peers (0 by construction), connections closed for protocol
        #: errors, connections closed at once because max_conns were open
        self.stats: dict[str, int] = {"connections": 0, "refused": 0, "refused_bytes_read": 0, "protocol_errors": 0, "rejected": 0}
        self.addr: Address | None = None

    # --- connections ----------------------------------------------------------

    def _conn_added(self, c: ServerConn) -> None:
        self._conns.add(c)
        self.stats["connections"] += 1
        self._idle.clear()
        if self._sweeper is None:
            tick = self._sweep_tick()
            if tick:
                self._sweeper = self._loop.call_later(tick, self._sweep)

    def _conn_gone(self, c: ServerConn) -> None:
        if c in self._conns:
            self._conns.discard(c)
            self._budget_waiters.pop(c, None)
            if not self._conns:
                self._idle.set()
                self._wake.set()
        self.held -= c.accounted
        c.accounted = 0
        self._recheck_budget()

    @property
    def connections(self) -> int:
        return len(self._conns)

    # --- the sweeper: timeouts --------------------------------------------------

    def _sweep_tick(self) -> float:
        ts = [t for t in (self.handshake_timeout, self.frame_timeout, self.write_timeout, self.idle_timeout) if t > 0]
        if not ts:
            return 0.0
        return min(1.0, max(0.01, min(ts) / 4))

    def _sweep(self) -> None:
        self._sweeper = None
        self._maybe_trim()
        if not self._conns:
            return
        now = self._loop.time()
        for c in list(self._conns):
            c.sweep(now)
        if self._conns:
            self._sweeper = self._loop.call_later(self._sweep_tick(), self._sweep)
        else:
            self._sweeper = self._loop.call_later(self._sweep_tick(), self._maybe_trim)

    # --- cancelling the calls of closed connections ------------------------------

    def _cancel_calls(self, calls: Iterable[Call]) -> None:
        """Cancels calls (of a connection that closed): CANCEL_BATCH of them now
        and as many in each following loop iteration, in order, so that a client
        leaving with thousands of calls in flight does not stall the loop."""
        n = len(self._cancelq)
        self._cancelq.extend(calls)
        self._burst += len(self._cancelq) - n
        if self._cancel_h is None:
            self._cancel_batch()

    def _cancel_batch(self) -> None:
        self._cancel_h = None
        q = self._cancelq
        for _ in range(min(len(q), CANCEL_BATCH)):
            cancel_call_now(q.popleft())
        if q:
            # (call_soon from a callback: the next iteration, after I/O is polled)
            self._cancel_h = self._loop.call_soon(self._cancel_batch)
        else:
            # The last batch's tasks end in the next iteration, before this:
            # a burst that ended is trimmed at once, not at the next sweep
            # (up to a second later, when a measure of what was kept may
            # already have been taken).
            self._loop.call_soon(self._burst_cancelled, self._burst)
            self._burst = 0

    def _burst_cancelled(self, n: int) -> None:
        """The tasks of the last batch have run (their sleep timers are
        cancelled): after a burst of BURST_TIMERS calls or more the loop's
        cancelled timers go whatever the trim decides (it may have run, and
        reset its peak, on a sweep while the burst was being cancelled)."""
        if n >= BURST_TIMERS:
            _drop_cancelled_timers(self._loop)
        self._maybe_trim()

    def _new_iteration(self) -> None:
        self.iter_read = 0

    def count_call(self, loop: asyncio.AbstractEventLoop) -> int:
        """Counts a call started in this loop iteration (framed or NDJSON,
        against _framed.ITER_CALLS) and returns the count, which goes back
        to 0 in the next iteration."""
        self.iter_calls += 1
        if self.iter_calls == 1:
            loop.call_soon(self._new_call_iteration)  # (runs in the next iteration)
        return self.iter_calls

    def _new_call_iteration(self) -> None:
        self.iter_calls = 0

    def _new_frame_iteration(self) -> None:
        self.iter_frames = 0

    def _maybe_trim(self) -> None:
        """After the server held much and now holds little (an attack, a burst
        ended): give the freed heap back to the system (glibc keeps it
        otherwise: memory would stay at the attack's peak)."""
        self.held_peak = max(self.held_peak, self.held)
        if self._cancelq:
            # A burst's calls are still being cancelled (a batch per
            # iteration): trimming now (the sweeper landing mid-way) would
            # drop the timers of the calls cancelled so far only and reset
            # the peak, so the trim when the queue drains would not run and
            # the later calls' cancelled timers would pin their arenas ("25
            # conns x 4000 calls": 50-58 MiB kept with batches of 128).
            return
        if self.held_peak >= TRIM_AFTER and self.held <= self.held_peak // 16:
            self.held_peak = self.held
            _drop_cancelled_timers(self._loop)
            _malloc_trim()

    # --- the total budget --------------------------------------------------------

    def _budget_wait(self, c: ServerConn) -> None:
        """c waits for room (paused reading or a stream waiting): look again soon."""
        self._budget_waiters.setdefault(c, None)
        if self._budget_timer is None:
            self._budget_timer = self._loop.call_later(BUDGET_POLL, self._budget_poll)

    def _budget_poll(self) -> None:
        self._budget_timer = None
        self.resumed = 0  # (the reads resumed since the last poll have arrived, or not: look again)
        self._recheck_budget()
        if self._budget_waiters:
            self._budget_timer = self._loop.call_later(BUDGET_POLL, self._budget_poll)

    def _recheck_budget(self) -> None:
        for c in list(self._budget_waiters):
            c.check_budget()
            if c.closed or (not c.pause and not c.room_waiters):
                self._budget_waiters.pop(c, None)

    # --- logs, limited ------------------------------------------------------------

    def _log_limited(self, kind: str, msg: str, *args: Any) -> None:
        """Logs a warning at most once a second per kind; the others are counted
        and their number given with the next line."""
        now = self._loop.time()
        last = self._log_last.get(kind)
        if last is not None and now - last < LOG_EVERY:
            self._log_skipped[kind] = self._log_skipped.get(kind, 0) + 1
            return
        self._log_last[kind] = now
        skipped = self._log_skipped.pop(kind, 0)
        if skipped:
            msg += " (and %d more like it in the last %.0fs)"
            args = (*args, skipped, now - last if last is not None else 0)
        log.warning(msg, *args)

    def _note_refused(self, peer: Peer | None) -> None:
        self.stats["refused"] += 1
        self._log_limited("refused", "udskit: refused peer %s by policy %s", peer, getattr(self.policy, "__name__", "policy"))

    def _note_rejected(self) -> None:
        self.stats["rejected"] += 1
        self._log_limited("rejected", "udskit: %d connections open (max_conns): closing a new one", len(self._conns))

    # --- registering on a running server ---------------------------------------

    def bidi(self, name: str) -> Callable[[Handler], Handler]:
        """Registers a bidirectional handler: ``@srv.bidi("sum")`` over ``async def
        h(ctx, requests)`` that yields responses (see ``udskit.bidi``)."""

        def register(fn: Handler) -> Handler:
            self._methods.update(wrap_methods(methods_of({name: bidi(fn)}), *self._interceptors))
            return fn

        return register

    def client_stream(self, name: str) -> Callable[[Handler], Handler]:
        """Registers a client-streaming handler: ``@srv.client_stream("count")`` over
        ``async def h(ctx, requests)`` returning the response (see ``udskit.client_stream``)."""

        def register(fn: Handler) -> Handler:
            self._methods.update(wrap_methods(methods_of({name: client_stream(fn)}), *self._interceptors))
            return fn

        return register

    # --- health -------------------------------------------------------------------

    def set_health(self, service: str, status: str) -> None:
        """Sets what ``udskit.health`` reports for service ("" is the server
        as a whole): "serving" or "not_serving" ("draining" is reported for
        every service once a drain has started)."""
        if status not in HEALTH_STATUSES:
            raise ValueError(f"health status {status!r}: want one of {sorted(HEALTH_STATUSES)}")
        self._health[service] = status

    def health(self, service: str = "") -> str:
        """What ``udskit.health`` answers for service; KeyError if unknown."""
        st = self._health[service]
        if self._draining and st == "serving":
            return "draining"
        return st

    def _methods_method(self, ctx: Context, req: Any) -> dict[str, list[dict[str, str]]]:
        """udskit.methods (spec 9.2): the registered methods, sorted, with kind
        (unary, stream, client_stream or bidi) and format (json or raw); standard methods left out."""
        return {"methods": [
            {"name": name, "kind": kind_name(m.kind), "format": "raw" if m.raw else "json"}
            for name, m in sorted(self._methods.items()) if not name.startswith("udskit.")
        ]}

    def _stats_method(self, ctx: Context, req: Any) -> dict[str, Any]:
        """udskit.stats (spec 9.3): the connections served now. No "shm": this server takes
        no shared-memory offers (`udskit ls --stats` shows "shm off")."""
        return {"conns": len(self._conns)}

    def _health_method(self, ctx: Context, req: Any) -> dict[str, str]:
        service = ""
        if req is not None:
            if not isinstance(req, dict) or not isinstance(req.get("service", ""), str):
                raise UdskitError(INVALID_ARGUMENT, 'udskit.health takes {} or {"service":"NAME"}')
            service = req.get("service", "")
        try:
            return {"status": self.health(service)}
        except KeyError:
            raise UdskitError(NOT_FOUND, f"unknown service {service!r}") from None

    # --- start and stop ---------------------------------------------------------

    async def _start(self, addr: Address, mode: int, dir_mode: int, backlog: int, tls: ServerTLSConfig | None = None) -> None:
        if addr.kind == "tls":
            await self._start_tls(addr, backlog, tls)
            return
        if self.policy is not None and addr.kind == "tcp":
            raise ListenError("policy_on_tcp", f"a peer policy needs a unix socket; {addr} is TCP, whose peers carry no kernel credentials")
        self._listener = listen(addr, mode=mode, dir_mode=dir_mode, backlog=backlog)
        self.addr = self._listener.addr

        def factory() -> asyncio.BaseProtocol:
            return ServerConn(self)

        sock = self._listener.sock
        try:
            # asyncio accepts up to `backlog` connections per loop iteration
            # and starts them all in the next: 2,000 hostile connects held a
            # good client's call behind hundreds of connection setups. It is
            # given ACCEPT_BATCH; the kernel's queue keeps the full backlog
            # (listen() again on the listening socket), so connects wait in
            # the queue rather than being refused.
            if addr.kind == "tcp":
                self._aserver = await self._loop.create_server(factory, sock=sock, backlog=min(backlog, ACCEPT_BATCH))
            else:
                self._aserver = await self._loop.create_unix_server(factory, sock=sock, backlog=min(backlog, ACCEPT_BATCH))
            sock.listen(backlog)
        except BaseException:
            self._listener.close()
            raise

    async def _start_tls(self, addr: Address, backlog: int, tls: ServerTLSConfig | None) -> None:
        if tls is None:
            raise ListenError("no_tls_config", f"{addr}: a tls: address needs tls=ServerTLSConfig(cert=..., key=...); there is no plaintext fallback")
        if self.policy is not None and tls.ca is None:
            raise ListenError("no_tls_config", f"{addr}: a peer policy on a tls: listener needs ServerTLSConfig(ca=...): the CA bundle client certificates are verified against")
        # A policy makes TLS mutual: it runs on the client's verified certificate.
        ctx = tls.context(require_client_cert=self.policy is not None)
        self.tls = tls
        self._listener = listen(Address("tcp", addr.name), backlog=backlog)
        self.addr = Address("tls", self._listener.addr.name)

        def factory() -> asyncio.BaseProtocol:
            return ServerConn(self)

        try:
            self._aserver = await self._loop.create_server(factory, sock=self._listener.sock, backlog=backlog, ssl=ctx, ssl_handshake_timeout=10.0)
        except BaseException:
            self._listener.close()
            raise

    @property
    def draining(self) -> bool:
        """Whether a shutdown (either mode) has started."""
        return self._draining

    async def shutdown(
        self,
        grace: float | None = None,
        *,
        mode: str = "goaway",
        min_grace: float = 0.0,
        timeout: float | None = None,
    ) -> None:
        """Drains the server, then returns; timeout (or grace, its older name;
        default 10 s) is the deadline.

        mode "goaway" (default): stop accepting (removing the socket file if
        still ours), send goaway, let calls in flight finish and be answered
        (NDJSON lines already read included); connections close when idle and
        their client has closed, or at the deadline (then what is left is
        cancelled and closed).

        mode "linger": keep serving and accepting as usual (no goaway: a
        client shutting down too may still call and reconnect) until no
        client is connected and min_grace seconds have passed, or the
        deadline; then as goaway.

        Either way ``udskit.health`` says "draining" from now on. A second
        call cuts the first short to its own deadline (``close()``: now)."""
        if mode not in DRAIN_MODES:
            raise ValueError(f"shutdown mode {mode!r}: want 'goaway' or 'linger'")
        if timeout is None:
            timeout = 10.0 if grace is None else grace
        loop = self._loop
        end = loop.time() + max(0.0, timeout)
        self._draining = True
        if self._shutting:
            if end < self._end:
                self._end = end
                self._wake.set()
            await self._done.wait()
            return
        self._shutting = True
        self._end = end
        try:
            if mode == "linger":
                await self._linger(loop.time() + max(0.0, min_grace))
            await self._goaway()
        finally:
            self._done.set()

    async def _linger(self, min_end: float) -> None:
        loop = self._loop
        while True:
            now = loop.time()
            if now >= self._end or (not self._conns and now >= min_end):
                return
            self._wake.clear()
            until = self._end if self._conns else min(self._end, min_end)
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, until - now))
            except asyncio.TimeoutError:
                pass

    async def _goaway(self) -> None:
        loop = self._loop
        if self._aserver is not None:
            self._aserver.close()
            self._aserver = None
        if self._listener is not None:
            self._listener.close()
        for c in list(self._conns):
            c.start_drain()
        while self._conns:
            now = loop.time()
            if now >= self._end:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._end - now)
            except asyncio.TimeoutError:
                pass
        for c in list(self._conns):
            c.cut()
        if self._conns:
            await asyncio.sleep(0)  # the cancelled calls answer "unavailable"
        for c in list(self._conns):
            c.close()
        await asyncio.sleep(0)

    async def close(self) -> None:
        """Immediate: close the listener and every connection."""
        await self.shutdown(timeout=0)

    async def serve_forever(
        self,
        handle_signals: bool = True,
        grace: float = 10.0,
        *,
        mode: str = "goaway",
        min_grace: float = 0.0,
    ) -> None:
        """Runs until shutdown. With handle_signals, the first SIGTERM/SIGINT
        starts a shutdown (mode, min_grace, grace as its deadline) and a second
        one cuts it short."""
        if mode not in DRAIN_MODES:
            raise ValueError(f"shutdown mode {mode!r}: want 'goaway' or 'linger'")
        tasks: set[asyncio.Task[None]] = set()

        def on_signal() -> None:
            if self._shutting:
                t = self._loop.create_task(self.shutdown(timeout=0))
            else:
                t = self._loop.create_task(self.shutdown(mode=mode, min_grace=min_grace, timeout=grace))
            tasks.add(t)
            t.add_done_callback(tasks.discard)

        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, on_signal)
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
    policy: Policy | PeerPolicy | None = None,
    *,
    dir_mode: int = 0o700,
    max_frame: int = DEFAULT_MAX_FRAME,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    backlog: int = 512,
    write_high_water: int = 4 << 20,
    handshake_timeout: float | None = 10.0,
    frame_timeout: float | None = 30.0,
    write_timeout: float | None = 30.0,
    idle_timeout: float | None = 0.0,
    max_conn_bytes: int = 16 << 20,
    max_server_bytes: int = 64 << 20,
    max_conns: int | None = None,
    disable_ndjson: bool = False,
    tls: ServerTLSConfig | None = None,
    unary_interceptors: Sequence[UnaryServerInterceptor] | None = None,
    stream_interceptors: Sequence[StreamServerInterceptor] | None = None,
) -> Server:
    """Starts serving handlers on addr; returns the running Server.

    handlers maps method names to ``async def h(ctx, request)`` (JSON request,
    JSON-encodable result), plain ``def`` functions (run inline: keep them
    quick), async generators (server streams), or any of these wrapped in
    ``udskit.raw`` (bytes in, bytes out). Raise UdskitError to answer with a
    code; any other exception is answered as ``unknown``. Names starting
    with "udskit." are the standard methods (``udskit.health`` is built in).

    policy runs on each peer before any of its bytes is read, as a Peer: a local
    process on a unix socket (``allow_uids(...)``, ``allow_same_user()``), a remote
    workload's verified certificate on a tls: listener (``allow_spiffe(...)``,
    ``allow_dns(...)``, ``allow_any_verified()``; it makes TLS mutual), or both
    composed with ``any_peer``/``all_peers``: one policy object can guard a unix
    and a tls: listener. Any ``callable(peer) -> bool`` works; a policy on plain
    tcp: is refused (its peers carry no identity).

    The limits (timeouts in seconds, 0 or None: none) are those of Go's
    rpc.ServerOptions, with its defaults: see this module's doc.

    unary_interceptors and stream_interceptors run around every call, the
    first outermost (see udskit._intercept)."""
    srv = Server(
        handlers,
        policy=policy,
        max_frame=max_frame,
        max_in_flight=max_in_flight,
        write_high_water=write_high_water,
        handshake_timeout=handshake_timeout,
        frame_timeout=frame_timeout,
        write_timeout=write_timeout,
        idle_timeout=idle_timeout,
        max_conn_bytes=max_conn_bytes,
        max_server_bytes=max_server_bytes,
        max_conns=max_conns,
        disable_ndjson=disable_ndjson,
        unary_interceptors=unary_interceptors,
        stream_interceptors=stream_interceptors,
    )
    await srv._start(as_address(addr), mode, dir_mode, backlog, tls)
    return srv
