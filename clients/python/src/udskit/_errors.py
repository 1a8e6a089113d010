"""Error codes (protocol/codes.json) and the exceptions that carry them."""

from __future__ import annotations

from typing import Final

# The code table of protocol/spec.md section 5.1; tests check it against
# protocol/codes.json. name -> number.
CODES: Final[dict[str, int]] = {
    "ok": 0,
    "canceled": 1,
    "unknown": 2,
    "invalid_argument": 3,
    "deadline_exceeded": 4,
    "not_found": 5,
    "already_exists": 6,
    "permission_denied": 7,
    "resource_exhausted": 8,
    "failed_precondition": 9,
    "aborted": 10,
    "out_of_range": 11,
    "unimplemented": 12,
    "internal": 13,
    "unavailable": 14,
    "data_loss": 15,
    "unauthenticated": 16,
    "protocol_violation": 32,
}
CODE_NAMES: Final[dict[int, str]] = {v: k for k, v in CODES.items()}
RETRYABLE: Final[frozenset[int]] = frozenset({14})

CANCELED: Final = 1
UNKNOWN: Final = 2
INVALID_ARGUMENT: Final = 3
DEADLINE_EXCEEDED: Final = 4
NOT_FOUND: Final = 5
PERMISSION_DENIED: Final = 7
RESOURCE_EXHAUSTED: Final = 8
FAILED_PRECONDITION: Final = 9
UNIMPLEMENTED: Final = 12
INTERNAL: Final = 13
UNAVAILABLE: Final = 14
UNAUTHENTICATED: Final = 16
PROTOCOL_VIOLATION: Final = 32

# Protocol error names (protocol/vectors/README.md).
PROTOCOL_ERROR_NAMES: Final[frozenset[str]] = frozenset(
    {
        "truncated",
        "bad_magic",
        "bad_version",
        "bad_limits",
        "frame_too_large",
        "head_too_large",
        "bad_id",
        "bad_code",
        "bad_head",
        "bad_request",
    }
)


def code_number(code: int | str) -> int:
    """Returns the number of a code given by number or name (ValueError if unknown)."""
    if isinstance(code, int):
        if not 0 <= code <= 0xFFFFFFFF:
            raise ValueError(f"code {code} out of range")
        return code
    if code in CODES:
        return CODES[code]
    if code.isdigit():
        return int(code)
    raise ValueError(f"unknown code name {code!r} (known: {', '.join(CODES)})")


class UdskitError(Exception):
    """A call failed with a protocol error code.

    ``code`` is the code's name ("not_found"; "code_N" for a number this
    package does not know, which is treated as unknown for retries),
    ``number`` its number, ``retryable`` whether sending the call again may
    succeed (unavailable), ``refused`` whether the server said it did not
    process the call at all (safe to resend), ``details`` the optional bytes the
    server attached.
    """

    def __init__(
        self,
        code: int | str,
        message: str = "",
        *,
        refused: bool = False,
        details: bytes = b"",
    ) -> None:
        self.number: int = code_number(code)
        self.code: str = CODE_NAMES.get(self.number, f"code_{self.number}")
        self.message: str = message
        self.refused: bool = refused
        self.details: bytes = details
        super().__init__(f"{self.code} ({self.number}): {message}")

    @property
    def retryable(self) -> bool:
        return self.number in RETRYABLE


class ProtocolError(UdskitError):
    """The peer broke the wire protocol. ``name`` is the protocol error name
    from protocol/codes.json ("frame_too_large", "bad_head", ...); the code is
    protocol_violation (32), except resource_exhausted for a limit hit."""

    def __init__(self, name: str, message: str, code: int = PROTOCOL_VIOLATION) -> None:
        self.name: str = name
        super().__init__(code, f"{name}: {message}")


class AddressError(ValueError):
    """An address that does not parse. ``name`` is the error name from
    protocol/addresses.json ("empty", "bad_port", ...)."""

    def __init__(self, input: str, name: str, reason: str) -> None:
        self.input = input
        self.name = name
        self.reason = reason
        super().__init__(
            f"bad address {input[:64]!r}: {reason} (accepted forms: unix:/path/to.sock, "
            "/path/to.sock, ./rel.sock, unix:@name, @name, tcp:host:port, host:port)"
        )


class ListenError(OSError):
    """A listening address could not be taken. ``reason`` is one of
    "in_use" (a live server answers there; ``pid`` when the kernel says),
    "not_socket" (something else is at the path; never removed),
    "path_too_long", "policy_on_tcp"."""

    def __init__(self, reason: str, message: str, pid: int | None = None) -> None:
        self.reason = reason
        self.pid = pid
        super().__init__(message)
