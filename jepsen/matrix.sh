#!/usr/bin/env bash
# The long runs behind docs/jepsen.md: every system × nemesis, 5 runs each (seeds 1..5),
# the counter workload (mutual exclusion, fencing, stale writes, lost updates, availability)
# and the register workload (linearizability). About 30 s per run; LANES runs in parallel
# (each in its own namespaces). Results: $OUT/<system>-<workload>-<nemesis>/summary.json.
#   OUT=/tmp/fj-matrix LANES=3 bash jepsen/matrix.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-jepsen/store/matrix}
LANES=${LANES:-2}
RUNS=${RUNS:-5}
TIME=${TIME:-30}
cargo build -q -p fenced-server -p fenced-guard -p fenced-jepsen
mkdir -p "$OUT/bin"
# Private copies: rebuilding the tree during the matrix must not change what runs.
cp target/debug/fenced target/debug/fenced-guard target/debug/fenced-jepsen "$OUT/bin/"
BIN=$OUT/bin/fenced-jepsen
trap '"$BIN" cleanup --prefix fjm >/dev/null 2>&1 || true' EXIT

jobs_list() {
    for n in none partition kill pause clock; do echo "fenced counter $n"; done
    for s in redis redlock; do
        for n in none partition kill pause clock restart-empty restart-delayed; do echo "$s counter $n"; done
    done
    for n in partition kill pause clock; do echo "fenced register $n"; done
    for n in pause restart-empty; do echo "redis register $n"; done
}

lane() { # lane number
    local i=0
    jobs_list | while read -r sys wl nem; do
        i=$((i + 1))
        [ $((i % LANES)) -eq "$1" ] || continue
        local dir="$OUT/$sys-$wl-$nem"
        [ -f "$dir/summary.json" ] && continue
        "$BIN" test --system "$sys" --workload "$wl" --nemesis "$nem" --time-limit "$TIME" \
            --seed 1 --runs "$RUNS" --prefix "fjm$1" --bin-dir "$OUT/bin" --out "$dir" \
            >"$dir.log" 2>&1 || true
        echo "done $sys $wl $nem: $(tr -d '\n ' <"$dir/summary.json" 2>/dev/null | head -c 300)"
    done
}

for l in $(seq 0 $((LANES - 1))); do lane "$l" & done
wait
