"""Wire format of protocol/spec.md: hellos, frame headers, heads, and an
incremental frame decoder shared by the clients and the server.

Every length is checked against its limit right after the 16-byte header is
unpacked, before a byte of the frame's head or payload is buffered, and a
partial frame's buffer grows only as bytes arrive.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Final, Iterable, Mapping

from ._errors import INVALID_ARGUMENT, ProtocolError, UdskitError

HEADER_SIZE: Final = 16
HELLO_SIZE: Final = 16
VERSION: Final = 1
MAGIC: Final = b"UDSK"
DEFAULT_MAX_FRAME: Final = 16 << 20
MIN_MAX_FRAME: Final = 1024
MAX_HEAD: Final = 16 << 10
DEFAULT_MAX_IN_FLIGHT: Final = 4096
INITIAL_STREAM_CREDIT: Final = 1 << 20
FEATURE_STREAM_CREDIT: Final = 1
#: hello flag bit 1 (spec 4.3): client-streaming and bidirectional calls
FEATURE_CLIENT_STREAM: Final = 2

T_REQUEST: Final = 1
T_RESPONSE: Final = 2
T_ERROR: Final = 3
T_CANCEL: Final = 4
T_STREAM_DATA: Final = 5
T_STREAM_END: Final = 6
T_PING: Final = 7
T_PONG: Final = 8
T_GOAWAY: Final = 9
T_STREAM_CREDIT: Final = 10
T_REQUEST_DATA: Final = 11
T_REQUEST_END: Final = 12
T_REQUEST_CREDIT: Final = 13

FLAG_STREAM: Final = 1
#: request flag bit 1 (spec 4.3): the call carries request items from the client
FLAG_CLIENT_STREAM: Final = 2
FLAG_REFUSED: Final = 1

TYPE_NAMES: Final = (
    "",
    "request",
    "response",
    "error",
    "cancel",
    "stream_data",
    "stream_end",
    "ping",
    "pong",
    "goaway",
    "stream_credit",
    "request_data",
    "request_end",
    "request_credit",
)

HEADER: Final = struct.Struct("<BBHIII")
HELLO: Final = struct.Struct("<4sBBHII")
U16: Final = struct.Struct("<H")

_NEEDS_ID: Final = frozenset(
    {T_REQUEST, T_RESPONSE, T_CANCEL, T_STREAM_DATA, T_STREAM_END, T_STREAM_CREDIT, T_REQUEST_DATA, T_REQUEST_END, T_REQUEST_CREDIT}
)
_NEEDS_ZERO_ID: Final = frozenset({T_PING, T_PONG, T_GOAWAY})


def type_name(t: int) -> str:
    return TYPE_NAMES[t] if 0 < t < len(TYPE_NAMES) else f"type_{t}"


@dataclass(frozen=True)
class Hello:
    version: int = VERSION
    flags: int = FEATURE_STREAM_CREDIT | FEATURE_CLIENT_STREAM
    max_frame: int = DEFAULT_MAX_FRAME
    max_in_flight: int = 0

    def encode(self) -> bytes:
        return HELLO.pack(MAGIC, self.version, self.flags, 0, self.max_frame, self.max_in_flight)


def check_hello_start(b: bytes) -> None:
    """Checks the first bytes of a hello that is still arriving: a wrong magic fails at once."""
    m = bytes(b[:4])
    if m != MAGIC[: len(m)]:
        raise ProtocolError("bad_magic", f"hello starts with {m.hex()}, not UDSK (5544534b)")


def decode_hello(b: bytes) -> Hello:
    """Decodes a 16-byte hello: truncated, bad_magic, bad_version, bad_limits."""
    check_hello_start(b)
    if len(b) < HELLO_SIZE:
        raise ProtocolError("truncated", f"hello is {len(b)} bytes, want {HELLO_SIZE}")
    _, version, flags, _, max_frame, max_in_flight = HELLO.unpack_from(b)
    if version == 0:
        raise ProtocolError("bad_version", "version 0")
    if max_frame < MIN_MAX_FRAME:
        raise ProtocolError("bad_limits", f"max frame {max_frame} under the minimum {MIN_MAX_FRAME}")
    return Hello(version, flags, max_frame, max_in_flight)


@dataclass(frozen=True)
class Negotiated:
    version: int
    max_frame: int
    max_in_flight: int
    features: int


def negotiate(client: Hello, server: Hello) -> Negotiated:
    version = min(client.version, server.version)
    if version != VERSION:
        raise ProtocolError("bad_version", f"no common version (client {client.version}, server {server.version})")
    return Negotiated(version, min(client.max_frame, server.max_frame), server.max_in_flight, client.flags & server.flags)


def check_header(t: int, head_len: int, id: int, payload_len: int, aux: int, max_frame: int) -> None:
    """Validates a header's lengths and id before anything is read for it."""
    if payload_len > max_frame:
        raise ProtocolError("frame_too_large", f"payload length {payload_len} over the limit {max_frame}")
    if head_len > MAX_HEAD:
        raise ProtocolError("head_too_large", f"head length {head_len} over the limit {MAX_HEAD}")
    if t in _NEEDS_ID:
        if id == 0:
            raise ProtocolError("bad_id", f"{type_name(t)} frame with id 0")
    elif t in _NEEDS_ZERO_ID:
        if id != 0:
            raise ProtocolError("bad_id", f"{type_name(t)} frame with id {id}, want 0")
    elif t == T_ERROR and aux == 0:
        raise ProtocolError("bad_code", "error frame with code 0")


