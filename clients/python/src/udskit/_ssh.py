"""ssh://[user@]host[:port]/path for the Python client: as Go's uds.Dial does, each connection
runs the system's ssh with OpenSSH stream-local forwarding (-L LOCAL:/remote.sock) to a socket in
a fresh 0700 temp dir and connects there once ssh has bound it. The user's ssh config, agent,
known_hosts and ProxyJump apply; BatchMode: no prompts."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO


@dataclass(frozen=True)
class SSHConfig:
    """How a client reaches ssh:// addresses."""

    #: the ssh client to run
    binary: str = "ssh"
    #: extra ssh arguments before the destination, e.g. ("-i", "key")
    args: tuple[str, ...] = field(default_factory=tuple)


def explain_ssh(stderr: str, host: str) -> str:
    s = stderr.lower()
    if "host key verification failed" in s or "host key is known" in s or "identification has changed" in s:
        return f"the host key of {host} is unknown or changed: check it and add it to known_hosts (connect once with ssh, or ssh-keyscan)"
    if "permission denied" in s:
        return f"authentication refused by {host}: load a key it accepts into ssh-agent, or name it in ~/.ssh/config (no prompts: BatchMode)"
    if "could not resolve hostname" in s:
        return f"host {host} does not resolve"
    if "connection refused" in s or "timed out" in s or "no route to host" in s:
        return f"no ssh server answers at {host}"
    return f"ssh to {host} failed"


async def ssh_forward(user: str, host: str, port: str, path: str, cfg: SSHConfig, timeout: float) -> Forward:
    """Starts ssh forwarding a private local socket to path on host; returns the Forward once
    ssh has bound its local socket. Raises RuntimeError with the reason when ssh does not get
    through."""
    f = Forward.start(user, host, port, path, cfg)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not f.ready(timeout, loop.time() > end):
        await asyncio.sleep(0.01)
    return f


def ssh_forward_sync(user: str, host: str, port: str, path: str, cfg: SSHConfig, timeout: float) -> Forward:
    """ssh_forward for the blocking client."""
    f = Forward.start(user, host, port, path, cfg)
    end = time.monotonic() + timeout
    while not f.ready(timeout, time.monotonic() > end):
        time.sleep(0.01)
    return f


class Forward:
    """One ssh -L process carrying one connection: its private local socket, its temp dir and
    the tail of its stderr (which says why a remote socket could not be opened)."""

    def __init__(self, proc: subprocess.Popen[bytes], local: str, d: str, errf: IO[bytes], target: tuple[str, str, str]) -> None:
        self.proc, self.local, self.dir, self.errf = proc, local, d, errf
        self.user, self.host, self.path = target

    @classmethod
    def start(cls, user: str, host: str, port: str, path: str, cfg: SSHConfig) -> Forward:
        d = tempfile.mkdtemp(prefix="udskit-ssh-")
        local = os.path.join(d, "s.sock")
        args = ["-N", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes", "-o", "StreamLocalBindMask=0177"]
        if port:
            args += ["-p", port]
        args += [*cfg.args, "-L", f"{local}:{path}", "--", f"{user}@{host}" if user else host]
        errf = tempfile.TemporaryFile()
        try:
            # A plain Popen, not an asyncio subprocess: the forwarder may outlive the event loop.
            proc = subprocess.Popen([cfg.binary, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf)
        except OSError as e:
            errf.close()
            shutil.rmtree(d, ignore_errors=True)
            raise RuntimeError(f"no ssh client {cfg.binary!r} ({e}): install OpenSSH's client") from e
        _live[proc.pid] = proc
        return cls(proc, local, d, errf, (user, host, path))

    def ready(self, timeout: float, late: bool) -> bool:
        """True once ssh listens on the local socket; raises RuntimeError (and cleans up) when
        ssh exited (with the reason from its stderr) or late is True."""
        if self.proc.poll() is None:
            if os.path.exists(self.local):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(self.local)
                    return True
                except OSError:
                    pass  # bound, not listening yet
                finally:
                    s.close()
            if not late:
                return False
            self.stop()
            raise RuntimeError(f"ssh to {self.host} did not set up the forwarding within {timeout}s")
        err = self.stderr()
        self.stop()
        raise RuntimeError(f"{explain_ssh(err, self.host)} (ssh: {'; '.join(err.strip().splitlines()[-2:])})")

    def stderr(self) -> str:
        try:
            self.errf.seek(0)
            return self.errf.read(65536).decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def remote_socket_error(self) -> str | None:
        """Why the connection ended before the server said a word, when ssh says the remote
        socket could not be opened (it closes our end right after printing that: give its
        stderr a moment). None: ssh said nothing of the kind."""
        end = time.monotonic() + 0.2
        while True:
            s = self.stderr()
            if "open failed" in s:
                who = self.user or "the ssh login user"
                last = "; ".join(s.strip().splitlines()[-2:])
                return (f"the remote socket {self.path} on {self.host} could not be opened: it is missing "
                        f"(is the server running there?), or {who} may not connect to it (ssh: {last})")
            if time.monotonic() > end:
                return None
            time.sleep(0.005)

    def stop(self) -> None:
        stop(self.proc, self.dir)
        try:
            self.errf.close()
        except OSError:
            pass


#: forwarders still running: ended at interpreter exit if their connection never was
_live: dict[int, subprocess.Popen[bytes]] = {}


def stop(proc: subprocess.Popen[bytes], d: str) -> None:
    _live.pop(proc.pid, None)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(d, ignore_errors=True)


@atexit.register
def _stop_all() -> None:
    for proc in list(_live.values()):
        if proc.poll() is None:
            proc.terminate()
