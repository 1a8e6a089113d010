"""W3C trace context (traceparent, tracestate) in udskit call metadata, with no dependency.

The same two metadata keys the Go OpenTelemetry adapter (rpc/rpcotel) and the Node package
read and write, so a trace crosses from a Python app through a Go sidecar::

    call = child_of(trace_from_metadata(incoming) or new_trace())
    await client.call("lookup", {"user": 42}, metadata=trace_metadata(call))

and in a udskit server handler: ``trace_from_metadata(ctx.metadata)``. With the OpenTelemetry
SDK instead: ``opentelemetry.propagate.inject(metadata)`` / ``extract(ctx.metadata)``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Mapping

__all__ = ["TraceContext", "parse_traceparent", "format_traceparent", "new_trace", "child_of",
           "trace_metadata", "trace_from_metadata"]

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True)
class TraceContext:
    """32 hex digits of trace id, 16 of (parent) span id, the flags (1: sampled), tracestate."""

    trace_id: str
    span_id: str
    flags: int = 1
    state: str | None = None


def parse_traceparent(value: str | None) -> TraceContext | None:
    """A traceparent value (version 00, or a later one read as 00); None if it is not one."""
    if value is None or len(value) > 512:
        return None
    m = _TRACEPARENT.match(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return None
    return TraceContext(trace_id, span_id, int(flags, 16))


def format_traceparent(tc: TraceContext) -> str:
    """The traceparent value of tc (version 00)."""
    return f"00-{tc.trace_id}-{tc.span_id}-{tc.flags & 0xFF:02x}"


def _nonzero_hex(n: int) -> str:
    while True:
        b = os.urandom(n)
        if any(b):
            return b.hex()


def new_trace() -> TraceContext:
    """A new trace: random ids, sampled."""
    return TraceContext(_nonzero_hex(16), _nonzero_hex(8), 1)


def child_of(parent: TraceContext | None) -> TraceContext:
    """A child of parent (same trace and state, a new span id), or a new trace."""
    if parent is None:
        return new_trace()
    return replace(parent, span_id=_nonzero_hex(8))


def trace_metadata(tc: TraceContext) -> dict[str, str]:
    """The metadata that carries tc on a call: {"traceparent": ..., "tracestate": ...}."""
    md = {"traceparent": format_traceparent(tc)}
    if tc.state:
        md["tracestate"] = tc.state
    return md


def with_trace(metadata: Mapping[str, str] | None, trace: TraceContext | None) -> Mapping[str, str] | None:
    """metadata with a child of trace as traceparent/tracestate added (what a call made with
    ``trace=`` sends); metadata itself when trace is None."""
    if trace is None:
        return metadata
    return {**(metadata or {}), **trace_metadata(child_of(trace))}


def trace_from_metadata(md: Mapping[str, str] | None) -> TraceContext | None:
    """The trace context a caller sent (a handler's ctx.metadata), or None."""
    if not md:
        return None
    tc = parse_traceparent(md.get("traceparent"))
    if tc is not None and md.get("tracestate"):
        tc = replace(tc, state=md["tracestate"])
    return tc
