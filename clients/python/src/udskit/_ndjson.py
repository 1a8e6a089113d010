"""Newline-delimited JSON (protocol/spec.md section 7): request parsing and
response lines for the server, and NDJSONClient for existing newline-JSON
sidecars (``await udskit.connect_ndjson(addr)``)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from ._addr import Address, as_address
from ._common import Backoff, Payload, json_text, lost_error, open_connection
from ._errors import CANCELED, CODES, UNKNOWN, ProtocolError, UdskitError
from ._wire import DEFAULT_MAX_FRAME


class _RawFloat(float):
    """A JSON number that is not an integer, keeping its text so an id is echoed verbatim."""

    text: str

    def __new__(cls, text: str) -> _RawFloat:
        f = super().__new__(cls, text)
        f.text = text
        return f


def _parse(line: bytes | str) -> Any:
    return json.loads(line, parse_float=_RawFloat)


def _id_text(v: Any) -> bytes | None:
    """The id's JSON text, or None if it is not a number or string."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, _RawFloat):
        return v.text.encode()
    if isinstance(v, int):
        return str(v).encode()
    if isinstance(v, str):
        return json_text(v).encode()
    return None


def _plain(v: Any) -> Any:
    """Turns _RawFloat back into float (for handler arguments)."""
    if isinstance(v, _RawFloat):
        return float(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


@dataclass(frozen=True)
class NDJSONRequest:
    id_text: bytes  # the id's JSON text, echoed back verbatim
    func: str
    data: Any  # decoded request data (None when absent or null)
    data_text: bytes  # compact JSON text of data; b"" when absent or null


def _bad(msg: str, id_text: bytes = b"null") -> ProtocolError:
    e = ProtocolError("bad_request", msg, CODES["invalid_argument"])
    e.id_text = id_text  # type: ignore[attr-defined]
    return e


_WS = " \t\n\r"
_scan_value = json.JSONDecoder(parse_float=_RawFloat).raw_decode


def recover_id(line: str) -> bytes:
    """The id of a line that does not parse (spec 7): a number or string "id"
    member of the top-level object read before the first syntax error, else null."""
    found = b"null"
    n = len(line)

    def ws(i: int) -> int:
        while i < n and line[i] in _WS:
            i += 1
        return i

    i = ws(0)
    if i >= n or line[i] != "{":
        return found
    i += 1
    try:
        while True:
            i = ws(i)
            if i >= n or line[i] != '"':
                return found
            key, i = json.decoder.scanstring(line, i + 1)  # type: ignore[attr-defined]
            i = ws(i)
            if i >= n or line[i] != ":":
                return found
            val, i = _scan_value(line, ws(i + 1))
            if key == "id":
                found = _id_text(val) or b"null"
            i = ws(i)
            if i >= n or line[i] != ",":
                return found
            i += 1
    except (ValueError, RecursionError):
        return found


def parse_ndjson_request(line: bytes) -> NDJSONRequest:
    """Parses one NDJSON request line; ProtocolError "bad_request" (with .id_text) if it is not one."""
    try:
        obj = _parse(line)
    except (ValueError, RecursionError) as e:
        raise _bad(f"line is not JSON: {e}", recover_id(line.decode("utf-8", "replace"))) from None
    if not isinstance(obj, dict):
        raise _bad(f"want a JSON object, got {type(obj).__name__}")
    if "id" not in obj:
        raise _bad("missing id")
    id_text = _id_text(obj["id"])
    if id_text is None:
        raise _bad("id must be a number or a string")
    func = obj.get("func")
    if not isinstance(func, str) or not func:
        raise _bad("func must be a non-empty string", id_text)
    data = obj.get("data")
    if data is None:
        return NDJSONRequest(id_text, func, None, b"")
    try:
        data = _plain(data)
        return NDJSONRequest(id_text, func, data, json_text(data).encode())
    except RecursionError:
        raise _bad("data is nested too deeply", id_text) from None


def ndjson_response_line(id_text: bytes, data: bytes) -> bytes:
    return b'{"id":' + id_text + b',"data":' + (data or b"null") + b"}\n"


def ndjson_error_line(id_text: bytes, message: str, code: str) -> bytes:
    return b'{"id":' + id_text + b',"error":' + json_text(message).encode() + b',"code":' + json_text(code).encode() + b"}\n"


class _NDProto(asyncio.Protocol):
    def __init__(self, limit: int) -> None:
        self.buf = bytearray()
        self.scan = 0  # bytes of buf already searched for a newline
        self.limit = limit
        self.write_paused = False
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        start = 0
        pos = self.scan  # (a long line in small reads is searched once, not once per read)
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            self._line(bytes(buf[start:nl]))
            start = pos = nl + 1
        if start:
            del buf[:start]
        self.scan = len(buf)
        if len(buf) > self.limit:
            self._fail(UdskitError("resource_exhausted", f"server sent a line over {self.limit} bytes"))

    def _line(self, line: bytes) -> None:
        try:
            obj = json.loads(line)
        except ValueError:
            return  # not ours to judge; a sidecar may log
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), int):
            return
        fut = self.pending.pop(obj["id"], None)
        if fut is None or fut.done():
            return
        if "error" in obj and obj["error"] is not None:
            code = obj.get("code")
            num = CODES.get(code, UNKNOWN) if isinstance(code, str) else UNKNOWN
            fut.set_exception(UdskitError(num, str(obj["error"])))
        else:
            fut.set_result(obj.get("data"))

    def eof_received(self) -> bool | None:
        self._fail(lost_error("the server closed the connection"))
        return None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        ws, self.drain_waiters = self.drain_waiters, []
        for w in ws:
            if not w.done():
                w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(lost_error(str(exc) if exc else "closed"))

    def _fail(self, err: UdskitError) -> None:
        if self.closed:
            return
        self.closed = True
        self.resume_writing()
        p, self.pending = self.pending, {}
        for f in p.values():
            if not f.done():
                f.set_exception(err)
        if self.transport is not None:
            self.transport.close()


