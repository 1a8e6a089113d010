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
from dataclasses import dataclass, field


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


async def ssh_forward(user: str, host: str, port: str, path: str, cfg: SSHConfig, timeout: float) -> tuple[str, subprocess.Popen[bytes], str]:
    """Starts ssh forwarding a private local socket to path on host; returns (local path, the
    process, its temp dir). Raises RuntimeError with the reason when ssh does not get through."""
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
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    try:
        while proc.poll() is None:
            if os.path.exists(local):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(local)
                    return local, proc, d
                except OSError:
                    pass  # bound, not listening yet
                finally:
                    s.close()
            if loop.time() > end:
                stop(proc, d)
                raise RuntimeError(f"ssh to {host} did not set up the forwarding within {timeout}s")
            await asyncio.sleep(0.01)
        errf.seek(0)
        err = errf.read(65536).decode(errors="replace")
    finally:
        errf.close()
    _live.pop(proc.pid, None)
    shutil.rmtree(d, ignore_errors=True)
    raise RuntimeError(f"{explain_ssh(err, host)} (ssh: {'; '.join(err.strip().splitlines()[-2:])})")


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
