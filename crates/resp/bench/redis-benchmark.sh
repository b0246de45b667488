#!/usr/bin/env bash
# redis-benchmark against a 3-node fenced cluster (release build) and a real redis-server, in
# the same run, on loopback only: -t set,get,incr with and without -P 16. Prints requests/s
# and the fenced/redis ratio per test. Everything started here is killed on exit.
# TLS=1: both servers speak TLS only (a throwaway CA made with openssl), clients use --tls.
#
#   cargo build --release --bin fenced && crates/resp/bench/redis-benchmark.sh [N] [CLIENTS]
#   TLS=1 crates/resp/bench/redis-benchmark.sh [N] [CLIENTS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
N=${1:-20000}
C=${2:-50}
F=${FENCED_BIN:-target/release/fenced}
NET=127.0.90
DIR=$(mktemp -d -t fenced-bench-XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

FTLS=() STATUS_TLS=() CLI_TLS=() REDIS_LISTEN=(--port 6390)
if [ "${TLS:-0}" = 1 ]; then
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -days 2 -subj /CN=bench-ca -keyout "$DIR/ca.key" -out "$DIR/ca.pem" 2>/dev/null
    openssl req "${ec[@]}" -subj /CN=bench -keyout "$DIR/node.key" -out "$DIR/node.csr" 2>/dev/null
    printf 'subjectAltName=IP:%s.1,IP:%s.2,IP:%s.3,IP:%s.10\n' $NET $NET $NET $NET >"$DIR/san.ext"
    openssl x509 -req -in "$DIR/node.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial \
        -days 2 -extfile "$DIR/san.ext" -out "$DIR/node.pem" 2>/dev/null
    FTLS=(--tls-cert "$DIR/node.pem" --tls-key "$DIR/node.key" --tls-ca "$DIR/ca.pem")
    STATUS_TLS=(--tls-ca "$DIR/ca.pem")
    CLI_TLS=(--tls --cacert "$DIR/ca.pem")
    REDIS_LISTEN=(--port 0 --tls-port 6390 --tls-cert-file "$DIR/node.pem" --tls-key-file "$DIR/node.key"
        --tls-ca-cert-file "$DIR/ca.pem" --tls-auth-clients no)
fi

CL=1=$NET.1:7380,2=$NET.2:7380,3=$NET.3:7380
for i in 1 2 3; do
    "$F" serve --id $i --data-dir "$DIR/n$i" --grpc-addr $NET.$i:7380 --resp-addr $NET.$i:7379 \
        --initial-cluster $CL --initial-cluster-state new "${FTLS[@]}" >"$DIR/n$i.log" 2>&1 &
    PIDS+=($!)
done
redis-server --bind $NET.10 "${REDIS_LISTEN[@]}" --save "" --appendonly no --daemonize no >"$DIR/redis.log" 2>&1 &
PIDS+=($!)

leader=""
for _ in $(seq 1 100); do
    leader=$("$F" status --endpoints $NET.1:7380 "${STATUS_TLS[@]}" 2>/dev/null | sed -n 's/.*"leader": *\([0-9]*\).*/\1/p' || true)
    [ -n "$leader" ] && [ "$leader" != 0 ] && redis-cli "${CLI_TLS[@]}" -h $NET.$leader -p 7379 ping >/dev/null 2>&1 && break
    sleep 0.2
done
[ -n "$leader" ] || { echo "no leader"; exit 1; }
for _ in $(seq 1 50); do redis-cli "${CLI_TLS[@]}" -h $NET.10 -p 6390 ping >/dev/null 2>&1 && break; sleep 0.1; done

rps() { # host port pipeline -> "set get incr" requests/s
    redis-benchmark "${CLI_TLS[@]}" -h "$1" -p "$2" -n "$N" -c "$C" -P "$3" -t set,get,incr -q 2>/dev/null |
        tr '\r' '\n' | grep -E '^(SET|GET|INCR):' | sed -E 's/^([A-Z]+): ([0-9.]+) requests.*/\1 \2/'
}
echo "redis-benchmark -n $N -c $C${CLI_TLS:+ (TLS)}; fenced: 3 nodes, leader node $leader; redis-server: no persistence"
printf '%-6s %-4s %14s %14s %8s\n' test P fenced_rps redis_rps ratio
for P in 1 16; do
    fen=$(rps $NET.$leader 7379 $P)
    red=$(rps $NET.10 6390 $P)
    for t in SET GET INCR; do
        a=$(echo "$fen" | awk -v t=$t '$1==t {print $2}')
        b=$(echo "$red" | awk -v t=$t '$1==t {print $2}')
        r=$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }')
        printf '%-6s %-4s %14s %14s %8s\n' $t $P "${a:-n/a}" "${b:-n/a}" "$r"
    done
done