class NDJSONClient:
    """A client for newline-JSON sidecars (``{"id":1,"func":"f","data":...}`` per line).

    Calls only (NDJSON has no streams, metadata or deadlines on the wire: the
    timeout is enforced here). Reconnects on the next call after a loss."""

    def __init__(self, addr: str | Address, max_line: int = DEFAULT_MAX_FRAME) -> None:
        self.addr = as_address(addr)
        self.max_line = max_line
        self._proto: _NDProto | None = None
        self._next = 0
        self._lock = asyncio.Lock()

    async def _connect(self, wait: bool, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        b = Backoff()
        proto = _NDProto(self.max_line)
        while True:
            try:
                await open_connection(loop, self.addr, proto)
                break
            except UdskitError as e:
                if not wait:
                    raise
                await asyncio.sleep(b.after(e, loop.time(), deadline))
        self._proto = proto

    async def _reconnect(self) -> None:
        async with self._lock:
            if self._proto is None or self._proto.closed:
                await self._connect(False, None)

    async def call(self, method: str, payload: Payload = None, *, timeout: float | None = None) -> Any:
        """Sends one request line; returns the response's data (decoded JSON)."""
        loop = asyncio.get_running_loop()
        # The timeout runs from here: encoding a large payload (20-200 ms for 1 MiB
        # on a loaded machine) and a reconnect count in it; they were added to it.
        deadline = None if timeout is None else loop.time() + timeout
        if isinstance(payload, (bytes, bytearray, memoryview)):
            data = bytes(payload) or b"null"
            json.loads(data)  # must be JSON
        else:
            data = json_text(payload).encode()
        p = self._proto
        if p is None or p.closed:
            try:
                await asyncio.wait_for(self._reconnect(), None if deadline is None else max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                raise UdskitError("deadline_exceeded", f"deadline exceeded (connecting to {self.addr})") from None
            p = self._proto
            assert p is not None
        while p.write_paused and not p.closed:
            # the server does not read: wait (within the timeout), not buffer without bound
            w = loop.create_future()
            p.drain_waiters.append(w)
            try:
                await asyncio.wait_for(w, None if deadline is None else max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                raise UdskitError("deadline_exceeded", "deadline exceeded (the server reads nothing)") from None
        if p.closed:
            raise UdskitError("unavailable", "connection lost")
        self._next += 1
        id = self._next
        fut: asyncio.Future[Any] = loop.create_future()
        p.pending[id] = fut
        assert p.transport is not None
        p.transport.write(b'{"id":%d,"func":%s,"data":%s}\n' % (id, json_text(method).encode(), data))
        try:
            return await asyncio.wait_for(fut, None if deadline is None else max(deadline - loop.time(), 0))
        except asyncio.TimeoutError:
            p.pending.pop(id, None)
            raise UdskitError("deadline_exceeded", "deadline exceeded") from None

    async def aclose(self) -> None:
        if self._proto is not None:
            self._proto._fail(UdskitError(CANCELED, "client closed"))

    async def __aenter__(self) -> NDJSONClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def connect_ndjson(addr: str | Address, wait: bool = False, timeout: float | None = 10.0) -> NDJSONClient:
    """Connects to a newline-JSON server (an existing sidecar, or any udskit server)."""
    c = NDJSONClient(addr)
    await c._connect(wait, timeout)
    return c
