"""The udskit (framed) side of a server connection: hellos, frames, calls and
server streams (protocol/spec.md sections 2-4)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, AsyncIterator

from . import _bidi_srv
from ._common import BIG_PAYLOAD
from ._conn import Call, too_many_error
from ._errors import (
    INVALID_ARGUMENT,
    PROTOCOL_VIOLATION,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    UNIMPLEMENTED,
    ProtocolError,
    UdskitError,
)
from ._handler import STANDARD_PREFIX, Context, Method, answer_head, body_of, error_of
from ._state import Event, Mode, Pause
from ._wire import (
    FLAG_CLIENT_STREAM,
    FLAG_REFUSED,
    FLAG_STREAM,
    HEADER,
    HELLO_SIZE,
    MAX_HEAD,
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
    FrameDecoder,
    Hello,
    check_hello_start,
    decode_hello,
    negotiate,
    parse_request,
)

if TYPE_CHECKING:
    from ._conn import ServerConn

_pack = HEADER.pack

#: while calls arrive in one read, the budget is looked at every this many calls
BUDGET_CHECK_EVERY = 64
#: calls the server starts per event-loop iteration, over all connections;
#: the frames past it wait in their decoder for the next iteration. 128, not
#: 256: "100k ids in flight" (scripts/soak.sh -server python -only "100k ids"),
#: quiet machine: good p99 12-24 ms in 6 runs (4 under 20) against 17-33 ms
#: (2 of 10 under 20) at 256. (CANCEL_BATCH at 128 too helped p99 more but
#: left 50-58 MiB kept after "25 x 4000" against 38-41.)
ITER_CALLS = 128

#: frames of any type the server takes per event-loop iteration, over all
#: connections (pings, cancels, credit, stream items cost a few us each: one
#: 256 KiB read of 16-byte pings was 16,000 of them in one callback); the rest
#: wait in their decoder for the next iteration, as calls past ITER_CALLS do
ITER_FRAMES = 2048

#: a stream handler that never awaits is made to yield to the event loop
#: after this many items in a row, so other connections are served meanwhile
STREAM_YIELD_EVERY = 16


def _ignore_frame(t: int, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
    pass


def connection_error_frame(code: int, msg: str) -> bytes:
    hb = msg.encode()[:MAX_HEAD]
    return _pack(T_ERROR, 0, len(hb), 0, 0, code) + hb


class FramedSession:
    __slots__ = ("conn", "hello_buf", "decoder")

    def __init__(self, conn: ServerConn) -> None:
        self.conn = conn
        self.hello_buf = b""
        self.decoder = FrameDecoder(self._on_frame, conn.server.max_frame)

    def buffered(self) -> int:
        return len(self.hello_buf) + self.decoder.buffered

    def mid_frame(self) -> bool:
        return self.decoder.mid_frame

    def holding(self) -> bool:
        return self.decoder.holding

    def feed(self, data: bytes) -> None:
        if self.conn.mode is Mode.FRAMES:
            self.decoder.feed(data)
        else:
            self._on_hello_bytes(data)

    def hold(self, on: bool) -> None:
        """Stops (or resumes) taking frames already read: the budget is over."""
        d = self.decoder
        if d.hold == on:
            return
        d.hold = on
        if not on and d.buffered:
            self.conn.loop.call_soon(self.conn.resume_held)

    def _resume_calls(self) -> None:
        conn = self.conn
        if conn.closed or conn.pause & Pause.BUDGET:
            return  # (the budget resumes it: hold(False))
        self.decoder.hold = False
        conn.resume_held()

    def on_eof(self) -> None:
        _bidi_srv.on_eof(self.conn)  # no more request items on any call (spec 4.3)

    def release(self) -> None:
        self.hello_buf = b""
        self.decoder = FrameDecoder(_ignore_frame, self.decoder.max_frame)
        self.conn.feed = self.decoder.feed

    # --- hello ----------------------------------------------------------------

    def _on_hello_bytes(self, data: bytes) -> None:
        conn = self.conn
        buf = self.hello_buf + data
        srv = conn.server
        mine = Hello(max_frame=srv.max_frame, max_in_flight=srv.max_in_flight)  # (flags: client_stream too)
        try:
            if len(buf) < HELLO_SIZE:
                check_hello_start(buf)
                self.hello_buf = buf
                return
            n = negotiate(decode_hello(buf[:HELLO_SIZE]), mine)
        except ProtocolError as e:
            conn.write(mine.encode())
            conn.flush()
            conn.conn_error(PROTOCOL_VIOLATION, e.message)
            return
        conn.write(mine.encode())
        self.decoder.max_frame = n.max_frame
        self.hello_buf = b""
        conn.to(Event.HELLO_DONE)
        conn.feed = self.decoder.feed  # from now on bytes go straight to the decoder
        if conn.draining:
            self._send_goaway()
        rest = buf[HELLO_SIZE:]
        if rest:
            self.decoder.feed(rest)

    # --- frames ------------------------------------------------------------

    def _on_frame(self, t: int, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
        conn = self.conn
        if conn.closed:
            return
        srv = conn.server
        srv.iter_frames += 1
        if srv.iter_frames == 1:
            conn.loop.call_soon(srv._new_frame_iteration)  # (runs in the next iteration)
        elif srv.iter_frames >= ITER_FRAMES and not self.decoder.hold:
            # Enough frames taken in this loop iteration: the rest of what was
            # read (kept as it came, not copied) is taken in the next one.
            self.decoder.hold = True
            conn.loop.call_soon(self._resume_calls)
        if t == T_REQUEST:
            self._on_request(flags, id, aux, head, payload)
        elif t == T_CANCEL:
            conn.cancel_call(id, 4 if aux == 4 else 1)
        elif t == T_STREAM_CREDIT:
            c = conn.calls.get(id)
            if c is not None:
                c.credit += aux
                if c.credit > 0 and c.credit_ev is not None:
                    c.credit_ev.set()
        elif t == T_REQUEST_DATA:
            _bidi_srv.on_request_data(conn, id, payload)
        elif t == T_REQUEST_END:
            _bidi_srv.on_request_end(conn, id)
        elif t == T_PING:
            conn.write(_pack(T_PONG, 0, 0, 0, len(payload), aux) + payload)
        elif t in (T_RESPONSE, T_ERROR, T_STREAM_DATA, T_STREAM_END, T_GOAWAY, T_REQUEST_CREDIT):
            raise ProtocolError("protocol_violation", f"client sent a server frame (type {t})")
        # pong and unknown types are skipped

    def _on_request(self, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
        conn = self.conn
        method, md = parse_request(head)
        if id in conn.calls:
            raise ProtocolError("protocol_violation", f"request id {id} is already in flight")
        srv = conn.server
        if len(conn.calls) >= srv.max_in_flight:
            raise too_many_error(srv.max_in_flight)
        if conn.draining and not method.startswith(STANDARD_PREFIX):
            self.error(id, UNAVAILABLE, "server is shutting down; call not processed", flags=FLAG_REFUSED)
            return
        m = srv._methods.get(method)
        if flags & FLAG_CLIENT_STREAM or (m is not None and m.kind in _bidi_srv.CLIENT_KINDS):
            _bidi_srv.open_call(self, flags, id, aux, method, md, payload, m)  # spec 4.3
            return
        stream = bool(flags & FLAG_STREAM)
        if m is None:
            self.error(id, UNIMPLEMENTED, f'unknown method "{method}"')
            return
        if (m.kind == "stream") != stream:
            # the same words as the Go server: `udskit call` looks for "server-streaming"
            if stream:
                msg = f'method "{method}" is unary; call it with Call, not Stream'
            else:
                msg = f'method "{method}" is server-streaming; call it with Stream'
            self.error(id, UNIMPLEMENTED, msg)
            return
        loop = conn.loop
        deadline = loop.time() + aux / 1e6 if aux else None
        ctx = Context(method, conn.peer, md, deadline, loop)
        if m.raw:
            req: Any = payload
        elif not payload:
            req = None
        else:
            try:
                req = json.loads(payload)
            except RecursionError:
                self.error(id, INVALID_ARGUMENT, f"{method}: request JSON is nested too deeply")
                return
            except ValueError as e:
                self.error(id, INVALID_ARGUMENT, f"{method}: request is not JSON: {e}")
                return
        if m.kind == "sync":
            conn.run_sync(id, m, ctx, req)
            return
        c = Call(len(payload))
        conn.add_call(id, c)
        if srv.count_call(loop) >= ITER_CALLS and not self.decoder.hold:
            # Enough calls started in this loop iteration (one 256 KiB read
            # holds 4,000 small requests: a task each, 20-30 ms while a good
            # client waited): take the rest of what was read in the next one.
            self.decoder.hold = True
            loop.call_soon(self._resume_calls)
        if len(conn.calls) % BUDGET_CHECK_EVERY == 0:
            # many calls in one read: look at the budget now, not after the read
            conn.check_budget()
        if deadline is not None:
            conn.set_deadline(c, deadline)
        if m.kind == "stream":
            c.credit_ev = asyncio.Event()
            c.task = loop.create_task(self._run_stream(id, c, m, ctx, req))
        else:
            conn.start(id, c, m, ctx, req)

    async def _run_stream(self, id: int, c: Call, m: Method, ctx: Context, req: Any) -> None:
        conn = self.conn
        gen: AsyncIterator[Any] = m.fn(ctx, req)
        ev = c.credit_ev
        assert ev is not None
        # The request is not needed once the handler has it: its bytes must not
        # count while the stream waits for credit its client may never send.
        conn._release(c)
        n = 0
        try:
            async for item in gen:
                body = body_of(m, ctx, item)
                while c.credit <= 0 and not conn.closed and not c.detached:
                    ev.clear()
                    await ev.wait()
                if not conn.has_room():
                    await conn.wait_room()
                if conn.closed or c.detached:
                    return
                c.credit -= len(body) + 16
                conn.write(_pack(T_STREAM_DATA, 0, 0, id, len(body), 0) + body)
                n += 1
                if n % STREAM_YIELD_EVERY == 0 or len(conn.out) >= BIG_PAYLOAD:
                    # a generator that never awaits must not hold the loop:
                    # flush and let the other connections (and this one's
                    # reader: credit, cancel) run
                    await asyncio.sleep(0)
                    conn.check_budget()
            if not c.detached:
                head = answer_head(ctx)
                conn.write(_pack(T_STREAM_END, 0, len(head), id, 0, 0) + head)
        except (asyncio.CancelledError, Exception) as e:
            conn.failed(id, c, e)
        finally:
            aclose = getattr(gen, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except BaseException:
                    pass
            conn.finish(id, c)

    # --- answers ------------------------------------------------------------------

    def answer(self, id: int, ctx: Context, body: bytes) -> None:
        try:
            head = answer_head(ctx)
        except (UdskitError, ValueError) as e:  # a reserved key, metadata over the head limit
            self.error(id, *error_of(e))
            return
        max_frame = self.decoder.max_frame
        if len(body) > max_frame:
            self.error(id, RESOURCE_EXHAUSTED, f"response of {len(body)} bytes is over the max frame {max_frame}")
            return
        if len(body) < BIG_PAYLOAD:
            self.conn.write(_pack(T_RESPONSE, 0, len(head), id, len(body), 0) + head + body)
        else:
            self.conn.write_big(_pack(T_RESPONSE, 0, len(head), id, len(body), 0) + head, body)

    def error(self, id: int, code: int, msg: str, details: bytes = b"", flags: int = 0) -> None:
        hb = msg.encode()[:MAX_HEAD]
        if len(details) > self.decoder.max_frame:
            details = b""
        self.conn.write(_pack(T_ERROR, flags, len(hb), id, len(details), code) + hb + details)

    # --- drain ---------------------------------------------------------------------

    def _send_goaway(self) -> None:
        reason = b"server is shutting down"
        self.conn.write(_pack(T_GOAWAY, 0, len(reason), 0, 0, 0) + reason)

    def start_drain(self) -> None:
        # goaway: no new call; the connection closes once no call is in flight
        # and the client closed, or when the shutdown's grace ends
        if self.conn.mode is Mode.FRAMES:
            self._send_goaway()

    def idle_close(self) -> None:
        self.conn.draining = True
        self._send_goaway()
        self.conn.close()
