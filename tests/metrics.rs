//! `--metrics-addr`: Prometheus metrics scraped from a loaded cluster and parsed as the text
//! format (the lock service's series, requests by gRPC method and RESP command, WAL fsync and
//! append, snapshots, peer round trips), every `fenced_*` name the Grafana dashboard
//! (`packaging/grafana/fenced-dashboard.json`) uses present in the scrape, and `/health`,
//! `/ready` and the gRPC health service flipping while a node has no leader.
//!
//! Run: `cargo test -p fenced-server --test metrics`.

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use support::{resp_connect, wait_for, within, TestCluster, LEADER_TIMEOUT};

const METRICS_PORT: u16 = 9190;
const CALL: Duration = Duration::from_secs(30);

/// `GET path` on node `ip`'s metrics listener: (status code, body).
async fn get(ip: &str, path: &str) -> Result<(u16, String), String> {
    support::http_get(ip, METRICS_PORT, path).await
}

/// Scrape and parse node `ip`'s metrics: sample name → value (labels dropped, buckets
/// skipped).
async fn scrape(ip: &str) -> HashMap<String, f64> {
    let (code, body) = get(ip, "/metrics").await.expect("scrape");
    assert_eq!(code, 200, "{body}");
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("Prometheus text format");
    parsed
        .samples
        .into_iter()
        .filter_map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some((s.metric, v)),
            prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => None,
        })
        .collect()
}

/// Scrape and parse node `ip`'s metrics, labels kept.
async fn scrape_samples(ip: &str) -> Vec<prometheus_parse::Sample> {
    let (code, body) = get(ip, "/metrics").await.expect("scrape");
    assert_eq!(code, 200, "{body}");
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    prometheus_parse::Scrape::parse(lines)
        .expect("Prometheus text format")
        .samples
}

