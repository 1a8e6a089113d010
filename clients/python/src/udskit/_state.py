"""The states of a server connection, written as a table (in the manner of
h11's ``_state.py``): what a connection is (its Mode), which event moves it
to which mode, and why it is not being read (Pause, a set of reasons).

Mode (what the connection speaks), one at a time::

    mode       event         next       when
    ---------  ------------  ---------  -------------------------------------------------
    SNIFF      BYTE_U        HELLO      first byte 'U': a udskit hello is arriving
    SNIFF      BYTE_BRACE    NDJSON     first byte '{': newline-JSON lines
    SNIFF      BYTE_OTHER    CLOSED     anything else: closed at once
    SNIFF      REFUSE        REFUSED    the peer policy said no (before any read)
    SNIFF      REJECT        REFUSED    over max_conns (before any read)
    HELLO      HELLO_DONE    FRAMES     16 hello bytes in, ours sent: frames flow
    any        CLOSE         CLOSED     closed by us, by the peer, or by an error

Orthogonal to the mode, and kept as two flags on the connection:
``draining`` (a shutdown started: goaway sent to a udskit client, no new
udskit call; NDJSON lines already read are still served) and ``peer_eof``
(the client shut down its sending side).

Reading stops while any Pause reason holds and resumes when none does:

- WRITES: the transport's write buffer is over its high-water mark (the
  client does not read its answers);
- IN_FLIGHT: an NDJSON connection has max_in_flight calls running (NDJSON
  has no way to refuse a line, so it is simply not read meanwhile);
- BUDGET: the connection, or the server in total, holds more bytes than
  max_conn_bytes / max_server_bytes (see _conn.py);
- LINES: an NDJSON connection holds lines already read, unparsed: for the
  next loop iteration (ITER_FRAMES lines, or ITER_CALLS calls, per
  iteration), until a call ends (max_in_flight reached), or until the budget
  has room (BUDGET).
"""

from __future__ import annotations

import enum
from typing import Final


class Mode(enum.Enum):
    SNIFF = "sniff"
    HELLO = "hello"
    FRAMES = "frames"
    NDJSON = "ndjson"
    REFUSED = "refused"
    CLOSED = "closed"


class Event(enum.Enum):
    BYTE_U = "byte_u"
    BYTE_BRACE = "byte_brace"
    BYTE_OTHER = "byte_other"
    REFUSE = "refuse"
    REJECT = "reject"
    HELLO_DONE = "hello_done"
    CLOSE = "close"


TRANSITIONS: Final[dict[Mode, dict[Event, Mode]]] = {
    Mode.SNIFF: {
        Event.BYTE_U: Mode.HELLO,
        Event.BYTE_BRACE: Mode.NDJSON,
        Event.BYTE_OTHER: Mode.CLOSED,
        Event.REFUSE: Mode.REFUSED,
        Event.REJECT: Mode.REFUSED,
        Event.CLOSE: Mode.CLOSED,
    },
    Mode.HELLO: {Event.HELLO_DONE: Mode.FRAMES, Event.CLOSE: Mode.CLOSED},
    Mode.FRAMES: {Event.CLOSE: Mode.CLOSED},
    Mode.NDJSON: {Event.CLOSE: Mode.CLOSED},
    Mode.REFUSED: {Event.CLOSE: Mode.CLOSED},
    Mode.CLOSED: {Event.CLOSE: Mode.CLOSED},
}

#: modes in which the connection is open for calls (its hello, if any, is done)
SERVING: Final = frozenset({Mode.FRAMES, Mode.NDJSON})


def next_mode(mode: Mode, event: Event) -> Mode:
    """The mode after event; an event the table does not allow is a bug here."""
    try:
        return TRANSITIONS[mode][event]
    except KeyError:
        raise RuntimeError(f"udskit: server connection in mode {mode.value} cannot take event {event.value}") from None


class Pause:
    """Reasons reading is paused, as bits of an int (an enum.Flag costs a
    Python-level call per operation, and these are tested on every read)."""

    NONE: Final = 0
    WRITES: Final = 1
    IN_FLIGHT: Final = 2
    BUDGET: Final = 4
    LINES: Final = 8
