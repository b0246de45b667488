#!/usr/bin/env bash
# docs/metrics.png: a 3-node cluster on loopback with --metrics-addr, a Prometheus scraping it,
# a minute of load from fenced-bench over gRPC and RESP, then a headless-Chromium screenshot
# of Prometheus's own graph page with a few key series. (Grafana is not installable on the
# machine this was made on; the Grafana dashboard is packaging/grafana/fenced-dashboard.json.)
#
#   scripts/metrics-screenshot.sh                 # needs target/release/{fenced,fenced-bench}
#   DURATION=60 CLIENTS=16 OUT=docs/metrics.png scripts/metrics-screenshot.sh
#
# Needs prometheus and chromium (Debian: apt-get install -y prometheus chromium), curl, and
# python3 with Pillow (python3-pil) to shrink the PNG. Everything listens on 127.0.77.0/24 (Linux routes
# all of 127/8 to lo); every process it starts is stopped on exit, failure included.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60}
CLIENTS=${CLIENTS:-16}
RESP_CLIENTS=${RESP_CLIENTS:-4}
OUT=${OUT:-docs/metrics.png}
BIN=${BIN:-target/release}
NET=${NET:-127.0.77}
PROM=$NET.10:9090

for p in "$BIN/fenced" "$BIN/fenced-bench"; do
    [ -x "$p" ] || { echo "missing $p: cargo build --release -p fenced-server -p fenced-bench" >&2; exit 1; }
done
for c in prometheus chromium curl python3; do
    command -v "$c" >/dev/null || { echo "missing $c (apt-get install -y prometheus chromium curl python3-pil)" >&2; exit 1; }
done
python3 -c 'import PIL' 2>/dev/null || { echo "missing Pillow (apt-get install -y python3-pil)" >&2; exit 1; }

