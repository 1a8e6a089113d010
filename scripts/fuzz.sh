#!/usr/bin/env bash
# Runs every Fuzz* target in the module for a short time (FUZZTIME, default 5s).
# Targets are discovered, so adding a fuzz test needs no edit here.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-5s}
n=0
while IFS= read -r line; do
  file=${line%%:*}
  name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]*).*/\1/' <<<"${line#*:}")
  pkg=./$(dirname "${file#./}")
  echo "fuzz: $pkg $name ($t)"
  go test -run='^$' -fuzz="^${name}\$" -fuzztime="$t" "$pkg"
  n=$((n+1))
done < <(grep -rE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' . | grep -v '/node_modules/' | sort)
echo "fuzz: $n targets ran"