# --- heads -----------------------------------------------------------------


def iter_metadata(md: bytes) -> list[tuple[str, str]]:
    """Parses raw metadata entries in wire order; bad_head if they do not parse."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(md)
    while i < n:
        if n - i < 2:
            raise ProtocolError("bad_head", "metadata entry cut short")
        kl = md[i] | md[i + 1] << 8
        if kl == 0:
            raise ProtocolError("bad_head", "empty metadata key")
        if i + 2 + kl + 2 > n:
            raise ProtocolError("bad_head", f"metadata key length {kl} overruns the head")
        key = md[i + 2 : i + 2 + kl]
        i += 2 + kl
        vl = md[i] | md[i + 1] << 8
        if i + 2 + vl > n:
            raise ProtocolError("bad_head", f"metadata value length {vl} overruns the head")
        val = md[i + 2 : i + 2 + vl]
        i += 2 + vl
        try:
            out.append((key.decode(), val.decode()))
        except UnicodeDecodeError:
            raise ProtocolError("bad_head", "metadata is not UTF-8") from None
    return out


def is_reserved(key: str) -> bool:
    """Whether a metadata key is reserved for the protocol: it starts with ':'
    (spec 3.1, e.g. ':pad')."""
    return key[:1] == ":"


def app_metadata(entries: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The metadata an application sees (spec 3.1): reserved keys (such as
    ':pad', known or not) dropped; of a repeated key the last value."""
    return {k: v for k, v in entries if not is_reserved(k)}


def reserved_key(md: Mapping[str, str]) -> str | None:
    """The first key of application metadata that is reserved for the protocol,
    or None."""
    return next((k for k in md if is_reserved(k)), None)


def reserved_key_message(key: str) -> str:
    return f"metadata key {key!r}: keys starting with ':' are reserved for the protocol"


def parse_request_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    """A request head's method and its metadata entries as on the wire (reserved
    keys included, in order); parse_request gives what a handler sees."""
    if len(head) < 2:
        raise ProtocolError("bad_head", f"request head is {len(head)} bytes, no method length")
    n = head[0] | head[1] << 8
    if n == 0:
        raise ProtocolError("bad_head", "empty method name")
    if 2 + n > len(head):
        raise ProtocolError("bad_head", f"method length {n} overruns the {len(head)}-byte head")
    try:
        method = head[2 : 2 + n].decode()
    except UnicodeDecodeError:
        raise ProtocolError("bad_head", "method name is not UTF-8") from None
    return method, iter_metadata(head[2 + n :]) if len(head) > 2 + n else []


def parse_request(head: bytes) -> tuple[str, dict[str, str]]:
    """A request head's method and the metadata its handler sees (app_metadata)."""
    method, md = parse_request_head(head)
    return method, app_metadata(md) if md else {}


def encode_metadata(md: Mapping[str, str] | None) -> bytes:
    """Encodes metadata entries as they are (reserved keys are not checked here:
    request_head and the server refuse them from applications)."""
    return encode_entries(md.items()) if md else b""


def encode_entries(entries: Iterable[tuple[str, str]]) -> bytes:
    """Encodes metadata entries in the given order (repeats and reserved keys kept)."""
    parts = []
    for k, v in entries:
        kb, vb = k.encode(), v.encode()
        if not kb:
            raise ValueError("metadata key is empty")
        parts.append(U16.pack(len(kb)) + kb + U16.pack(len(vb)) + vb)
    out = b"".join(parts)
    if len(out) > MAX_HEAD:
        raise ValueError(f"metadata is {len(out)} bytes, over the {MAX_HEAD}-byte head limit")
    return out


_method_heads: dict[str, bytes] = {}


def method_head(method: str) -> bytes:
    """The encoded head for a method without metadata (cached: built once per name)."""
    h = _method_heads.get(method)
    if h is None:
        mb = method.encode()
        if not mb or 2 + len(mb) > MAX_HEAD:
            raise ValueError(f"method name must be 1..{MAX_HEAD - 2} bytes")
        h = U16.pack(len(mb)) + mb
        if len(_method_heads) < 4096:
            _method_heads[method] = h
    return h


