"""ssh://[user@]host[:port]/path for the Python client: as Go's uds.Dial does, each connection
runs the system's ssh with OpenSSH stream-local forwarding (-L LOCAL:/remote.sock) to a socket in
a fresh 0700 temp dir and connects there once ssh has bound it. The user's ssh config, agent,
known_hosts and ProxyJump apply; BatchMode: no prompts."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
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


async def ssh_forward(user: str, host: str, port: str, path: str, cfg: SSHConfig, timeout: float) -> tuple[str, asyncio.subprocess.Process, str]:
    """Starts ssh forwarding a private local socket to path on host; returns (local path, the
    process, its temp dir). Raises RuntimeError with the reason when ssh does not get through."""
    d = tempfile.mkdtemp(prefix="udskit-ssh-")
    local = os.path.join(d, "s.sock")
    args = ["-N", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes", "-o", "StreamLocalBindMask=0177"]
    if port:
        args += ["-p", port]
    args += [*cfg.args, "-L", f"{local}:{path}", "--", f"{user}@{host}" if user else host]
    try:
        proc = await asyncio.create_subprocess_exec(cfg.binary, *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        shutil.rmtree(d, ignore_errors=True)
        raise RuntimeError(f"no ssh client {cfg.binary!r} ({e}): install OpenSSH's client") from e
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        if proc.returncode is not None:
            break
        if os.path.exists(local):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(local)
                s.close()
                return local, proc, d
            except OSError:
                s.close()  # bound, not listening yet
        if loop.time() > end:
            stop(proc, d)
            raise RuntimeError(f"ssh to {host} did not set up the forwarding within {timeout}s")
        try:
            await asyncio.wait_for(proc.wait(), 0.01)
        except asyncio.TimeoutError:
            pass
    err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr is not None else ""
    shutil.rmtree(d, ignore_errors=True)
    raise RuntimeError(f"{explain_ssh(err, host)} (ssh: {'; '.join(err.strip().splitlines()[-2:])})")


def stop(proc: asyncio.subprocess.Process, d: str) -> None:
    if proc.returncode is None:
        proc.terminate()
    shutil.rmtree(d, ignore_errors=True)
