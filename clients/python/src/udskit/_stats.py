"""Reading a server's statistics: the standard method udskit.stats (protocol/spec.md 9.3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._errors import INTERNAL, UdskitError

if TYPE_CHECKING:
    from ._client import AsyncClient
    from ._sync import Client

STATS_METHOD = "udskit.stats"


@dataclass(frozen=True)
class ShmServerStats:
    """The server side of the shared-memory data path (spec section 10).

    ``in_use`` of ``capacity`` is the fill level of the server's halves; ``sent``,
    ``received``, ``waits`` (payloads that waited for space: back-pressure),
    ``over_half`` (payloads larger than a half, sent on the socket) and ``stalled``
    (answers sent on the socket because the half was full while the connection's
    reader waited for the server's memory budget, spec 10.6; not 0: a client keeps
    more large payloads in flight on one connection than budget and region hold)
    count since the server started; so do the call-slot counters (a Go client's
    ShmCalls, spec 10.8; 0 from an older server): ``slot_calls`` (unary calls answered
    through a call slot), ``area_sent_bytes`` and ``area_received_bytes`` (bytes of
    their payloads carried in the slots' payload areas, answers and requests: payloads
    also counted in ``sent`` and ``received``) and ``spurious_wakes`` (wake-ups of the
    server's call-slot pollers that found nothing changed)."""

    enabled: bool = False
    threshold: int = 0
    conns: int = 0
    in_use: int = 0
    capacity: int = 0
    sent: int = 0
    received: int = 0
    waits: int = 0
    over_half: int = 0
    stalled: int = 0
    slot_calls: int = 0
    area_sent_bytes: int = 0
    area_received_bytes: int = 0
    spurious_wakes: int = 0

    @property
    def fill(self) -> float:
        """in_use / capacity, 0 without a region."""
        return self.in_use / self.capacity if self.capacity else 0.0


@dataclass(frozen=True)
class ServerStats:
    """A server's answer to udskit.stats: the connections it serves now (the asking
    one included) and its shared-memory path (all zero, enabled False, for a server
    without one: Node, Python, NoShm)."""

    conns: int = 0
    shm: ShmServerStats = field(default_factory=ShmServerStats)


_COUNTS = (
    "threshold", "conns", "in_use", "capacity", "sent", "received", "waits", "over_half", "stalled",
    "slot_calls", "area_sent_bytes", "area_received_bytes", "spurious_wakes",
)


def _count(o: dict[str, Any], k: str) -> int:
    v = o.get(k)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def parse_stats(answer: Any) -> ServerStats:
    """Reads an udskit.stats answer (parsed JSON): a missing ``shm`` or field reads
    as 0 (``enabled`` False; an older server has no ``stalled`` or call-slot
    counters), unknown fields are ignored. An answer that is not a JSON object
    raises UdskitError (internal)."""
    if not isinstance(answer, dict):
        raise UdskitError(INTERNAL, f"{STATS_METHOD}: the answer is not a JSON object")
    s = answer.get("shm")
    if not isinstance(s, dict):
        s = {}
    return ServerStats(
        conns=_count(answer, "conns"),
        shm=ShmServerStats(
            enabled=s.get("enabled") is True,
            **{k: _count(s, k) for k in _COUNTS},
        ),
    )


def fetch_stats(client: Client, *, timeout: float | None = None) -> ServerStats:
    """Calls udskit.stats on a sync Client's server. A server without it (an older
    one) raises UdskitError unimplemented."""
    return parse_stats(client.call(STATS_METHOD, {}, timeout=timeout))


async def afetch_stats(client: AsyncClient, *, timeout: float | None = None) -> ServerStats:
    """fetch_stats for an AsyncClient."""
    return parse_stats(await client.call(STATS_METHOD, {}, timeout=timeout))
