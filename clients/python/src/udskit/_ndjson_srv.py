"""The NDJSON side of a server connection (protocol/spec.md section 7): one
JSON request per line, answered by one line each, no streams.

Lines are scanned once: the search for the next newline resumes where the
last one stopped, so a long line arriving in small reads costs time linear
in its length. In a drain a line already read is served (within the drain's
deadline), and the connection closes only when no line is in flight and none
is half-received (an NDJSON client cannot retry a refused call).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ._bidi_srv import CLIENT_KINDS, ndjson_message
from ._conn import Call
from ._errors import CODE_NAMES, UNIMPLEMENTED, ProtocolError
from ._handler import Context
from ._ndjson import NDJSONRequest, ndjson_error_line, ndjson_response_line, parse_ndjson_request
from ._state import Pause

if TYPE_CHECKING:
    from ._conn import ServerConn


class NDJSONSession:
    __slots__ = ("conn", "buf", "scan", "ids", "next_key")

    def __init__(self, conn: ServerConn) -> None:
        self.conn = conn
        self.buf = bytearray()
        self.scan = 0  # bytes of buf already searched for a newline
        self.ids: dict[int, bytes] = {}
        self.next_key = 0

    def buffered(self) -> int:
        return len(self.buf)

    def feed(self, data: bytes) -> None:
        conn = self.conn
        buf = self.buf
        buf += data
        limit = conn.server.max_frame
        start = 0
        pos = self.scan
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
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
        self.scan = len(buf)
        if len(buf) > limit:
            self._too_long()

    def hold(self, on: bool) -> None:
        pass  # (lines past the budget within one read are few: a quarter of the budget)

    def release(self) -> None:
        self.buf = bytearray()
        self.scan = 0
        self.ids.clear()

    def on_eof(self) -> None:
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
        conn.start(key, c, m, ctx, arg)
        if len(conn.calls) >= conn.server.max_in_flight:
            conn.set_pause(Pause.IN_FLIGHT, True)

    def answer(self, key: int, ctx: Context, body: bytes) -> None:
        id_text = self.ids.pop(key, b"null")
        try:
            if body:
                json.loads(body)
        except (ValueError, RecursionError):
            self.conn.write(ndjson_error_line(id_text, f"handler {ctx.method} returned bytes that are not JSON", "internal"))
            return
        self.conn.write(ndjson_response_line(id_text, body))

    def error(self, key: int, code: int, msg: str, details: bytes = b"", flags: int = 0) -> None:
        id_text = self.ids.pop(key, b"null")
        self.conn.write(ndjson_error_line(id_text, msg, CODE_NAMES.get(code, "unknown")))

    def start_drain(self) -> None:
        pass  # lines keep being served; ServerConn.maybe_close closes when none is in flight

    def idle_close(self) -> None:
        self.conn.close()
