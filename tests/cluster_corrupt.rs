//! No majority, no service (issue 39, item 3; `crates/server/src/node/alarm.rs`): on a
//! 3-node cluster one follower is made to diverge (the test-only hook
//! `--unsafe-test-diverge-at-index`, accepted only with `FENCED_UNSAFE_TEST_HOOKS=1`) and is
//! fenced out by its divergence alarm; then the other follower diverges too, so the two
//! members left disagree with no majority — the leader raises the cluster-wide `CORRUPT`
//! alarm, replicated: every member refuses reads and writes over RESP (`-CORRUPT`), gRPC
//! (`UNAVAILABLE`, `x-fenced-alarm: corrupt`) and etcd (etcd's `DataLoss` "etcdserver: corrupt
//! cluster"), and etcd's `AlarmList` shows it. Once
//! the member taken for wrong is stopped, an operator's disarm (`fenced alarm disarm`,
//! `fenced.v1.Cluster/Alarm`) is accepted and the leader serves again. `fenced alarm list`,
//! `fenced status`, `/ready` (503) and `fenced_cluster_alarm_corrupt` show the alarm. A
//! session kept alive until the alarm outlives its TTL across it (apply rules 15: the alarm
//! stops the replicated clock).
//!
//! Run: `cargo test -p fenced-server --test cluster_corrupt`.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::kv_client::KvClient;
use fenced_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use fenced_proto::v1 as pb;
use support::{follower_of, resp_try, wait_for, within, TestCluster, LEADER_TIMEOUT};

/// Each member's metrics listener (`/ready`, `/metrics`), on its own loopback address.
const METRICS_PORT: u16 = 9191;

/// `fenced alarm <op>` against member `id`: its JSON output.
fn alarm_cli(c: &TestCluster, id: u64, op: &str) -> serde_json::Value {
    let out = std::process::Command::new(support::bin())
        .args(["alarm", op, "--endpoints", &c.grpc_addr(id)])
        .output()
        .expect("running fenced alarm");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fenced alarm {op}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Member `id`'s `/ready` status code and its `fenced_cluster_alarm_corrupt` gauge.
async fn ready_and_gauge(c: &TestCluster, id: u64) -> (u16, String) {
    let ip = c.ip(id);
    let (code, _) = within(
        "/ready",
        STEP,
        support::http_get(&ip, METRICS_PORT, "/ready"),
    )
    .await
    .expect("/ready");
    let (_, scraped) = within(
        "/metrics",
        STEP,
        support::http_get(&ip, METRICS_PORT, "/metrics"),
    )
    .await
    .expect("/metrics");
    let gauge = scraped
        .lines()
        .find(|l| l.starts_with("fenced_cluster_alarm_corrupt "))
        .unwrap_or("fenced_cluster_alarm_corrupt missing")
        .to_owned();
    (code, gauge)
}

/// The session the alarm holds (apply rules 15): the disarm comes after this much more.
const SESSION_TTL_MS: u64 = 8_000;

/// Digests every 8 indexes, a check every 500 ms: generous for a loaded machine.
const ALARM_WITHIN: Duration = Duration::from_secs(60);
const STEP: Duration = Duration::from_secs(30);

/// Up to `n` writes through `via`, one after another; stops at the first refusal (the
/// cluster alarm refuses them). How many were taken.
async fn writes(c: &TestCluster, via: u64, prefix: &str, n: usize) -> usize {
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        match resp_try(c, via, &["SET", &key, "v"]).await {
            Ok(Some(ok)) if ok == "OK" => {}
            _ => return i,
        }
    }
    n
}

async fn wait_member_alarm(c: &TestCluster, id: u64) {
    wait_for(
        &format!("node {id}'s divergence alarm"),
        ALARM_WITHIN,
        || async {
            let s = c.status(id).await?;
            if s.alarm.is_empty() {
                Err(format!("no alarm yet; applied {}", s.last_applied))
            } else {
                Ok(())
            }
        },
    )
    .await
}

