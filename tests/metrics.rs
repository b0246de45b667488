//! `--metrics-addr`: Prometheus metrics scraped from a loaded cluster and parsed as the text
//! format, and `/health`, `/ready` and the gRPC health service flipping while a node has no
//! leader.
//!
//! Run: `cargo test -p fenced-server --test metrics`.

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::{wait_for, within, TestCluster, LEADER_TIMEOUT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const METRICS_PORT: u16 = 9190;
const CALL: Duration = Duration::from_secs(30);

/// `GET path` on node `ip`'s metrics listener: (status code, body).
async fn get(ip: &str, path: &str) -> Result<(u16, String), String> {
    let mut s = tokio::net::TcpStream::connect((ip, METRICS_PORT))
        .await
        .map_err(|e| format!("connect {ip}: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((code, body.to_owned()))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_from_a_loaded_cluster_and_health_that_follows_the_leader() {
    let addr = format!("{{ip}}:{METRICS_PORT}");
    let c = TestCluster::start("metrics", &["--metrics-addr", &addr]);
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
    assert!(m["fenced_proposals_committed_total"] >= 30.0, "{m:?}");
    assert!(m["fenced_store_revision"] >= 30.0, "{m:?}");
    assert!(m["fenced_raft_term"] >= 1.0, "{m:?}");
    assert!(m["fenced_raft_applied_index"] >= 30.0, "{m:?}");
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
