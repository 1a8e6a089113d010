"""The Go client (`udskit call`) against the Python server."""

from __future__ import annotations

import json
import re
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

import udskit
from conftest import ThreadServer, short_dir, wait_for


def call(bin: str, *args: str, input: bytes | None = None, timeout: float = 60, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*prefix, bin, "call", *args], input=input, capture_output=True, timeout=timeout)


def test_every_method(udskit_bin: str, py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    r = call(udskit_bin, s.path, "echo", '{"hello":"world"}')
    assert r.returncode == 0 and json.loads(r.stdout) == {"hello": "world"}, r
    r = call(udskit_bin, s.path, "sleep", '{"ms":30}')
    assert r.returncode == 0 and json.loads(r.stdout) == {"slept_ms": 30}, r
    r = call(udskit_bin, s.path, "fail", '{"code":"not_found","message":"no such user"}')
    assert r.returncode == 1 and b"not_found (5): no such user" in r.stderr, r
    r = call(udskit_bin, s.path, "fail", '{"code":"7"}')
    assert r.returncode == 1 and b"permission_denied (7)" in r.stderr, r
    r = call(udskit_bin, s.path, "nope")
    assert r.returncode == 1 and b"unimplemented (12)" in r.stderr, r
    r = call(udskit_bin, s.path, "stream", '{"n":3,"interval_ms":10}')
    assert r.returncode == 0, r
    assert [json.loads(x) for x in r.stdout.splitlines()] == [{"i": i, "n": 3} for i in range(3)]
    r = call(udskit_bin, s.path, "stream", '{"n":20000}')  # needs stream credit grants from Go
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 20000, r.stderr


def test_whoami_sees_the_go_clients_pid(udskit_bin: str, py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    p = subprocess.Popen([udskit_bin, "call", s.path, "whoami"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert json.loads(out) == {"pid": p.pid, "uid": os.getuid(), "gid": os.getgid()}


def test_deadline_reaches_the_handler(udskit_bin: str, py_server: Callable[..., ThreadServer]) -> None:
    seen: list[Any] = []

    async def sleep(ctx: udskit.Context, req: Any) -> Any:
        seen.append(ctx.time_remaining())
        import asyncio

        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return None

    s = py_server({"sleep": sleep})
    t0 = time.monotonic()
    r = call(udskit_bin, s.path, "sleep", "{}", "--timeout", "300ms")
    assert r.returncode == 1 and b"deadline_exceeded (4)" in r.stderr, r
    assert time.monotonic() - t0 < 3
    wait_for(lambda: "cancelled" in seen)
    assert 0 < seen[0] <= 0.3


def test_raw_1mib_and_1000_concurrent(udskit_bin: str, py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    big = os.urandom(1 << 20)
    r = call(udskit_bin, "--raw", s.path, "echo", input=big)
    assert r.returncode == 0 and r.stdout == big, r.stderr
    r = call(udskit_bin, s.path, "echo", '{"x":1}', "-n", "1000", "-c", "1000", "--conns", "1")
    assert r.returncode == 0 and b"ok 1000  errors 0" in r.stdout, r
    r = call(udskit_bin, s.path, "sleep", '{"ms":50}', "-n", "1000", "-c", "1000", "--conns", "2", "--timeout", "20s")
    assert r.returncode == 0 and b"ok 1000  errors 0" in r.stdout, r


def test_ndjson_socat_and_udskit_on_one_socket(py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    lines = b'{"id":1,"func":"sleep","data":{"ms":50}}\n{"id":"a","func":"echo","data":[1,2]}\n{"id":3,"func":"fail","data":{"code":"not_found","message":"x"}}\nnot json\n'
    r = subprocess.run(["socat", "-", f"UNIX-CONNECT:{s.path}"], input=lines, capture_output=True, timeout=20)
    got = sorted(r.stdout.decode().splitlines())
    assert len(got) == 4, r
    bad = got.pop()  # '{"id":null,...' sorts last
    assert got == ['{"id":"a","data":[1,2]}', '{"id":1,"data":{"slept_ms":50}}', '{"id":3,"error":"x","code":"not_found"}'], r
    b = json.loads(bad)
    assert b["id"] is None and b["code"] == "invalid_argument" and b["error"].startswith("bad_request: line is not JSON")


def nobody_prefix() -> tuple[str, ...]:
    if os.geteuid() != 0:
        pytest.fail("these tests run as root (CI does): they drop to nobody with setpriv")
    assert shutil.which("setpriv"), "setpriv missing: scripts/install-deps.sh installs util-linux"
    return ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")


@pytest.fixture
def open_dir() -> Any:
    d = short_dir(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_nobody_refused_before_a_byte_is_read(udskit_bin: str, open_dir: str) -> None:
    prefix = nobody_prefix()
    bin = os.path.join(open_dir, "udskit")
    shutil.copy(udskit_bin, bin)
    s = ThreadServer(os.path.join(open_dir, "p.sock"), mode=0o666, policy=udskit.allow_uids([0]))
    try:
        r = call(bin, s.path, "echo", '{"x":1}', "--timeout", "5s", prefix=prefix)
        assert r.returncode == 1, r
        assert s.srv.stats["refused"] == 1 and s.srv.stats["connections"] == 0
        # a raw peer as nobody that writes first (socat): the server never reads its bytes
        r2 = subprocess.run(
            [*prefix, "socat", "-t", "2", "-", f"UNIX-CONNECT:{s.path}"], input=b"UDSK" + b"x" * 100000, capture_output=True, timeout=30, cwd=open_dir
        )
        assert r2.stdout == b"", r2  # not even a hello back
        assert s.srv.stats["refused"] == 2 and s.srv.stats["protocol_errors"] == 0
        assert s.srv.stats["refused_bytes_read"] == 0
        # root is admitted, and the handler sees the Go client's true pid and uid
        p = subprocess.Popen([bin, "call", s.path, "whoami"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert json.loads(out) == {"pid": p.pid, "uid": 0, "gid": 0}
    finally:
        s.stop()
    # allow nobody (65534) instead: its true uid reaches the handler
    s = ThreadServer(os.path.join(open_dir, "q.sock"), mode=0o666, policy=udskit.allow_uids(65534))
    try:
        p = subprocess.Popen([*prefix, bin, "call", s.path, "whoami"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        who = json.loads(out)
        assert who["uid"] == 65534 and who["gid"] == 65534 and who["pid"] > 0
    finally:
        s.stop()


def hello() -> bytes:
    return bytes.fromhex("5544534b010100000000000100000000")


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    out = b""
    while True:
        try:
            b = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not b:
            return out
        out += b


@pytest.mark.parametrize(
    "junk,name",
    [
        (bytes.fromhex("0200000001000000ffffffff00000000"), b"frame_too_large"),
        (bytes.fromhex("01000140010000000000000000000000"), b"head_too_large"),
        (bytes.fromhex("0100060000000000000000000000000004006563686f"), b"bad_id"),
        (bytes.fromhex("0100010001000000000000000000000004"), b"bad_head"),
        (bytes.fromhex("02000000010000000000000000000000"), b"protocol_violation"),  # a response from a client
    ],
)
def test_hostile_bytes_close_only_that_connection(py_server: Callable[..., ThreadServer], junk: bytes, name: bytes) -> None:
    s = py_server()
    good = udskit.Client(s.path)
    try:
        assert good.call("echo", {"a": 1}) == {"a": 1}
        bad = socket.socket(socket.AF_UNIX)
        bad.connect(s.path)
        bad.sendall(hello() + junk)
        out = read_all(bad)
        bad.close()
        assert out[:4] == b"UDSK"
        t, _, hl, id, _, aux = udskit._wire.HEADER.unpack_from(out, 16)
        assert (t, id, aux) == (3, 0, 32), out  # connection-level protocol_violation
        assert name in out[32 : 32 + hl], out
        assert good.call("echo", {"a": 2}) == {"a": 2}
        assert s.srv.stats["protocol_errors"] == 1
    finally:
        good.close()


def test_hostile_first_bytes(py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    for junk in (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"UDSX" + b"\0" * 12, bytes.fromhex("5544534b000000000000000100000000")):
        bad = socket.socket(socket.AF_UNIX)
        bad.connect(s.path)
        bad.sendall(junk)
        out = read_all(bad)
        bad.close()
        if junk.startswith(b"UDS"):
            assert out[:4] == b"UDSK" and out[16] == 3, out  # hello, then a connection error
    with udskit.Client(s.path) as c:
        assert c.call("echo", 1) == 1
    assert s.srv.stats["protocol_errors"] == 3


def start_py_demo(path: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-m", "udskit.demo", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith(b"listening on"), line
    return p


def test_go_client_through_python_server_kill_and_restart(udskit_bin: str, sdir: str) -> None:
    """kill -9 the Python server mid-load and start it again: the Go client's calls
    fail or succeed, none past its 1 s timeout, and the load run finishes."""
    path = os.path.join(sdir, "k.sock")
    srv = start_py_demo(path)
    load = subprocess.Popen(
        [udskit_bin, "call", path, "sleep", '{"ms":2}', "-n", "4000", "-c", "16", "--timeout", "1s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(0.5)
        srv.kill()
        srv.wait(10)
        time.sleep(0.3)
        srv = start_py_demo(path)  # stale socket file: removed after a refused probe
        out, err = load.communicate(timeout=90)
    finally:
        for p in (srv, load):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    text = out.decode()
    assert "requests 4000" in text, (out, err)
    m = re.search(r"max ([0-9.]+)(µs|ms|s)\b", text)
    assert m, text
    mx = float(m.group(1)) * {"µs": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
    assert mx < 1.3, text
    ok = int(re.search(r"ok (\d+)", text).group(1))  # type: ignore[union-attr]
    assert ok > 100, text
    errors = int(re.search(r"errors (\d+)", text).group(1))  # type: ignore[union-attr]
    assert errors > 0 or ok == 4000, text  # the kill was seen (or every call was retried in time)


def test_go_client_sees_goaway_drain(udskit_bin: str, py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    p = subprocess.Popen([udskit_bin, "call", s.path, "sleep", '{"ms":400}'], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: any(c.calls for c in list(s.srv._conns)))
    s.stop(grace=5)  # goaway; the call in flight is still answered
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and json.loads(out) == {"slept_ms": 400}, err
    assert not os.path.exists(s.path)
