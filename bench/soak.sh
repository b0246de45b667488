#!/usr/bin/env bash
# Soak: a 3-node fenced cluster on loopback (release build, fsync on) under half its peak
# load for a long time, sampling every node's memory and data-dir size, to show that both
# stay flat once snapshots and log purges cycle. First measures the peak (64 uncontended gRPC
# clients, 10 s), then runs 64 clients paced to half of it for $MINUTES, sampling every
# $EVERY seconds. Stops everything it started (trap on EXIT).
#
#   bench/soak.sh                      # 30 minutes
#   MINUTES=5 EVERY=5 bench/soak.sh    # a short one
#
# Output: $OUT (default bench/results/soak-<timestamp>): samples.csv (elapsed s, node, RSS
# MiB, data dir MiB, log segments MiB, snapshot MiB, applied index), bench.txt, and, if
# python3 has matplotlib, soak.png.
# Ports: gRPC 27881-27883, RESP 27871-27873 (PORT_OFFSET shifts them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
MINUTES=${MINUTES:-30}
EVERY=${EVERY:-15}
OUT=${OUT:-$ROOT/bench/results/soak-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
O=${PORT_OFFSET:-0}
FG=$((27880 + O)) FR=$((27870 + O))
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
cluster_start

PEAK=$("$BENCH" --backend fenced --clients 64 --keys c --duration 10 --fenced "$GRPC" 2>/dev/null |
    grep -E '^\| 64' | awk -F'|' '{gsub(/ /, "", $5); print $5}')
RATE=$((PEAK / 2))
echo "peak $PEAK pairs/s; soaking at $RATE pairs/s for $MINUTES min" | tee "$OUT/bench.txt" >&2

mib() { du -sm "$1" 2>/dev/null | awk '{print $1}'; }
sample() { # elapsed
    local i
    for i in 1 2 3; do
        local rss applied
        rss=$(awk '/VmRSS/{printf "%d", $2/1024}' "/proc/${PID[$i]}/status")
        applied=$("$FENCED" status --endpoints 127.0.0.1:$((FG + i)) 2>/dev/null |
            sed -n 's/.*"last_applied":\([0-9]*\).*/\1/p')
        echo "$1,$i,$rss,$(mib "$WORK/fenced-$i"),$(mib "$WORK/fenced-$i/wal"),$(mib "$WORK/fenced-$i/snapshots"),${applied:-0}"
    done
}
echo "elapsed_s,node,rss_mib,data_dir_mib,log_mib,snapshot_mib,applied_index" >"$OUT/samples.csv"
SECS=$((MINUTES * 60))
"$BENCH" --backend fenced --clients 64 --keys c --duration "$SECS" --rate "$RATE" \
    --fenced "$GRPC" --pids "fenced=$(server_pids)" >>"$OUT/bench.txt" 2>&1 &
BPID=$!
PIDS+=($BPID)
t0=$(date +%s)
while kill -0 "$BPID" 2>/dev/null; do
    sample $(($(date +%s) - t0)) >>"$OUT/samples.csv"
    sleep "$EVERY"
done
wait "$BPID" || true
grep -E '^\| 64' "$OUT/bench.txt" >&2 || true

if python3 -c 'import matplotlib' 2>/dev/null; then
    python3 - "$OUT" <<'EOF'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/samples.csv")))
fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
for node in "123":
    r = [x for x in rows if x["node"] == node]
    t = [int(x["elapsed_s"]) / 60 for x in r]
    a.plot(t, [int(x["rss_mib"]) for x in r], label=f"node {node}")
    b.plot(t, [int(x["data_dir_mib"]) for x in r], label=f"node {node}")
a.set_ylabel("RSS (MiB)"); b.set_ylabel("data dir (MiB)"); b.set_xlabel("minutes")
a.set_ylim(bottom=0); b.set_ylim(bottom=0)
a.legend(); a.grid(alpha=.3); b.grid(alpha=.3)
fig.suptitle(open(f"{out}/bench.txt").readline().strip())
fig.tight_layout()
fig.savefig(f"{out}/soak.png", dpi=90)
EOF
fi
echo "results in $OUT" >&2
