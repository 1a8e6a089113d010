"""The README's examples run as written (socket path moved into a temp dir)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
DEMO_PATH = "/tmp/udskit-py-demo/app.sock"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_examples(sdir: str) -> None:
    server, async_client, sync_client, both_ways = blocks()
    path = os.path.join(sdir, "demo", "app.sock")
    srv = subprocess.Popen([sys.executable, "-c", server.replace(DEMO_PATH, path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert srv.stdout is not None
        line = srv.stdout.readline()
        assert line.decode().startswith(f"listening on unix:{path}"), line + (srv.stderr.read() if srv.stderr else b"")
        assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
        r = subprocess.run([sys.executable, "-c", async_client.replace(DEMO_PATH, path)], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = r.stdout.decode().splitlines()
        assert out[0] == "b'raw bytes'"
        assert f"'uid': {os.getuid()}" in out[1] and "'pid': " in out[1]
        assert out[2:] == ["{'i': 0}", "{'i': 1}", "{'i': 2}", "unimplemented False"]
        r = subprocess.run([sys.executable, "-c", sync_client.replace(DEMO_PATH, path)], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().splitlines() == ["100 b'42'", "[0, 1, 2]"]
        r = subprocess.run([sys.executable, "-c", both_ways], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().splitlines() == ["1", "3", "6", "[]", "{'lines': 2}"]
    finally:
        srv.send_signal(signal.SIGTERM)
        rc = srv.wait(20)
    assert rc == 0
    assert not os.path.exists(path)
