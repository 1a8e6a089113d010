"""The blocking client under threads: leader/follower reading, deadlines, streams, close."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

import pytest

import udskit
from conftest import ThreadServer


def test_threads_share_one_connection(py_server: Callable[..., ThreadServer]) -> None:
    """16 threads, mixed unary calls (some past their deadline) and streams (some
    abandoned): every call ends by its deadline (+ slack), with its own answer."""
    s = py_server()
    c = udskit.Client(s.path)
    errors: list[str] = []
    late: list[float] = []

    def worker(k: int) -> None:
        rng = random.Random(k)
        try:
            for i in range(60):
                op = rng.randrange(4)
                t0 = time.monotonic()
                if op == 0:
                    assert c.call("echo", {"k": k, "i": i}, timeout=5) == {"k": k, "i": i}
                elif op == 1:
                    # short sleeps around their deadlines, or a long one its deadline must cut
                    ms, to = rng.choice([(rng.randrange(0, 40), rng.choice([0.005, 0.02, 1.0])), (3000, 0.05)])
                    try:
                        assert c.call("sleep", {"ms": ms}, timeout=to) == {"slept_ms": ms}
                    except udskit.UdskitError as e:
                        assert e.code == "deadline_exceeded", (e, ms, to)
                    el = time.monotonic() - t0
                    if el > to + 1.0:  # slack: 17 threads share the GIL on a loaded 2-core machine
                        late.append(el - to)
                elif op == 2:
                    n = rng.randrange(0, 50)
                    assert [x["i"] for x in c.stream("stream", {"n": n})] == list(range(n))
                else:
                    st = c.stream("stream", {"n": 1000})
                    for j, x in enumerate(st):
                        assert x["i"] == j
                        if j == 3:
                            break
                    st.close()
        except BaseException as e:
            errors.append(f"{k}: {e!r}")

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "a thread is stuck"
    assert not errors, errors
    assert not late, late
    # nothing left behind on the connection
    conn = c._conn
    assert conn is not None and not conn.unary and not conn.streams and not conn.reading
    c.close()


def test_close_ends_every_waiting_thread(py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    c = udskit.Client(s.path)
    got: list[str] = []

    def worker() -> None:
        try:
            c.call("sleep", {"ms": 5000})
            got.append("answered")
        except udskit.UdskitError as e:
            got.append(e.code)

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(6)]
    for t in ts:
        t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    c.close()
    for t in ts:
        t.join(5)
    assert not any(t.is_alive() for t in ts)
    assert got == ["canceled"] * 6 and time.monotonic() - t0 < 2


def test_connection_loss_fails_every_thread_fast(sdir: str) -> None:
    import os

    path = os.path.join(sdir, "x.sock")
    s = ThreadServer(path)
    c = udskit.Client(path, max_backoff=0.05)
    got: list[tuple[str, bool]] = []

    def worker() -> None:
        try:
            c.call("sleep", {"ms": 5000}, timeout=10)
        except udskit.UdskitError as e:
            got.append((e.code, e.retryable))

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
    for t in ts:
        t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    s.stop()  # grace 0: connections closed under the calls
    for t in ts:
        t.join(5)
    assert got == [("unavailable", True)] * 4 and time.monotonic() - t0 < 2, got
    c.close()


def test_request_over_max_frame_is_refused_locally(py_server: Callable[..., ThreadServer]) -> None:
    """Refused before sending, for calls and streams: the connection (and every
    other call on it) stays up."""
    s = py_server(max_frame=1024)
    with udskit.Client(s.path) as c:
        conn = c._conn
        starts: list[Callable[[], Any]] = [lambda: c.call("echo", b"x" * 1025), lambda: list(c.stream("stream", b"x" * 1025))]
        for start in starts:
            with pytest.raises(udskit.UdskitError) as ei:
                start()
            assert ei.value.code == "resource_exhausted", ei.value
        assert c.call("echo", b"x" * 1024) == b"x" * 1024 and c._conn is conn
