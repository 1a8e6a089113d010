#!/usr/bin/env bash
# The full, reproducible `udskit bench` run: the whole default matrix (every transport x
# 1 KiB, 10 KiB, 100 KiB, 1 MiB x 1 and 16 callers), 2 s per sample, repeated 3 times
# (median and spread), written to bench/results/<UTC date>-<host>/ as table.txt,
# results.json and chart.svg (+ chart.png when rsvg-convert is installed).
# Usage: bench/run.sh [extra udskit bench flags]   (make bench builds first and calls this)
# PROXY=1 also runs the proxy benchmark (go run ./tools/benchproxy) into proxy.txt.
# Takes about 3 minutes on 2 cores. Close other programs first: the table flags noisy cells.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-bin/udskit}
[ -x "$bin" ] || go build -trimpath -o "$bin" ./cmd/udskit
dir="bench/results/$(date -u +%Y%m%d-%H%M)-$(hostname -s 2>/dev/null || echo host)"
mkdir -p "$dir"
"$bin" bench --repeat "${REPEAT:-3}" --duration "${DURATION:-2s}" --warmup "${WARMUP:-500ms}" \
  --json "$dir/results.json" --chart "$dir/chart.svg" "$@" | tee "$dir/table.txt"
if command -v rsvg-convert >/dev/null 2>&1; then
  rsvg-convert -b white -o "$dir/chart.png" "$dir/chart.svg"
fi
{
  echo "command: $bin bench --repeat ${REPEAT:-3} --duration ${DURATION:-2s} --warmup ${WARMUP:-500ms} $*"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$dir/README.txt"
# The proxy benchmark (udskit proxy vs socat vs direct, side by side): PROXY=1 bench/run.sh
if [ "${PROXY:-0}" = 1 ]; then
  go run ./tools/benchproxy | tee "$dir/proxy.txt"
fi
echo "results in $dir"
