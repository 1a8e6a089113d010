"""Shared memory for large payloads (protocol/spec.md, section 10), client side.

The client creates an anonymous sealed memfd (nothing is ever named in
/dev/shm, so ``kill -9`` leaves nothing behind), offers it once per connection
with SCM_RIGHTS, and then moves payloads of at least ``threshold`` bytes
through it: a request's bytes are copied once into a slot of the client half,
the frame carries an 8-byte descriptor; a response's descriptor is checked
against the server half and its bytes copied out once, then the slot is
released.

Ownership (spec 10.3), as this client keeps it:

| slot | owner | freed when |
|---|---|---|
| request slot (client half) | the server from the send on | the server's shm_release names it (also after a cancel or a timeout: never reused before) |
| response / stream_data slot (server half) | this client from the frame on | copied out at once; released with the next flush (end of the read) |
| both, connection ends | nobody | the region is unmapped; releases are neither sent nor expected |

A region that is full makes a caller wait for releases within its deadline
(``waits`` counts it); a payload that fits the half never goes to the socket
because the region is momentarily full.
"""

from __future__ import annotations

import asyncio
import fcntl
import mmap
import os
import socket
import struct
import sys
from typing import Any, Callable, Final

from ._errors import ProtocolError, UdskitError

FEATURE_SHM: Final = 4
FLAG_SHM: Final = 4
T_SHM_OFFER: Final = 14
T_SHM_RELEASE: Final = 15
MIN_REGION: Final = 128 << 10
MAX_REGION: Final = 1 << 30
REGION_MULTIPLE: Final = 64 << 10
DEFAULT_REGION: Final = 64 << 20
DEFAULT_THRESHOLD: Final = 16 << 10
MAX_RELEASE_ENTRIES: Final = 2048
SEALS: Final = 7  # F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW
ALIGN: Final = 64

_HEADER = struct.Struct("<BBHIII")
_DESC = struct.Struct("<II")
_U64 = struct.Struct("<Q")

OnFrame = Callable[[int, int, int, int, bytes, bytes], None]


