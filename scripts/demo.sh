#!/usr/bin/env bash
# The README's main job: a short side-by-side benchmark of every transport built into udskit
# (udskit rpc, grpc-go, raw echo, newline-JSON; unix vs tcp), servers in separate processes on
# sockets in a private temp dir. A subset of the full matrix (`make bench` runs all of it):
# 1 KiB, 100 KiB and 1 MiB payloads with 16 concurrent callers, 2 interleaved runs of ~0.7 s per cell
# (median and spread, noisy cells flagged), about 20 s in all; a group with a noisy cell runs again,
# up to NOISY_RETRIES (3) extra rounds, all extra rounds within NOISY_RETRY_TIME (30s).
# The summary's last line says how many cells were repeated and how many stayed noisy.
# Prints a three-line summary and a table under 100 columns (bench --compact), and writes it,
# the JSON (every measure) and the chart into bench/out/.
set -euo pipefail
bin=${1:-bin/udskit}
out=${OUT:-bench/out}
mkdir -p "$out"
chart="$out/demo.svg"
"$bin" bench \
  --sizes 1KiB,100KiB,1MiB --conc 16 --compact \
  --duration "${DURATION:-700ms}" --warmup 300ms --repeat "${REPEAT:-2}" \
  --noisy-retries "${NOISY_RETRIES:-3}" --noisy-retry-time "${NOISY_RETRY_TIME:-30s}" \
  --json "$out/demo.json" --chart "$chart" | tee "$out/demo.txt"
if command -v rsvg-convert >/dev/null 2>&1; then
  rsvg-convert -b white -o "$out/demo.png" "$chart" && echo "chart: $out/demo.png"
fi
echo "$("$bin" version); table: $out/demo.txt, JSON: $out/demo.json, chart: $chart"
