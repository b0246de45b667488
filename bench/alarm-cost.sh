#!/usr/bin/env bash
# Cost of the divergence alarm (docs/operations.md, "Divergence alarm"): server CPU per
# acquire+release pair of a 3-node fenced cluster (release build, fsync on) with the state
# digest on (`--digest-interval $INTERVAL`, default the server's default 1000) and off
# (`--digest-interval 0`), in interleaved rounds: every round starts a fresh cluster for each
# setting, in alternating order, so machine drift hits both alike. Stops everything it
# started (trap on EXIT). Run it on a quiet machine.
#
#   bench/alarm-cost.sh                              # 4 rounds × 10 s, 16 uncontended gRPC clients
#   ROUNDS=6 DURATION=15 CLIENTS=64 bench/alarm-cost.sh
#   INTERVAL=100 bench/alarm-cost.sh                 # a digest every 100 indexes: the cost's slope
#
# Output: $OUT (default bench/results/alarm-cost-<timestamp>): one JSON of fenced-bench per
# (round, setting), and summary.txt: server CPU µs per pair and pairs/s, per round and the
# mean of each setting, and the change.
# Ports: gRPC 27981-27983, RESP 27971-27973 (PORT_OFFSET shifts them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-16}
INTERVAL=${INTERVAL:-1000}
OUT=${OUT:-$ROOT/bench/results/alarm-cost-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
O=${PORT_OFFSET:-0}
FG=$((27980 + O)) FR=$((27970 + O))
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

cluster_stop() {
    local i
    for i in 1 2 3; do kill -TERM "${PID[$i]}" 2>/dev/null || true; done
    for i in 1 2 3; do wait "${PID[$i]}" 2>/dev/null || true; done
    rm -rf "$WORK"/fenced-*
}

run_one() { # round setting interval
    FENCED_EXTRA_ARGS="--digest-interval $3" cluster_start
    "$BENCH" --backend fenced --clients "$CLIENTS" --keys c --duration "$DURATION" \
        --fenced "$GRPC" --pids "fenced=$(server_pids)" --json "$OUT/r$1-$2.json" \
        >"$OUT/r$1-$2.txt" 2>&1
    cluster_stop
}

for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then order="on off"; else order="off on"; fi
    for s in $order; do
        if [ "$s" = on ]; then n=$INTERVAL; else n=0; fi
        echo "round $r: digest $s (--digest-interval $n)" >&2
        run_one "$r" "$s" "$n"
    done
done

python3 - "$OUT" "$ROUNDS" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
cpu = {"on": [], "off": []}
rate = {"on": [], "off": []}
for r in range(1, rounds + 1):
    for s in ("on", "off"):
        row = json.load(open(f"{out}/r{r}-{s}.json"))[0]
        cpu[s].append(row["server_cpu_us_per_pair"])
        rate[s].append(row["pairs_per_s"])
        print(f"round {r} digest {s:3}: {row['server_cpu_us_per_pair']:.1f} µs server CPU/pair, "
              f"{row['pairs_per_s']:.0f} pairs/s")
mean = {s: sum(v) / len(v) for s, v in cpu.items()}
print(f"mean: on {mean['on']:.1f} µs/pair, off {mean['off']:.1f} µs/pair, "
      f"change {100 * (mean['on'] / mean['off'] - 1):+.1f} %")
print(f"pairs/s: on {sum(rate['on']) / rounds:.0f}, off {sum(rate['off']) / rounds:.0f}")
EOF
