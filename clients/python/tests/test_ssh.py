"""Python client -> ssh:// -> a Go `udskit serve` socket through a real sshd (Debian's
openssh-server) on 127.0.0.1 with throwaway keys: the server sees the ssh login user (nobody,
uid 65534) as the caller; a wrong key fails with an error that says authentication was refused."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import udskit
from conftest import GoServer


@dataclass
class SSHD:
    dir: str
    port: int
    args: tuple[str, ...]
    wrong: tuple[str, ...]


@pytest.fixture
def sshd() -> Iterator[SSHD]:
    assert os.path.exists("/usr/sbin/sshd"), "run scripts/install-deps.sh (openssh-server)"
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    d = tempfile.mkdtemp(prefix="udskit-py-sshd-")
    os.chmod(d, 0o755)  # authorized_keys is read as the login user
    for k in ("host_key", "user_key", "wrong_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(d, k)], check=True, timeout=30)
    shutil.copy(os.path.join(d, "user_key.pub"), os.path.join(d, "authorized_keys"))
    os.chmod(os.path.join(d, "authorized_keys"), 0o644)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with open(os.path.join(d, "sshd_config"), "w") as f:
        f.write(
            "\n".join(
                [
                    f"ListenAddress 127.0.0.1:{port}",
                    f"HostKey {d}/host_key",
                    f"AuthorizedKeysFile {d}/authorized_keys",
                    "PidFile none",
                    "StrictModes no",
                    "UsePAM no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "AllowStreamLocalForwarding yes",
                    "",
                ]
            )
        )
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", os.path.join(d, "sshd_config")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < end, "sshd did not start"
                time.sleep(0.01)
        with open(os.path.join(d, "host_key.pub")) as f:
            kind, key = f.read().split()[:2]
        with open(os.path.join(d, "known_hosts"), "w") as f:
            f.write(f"[127.0.0.1]:{port} {kind} {key}\n")

        def base(k: str) -> tuple[str, ...]:
            return ("-F", "/dev/null", "-i", os.path.join(d, k), "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
                    "-o", f"UserKnownHostsFile={d}/known_hosts", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes")  # fmt: skip

        yield SSHD(d, port, base("user_key"), base("wrong_key"))
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


def test_ssh_reaches_remote_socket_as_the_ssh_user(sshd: SSHD, udskit_bin: str) -> None:
    g = GoServer(udskit_bin, os.path.join(sshd.dir, "app.sock"), "--mode", "0666")
    g.start()
    try:
        addr = f"ssh://nobody@127.0.0.1:{sshd.port}{sshd.dir}/app.sock"

        async def main() -> Any:
            async with await udskit.connect(addr, timeout=20, ssh=udskit.SSHConfig(args=sshd.args)) as c:
                assert await c.call("echo", {"via": "ssh"}) == {"via": "ssh"}
                return await c.call("whoami")

        assert asyncio.run(main())["uid"] == 65534

        async def wrong() -> None:
            c = await udskit.connect(addr, timeout=20, reconnect=False, ssh=udskit.SSHConfig(args=sshd.wrong))
            await c.aclose()

        with pytest.raises(udskit.UdskitError) as ei:
            asyncio.run(wrong())
        assert "authentication refused" in ei.value.message, ei.value.message
    finally:
        g.stop()