def supported() -> bool:
    """True where this Python can create, seal and pass a memfd (Linux)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(socket, "send_fds") and hasattr(fcntl, "F_ADD_SEALS")


def check_size(size: int) -> None:
    if size % REGION_MULTIPLE or not MIN_REGION <= size <= MAX_REGION:
        raise ValueError(f"shm region size {size}: want a multiple of {REGION_MULTIPLE} between {MIN_REGION} and {MAX_REGION}")


def offer_frame(size: int) -> bytes:
    """The 24-byte shm_offer frame (spec 10.2)."""
    return _HEADER.pack(T_SHM_OFFER, 0, 0, 0, 8, 0) + _U64.pack(size)


def release_frame(entries: list[tuple[int, int]]) -> bytes:
    body = b"".join(_DESC.pack(o, n) for o, n in entries)
    return _HEADER.pack(T_SHM_RELEASE, 0, 0, 0, len(body), 0) + body


def violation(name: str, detail: str) -> ProtocolError:
    """A connection error protocol_violation; name is the vectors' error name
    (bad_offer, bad_desc, bad_release)."""
    return ProtocolError(name, "shared memory: " + detail)


class Region:
    """A sealed memfd mapped read-write; ``fd`` is closed once offered."""

    def __init__(self, size: int = DEFAULT_REGION) -> None:
        check_size(size)
        self.size = size
        self.fd: int | None = os.memfd_create("udskit-shm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
            self.mm: mmap.mmap | None = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise

    def offer(self, sock: Any) -> None:
        """Sends the offer with the memfd on sock (a transport's socket): one
        sendmsg, one SCM_RIGHTS message, one descriptor. The fd is closed
        afterwards; the mapping keeps the region alive."""
        assert self.fd is not None
        s = sock.dup() if not isinstance(sock, socket.socket) else sock
        try:
            frame = offer_frame(self.size)
            n = socket.send_fds(s, [frame], [self.fd])
            if n < len(frame):
                # only the first byte carries the descriptor; the rest may follow alone
                s.setblocking(True)
                s.sendall(frame[n:])
        finally:
            if s is not sock:
                s.close()
            self.close_fd()

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        self.close_fd()
        if self.mm is not None:
            self.mm.close()
            self.mm = None


class ShmSession:
    """One connection's use of a region: the client-half allocator, the
    server-half checks and the release batch. All methods run on the
    connection's event loop (or under the sync client's lock)."""

    def __init__(self, region: Region, max_frame: int, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.region = region
        self.half = region.size // 2
        self.max_frame = max_frame
        self.threshold = max(1, threshold)
        # free runs of the client half, sorted by offset: [offset, length]
        self.free: list[list[int]] = [[0, self.half]]
        self.out: dict[int, int] = {}  # handed-over request slots: offset -> length
        self.pending: list[tuple[int, int]] = []  # response slots to release
        self.waiters: list[asyncio.Future[None]] = []
        self.waits = 0  # calls that waited for region space
        self.sent = 0  # payloads sent through the region
        self.received = 0
        self.closed = False

    # --- stats --------------------------------------------------------------

    def in_use(self) -> int:
        """Bytes of the client half handed over and not released yet."""
        return sum(self.out.values())

    def fits(self, n: int) -> bool:
        return self.threshold <= n <= min(self.half, self.max_frame)

    # --- the client half ----------------------------------------------------

    def _take(self, n: int) -> int | None:
        need = (n + ALIGN - 1) // ALIGN * ALIGN
        for i, run in enumerate(self.free):
            off, ln = run
            if ln >= need:
                if ln == need:
                    del self.free[i]
                else:
                    run[0] += need
                    run[1] -= need
                self.out[off] = n
                return off
        return None

    def try_place(self, body: bytes) -> bytes | None:
        """Copies body into a free slot; returns its descriptor, or None when
        no free run is large enough now."""
        if self.closed:
            raise UdskitError("unavailable", "connection closed")
        off = self._take(len(body))
        if off is None:
            return None
        mm = self.region.mm
        assert mm is not None
        mm[off : off + len(body)] = body
        self.sent += 1
        return _DESC.pack(off, len(body))

    async def place(self, body: bytes, deadline: float | None, loop: asyncio.AbstractEventLoop) -> bytes:
        """try_place, waiting for releases within the deadline (spec 10.6)."""
        d = self.try_place(body)
        if d is not None:
            return d
        self.waits += 1
        while True:
            w: asyncio.Future[None] = loop.create_future()
            self.waiters.append(w)
            if deadline is None:
                await w
            else:
                left = deadline - loop.time()
                if left <= 0:
                    raise UdskitError("deadline_exceeded", "waiting for shared memory: deadline exceeded")
                try:
                    await asyncio.wait_for(asyncio.shield(w), left)
                except asyncio.TimeoutError:
                    raise UdskitError("deadline_exceeded", "waiting for shared memory: deadline exceeded") from None
            d = self.try_place(body)
            if d is not None:
                return d

    def unplace(self, desc: bytes) -> None:
        """Frees a slot that was placed but never handed over."""
        off, n = _DESC.unpack(desc)
        if self.out.pop(off, None) is not None and not self.closed:
            self._free(off, n)

    def _free(self, off: int, n: int) -> None:
        ln = (n + ALIGN - 1) // ALIGN * ALIGN
        free = self.free
        lo, hi = 0, len(free)
        while lo < hi:
            mid = (lo + hi) // 2
            if free[mid][0] < off:
                lo = mid + 1
            else:
                hi = mid
        free.insert(lo, [off, ln])
        # coalesce with the next, then the previous run
        if lo + 1 < len(free) and free[lo][0] + free[lo][1] == free[lo + 1][0]:
            free[lo][1] += free[lo + 1][1]
            del free[lo + 1]
        if lo > 0 and free[lo - 1][0] + free[lo - 1][1] == free[lo][0]:
            free[lo - 1][1] += free[lo][1]
            del free[lo]

    def on_release(self, payload: bytes) -> None:
        """The server's shm_release: every entry must be exactly a slot we
        handed over and that is not released yet."""
        n = len(payload)
        if n == 0 or n % 8 or n // 8 > MAX_RELEASE_ENTRIES:
            raise violation("bad_release", f"shm_release payload of {n} bytes (want 8..{8 * MAX_RELEASE_ENTRIES}, a multiple of 8)")
        for off, ln in _DESC.iter_unpack(payload):
            if self.out.get(off) != ln:
                raise violation("bad_release", f"shm_release of slot ({off}, {ln}), which is not a slot this client handed over")
            del self.out[off]
            self._free(off, ln)
        ws, self.waiters = self.waiters, []
        for w in ws:
            if not w.done():
                w.set_result(None)

    # --- the server half ----------------------------------------------------

    def take(self, payload: bytes, copy: bool = True) -> bytes:
        """A descriptor from the server: checks it (spec 10.4), copies the
        bytes out once (unless copy is false: nobody waits for them) and
        queues the slot's release."""
        if len(payload) != 8:
            raise violation("bad_desc", f"descriptor of {len(payload)} bytes, want 8")
        off, ln = _DESC.unpack(payload)
        end = off + ln
        if ln < 1 or ln > self.max_frame:
            raise violation("bad_desc", f"descriptor length {ln} outside 1..{self.max_frame}")
        if off < self.half or end > self.region.size:
            raise violation("bad_desc", f"descriptor ({off}, {ln}) outside the server half [{self.half}, {self.region.size})")
        for o, n in self.pending:
            if off < o + n and o < end:
                raise violation("bad_desc", f"descriptor ({off}, {ln}) overlaps unreleased slot ({o}, {n})")
        mm = self.region.mm
        assert mm is not None
        data = mm[off:end] if copy else b""
        self.pending.append((off, ln))
        self.received += 1
        return data

    def flush(self) -> bytes:
        """The release frame(s) for the slots taken since the last flush."""
        p = self.pending
        if not p:
            return b""
        self.pending = []
        if len(p) <= MAX_RELEASE_ENTRIES:
            return release_frame(p)
        return b"".join(release_frame(p[i : i + MAX_RELEASE_ENTRIES]) for i in range(0, len(p), MAX_RELEASE_ENTRIES))

    def close(self) -> None:
        """The connection ended: unmap; waiters fail as the connection does."""
        if self.closed:
            return
        self.closed = True
        self.out.clear()
        self.pending = []
        ws, self.waiters = self.waiters, []
        for w in ws:
            if not w.done():
                w.set_result(None)
        self.region.close()


def parse_answer(buf: bytes) -> bool:
    """The server's answer to an offer (16 bytes): True accepted, False declined."""
    t, flags, hl, id, pl, aux = _HEADER.unpack_from(buf)
    if t != T_SHM_OFFER or id != 0 or hl != 0 or pl != 0 or aux not in (0, 1):
        raise violation("bad_offer", f"expected the server's shm_offer answer, got frame type {t} id {id} head {hl} payload {pl} aux {aux}")
    return bool(aux == 1)
