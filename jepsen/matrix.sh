#!/usr/bin/env bash
# The long runs behind docs/jepsen.md: every system × nemesis, 5 runs each (seeds 1..5),
# the counter workload (mutual exclusion, fencing, stale writes, lost updates, availability),
# the lock workload for fenced's three clients (gRPC, RESP LOCK.*, RESP SET NX), the
# register workload (linearizability), the kv and watch workloads through fenced's etcd API
# (linearizability; every revision delivered once, in order, across reconnects), and the
# limiter workload (over-admission: fenced's CL.THROTTLE vs the token-bucket Lua script with
# the client's clock, on fenced and on Redis), and the rwlock and semaphore workloads (issue 26:
# holders per mode — no writer beside anyone, at most 3 permit holders — and tokens per lock;
# fenced over RESP and gRPC, and Redisson's Lua scripts on Redis for comparison), and the lock
# and counter workloads through etcd's Lock service (issue 27: fenced-etcdlock on fenced's gRPC
# port, etcd-lock on a 3-node etcd). Only the etcd Lock-service rows:
#   SYSTEMS="etcd-lock fenced-etcdlock" WORKLOADS="lock counter" \
#     NEMESES="partition kill pause clock" RUNS=2 TIME=20 OUT=/tmp/fj-el bash jepsen/matrix.sh
# (the clock rows of etcd-lock are refused by the harness: etcd runs partition, kill, pause).
# About 30 s per run; LANES runs in parallel (each in its own namespaces).
# Results: $OUT/<system>-<workload>-<nemesis>/summary.json.
#   OUT=/tmp/fj-matrix LANES=3 bash jepsen/matrix.sh
# Only some rows: the product SYSTEMS × WORKLOADS × NEMESES (each a space-separated list), e.g.
#   SYSTEMS="fenced-resp fenced-setnx" WORKLOADS="counter lock" \
#     NEMESES="partition kill pause clock" OUT=/tmp/fj-resp bash jepsen/matrix.sh
#   SYSTEMS=fenced-resp WORKLOADS="rwlock semaphore" NEMESES="partition kill pause" \
#     RUNS=1 TIME=20 OUT=/tmp/fj-rw bash jepsen/matrix.sh
# BIN_DIR: take fenced and fenced-fence-check from there instead of this tree's target/debug
# (e.g. a build of a clean checkout while the tree is being edited). SEED: the first seed
# (default 1). PREFIX: the namespaces' prefix, lane L uses PREFIX$L (default fjm): give
# matrices that run at the same time on one machine different prefixes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-jepsen/store/matrix}
LANES=${LANES:-2}
RUNS=${RUNS:-5}
TIME=${TIME:-30}
SEED=${SEED:-1}
PREFIX=${PREFIX:-fjm}
if [ -n "${BIN_DIR:-}" ]; then
    cargo build -q -p fenced-jepsen
else
    cargo build -q -p fenced-server -p fenced-fence-check -p fenced-jepsen
    BIN_DIR=target/debug
fi
mkdir -p "$OUT/bin"
# Private copies: rebuilding the tree during the matrix must not change what runs.
cp "$BIN_DIR/fenced" "$BIN_DIR/fenced-fence-check" target/debug/fenced-jepsen "$OUT/bin/"
BIN=$OUT/bin/fenced-jepsen
cleanup() {
    for l in $(seq 0 $((LANES - 1))); do "$BIN" cleanup --prefix "$PREFIX$l" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

jobs_list() {
    if [ -n "${SYSTEMS:-}${WORKLOADS:-}${NEMESES:-}" ]; then
        for s in ${SYSTEMS:-fenced}; do
            for w in ${WORKLOADS:-counter}; do
                for n in ${NEMESES:-none}; do echo "$s $w $n"; done
            done
        done
        return
    fi
    for n in none partition kill pause clock; do echo "fenced counter $n"; done
    for n in partition kill pause clock; do echo "fenced lock $n"; done
    for w in counter lock; do
        for n in restart-empty restart-delayed; do echo "fenced $w $n"; done
    done
    for s in fenced-resp fenced-setnx; do
        for w in counter lock; do
            for n in partition kill pause clock; do echo "$s $w $n"; done
        done
    done
    for s in redis redlock; do
        for n in none partition kill pause clock restart-empty restart-delayed; do echo "$s counter $n"; done
    done
    for n in partition kill pause clock; do echo "fenced register $n"; done
    # etcd's API on fenced: KV linearizability and Watch delivery (see docs/jepsen.md, "kv",
    # "watch").
    for w in kv watch; do
        for n in none partition kill pause clock membership; do echo "fenced $w $n"; done
        # The same clients against a 3-node etcd (Debian's etcd-server), for comparison.
        for n in partition kill pause; do echo "etcd $w $n"; done
    done
    # Membership changes (a voter replaced by a new node, again and again; fenced only).
    for w in lock register counter; do echo "fenced $w membership"; done
    for s in fenced-resp fenced-setnx; do echo "$s lock membership"; done
    echo "fenced lock membership,kill"
    for n in pause restart-empty; do echo "redis register $n"; done
    # Rate limiting (one key hammered by every client; see docs/jepsen.md, "limiter").
    for n in none partition kill pause clock; do echo "fenced limiter $n"; done
    for n in none kill clock; do echo "fenced-lua limiter $n"; done
    for n in none restart-empty kill clock; do echo "redis limiter $n"; done
    # Read-write locks (70 % reads) and 3-permit semaphores (5 clients; see docs/jepsen.md,
    # "rwlock and semaphore").
    for s in fenced-resp fenced; do
        for w in rwlock semaphore; do
            for n in partition kill pause clock; do echo "$s $w $n"; done
        done
    done
    for w in rwlock semaphore; do
        for n in none pause clock restart-empty; do echo "redis $w $n"; done
    done
    # etcd's server-side Lock service (issue 27; see docs/jepsen.md, "etcd's Lock service
    # beside fenced's"): through fenced's gRPC port, and on a 3-node etcd (its nemeses:
    # partition, kill, pause — Go reads its clock through the vDSO, which the shim cannot shift).
    for w in lock counter; do
        for n in partition kill pause clock; do echo "fenced-etcdlock $w $n"; done
        for n in partition kill pause; do echo "etcd-lock $w $n"; done
    done
}

lane() { # lane number
    local i=0
    jobs_list | while read -r sys wl nem; do
        i=$((i + 1))
        [ $((i % LANES)) -eq "$1" ] || continue
        local dir="$OUT/$sys-$wl-$nem"
        # --runs N writes summary.json; a single run (RUNS=1) its results.json.
        [ -f "$dir/summary.json" ] || [ -f "$dir/results.json" ] && continue
        "$BIN" test --system "$sys" --workload "$wl" --nemesis "$nem" --time-limit "$TIME" \
            --seed "$SEED" --runs "$RUNS" --prefix "$PREFIX$1" --bin-dir "$OUT/bin" --out "$dir" \
            >"$dir.log" 2>&1 || true
        local res=$dir/summary.json
        [ -f "$res" ] || res=$dir/results.json
        echo "done $sys $wl $nem: $(tr -d '\n ' <"$res" 2>/dev/null | head -c 300)"
    done
}

for l in $(seq 0 $((LANES - 1))); do lane "$l" & done
wait
