# Shared by bench/run.sh, bench/profile.sh, bench/million.sh and bench/soak.sh (sourced, not
# run): the release binaries, a 3-node fenced cluster on loopback with fsync on, and a trap
# that stops everything in PIDS and keeps the logs of $WORK in $OUT.
#
# Before sourcing: ROOT (the repository), OUT (results folder), FG and FR (gRPC and RESP base
# ports: node i listens on FG+i and FR+i; FM, optional: its /metrics on FM+i). Provides FENCED, BENCH, WORK, CLUSTER, GRPC, RESP,
# PID[i] and PIDS, and the functions below. FENCED_EXTRA_ARGS (optional) is appended to every
# `fenced serve`.

if [ -z "${FENCED_BIN:-}" ] || [ -z "${BENCH_BIN:-}" ]; then
    cargo build --release -q -p fenced-server -p fenced-bench
fi
FENCED=${FENCED_BIN:-$ROOT/target/release/fenced}
BENCH=${BENCH_BIN:-$ROOT/target/release/fenced-bench}

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/fenced-bench.XXXXXX")
declare -A PID
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    cp "$WORK"/*.log "$OUT"/ 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CLUSTER=1=127.0.0.1:$((FG + 1)),2=127.0.0.1:$((FG + 2)),3=127.0.0.1:$((FG + 3))
GRPC=127.0.0.1:$((FG + 1)),127.0.0.1:$((FG + 2)),127.0.0.1:$((FG + 3))
RESP=127.0.0.1:$((FR + 1)),127.0.0.1:$((FR + 2)),127.0.0.1:$((FR + 3))

node_start() { # node: start it (again) from its data dir; PID[node] is its pid
    local i=$1
    FENCED_LOG=${FENCED_LOG:-info,openraft=warn} "$FENCED" serve --id "$i" \
        --data-dir "$WORK/fenced-$i" --grpc-addr 127.0.0.1:$((FG + i)) \
        --resp-addr 127.0.0.1:$((FR + i)) --initial-cluster "$CLUSTER" \
        --initial-cluster-state new ${FM:+--metrics-addr 127.0.0.1:$((FM + i))} \
        ${FENCED_EXTRA_ARGS:-} >>"$WORK/fenced-$i.log" 2>&1 &
    PID[$i]=$!
    PIDS+=($!)
}

leader() { # the leader's id, once a node knows one
    "$FENCED" status --endpoints "$GRPC" 2>/dev/null | sed -n 's/.*"leader":\([0-9]*\).*/\1/p'
}

cluster_start() { # all three nodes, until they have a leader (30 s at most)
    local i
    for i in 1 2 3; do node_start "$i"; done
    for _ in $(seq 300); do
        [ -n "$(leader)" ] && return 0
        sleep 0.1
    done
    echo "no leader within 30 s; logs in $OUT" >&2
    return 1
}

server_pids() { echo "${PID[1]},${PID[2]},${PID[3]}"; } # for fenced-bench --pids
