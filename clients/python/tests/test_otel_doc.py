"""docs/observability.md's Python OpenTelemetry example (its ```python block) runs as pasted with
the real SDK (test dependencies only): interceptors make the spans, one trace of five, a
handler's own call the child of its server span."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from conftest import REPO, short_dir


def test_otel_example_one_trace_of_five_spans() -> None:
    md = (REPO / "docs" / "observability.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", md, re.S)
    assert len(blocks) == 1, "docs/observability.md has one ```python block (the OpenTelemetry example)"
    d = short_dir()
    try:
        script = f"{d}/otel.py"
        with open(script, "w") as f:
            f.write(blocks[0])
        r = subprocess.run([sys.executable, script, d], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        first, *lines = r.stdout.strip().splitlines()
        assert first == "{'user': 42, 'name': 'ada'}"
        spans = {}
        traces = set()
        for line in lines:
            m = re.fullmatch(r"([0-9a-f]{32}) ([0-9a-f]{16}) parent (\S+) (\w+) (\S+)", line)
            assert m is not None, line
            traces.add(m[1])
            spans[(m[4], m[5])] = (m[2], m[3])
        assert len(lines) == 5 and len(traces) == 1, r.stdout
        root, cl, sl = spans[("INTERNAL", "request")], spans[("CLIENT", "lookup")], spans[("SERVER", "lookup")]
        cp, sp = spans[("CLIENT", "profile")], spans[("SERVER", "profile")]
        assert root[1] == "-"
        assert cl[1] == root[0]
        assert sl[1] == cl[0], "the server continued the trace its caller sent"
        assert cp[1] == sl[0], "the handler's call is a child of its server span"
        assert sp[1] == cp[0]
    finally:
        shutil.rmtree(d, ignore_errors=True)
