#!/usr/bin/env bash
# Profile a 3-node fenced cluster under load: starts the cluster on loopback (release build,
# fsync on), runs fenced-bench against it and, during the measured window, `perf record`s the
# whole machine; then prints where the CPU went by process, thread, shared object and symbol.
# Stops everything it started (trap on EXIT).
#
#   bench/profile.sh                          # 64 uncontended gRPC clients, 8 s
#   BACKEND=fenced-resp CLIENTS=1 bench/profile.sh
#   PERF=0 bench/profile.sh                   # only the load (syscall/context-switch counters)
#
# Output in $OUT (default bench/results/profile-<timestamp>): perf.data, report-*.txt,
# bench.txt, and per-node /proc counters (CPU, context switches) over the window.
# Ports: gRPC 27581-27583, RESP 27571-27573 (PORT_OFFSET shifts them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BACKEND=${BACKEND:-fenced}
CLIENTS=${CLIENTS:-64}
KEYS=${KEYS:-c}
DURATION=${DURATION:-8}
PERF=${PERF:-1}
OUT=${OUT:-$ROOT/bench/results/profile-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

if [ "$PERF" = 1 ] && ! command -v perf >/dev/null; then
    echo "perf is missing: apt-get install -y linux-perf" >&2
    exit 1
fi
O=${PORT_OFFSET:-0}
FG=$((27580 + O)) FR=$((27570 + O))
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
FENCED_LOG=warn cluster_start
LEADER=$(leader)
echo "leader: node $LEADER (pid ${PID[$LEADER]})" | tee "$OUT/nodes.txt"

counters() { # pid → "utime stime voluntary_ctxt nonvoluntary_ctxt" (summed over threads)
    local pid=$1 u=0 s=0 v=0 n=0 t f
    for t in /proc/"$pid"/task/*; do
        f=$(sed 's/.*) //' "$t/stat" 2>/dev/null) || continue
        u=$((u + $(echo "$f" | awk '{print $12}')))
        s=$((s + $(echo "$f" | awk '{print $13}')))
        v=$((v + $(awk '/^voluntary_ctxt/{print $2}' "$t/status")))
        n=$((n + $(awk '/^nonvoluntary_ctxt/{print $2}' "$t/status")))
    done
    echo "$u $s $v $n"
}

"$BENCH" --backend "$BACKEND" --clients "$CLIENTS" --keys "$KEYS" --duration "$((DURATION + 2))" \
    --fenced "$GRPC" --fenced-resp "$RESP" --pids "$BACKEND=$(server_pids)" >"$OUT/bench.txt" 2>&1 &
BPID=$!
PIDS+=($BPID)
sleep 1
declare -A BEFORE
for i in 1 2 3; do BEFORE[$i]=$(counters "${PID[$i]}"); done
if [ "$PERF" = 1 ]; then
    perf record -F 999 -a -g -o "$OUT/perf.data" -- sleep "$DURATION" 2>"$OUT/perf-record.log"
else
    sleep "$DURATION"
fi
{
    tck=$(getconf CLK_TCK)
    echo "per node over ${DURATION}s: CPU ms (user/system), context switches (voluntary/involuntary), threads"
    for i in 1 2 3; do
        pid=${PID[$i]}
        read -r u0 s0 v0 n0 <<<"${BEFORE[$i]}"
        read -r u1 s1 v1 n1 <<<"$(counters "$pid")"
        role=follower
        [ "$i" = "$LEADER" ] && role=leader
        echo "node $i ($role): $(((u1 - u0) * 1000 / tck)) / $(((s1 - s0) * 1000 / tck)) ms," \
            "$((v1 - v0)) / $((n1 - n0)) switches, $(ls /proc/"$pid"/task | wc -l) threads"
    done
} | tee "$OUT/counters.txt"
wait "$BPID" || true
tail -3 "$OUT/bench.txt"
if [ "$PERF" = 1 ]; then
    perf report -i "$OUT/perf.data" --no-children --sort comm,dso -g none --percent-limit 1 \
        --stdio 2>/dev/null | grep -v '^$' | head -40 >"$OUT/report-dso.txt"
    perf report -i "$OUT/perf.data" --no-children --sort sym -g none --percent-limit 0.4 \
        --stdio 2>/dev/null | grep -v '^$' | head -80 >"$OUT/report-sym.txt"
    perf report -i "$OUT/perf.data" --no-children --sort pid,comm -g none --percent-limit 0.5 \
        --stdio 2>/dev/null | grep -v '^$' | head -40 >"$OUT/report-thread.txt"
    cat "$OUT/report-dso.txt" "$OUT/report-thread.txt"
    head -60 "$OUT/report-sym.txt"
fi
echo "profile in $OUT" >&2
