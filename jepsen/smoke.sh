#!/usr/bin/env bash
# Fault-injection smoke run for CI (about 95 s plus the build): the pause nemesis (SIGSTOP/SIGCONT of nodes
# and clients) on the counter workload, against fenced (gRPC client), fenced through its RESP
# front end (LOCK.ACQUIRE/RELEASE, client pinned to one node, failing over) and Redlock; and
# one short kv run (etcd Range/Put/Txn through fenced's etcd API, checked for
# linearizability) and one short semaphore run (3 permits over RESP's LOCK.PERMIT, checked
# for holders per mode and tokens) under the same nemesis.
#  - the fenced runs must come out valid (exit 0): an anomaly there is a real bug.
#  - Redlock may show anomalies (exit 1: that is the point of the comparison); only a
#    harness error (exit 2) fails the smoke.
# Everything runs in network namespaces named fjci<pid>-* (root) or on 127.0.x.x (not root);
# the trap removes the namespaces and the processes in them even if the harness dies.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX="fjci$$"
OUT=$(mktemp -d "${TMPDIR:-/tmp}/fenced-jepsen-smoke.XXXXXX")
BIN="${CARGO_TARGET_DIR:-target}/debug/fenced-jepsen"
cleanup() {
    local rc=$?
    if [ -x "$BIN" ]; then "$BIN" cleanup --prefix "$PREFIX" >/dev/null 2>&1 || true; fi
    if [ "$rc" -ne 0 ]; then
        echo "jepsen smoke failed (rc $rc); histories, reports and logs kept in $OUT" >&2
    else
        rm -rf "$OUT"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cargo build -q -p fenced-server -p fenced-fence-check -p fenced-jepsen

# Network namespaces when this machine allows them (root with CAP_SYS_ADMIN), else loopback.
NET=loopback
if [ "$(id -u)" = 0 ] && ip netns add "$PREFIX-check" 2>/dev/null; then
    ip netns del "$PREFIX-check" 2>/dev/null || true
    NET=netns
fi

run() { # system seed
    "$BIN" test --system "$1" --workload counter --nemesis pause --time-limit 25 \
        --seed "$2" --clients 4 --net "$NET" --prefix "$PREFIX" --out "$OUT/$1"
}

run fenced 2
run fenced-resp 2
"$BIN" test --system fenced --workload kv --nemesis pause --time-limit 12 \
    --seed 2 --clients 4 --net "$NET" --prefix "$PREFIX" --out "$OUT/fenced-kv"
"$BIN" test --system fenced-resp --workload semaphore --nemesis pause --time-limit 12 \
    --seed 2 --net "$NET" --prefix "$PREFIX" --out "$OUT/fenced-resp-semaphore"
set +e
run redlock 2
rc=$?
set -e
if [ "$rc" -gt 1 ]; then
    echo "jepsen smoke: the Redlock run failed to run (rc $rc)" >&2
    exit "$rc"
fi
echo "jepsen smoke: fenced, fenced-resp, fenced kv and the RESP semaphore valid under pause; Redlock run completed (exit $rc: 1 = anomalies found)"