/// The sum of the samples named `name` whose labels include `labels` (a histogram's
/// `_count` and `_sum` are plain samples).
fn sum(samples: &[prometheus_parse::Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// Every series name a scrape holds (a histogram `h` as `h_bucket`, `h_sum`, `h_count`).
fn names(samples: &[prometheus_parse::Sample]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for s in samples {
        out.insert(s.metric.clone());
        if matches!(s.value, prometheus_parse::Value::Histogram(_)) {
            out.insert(format!("{}_bucket", s.metric));
        }
    }
    out
}

/// Every `fenced_*` series name in the dashboard's queries.
fn dashboard_series() -> BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/grafana/fenced-dashboard.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"));
    let mut exprs = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "query", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&json, &mut exprs);
    assert!(exprs.len() >= 15, "dashboard queries: {exprs:?}");
    let mut series = BTreeSet::new();
    for e in &exprs {
        let mut rest = e.as_str();
        while let Some(at) = rest.find("fenced_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            // `fenced_` inside a longer identifier is not a series name.
            let standalone = rest[..at]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
            if standalone {
                series.insert(tail[..end].to_owned());
            }
            rest = &tail[end..];
        }
    }
    series
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_from_a_loaded_cluster_and_health_that_follows_the_leader() {
    let addr = format!("{{ip}}:{METRICS_PORT}");
    // Small snapshot threshold: the load below makes every node build one.
    let c = TestCluster::start(
        "metrics",
        &["--metrics-addr", &addr, "--snapshot-logs", "16"],
    );
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client();
    let ttl = Duration::from_secs(60);
    for i in 0..20 {
        let g = within(
            "acquire",
            CALL,
            client.acquire(&format!("m{i}"), "o", ttl, Duration::ZERO, 0),
        )
        .await
        .expect("acquire")
        .expect("granted");
        if i % 2 == 0 {
            within(
                "release",
                CALL,
                client.release(&format!("m{i}"), "o", g.token),
            )
            .await
            .expect("release");
        }
    }
    // Two fenced writes, the second with an older token: one stale write rejected.
    for (token, accepted) in [(9, true), (5, false)] {
        let r = within("fenced put", CALL, client.fenced_put("file", b"v", token))
            .await
            .expect("fenced put");
        assert_eq!(r.is_ok(), accepted, "token {token}: {r:?}");
    }
    let ip = c.ip(leader);
    let m = wait_for("metrics after the load", CALL, || async {
        let m = scrape(&ip).await;
        match m.get("fenced_locks_held") {
            Some(v) if *v == 10.0 => Ok(m),
            other => Err(format!("locks held {other:?}")),
        }
    })
    .await;
    assert_eq!(m.get("fenced_is_leader"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("fenced_alarm_corrupt"), Some(&0.0), "{m:?}");
    assert!(m.contains_key("fenced_apply_semantics"), "{m:?}");
    assert!(m["fenced_proposals_committed_total"] >= 30.0, "{m:?}");
    assert!(m["fenced_store_revision"] >= 30.0, "{m:?}");
    assert!(m["fenced_raft_term"] >= 1.0, "{m:?}");
    assert!(m["fenced_raft_applied_index"] >= 30.0, "{m:?}");
    assert!(m["fenced_raft_committed_index"] >= 30.0, "{m:?}");
    assert!(m.contains_key("fenced_leader_changes_total"), "{m:?}");
    // The lock service's own series (one leader throughout: it answered every call).
    assert_eq!(m.get("fenced_lock_grants_total"), Some(&20.0), "{m:?}");
    assert_eq!(m.get("fenced_lock_releases_total"), Some(&10.0), "{m:?}");
    assert_eq!(
        m.get("fenced_stale_writes_rejected_total"),
        Some(&1.0),
        "{m:?}"
    );
    let follower = support::follower_of(leader);
    let fm = scrape(&c.ip(follower)).await;
    assert_eq!(fm.get("fenced_is_leader"), Some(&0.0));

    // The latency breakdown: 32 proposals on the leader, one in 8 traced through every stage
    // (a follower's acknowledgement included); the followers' appends on their side.
    let stages = |ip: String, path: &'static str| async move {
        let (code, body) = get(&ip, path).await.expect("debug/stages");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).expect("stages JSON")
    };
    let s = stages(c.ip(leader), "/debug/stages").await;
    assert!(s["samples"].as_u64() >= Some(2), "{s}");
    let count = |s: &serde_json::Value, key: &str, stage: &str| {
        s[key]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["stage"] == stage))
            .and_then(|x| x["count"].as_u64())
    };
    for stage in ["batched", "written", "synced", "ack1", "applied", "total"] {
        assert!(count(&s, "stages", stage) >= Some(1), "{stage}: {s}");
    }
    let f = stages(c.ip(follower), "/debug/stages?reset=1").await;
    assert!(f["follower_samples"].as_u64() >= Some(1), "{f}");
    assert!(count(&f, "follower_stages", "synced") >= Some(1), "{f}");
    let f = stages(c.ip(follower), "/debug/stages").await;
    assert_eq!(f["follower_samples"].as_u64(), Some(0), "reset: {f}");

    // RESP on the follower: two SETs, a GET with the wrong arity, an unknown command.
    let mut con = resp_connect(&c, follower).await;
    for args in [
        &["SET", "rk", "1"][..],
        &["SET", "rk", "2"],
        &["GET"],
        &["NOSUCHCOMMAND", "x"],
    ] {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let r = within("RESP", CALL, cmd.query_async::<redis::Value>(&mut con)).await;
        assert_eq!(r.is_ok(), args[0] == "SET", "{args:?}: {r:?}");
    }
    let fs = scrape_samples(&c.ip(follower)).await;
    let resp = |command, result| {
        sum(
            &fs,
            "fenced_resp_commands_total",
            &[("command", command), ("result", result)],
        )
    };
    assert_eq!(resp("SET", "ok"), 2.0, "{fs:?}");
    assert_eq!(resp("GET", "err"), 1.0, "{fs:?}");
    assert_eq!(resp("unknown", "err"), 1.0, "{fs:?}");
    assert_eq!(
        sum(
            &fs,
            "fenced_resp_command_duration_seconds_count",
            &[("command", "SET")]
        ),
        2.0,
        "{fs:?}"
    );

    // Over the whole cluster (the client may have reached the leader through a follower):
    // every gRPC call counted by method and code, with its latency.
    let mut all = Vec::new();
    for id in c.ids() {
        all.push(scrape_samples(&c.ip(id)).await);
    }
    let total = |name: &str, labels: &[(&str, &str)]| -> f64 {
        all.iter().map(|s| sum(s, name, labels)).sum()
    };
    let acquires = [("method", "Lock.Acquire"), ("code", "OK")];
    assert!(
        total("fenced_grpc_requests_total", &acquires) >= 20.0,
        "{all:?}"
    );
    assert!(
        total("fenced_grpc_requests_total", &[("method", "Lock.Release")]) >= 10.0,
        "{all:?}"
    );
    assert!(
        total(
            "fenced_grpc_request_duration_seconds_count",
            &[("method", "Lock.Acquire")]
        ) >= 20.0,
        "{all:?}"
    );
    assert!(
        total("fenced_grpc_requests_total", &[("method", "Kv.FencedPut")]) >= 2.0,
        "{all:?}"
    );
    // The node-to-node services are not counted.
    for s in &all {
        for sample in s.iter().filter(|x| x.metric.starts_with("fenced_grpc_")) {
            // Node-wide counters (the request budget's refusals) have no method.
            let Some(method) = sample.labels.get("method") else {
                continue;
            };
            assert!(
                method.contains('.') && !method.contains("Raft") && !method.contains("Forward"),
                "{sample:?}"
            );
        }
    }
    // Storage on every node: fsyncs and appends observed, a snapshot built (every node
    // applies ~35 entries, over --snapshot-logs 16).
    for id in c.ids() {
        let s = wait_for(&format!("node {id}'s snapshot"), CALL, || async {
            let s = scrape_samples(&c.ip(id)).await;
            match sum(&s, "fenced_snapshot_total", &[]) {
                n if n >= 1.0 => Ok(s),
                n => Err(format!("{n} snapshots")),
            }
        })
        .await;
        assert!(sum(&s, "fenced_wal_fsync_duration_seconds_count", &[]) >= 1.0);
        assert!(sum(&s, "fenced_wal_fsync_duration_seconds_sum", &[]) > 0.0);
        assert!(sum(&s, "fenced_wal_append_duration_seconds_count", &[]) >= 1.0);
        assert!(sum(&s, "fenced_snapshot_bytes", &[]) > 0.0, "{s:?}");
        assert!(sum(&s, "fenced_snapshot_duration_seconds_count", &[]) >= 1.0);
    }
    // The leader times its heartbeats to both peers.
    let ls = wait_for("peer round trips on the leader", CALL, || async {
        let s = scrape_samples(&ip).await;
        let peers: Vec<f64> = c
            .ids()
            .filter(|id| *id != leader)
            .map(|id| {
                sum(
                    &s,
                    "fenced_peer_round_trip_seconds_count",
                    &[("peer", &id.to_string())],
                )
            })
            .collect();
        if peers.iter().all(|n| *n >= 1.0) {
            Ok(s)
        } else {
            Err(format!("round trips per peer {peers:?}"))
        }
    })
    .await;
    for id in c.ids().filter(|id| *id != leader) {
        let peer = id.to_string();
        let n = sum(
            &ls,
            "fenced_peer_round_trip_seconds_count",
            &[("peer", &peer)],
        );
        let secs = sum(
            &ls,
            "fenced_peer_round_trip_seconds_sum",
            &[("peer", &peer)],
        );
        let mean = secs / n;
        // Loopback: well under the heartbeat timeout.
        assert!(
            mean > 0.0 && mean < 0.5,
            "peer {id}: mean round trip {mean} s"
        );
    }

    // The dashboard asks only for series that exist.
    let mut present = BTreeSet::new();
    for id in c.ids() {
        present.extend(names(&scrape_samples(&c.ip(id)).await));
    }
    let wanted = dashboard_series();
    let missing: Vec<_> = wanted.difference(&present).collect();
    assert!(
        missing.is_empty(),
        "the dashboard uses series no node exports: {missing:?} (present: {present:?})"
    );

    // Healthy and ready everywhere.
    for id in c.ids() {
        assert_eq!(get(&c.ip(id), "/health").await.map(|r| r.0), Ok(200));
        wait_for(&format!("node {id} ready"), CALL, || async {
            match get(&c.ip(id), "/ready").await? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        })
        .await;
    }
    let mut grpc_health =
        tonic_health::pb::health_client::HealthClient::new(c.raw_channel(follower));
    let serving = |r: tonic_health::pb::HealthCheckResponse| r.status;
    let check = tonic_health::pb::HealthCheckRequest {
        service: "fenced.v1.Lock".into(),
    };
    let r = grpc_health.check(check.clone()).await.expect("gRPC health");
    assert_eq!(serving(r.into_inner()), 1, "SERVING with a leader");

    // Alone, the follower has no leader: still healthy, not ready, gRPC NOT_SERVING.
    for id in c.ids().filter(|id| *id != follower) {
        c.kill(id);
    }
    wait_for("the follower not ready", CALL, || async {
        match get(&c.ip(follower), "/ready").await? {
            (503, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    assert_eq!(get(&c.ip(follower), "/health").await.map(|r| r.0), Ok(200));
    wait_for("gRPC health NOT_SERVING", CALL, || {
        let mut h = grpc_health.clone();
        let check = check.clone();
        async move {
            let r = h.check(check).await.map_err(|e| e.to_string())?;
            match r.into_inner().status {
                2 => Ok(()),
                s => Err(format!("status {s}")),
            }
        }
    })
    .await;

    // The others back: ready again.
    for id in c.ids().filter(|id| *id != follower) {
        c.restart(id);
    }
    wait_for("the follower ready again", CALL, || async {
        match get(&c.ip(follower), "/ready").await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
}