def request_head(method: str, metadata: Mapping[str, str] | None) -> bytes:
    """The head of a request with application metadata. A reserved key (starting
    with ':') is refused with invalid_argument: nothing is sent (spec 3.1)."""
    h = method_head(method)
    if metadata:
        k = reserved_key(metadata)
        if k is not None:
            raise UdskitError(INVALID_ARGUMENT, reserved_key_message(k) + "; nothing was sent")
        h += encode_metadata(metadata)
        if len(h) > MAX_HEAD:
            raise ValueError(f"method and metadata are {len(h)} bytes, over the {MAX_HEAD}-byte head limit")
    return h


def frame(t: int, flags: int, id: int, aux: int, head: bytes = b"", payload: bytes = b"") -> bytes:
    return HEADER.pack(t, flags, len(head), id, len(payload), aux) + head + payload


# --- whole-frame decoding (vectors, tests) ---------------------------------


@dataclass(frozen=True)
class Frame:
    type: int
    flags: int
    id: int
    aux: int
    head: bytes
    payload: bytes

    @property
    def type_name(self) -> str:
        return type_name(self.type)


def check_head(t: int, head: bytes) -> None:
    if t == T_REQUEST:
        parse_request_head(head)
    elif t in (T_RESPONSE, T_STREAM_END) and head:
        iter_metadata(head)


def decode_frame(b: bytes, max_frame: int) -> tuple[Frame, int]:
    """Decodes one whole frame from the start of b; returns it and its size."""
    if len(b) < HEADER_SIZE:
        raise ProtocolError("truncated", f"{len(b)} bytes, a header is {HEADER_SIZE}")
    t, flags, hl, id, pl, aux = HEADER.unpack_from(b)
    check_header(t, hl, id, pl, aux, max_frame)
    n = HEADER_SIZE + hl + pl
    if len(b) < n:
        raise ProtocolError("truncated", f"frame needs {n} bytes, have {len(b)}")
    f = Frame(t, flags, id, aux, bytes(b[HEADER_SIZE : HEADER_SIZE + hl]), bytes(b[HEADER_SIZE + hl : n]))
    check_head(t, f.head)
    return f, n


# --- incremental decoding ---------------------------------------------------

OnFrame = Callable[[int, int, int, int, bytes, bytes], None]


def _take(parts: list[bytes], a: int, b: int) -> bytes:
    """Bytes a..b of the pieces as if joined (one copy)."""
    p0 = parts[0]
    if b <= len(p0):
        return p0[a:b]
    views = []
    pos = 0
    for p in parts:
        n = len(p)
        if pos + n > a:
            views.append(memoryview(p)[max(a - pos, 0) : min(b - pos, n)])
        pos += n
        if pos >= b:
            break
    return b"".join(views)


