#!/bin/sh
# Builds the Go udskit CLI the interop tests run, unless UDSKIT_BIN names one.
set -e
if [ -n "$UDSKIT_BIN" ]; then
  [ -x "$UDSKIT_BIN" ] || { echo "UDSKIT_BIN=$UDSKIT_BIN is not an executable" >&2; exit 1; }
  exit 0
fi
cd "$(dirname "$0")/../../.."
go build -o clients/node/dist-test/udskit ./cmd/udskit
