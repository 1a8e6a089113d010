#!/usr/bin/env bash
# The README's main job: a short side-by-side benchmark of every transport built into udskit
# (udskit rpc, grpc-go, raw echo, newline-JSON; unix vs tcp), servers in separate processes on
# sockets in a private temp dir. A subset of the full matrix (`make bench` runs all of it):
# 1 KiB, 100 KiB and 1 MiB payloads with 16 concurrent callers, ~1 s per cell, well under a minute.
# Prints the table and writes it, the JSON and the chart into bench/out/.
set -euo pipefail
bin=${1:-bin/udskit}
out=${OUT:-bench/out}
mkdir -p "$out"
"$bin" version
chart="$out/demo.svg"
"$bin" bench \
  --sizes 1KiB,100KiB,1MiB --conc 16 \
  --duration "${DURATION:-1s}" --warmup 300ms \
  --json "$out/demo.json" --chart "$chart" | tee "$out/demo.txt"
if command -v rsvg-convert >/dev/null 2>&1; then
  rsvg-convert -b white -o "$out/demo.png" "$chart" && echo "chart: $out/demo.png"
fi
echo "table: $out/demo.txt  chart: $chart  (open the .svg in a browser; docs/bench.md explains the columns)"
