"""The NDJSON side of a server connection (protocol/spec.md section 7): one
JSON request per line, answered by one line each, no streams.

Lines are scanned once: the search for the next newline resumes where the
last one stopped, so a long line arriving in small reads costs time linear
in its length. Lines count as frames: at most ITER_FRAMES are taken per
event-loop iteration over all connections (one 256 KiB read of short lines
was 10,000 parses and answers in one callback), and their calls as framed
calls: at most ITER_CALLS started per iteration, none past max_in_flight
calls running, none once the budget is over (looked at every
BUDGET_CHECK_EVERY calls: the lines of one read all started calls, 3,000
with room for 1,000 in the server's total); the rest wait in the buffer,
unparsed, read no further (Pause.LINES), until the next iteration, a call
ends or the budget has room. The client's EOF closes the connection once they are served. In a drain a line already read is served (within the drain's
deadline), and the connection closes only when no line is in flight and none
is half-received (an NDJSON client cannot retry a refused call).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from ._bidi_srv import CLIENT_KINDS, ndjson_message
from ._conn import Call
from ._framed import BUDGET_CHECK_EVERY, ITER_CALLS, ITER_FRAMES
from ._errors import CODE_NAMES, UNIMPLEMENTED, ProtocolError
from ._handler import Context
from ._ndjson import NDJSONRequest, ndjson_error_line, ndjson_response_line, parse_ndjson_request
from ._state import Pause

if TYPE_CHECKING:
    from ._conn import ServerConn


class NDJSONSession:
    __slots__ = ("conn", "buf", "scan", "ids", "next_key", "held", "resume_h", "eof", "budget")

    def __init__(self, conn: ServerConn) -> None:
        self.conn = conn
        self.buf = bytearray()
        self.scan = 0  # bytes of buf already searched for a newline
        self.ids: dict[int, bytes] = {}
        self.next_key = 0
        self.held = False  # whole lines wait in buf (Pause.LINES)
        self.resume_h: asyncio.Handle | None = None
        self.eof = False  # the client sent EOF while lines were held
        self.budget = False  # over the budget (ServerConn.check_budget): no line starts

    def buffered(self) -> int:
        return len(self.buf)

    def mid_frame(self) -> bool:
        return bool(self.buf) and not self.held

    def holding(self) -> bool:
        return self.held

    def feed(self, data: bytes) -> None:
        self.buf += data
        if not self.held:
            self._scan()

    def _scan(self) -> None:
        conn = self.conn
        srv = conn.server
        buf = self.buf
        limit = srv.max_frame
        start = 0
        pos = self.scan
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            if (
                srv.iter_frames >= ITER_FRAMES
                or srv.iter_calls >= ITER_CALLS
                or len(conn.calls) >= srv.max_in_flight
                or self.budget
            ):
                self._hold()
                break
            srv.iter_frames += 1
            if srv.iter_frames == 1:
                conn.loop.call_soon(srv._new_frame_iteration)  # (runs in the next iteration)
            line = bytes(buf[start:nl])
            start = pos = nl + 1
            if len(line) > limit:
                self._too_long()
                return
            if line.strip():
                self._line(line)
            if conn.closed:
                return
        if start:
            del buf[:start]
        if self.held:
            self.scan = 0  # (from the first line held: its newline is found again)
            return
        self.scan = len(buf)
        if self.eof:
            self.on_eof()
        elif len(buf) > limit:
            self._too_long()

    def _hold(self) -> None:
        """Lines wait: until the next loop iteration (ITER_FRAMES, ITER_CALLS), until
        a call ends (max_in_flight: answer and error resume then), or until the
        budget has room (hold(False))."""
        conn = self.conn
        self.held = True
        conn.set_pause(Pause.LINES, True)
        if len(conn.calls) < conn.server.max_in_flight and not self.budget and self.resume_h is None:
            self.resume_h = conn.loop.call_soon(self._resume)

    def _resume(self) -> None:
        self.resume_h = None
        conn = self.conn
        if not self.held or conn.closed:
            return
        self.held = False
        self._scan()
        if conn.closed:
            return
        if not self.held:
            conn.set_pause(Pause.LINES, False)
        conn.after_read()
        conn.maybe_close()

    def _room(self) -> None:
        """A call ended: lines held at max_in_flight go on (in the next iteration)."""
        if self.held and self.resume_h is None and not self.conn.closed:
            self.resume_h = self.conn.loop.call_soon(self._resume)

    def hold(self, on: bool) -> None:
        """Stops (or resumes) starting the lines already read: the budget is over."""
        self.budget = on
        if not on:
            self._room()

    def release(self) -> None:
        self.buf = bytearray()
        self.scan = 0
        self.ids.clear()
        if self.resume_h is not None:
            self.resume_h.cancel()
            self.resume_h = None

    def on_eof(self) -> None:
        if self.held:
            self.eof = True  # the lines held are served first (ServerConn.maybe_close waits)
            return
        self.buf.clear()  # a final line without a newline is not a request
        self.scan = 0

    def _too_long(self) -> None:
        conn = self.conn
        conn.server.stats["protocol_errors"] += 1
        conn.write(ndjson_error_line(b"null", f"line over the {conn.server.max_frame}-byte limit", "resource_exhausted"))
        conn.close()

    def _line(self, line: bytes) -> None:
        conn = self.conn
        try:
            req: NDJSONRequest = parse_ndjson_request(line)
        except ProtocolError as e:
            id_text = getattr(e, "id_text", b"null")
            conn.write(ndjson_error_line(id_text, e.message, "invalid_argument"))
            return
        # NDJSON calls get internal ids above the udskit id range
        self.next_key += 1
        key = (1 << 32) + self.next_key
        self.ids[key] = req.id_text
        m = conn.server._methods.get(req.func)
        if m is None:
            self.error(key, UNIMPLEMENTED, f'unknown method "{req.func}"')
            return
        if m.kind == "stream":
            self.error(key, UNIMPLEMENTED, f"method {req.func} is a server stream; NDJSON has no streams")
            return
        ctx = Context(req.func, conn.peer, {}, None, conn.loop)
        arg: Any = req.data_text if m.raw else (req.data if req.data_text else None)
        if m.kind in CLIENT_KINDS:
            self.error(key, UNIMPLEMENTED, ndjson_message(req.func, m.kind))
            return
        if m.kind == "sync":
            conn.run_sync(key, m, ctx, arg)
            return
        c = Call(len(line))
        conn.add_call(key, c)
        srv = conn.server
        srv.count_call(conn.loop)
        conn.start(key, c, m, ctx, arg)
        if len(conn.calls) >= srv.max_in_flight:
            conn.set_pause(Pause.IN_FLIGHT, True)
        if len(conn.calls) % BUDGET_CHECK_EVERY == 0:
            conn.check_budget()  # many calls in one read: look at the budget now (hold), not after the read

    def answer(self, key: int, ctx: Context, body: bytes) -> None:
        if self.held:
            self._room()
        id_text = self.ids.pop(key, b"null")
        try:
            if body:
                json.loads(body)
        except (ValueError, RecursionError):
            self.conn.write(ndjson_error_line(id_text, f"handler {ctx.method} returned bytes that are not JSON", "internal"))
            return
        self.conn.write(ndjson_response_line(id_text, body))

    def error(self, key: int, code: int, msg: str, details: bytes = b"", flags: int = 0) -> None:
        if self.held:
            self._room()
        id_text = self.ids.pop(key, b"null")
        self.conn.write(ndjson_error_line(id_text, msg, CODE_NAMES.get(code, "unknown")))

    def start_drain(self) -> None:
        pass  # lines keep being served; ServerConn.maybe_close closes when none is in flight

    def idle_close(self) -> None:
        self.conn.close()
