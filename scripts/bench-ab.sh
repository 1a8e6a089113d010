#!/usr/bin/env bash
# bench-ab.sh: A/B two or more builds of udskit on the rpc transport, against
# the raw floor, interleaved round by round (this machine's speed drifts, so
# the builds and the floor run one after another in every round).
#
#   scripts/bench-ab.sh SIZE REQUESTS ROUNDS BIN [BIN...]
#
# Each round runs, for each BIN, `BIN bench --transports rpc-unix` with a
# fixed request count, then the floor (raw-unix, with the first BIN), and
# prints req/s, p50 latency and CPU per request (client + server, the bench's
# own column). At the end: per build, the median req/s, p50 and CPU per
# request, and the medians of its per-round ratios to the floor: req/s
# (rpc/raw, above 1 is faster) and p50 (p50/raw, above 1 is slower).
#
# Environment: CONC (callers, default 16); CPUS (e.g. "0": pin everything to
# those CPUs with taskset, to take the second core's scheduling out).
#
# Example (a scratch build against the committed one):
#   go build -o /tmp/before ./cmd/udskit && ...edit... && go build -o /tmp/after ./cmd/udskit
#   scripts/bench-ab.sh 10KiB 100000 5 /tmp/before /tmp/after
#   CONC=1 scripts/bench-ab.sh 64B 30000 9 /tmp/before /tmp/after   # lone caller
set -euo pipefail

if [ $# -lt 4 ]; then
	sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
fi
size=$1 reqs=$2 rounds=$3
shift 3
for b in "$@"; do
	if [ ! -x "$b" ]; then
		echo "bench-ab: $b is not an executable udskit binary (build one with: go build -o $b ./cmd/udskit)" >&2
		exit 2
	fi
done
conc=${CONC:-16}
pin=()
if [ -n "${CPUS:-}" ]; then
	pin=(taskset -c "$CPUS")
fi

# one BIN TRANSPORT: prints "req/s cpu p50" for one run (p50 in µs)
one() {
	local line
	line=$("${pin[@]}" "$1" bench -q --transports "$2" --sizes "$size" --conc "$conc" \
		--requests "$reqs" --warmup 100ms 2>&1 | awk -v t="$2" '$1 == t { print; exit }')
	if [ -z "$line" ]; then
		echo "bench-ab: $1 bench --transports $2 printed no result row" >&2
		exit 1
	fi
	# columns: transport size conc req/s spread p50 p99 p99.9 allocs-cli allocs-srv cpu ...
	echo "$line" | awk '
	function us(v) {
		if (v ~ /µs$/) return substr(v, 1, length(v) - 3) + 0
		if (v ~ /ms$/) return substr(v, 1, length(v) - 2) * 1000
		if (v ~ /ns$/) return substr(v, 1, length(v) - 2) / 1000
		if (v ~ /s$/) return substr(v, 1, length(v) - 1) * 1000000
		return v + 0
	}
	{ gsub(",", "", $4); print $4, $11, us($6) }'
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for r in $(seq "$rounds"); do
	raw=$(one "$1" raw-unix)
	for b in "$@"; do
		# fields: round bin rps cpu p50 raw-rps raw-cpu raw-p50
		echo "$r $b $(one "$b" rpc-unix) $raw" | tee -a "$results" |
			awk '{ printf "round %s  %-24s req/s %8d  cpu %6.1f µs  p50 %8.1f µs  | raw req/s %8d  cpu %6.1f µs  p50 %8.1f µs  | rpc/raw %.2f  p50/raw %.2f\n", $1, $2, $3, $4, $5, $6, $7, $8, $3/$6, $5/$8 }'
	done
done

echo
echo "size $size, $conc callers, $rounds rounds of $reqs requests (medians):"
awk '
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
	rps[$2] = rps[$2] " " $3; cpu[$2] = cpu[$2] " " $4; p50[$2] = p50[$2] " " $5
	ratio[$2] = ratio[$2] sprintf(" %.2f", $3 / $6); pr[$2] = pr[$2] sprintf(" %.2f", $5 / $8)
	rawr = rawr " " $6; rawc = rawc " " $7; rawp = rawp " " $8; order[$2] = NR
}
END {
	for (b in order) printf "  %-24s req/s %8d  cpu %6.1f µs/req  p50 %8.1f µs  rpc/raw %.2f (per round:%s)  p50/raw %.2f (per round:%s)\n", b, median(rps[b]), median(cpu[b]), median(p50[b]), median(ratio[b]), ratio[b], median(pr[b]), pr[b]
	printf "  %-24s req/s %8d  cpu %6.1f µs/req  p50 %8.1f µs\n", "raw-unix (floor)", median(rawr), median(rawc), median(rawp)
}' "$results"