class FrameDecoder:
    """Splits a byte stream into frames and calls on_frame(type, flags, id,
    aux, head, payload) for each, in order. Header checks (lengths, ids,
    codes) raise ProtocolError before anything of the frame is buffered.

    A partial frame is kept as the pieces that arrived (a list of bytes,
    growing only as they arrive; the decoder holds at most one partial frame,
    at most 16 + 16 KiB + max_frame bytes) and joined once when it is whole:
    a bytearray grown by each read was copied again by realloc every few reads
    (33 us per 8 KiB read with 200 such frames arriving at once, 3 us now).
    Whole frames in one read are sliced straight out of it.

    Setting ``hold`` (from on_frame) stops decoding after the current frame:
    the rest of the read is kept (``buffered`` counts it) until ``feed(b"")``
    is called with hold cleared. The server uses it to stop taking calls in
    the middle of a read once it is over its memory budget, or once it has
    started enough calls in one event-loop iteration. What is held is kept as
    the reads themselves (a list of bytes and an offset into the first), not
    copied: a 4 MB backlog of small requests taken 256 calls at a time was
    copied whole at every step (3-30 ms a step, 16,000 calls: half a second).
    """

    __slots__ = ("max_frame", "on_frame", "_pending", "_need", "hold", "_chunks", "_coff", "_cbytes", "_parts", "_plen")

    def __init__(self, on_frame: OnFrame, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self.on_frame = on_frame
        # the start of a frame shorter than its 16-byte header
        self._pending = bytearray()
        # a frame whose header is in (checked): its pieces, their length, and
        # the frame's whole size
        self._parts: list[bytes] = []
        self._plen = 0
        self._need = 0
        self.hold = False
        # reads (or what is left of one, from _coff) held back while hold is
        # set, in order; _cbytes: their bytes not yet decoded
        self._chunks: list[bytes] = []
        self._coff = 0
        self._cbytes = 0

    @property
    def buffered(self) -> int:
        return len(self._pending) + self._plen + self._cbytes

    @property
    def mid_frame(self) -> bool:
        """A frame's header is in and the rest of it is still to come (reads
        held back whole, ``hold``, are not that: they wait for us)."""
        return bool(self._parts) and not self._chunks and self._plen < self._need

    @property
    def holding(self) -> bool:
        """Bytes read and held back (``hold``) that may be whole frames."""
        return bool(self._chunks) or (bool(self._parts) and self._plen >= self._need)

    def _keep(self, data: bytes, off: int) -> None:
        """Held in the middle of data: keep its rest (and what follows) undecoded."""
        if type(data) is not bytes:
            data = bytes(data)
        self._chunks.append(data)
        if len(self._chunks) == 1:
            self._coff = off
        self._cbytes += len(data) - off

    def feed(self, data: bytes) -> None:
        if type(data) is not bytes:
            data = bytes(data)  # (kept by reference below: it must not change)
        if self._chunks:
            if data:
                self._chunks.append(data)
                self._cbytes += len(data)
            if not self.hold:
                self._resume()
            return
        if self._parts:
            if data:
                self._parts.append(data)
                self._plen += len(data)
            need = self._need
            if self._plen < need or self.hold:
                return
            # The frame is whole: its head and payload are copied out of the
            # pieces once each.
            parts, plen = self._parts, self._plen
            self._parts = []
            self._plen = 0
            t, flags, hl, id, pl, aux = HEADER.unpack_from(parts[0], 0)
            mid = 16 + hl
            head = _take(parts, 16, mid) if hl else b""
            payload = _take(parts, mid, need) if pl else b""
            rest = _take(parts, need, plen) if plen > need else b""
            del parts
            self.on_frame(t, flags, id, aux, head, payload)
            if not rest:
                return
            if self.hold:
                self._keep(rest, 0)
                return
            data = rest
        elif self.hold:
            # (bytes read while held wait with the rest, undecoded)
            if data:
                if self._pending:
                    self._pending += data
                else:
                    self._keep(data, 0)
            return
        elif self._pending:
            p = self._pending
            p += data
            if len(p) < 16:
                return
            self._pending = bytearray()
            data = bytes(p)
        off = self._frames(data, 0)
        if off < len(data):
            if self.hold:
                self._keep(data, off)
            else:
                self._partial(data, off)

    def _resume(self) -> None:
        """Decodes the reads held back (hold was cleared), until hold is set again."""
        chunks = self._chunks
        while chunks and not self.hold:
            c = chunks[0]
            off = self._coff
            end = self._frames(c, off)
            self._cbytes -= end - off
            if end < len(c) and self.hold:
                self._coff = end
                return
            del chunks[0]
            self._coff = 0
            if end < len(c):
                # a partial frame at the end of this read: it goes on in the
                # next ones, through the usual path (each byte copied once more)
                self._cbytes -= len(c) - end
                rest = chunks[:]
                chunks.clear()
                self._cbytes = 0
                self._partial(c, end)
                for r in rest:
                    self.feed(r)
                return

    def _partial(self, data: bytes, off: int) -> None:
        """data[off:] is the start of a frame (its header checked if it is
        in): keep it until the rest arrives."""
        n = len(data)
        if n - off >= 16:
            _t, _f, hl, _id, pl, _aux = HEADER.unpack_from(data, off)
            self._need = 16 + hl + pl
            tail = data if off == 0 else bytes(memoryview(data)[off:])
            self._parts = [tail]
            self._plen = n - off
        else:
            self._need = 16
            self._pending = bytearray(memoryview(data)[off:])

    def _frames(self, data: bytes, off: int) -> int:
        """Calls on_frame for each whole frame of data from off, until hold is
        set; returns where it stopped (a partial frame starts there, or hold)."""
        n = len(data)
        unpack = HEADER.unpack_from
        on_frame = self.on_frame
        max_frame = self.max_frame
        while n - off >= 16:
            t, flags, hl, id, pl, aux = unpack(data, off)
            if pl > max_frame or hl > MAX_HEAD or (t in _NEEDS_ID and not id) or (t in _NEEDS_ZERO_ID and id) or (t == T_ERROR and not aux):
                check_header(t, hl, id, pl, aux, max_frame)
            start = off + 16
            end = start + hl + pl
            if end > n:
                return off
            if hl:
                mid = start + hl
                on_frame(t, flags, id, aux, data[start:mid], data[mid:end])
            else:
                on_frame(t, flags, id, aux, b"", data[start:end] if pl else b"")
            off = end
            if self.hold:
                return off
        return off
