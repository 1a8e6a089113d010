#!/usr/bin/env bash
# Soak: attack a udskit server as a hostile local peer would, one attack at a
# time, while a well-behaved client calls echo; then SIGKILL the server under
# load ten times. Prints a table (docs/reliability.md records one) and exits
# non-zero when calls ran past their deadline. Not part of `make test`: it
# takes about three minutes and wants a quiet machine.
#
#   scripts/soak.sh                 # everything, against the Go server
#   scripts/soak.sh -server node    # the same attacks against the Node server
#   scripts/soak.sh -server python  # ... and the Python server
#   scripts/soak.sh -only slowloris # attacks whose name contains "slowloris"
#   scripts/soak.sh -conns 500 -idle 1000 -kills 3   # a smaller run
#   scripts/soak.sh -never-read 400 -dribble 20 -inflight-conns 25 -inflight-calls 4000   # the budget rows (defaults)
#
# -server node runs tools/soak/server_node.mjs on clients/node/dist (built
# here when missing); -server python runs tools/soak/server_python.py on
# clients/python/src. Both serve echo, sleep and stream with the soak's
# timeouts, like the Go server. The table ends with the rows that miss the
# targets ("findings").
#
# Everything happens on a unix socket in a private temp dir; every attack is
# bounded in connections and time, and the whole run by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mkdir -p bin
$GO build -o bin/udskit-soak ./tools/soak
case " $* " in
*" -server node "* | *" --server node "* | *"-server=node"*)
	if [ ! -f clients/node/dist/index.js ]; then
		(cd clients/node && npm ci --no-audit --no-fund && npm run build)
	fi
	;;
esac
# 5,000 idle connections on each side need fds: make sure the limit allows it.
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 12000 ]; then
	ulimit -n 12000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), ulimit -n $(ulimit -n), $($GO version | cut -d' ' -f3)"
exec timeout 900 bin/udskit-soak "$@"
