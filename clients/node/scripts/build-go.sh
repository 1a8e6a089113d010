#!/bin/sh
# Builds the Go programs the interop tests and the bench run, unless
# UDSKIT_BIN / UDSKIT_GRPCECHO_BIN name them: the udskit CLI and the
# grpc-go echo server (tools/grpcecho).
set -e
root="$(cd "$(dirname "$0")/../../.." && pwd)"
out="$root/clients/node/dist-test"
mkdir -p "$out"
cd "$root"
if [ -n "$UDSKIT_BIN" ]; then
  [ -x "$UDSKIT_BIN" ] || { echo "UDSKIT_BIN=$UDSKIT_BIN is not an executable" >&2; exit 1; }
else
  go build -o "$out/udskit" ./cmd/udskit
fi
if [ -z "$UDSKIT_GRPCECHO_BIN" ]; then
  go build -o "$out/grpcecho" ./tools/grpcecho
fi
