#!/usr/bin/env bash
# Installs what udskit's tests need on a fresh Debian machine: idempotent, quiet when all is present.
# Real peers for the integration tests: PostgreSQL, Redis, socat, curl, psql, redis-cli.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

[ -n "$(pg_bin)" ] && [ -x "$(pg_bin)/initdb" ] || need+=(postgresql)
have psql || need+=(postgresql-client)
have redis-server || need+=(redis-server)
have redis-cli || need+=(redis-tools)
have socat || need+=(socat)
have curl || need+=(curl)
have setpriv || need+=(util-linux)
have lsof || need+=(lsof)
have tshark || need+=(tshark)

if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts services on install; the tests start their own on temp dirs.
  $SUDO service postgresql stop >/dev/null 2>&1 || true
  $SUDO service redis-server stop >/dev/null 2>&1 || true
fi
echo "install-deps: ok (postgres bin: $(pg_bin))"