TMP=$(mktemp -d /tmp/fenced-metrics-shot.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

NODES=()
CLUSTER=1=$NET.1:7380,2=$NET.2:7380,3=$NET.3:7380
for i in 1 2 3; do
    "$BIN/fenced" serve --id "$i" --data-dir "$TMP/n$i" \
        --grpc-addr "$NET.$i:7380" --resp-addr "$NET.$i:7379" --metrics-addr "$NET.$i:9100" \
        --initial-cluster "$CLUSTER" --initial-cluster-state new \
        >"$TMP/node-$i.log" 2>&1 &
    PIDS+=($!)
    NODES+=($!)
done

mkdir -p "$TMP/prom"
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 2s
  evaluation_interval: 2s
scrape_configs:
  - job_name: fenced
    static_configs:
      - targets: ['$NET.1:9100', '$NET.2:9100', '$NET.3:9100']
EOF
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/prom" \
    --web.listen-address="$PROM" >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)

# Wait for a ready cluster (/ready: a leader, caught up) and for Prometheus.
for _ in $(seq 1 100); do
    ready=0
    for i in 1 2 3; do
        curl -fs "http://$NET.$i:9100/ready" >/dev/null 2>&1 && ready=$((ready + 1))
    done
    [ "$ready" = 3 ] && curl -fs "http://$PROM/-/ready" >/dev/null 2>&1 && break
    sleep 0.2
done
[ "$ready" = 3 ] || { echo "cluster not ready:" >&2; tail -n 20 "$TMP"/node-*.log >&2; exit 1; }

echo "load: $CLIENTS gRPC clients and $RESP_CLIENTS RESP clients for ${DURATION}s" >&2
"$BIN/fenced-bench" --backend fenced --clients "$CLIENTS" --duration "$DURATION" \
    --fenced "$NET.1:7380,$NET.2:7380,$NET.3:7380" >"$TMP/bench-grpc.txt" 2>&1 &
GRPC_BENCH=$!
PIDS+=("$GRPC_BENCH")
"$BIN/fenced-bench" --backend fenced-resp --clients "$RESP_CLIENTS" --duration "$DURATION" \
    --fenced-resp "$NET.1:7379,$NET.2:7379,$NET.3:7379" >"$TMP/bench-resp.txt" 2>&1 &
RESP_BENCH=$!
PIDS+=("$RESP_BENCH")
wait "$GRPC_BENCH" || { echo "gRPC load failed:" >&2; cat "$TMP/bench-grpc.txt" >&2; exit 1; }
wait "$RESP_BENCH" || { echo "RESP load failed:" >&2; cat "$TMP/bench-resp.txt" >&2; exit 1; }
sed -n '/|/p' "$TMP/bench-grpc.txt" "$TMP/bench-resp.txt" >&2
sleep 6 # two more scrapes

# Numbers for the record: p99s over the load, from Prometheus.
query() {
    curl -fsG "http://$PROM/api/v1/query" --data-urlencode "query=$1" |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print("\n".join("  %s %s" % (x["metric"], x["value"][1]) for x in r))'
}
W=${DURATION}s
echo "WAL fsync p99 per node:" >&2
query "histogram_quantile(0.99, sum by (instance, le) (increase(fenced_wal_fsync_duration_seconds_bucket[$W])))" >&2
echo "WAL append p99 per node:" >&2
query "histogram_quantile(0.99, sum by (instance, le) (increase(fenced_wal_append_duration_seconds_bucket[$W])))" >&2
echo "commit p50 / p99 on the leader:" >&2
query "histogram_quantile(0.5, sum by (le) (increase(fenced_commit_duration_seconds_bucket[$W])))" >&2
query "histogram_quantile(0.99, sum by (le) (increase(fenced_commit_duration_seconds_bucket[$W])))" >&2
echo "peer round trip p50 / p99 (leader to each peer):" >&2
query "histogram_quantile(0.5, sum by (instance, peer, le) (increase(fenced_peer_round_trip_seconds_bucket[$W])))" >&2
query "histogram_quantile(0.99, sum by (instance, peer, le) (increase(fenced_peer_round_trip_seconds_bucket[$W])))" >&2
echo "gRPC Lock.Acquire p99, RESP LOCK.ACQUIRE p99:" >&2
query "histogram_quantile(0.99, sum by (le) (increase(fenced_grpc_request_duration_seconds_bucket{method=\"Lock.Acquire\"}[$W])))" >&2
query "histogram_quantile(0.99, sum by (le) (increase(fenced_resp_command_duration_seconds_bucket{command=\"LOCK.ACQUIRE\"}[$W])))" >&2
echo "snapshots built per node:" >&2
query "fenced_snapshot_total" >&2

# Prometheus's graph page, one panel per expression, over the last few minutes.
urlencode() { python3 -c 'import sys,urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$1"; }
EXPRS=(
    'sum by (method) (rate(fenced_grpc_requests_total[10s]))'
    'sum by (command) (rate(fenced_resp_commands_total[10s]))'
    'histogram_quantile(0.99, sum by (le) (rate(fenced_commit_duration_seconds_bucket[10s])))'
    'histogram_quantile(0.99, sum by (instance, le) (rate(fenced_wal_fsync_duration_seconds_bucket[10s])))'
    'histogram_quantile(0.99, sum by (instance, peer, le) (rate(fenced_peer_round_trip_seconds_bucket[10s])))'
)
# Stop the cluster first: its series end with the load, and the screenshots (chromium is
# heavy on a small machine) cannot disturb the latencies they show.
for pid in "${NODES[@]}"; do kill "$pid" 2>/dev/null || true; done
for pid in "${NODES[@]}"; do wait "$pid" 2>/dev/null || true; done
RANGE=$((DURATION + 45))s
mkdir -p "$(dirname "$OUT")"
# One page per expression (a page of several scrolls to the last one's input), stacked below.
for i in "${!EXPRS[@]}"; do
    URL="http://$PROM/graph?g0.expr=$(urlencode "${EXPRS[$i]}")&g0.tab=0&g0.stacked=0&g0.range_input=$RANGE"
    # chromium refuses to run as root without --no-sandbox.
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,900 \
        --virtual-time-budget=10000 --screenshot="$TMP/shot-$i.png" "$URL" >"$TMP/chromium.log" 2>&1 ||
        { cat "$TMP/chromium.log" >&2; exit 1; }
    [ -z "${KEEP_SHOTS:-}" ] || cp "$TMP/shot-$i.png" "$KEEP_SHOTS/"
done
# Stacked: the navigation bar once, then per page its expression and its graph with the
# legend (the buttons between them cut out), as a palette PNG at 85 % scale: a graph page has
# few colours, and the file stays small. The crop rows fit Prometheus 2.42's classic UI at a
# 1100 px wide window.
python3 - "$OUT" "$TMP"/shot-*.png <<'PY'
import sys
from PIL import Image
out, shots = sys.argv[1], sys.argv[2:]
ims = [Image.open(p).convert("RGB") for p in shots]
parts = [ims[0].crop((0, 0, ims[0].width, 56))]
for im in ims:
    parts.append(im.crop((0, 104, im.width, 160)))   # the expression
    parts.append(im.crop((0, 330, im.width, 830)))   # the graph and its legend
sheet = Image.new("RGB", (ims[0].width, sum(p.height for p in parts)), "white")
y = 0
for p in parts:
    sheet.paste(p, (0, y))
    y += p.height
sheet = sheet.resize((sheet.width * 85 // 100, sheet.height * 85 // 100), Image.LANCZOS)
sheet.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
PY
echo "wrote $OUT ($(stat -c %s "$OUT") bytes)" >&2
