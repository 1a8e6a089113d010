"""clients/python/tools/bench.py runs end to end (tiny durations; the numbers are not checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO


def test_bench_smoke(udskit_bin: str, sdir: str) -> None:
    out = os.path.join(sdir, "bench.json")
    cells = "udskit-async:1:64,ndjson-asyncio:1:64,udskit-sync:2:64,grpcio-aio:4:1024,udskit-async-bidi:2:64,udskit-sync-bidi:1:64"
    env = dict(os.environ, UDSKIT_BIN=udskit_bin)
    r = subprocess.run(
        [sys.executable, str(REPO / "clients/python/tools/bench.py"), "--rounds", "1", "--duration", "0.2", "--warmup", "0.05", "--cells", cells, "--json", out],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    doc = json.loads(open(out).read())
    assert [(x["client"], x["conc"], x["size"]) for x in doc["rows"]] == [
        ("udskit-async", 1, 64),
        ("ndjson-asyncio", 1, 64),
        ("udskit-sync", 2, 64),
        ("grpcio-aio", 4, 1024),
        ("udskit-async-bidi", 2, 64),
        ("udskit-sync-bidi", 1, 64),
    ]
    assert all(x["requests"] > 0 for row in doc["rows"] for x in row["rounds"])
    assert "p50_1x64_udskit_vs_ndjson" in doc["targets"]
    assert "p50_1x_bidi_round_vs_unary" not in doc["targets"]  # (its cell is 1 caller; this run has 2)
    assert b"udskit-async" in r.stdout