/// Member `id` refuses, as the cluster alarm does, over RESP and gRPC.
async fn assert_refuses(c: &TestCluster, id: u64) {
    for args in [&["GET", "k-0"][..], &["SET", "k-x", "v"][..]] {
        match resp_try(c, id, args).await {
            Err(e) => assert!(e.contains("CORRUPT"), "{args:?} on node {id}: {e}"),
            Ok(v) => panic!("{args:?} on node {id} answered {v:?} under the cluster alarm"),
        }
    }
    let mut lock = c.raw_lock_client(id, Duration::from_secs(5));
    let refused = lock
        .info(pb::InfoRequest { name: "l".into() })
        .await
        .expect_err("Lock.Info under the cluster alarm");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(
        refused
            .metadata()
            .get("x-fenced-alarm")
            .and_then(|v| v.to_str().ok()),
        Some("corrupt"),
        "{refused:?}"
    );
    let mut kv = KvClient::new(c.raw_channel(id));
    let range = within(
        "etcd Range",
        STEP,
        kv.range(epb::RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        }),
    )
    .await
    .expect_err("etcd Range under the cluster alarm");
    // etcd's own answer for a corrupt cluster (rpctypes.ErrGRPCCorrupt): clients stop, as
    // no other member serves either.
    assert_eq!(range.code(), tonic::Code::DataLoss, "{range:?}");
    assert_eq!(range.message(), "etcdserver: corrupt cluster", "{range:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_that_disagree_without_a_majority_stop_the_cluster_until_disarmed() {
    std::env::set_var("FENCED_UNSAFE_TEST_HOOKS", "1");
    let metrics = format!("{{ip}}:{METRICS_PORT}");
    let c = TestCluster::start(
        "cluster-corrupt",
        &["--digest-interval", "8", "--metrics-addr", &metrics],
    );
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_eq!(writes(&c, leader, "warm", 3).await, 3);
    let first = follower_of(leader);
    let second = c
        .ids()
        .find(|id| *id != first && *id != leader)
        .expect("a third");
    let at = c.status_ok(leader).await.last_applied;
    let (at1, at2) = (at + 12, at + 44);
    for (id, index) in [(first, at1), (second, at2)] {
        c.kill(id);
        c.restart_with(id, &["--unsafe-test-diverge-at-index", &index.to_string()]);
        c.wait_all_caught_up(leader, STEP).await;
    }
    assert_eq!(c.wait_for_leader(LEADER_TIMEOUT).await, leader);

    // The first diverges and is fenced out; the cluster goes on.
    assert_eq!(writes(&c, leader, "k", 24).await, 24);
    wait_member_alarm(&c, first).await;
    // A session kept alive until the alarm refuses its keep-alives.
    let session = resp_try(&c, leader, &["SESSION.OPEN", &SESSION_TTL_MS.to_string()])
        .await
        .expect("SESSION.OPEN")
        .expect("a session id");
    let kept = std::sync::Mutex::new(Instant::now());
    let keep_alive = || async {
        if let Ok(Some(_)) = resp_try(&c, leader, &["SESSION.KEEPALIVE", &session]).await {
            *kept.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    };
    // The second diverges: the leader and it disagree, with no majority.
    for _ in 0..6 {
        writes(&c, leader, "more", 10).await;
        keep_alive().await;
    }
    wait_for("the cluster-wide CORRUPT alarm", ALARM_WITHIN, || async {
        match resp_try(&c, leader, &["GET", "k-0"]).await {
            Err(e) if e.contains("CORRUPT") && e.contains("cluster") => Ok(()),
            other => {
                // Writes bring the digest indexes on.
                let _ = resp_try(&c, leader, &["SET", "tick", "v"]).await;
                keep_alive().await;
                Err(format!("{other:?}"))
            }
        }
    })
    .await;
    for id in c.ids() {
        assert_refuses(&c, id).await;
        // The operator's view: `fenced alarm list`, `fenced status`, `/ready`, the gauge.
        let listed = alarm_cli(&c, id, "list");
        assert_eq!(listed["cluster"]["alarm"], "CORRUPT", "node {id}: {listed}");
        assert_eq!(
            listed["cluster"]["raised_by"], leader,
            "node {id}: {listed}"
        );
        let status = c.status_ok(id).await;
        let alarm = status
            .cluster_alarm
            .expect("fenced status shows the cluster alarm");
        assert_eq!(alarm.raised_by, leader);
        assert_eq!(
            ready_and_gauge(&c, id).await,
            (503, "fenced_cluster_alarm_corrupt 1".into()),
            "node {id}"
        );
    }
    let on_leader = alarm_cli(&c, leader, "list");
    let fenced_out = on_leader["alarmed_members"]
        .as_array()
        .expect("alarmed_members");
    assert!(fenced_out.iter().any(|m| m == first), "{on_leader}");
    let m = MaintenanceClient::new(c.raw_channel(second));
    let listed = wait_for("etcd's AlarmList to show CORRUPT", STEP, || {
        let mut m = m.clone();
        async move {
            let r = m
                .alarm(epb::AlarmRequest {
                    action: epb::alarm_request::AlarmAction::Get as i32,
                    member_id: 0,
                    alarm: epb::AlarmType::None as i32,
                })
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            r.alarms
                .iter()
                .any(|a| a.alarm == epb::AlarmType::Corrupt as i32 && a.member_id == leader)
                .then_some(r.alarms.clone())
                .ok_or(format!("{:?}", r.alarms))
        }
    })
    .await;
    assert!(!listed.is_empty());
    let log = c.log_tail(leader, 400);
    assert!(log.contains("CLUSTER CORRUPT ALARM"), "{log}");

    // Recovery: the member taken for wrong is stopped, then the alarm disarmed — after the
    // session's whole TTL went by since its last keep-alive.
    c.kill(second);
    let last_kept = *kept.lock().unwrap_or_else(|e| e.into_inner());
    let held = Duration::from_millis(SESSION_TTL_MS + 2_000);
    tokio::time::sleep(held.saturating_sub(last_kept.elapsed())).await;
    let disarmed = alarm_cli(&c, leader, "disarm");
    assert_eq!(disarmed["disarmed"]["alarm"], "CORRUPT", "{disarmed}");
    assert_eq!(disarmed["cluster"], serde_json::Value::Null, "{disarmed}");
    wait_for("the leader to serve again", STEP, || async {
        match resp_try(&c, leader, &["SET", "after", "1"]).await {
            Ok(Some(ok)) if ok == "OK" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        resp_try(&c, leader, &["GET", "after"]).await,
        Ok(Some("1".into()))
    );
    // The alarm held the session: it has the time it had left at the raise, and lives on.
    let alive = resp_try(&c, leader, &["SESSION.KEEPALIVE", &session]).await;
    assert!(
        matches!(alive, Ok(Some(_))),
        "session {session} after the disarm, {:?} after its last keep-alive: {alive:?}",
        last_kept.elapsed()
    );
    assert!(c.status_ok(leader).await.cluster_alarm.is_none());
    assert_eq!(
        ready_and_gauge(&c, leader).await,
        (200, "fenced_cluster_alarm_corrupt 0".into())
    );
    // It stays disarmed: the member left disagrees with nobody it can be compared with.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        resp_try(&c, leader, &["GET", "after"]).await,
        Ok(Some("1".into()))
    );
}
