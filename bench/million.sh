#!/usr/bin/env bash
# A million held locks: starts a 3-node fenced cluster on loopback (release build, fsync on),
# measures the 64-client lock throughput with no locks held, then takes N locks (default
# 1,000,000, 24 h leases) through the RESP port with `redis-cli --pipe`, and measures what
# that costs: memory of every node (RSS, and its peak over the whole run), data-dir sizes,
# the snapshots built meanwhile (size, time), the same throughput again with the locks held,
# and a full restart (SIGTERM all, start all, time until a lock is granted). Stops everything
# it started (trap on EXIT).
#
#   bench/million.sh                    # N=1000000
#   N=200000 DURATION=5 bench/million.sh
#
# Output: $OUT (default bench/results/million-<timestamp>)/million.md and the node logs.
# Ports: gRPC 27781-27783, RESP 27771-27773 (PORT_OFFSET shifts them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
N=${N:-1000000}
DURATION=${DURATION:-10}
OUT=${OUT:-$ROOT/bench/results/million-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
for p in redis-cli python3; do
    command -v $p >/dev/null || { echo "$p is missing (apt-get install -y redis-tools python3)" >&2; exit 1; }
done
O=${PORT_OFFSET:-0}
FG=$((27780 + O)) FR=$((27770 + O))
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
wait_grant() { # until a lock is granted; prints seconds waited
    local t0 t1
    t0=$(date +%s.%N)
    for _ in $(seq 600); do
        if "$FENCED" lock --endpoints "$GRPC" --ttl-ms 2000 "probe-$RANDOM" -- true 2>/dev/null; then
            t1=$(date +%s.%N)
            awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
            return 0
        fi
        sleep 0.1
    done
    echo "no grant within 60 s" >&2
    return 1
}
mem() { # "rss MiB / peak MiB" per node
    local i out=""
    for i in 1 2 3; do
        out+="node $i: $(awk '/VmRSS/{r=$2} /VmHWM/{h=$2} END {printf "%d / %d MiB", r/1024, h/1024}' \
            "/proc/${PID[$i]}/status"); "
    done
    echo "$out"
}
disk() { du -sm "$WORK"/fenced-{1,2,3} | awk '{printf "%s MiB ", $1}'; }
throughput() {
    "$BENCH" --backend fenced --clients 64 --keys c --duration "$DURATION" --fenced "$GRPC" \
        --pids "fenced=$(server_pids)" 2>/dev/null | grep -E '^\| 64' |
        awk -F'|' '{gsub(/ /, "", $5); gsub(/^ +| +$/, "", $8); print $5 " pairs/s, acquire p50/p99/p99.9 " $8 " ms"}'
}
snapshots() { grep -h "snapshot built" "$WORK"/fenced-*.log | sed 's/\x1b\[[0-9;]*m//g' | tail -3; }

cluster_start
L=$(leader)
echo "leader: node $L" >&2
{
    echo "# $N held locks, $(date -u +%FT%TZ), $(nproc) cores"
    echo
    echo "- empty: memory $(mem)"
    echo "- empty: throughput (64 clients, ${DURATION} s): $(throughput)"
} | tee "$OUT/million.md"

# Take N locks: LOCK.ACQUIRE held:<i> filler 86400000, as one RESP stream.
t0=$(date +%s.%N)
python3 - "$N" <<'EOF' | redis-cli -h 127.0.0.1 -p $((FR + L)) --pipe >"$WORK/fill.txt"
import sys
n = int(sys.argv[1])
out = sys.stdout.buffer
for i in range(n):
    name = b"held:%d" % i
    out.write(b"*4\r\n$12\r\nLOCK.ACQUIRE\r\n$%d\r\n%s\r\n$6\r\nfiller\r\n$8\r\n86400000\r\n" % (len(name), name))
EOF
t1=$(date +%s.%N)
{
    echo "- fill: $(tail -1 "$WORK/fill.txt") in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s"
    echo "- $N held: memory $(mem)"
    echo "- $N held: data dirs $(disk)"
    echo "- $N held: throughput (64 clients, ${DURATION} s): $(throughput)"
    echo "- $N held: memory after the load (snapshots built meanwhile) $(mem)"
    echo "- $N held: data dirs $(disk)"
    echo "- snapshots: $(snapshots | tr '\n' ';')"
} | tee -a "$OUT/million.md"

# Full restart.
for i in 1 2 3; do kill -TERM "${PID[$i]}"; done
for i in 1 2 3; do wait "${PID[$i]}" 2>/dev/null || true; done
for i in 1 2 3; do node_start "$i"; done
{
    echo "- restart (all 3 nodes, SIGTERM then start): first grant after $(wait_grant) s"
    echo "- after restart: memory $(mem)"
} | tee -a "$OUT/million.md"
echo "results in $OUT" >&2
