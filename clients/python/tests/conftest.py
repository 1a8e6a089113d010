"""Shared fixtures: the Go udskit binary, a Go demo server, a Python server on a thread."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import udskit
from udskit import demo

REPO = Path(__file__).resolve().parents[3]
PROTOCOL = REPO / "protocol"


def short_dir(mode: int = 0o700) -> str:
    d = tempfile.mkdtemp(prefix="udspy", dir="/tmp")
    os.chmod(d, mode)
    return d


@pytest.fixture
def sdir() -> Iterator[str]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def udskit_bin() -> Iterator[str]:
    env = os.environ.get("UDSKIT_BIN")
    if env:
        yield str(Path(env).resolve())
        return
    d = short_dir(0o755)
    out = os.path.join(d, "udskit")
    subprocess.run(["go", "build", "-o", out, "./cmd/udskit"], cwd=REPO, check=True, timeout=600)
    yield out
    shutil.rmtree(d, ignore_errors=True)


class GoServer:
    def __init__(self, bin: str, path: str, *args: str) -> None:
        self.bin, self.path, self.args = bin, path, args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([self.bin, "serve", self.path, "-q", *self.args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert b"listening" in line, line + self.proc.stderr.read() if self.proc.stderr else b""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def stop(self) -> None:
        self.kill(signal.SIGKILL)
        if self.proc is not None:
            for f in (self.proc.stdout, self.proc.stderr):
                if f is not None:
                    f.close()


@pytest.fixture
def go_server(udskit_bin: str, sdir: str) -> Iterator[GoServer]:
    s = GoServer(udskit_bin, os.path.join(sdir, "go.sock"))
    s.start()
    yield s
    s.stop()


class ThreadServer:
    """A Python udskit server on its own event loop thread, for sync tests and Go clients."""

    def __init__(self, addr: str, handlers: dict[str, Any] | None = None, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.srv: udskit.Server = self.run(udskit.serve(addr, handlers or demo.handlers(), **kw))
        self.addr = str(self.srv.addr)
        self.path = addr

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call_soon(self, fn: Callable[[], Any]) -> Any:
        async def f() -> Any:
            return fn()

        return self.run(f())

    def stop(self, grace: float = 0) -> None:
        if self.loop.is_running():
            self.run(self.srv.shutdown(grace))
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def py_server(sdir: str) -> Iterator[Callable[..., ThreadServer]]:
    made: list[ThreadServer] = []

    def make(handlers: dict[str, Any] | None = None, name: str = "py.sock", **kw: Any) -> ThreadServer:
        s = ThreadServer(os.path.join(sdir, name), handlers, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)
