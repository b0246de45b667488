//! The apply-semantics gate and the divergence alarm (`crates/server/src/node/alarm.rs`) on
//! real 3-node clusters: a member made to diverge on purpose (the test-only hook
//! `--unsafe-test-diverge-at-index`, accepted only with `FENCED_UNSAFE_TEST_HOOKS=1`) is
//! fenced out within seconds — `/ready` fails, status and the metric show it, RESP and gRPC
//! refuse it, it never serves the diverged value — while the others go on serving; the alarm
//! survives a restart; a diverged leader fences itself and a healthy member takes over; and
//! the leader stamps the deterministic rules only while every member advertises them.
//!
//! Run: `cargo test -p fenced-server --test alarm`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use fenced_proto::v1 as pb;
use support::{follower_of, resp_connect, resp_try, wait_for, TestCluster, LEADER_TIMEOUT};

const METRICS_PORT: u16 = 9191;
/// How long a diverged member may take to be fenced out (digests every 8 indexes, a check
/// every 500 ms; generous for a loaded machine).
const FENCED_WITHIN: Duration = Duration::from_secs(30);
const STEP: Duration = Duration::from_secs(30);
/// The key the divergence hook sets on the diverged member only.
const DIVERGED_KEY: &str = "fenced-test-diverged";

fn enable_test_hooks() {
    std::env::set_var("FENCED_UNSAFE_TEST_HOOKS", "1");
}

async fn http_get(ip: &str, path: &str) -> Result<(u16, String), String> {
    support::http_get(ip, METRICS_PORT, path).await
}

/// `n` writes through node `via`, one after another (one log entry or so each).
async fn writes(c: &TestCluster, via: u64, prefix: &str, n: usize) {
    let mut con = resp_connect(c, via).await;
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        let ok: String = support::resp_cmd(&mut con, &["SET", &key, "v"]).await;
        assert_eq!(ok, "OK");
    }
}

async fn wait_alarm(c: &TestCluster, id: u64) -> pb::StatusResponse {
    wait_for(
        &format!("node {id}'s divergence alarm"),
        FENCED_WITHIN,
        || async {
            let s = c.status(id).await?;
            if s.alarm.is_empty() {
                Err(format!("no alarm yet; applied {}", s.last_applied))
            } else {
                Ok(s)
            }
        },
    )
    .await
}

/// Node `id` is fenced out: every client path refuses, and it never serves the diverged key.
async fn assert_fenced_out(c: &TestCluster, id: u64) {
    for args in [
        &["GET", DIVERGED_KEY][..],
        &["GET", "k-0"][..],
        &["SET", "k-x", "v"][..],
        &["LOCK.ACQUIRE", "l", "o", "5000"][..],
    ] {
        match resp_try(c, id, args).await {
            Err(e) => assert!(e.contains("CORRUPT"), "{args:?} on node {id}: {e}"),
            Ok(v) => panic!("{args:?} on fenced-out node {id} answered {v:?}"),
        }
    }
    let mut lock = c.raw_lock_client(id, Duration::from_secs(5));
    let refused = lock
        .info(pb::InfoRequest { name: "l".into() })
        .await
        .expect_err("Lock.Info on a fenced-out member");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().starts_with("corrupt:"), "{refused:?}");
    assert_eq!(
        refused
            .metadata()
            .get("x-fenced-alarm")
            .and_then(|v| v.to_str().ok()),
        Some("corrupt")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_follower_is_fenced_out_and_stays_out_across_a_restart() {
    enable_test_hooks();
    let metrics = format!("{{ip}}:{METRICS_PORT}");
    let c = TestCluster::start(
        "alarm-follower",
        &["--digest-interval", "8", "--metrics-addr", &metrics],
    );
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    writes(&c, leader, "warm", 3).await;
    let f = follower_of(leader);
    let at = c.status_ok(leader).await.last_applied + 12;
    c.kill(f);
    c.restart_with(f, &["--unsafe-test-diverge-at-index", &at.to_string()]);
    c.wait_all_caught_up(leader, STEP).await;
    let healthy = c
        .ids()
        .find(|id| *id != f && *id != leader)
        .expect("a third");

    writes(&c, leader, "k", 40).await;
    let s = wait_alarm(&c, f).await;
    assert!(s.alarm.contains("diverged at log index"), "{}", s.alarm);

    assert_fenced_out(&c, f).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(c.raw_channel(f));
    let check = tonic_health::pb::HealthCheckRequest {
        service: "fenced.v1.Lock".into(),
    };
    let r = health.check(check).await.expect("gRPC health");
    assert_eq!(r.into_inner().status, 2, "NOT_SERVING while alarmed");
    let (code, body) = http_get(&c.ip(f), "/ready").await.expect("/ready");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("corrupt"), "{body}");
    let (_, scraped) = http_get(&c.ip(f), "/metrics").await.expect("/metrics");
    assert!(scraped.contains("fenced_alarm_corrupt 1"), "{scraped}");
    let (_, scraped) = http_get(&c.ip(healthy), "/metrics")
        .await
        .expect("/metrics");
    assert!(scraped.contains("fenced_alarm_corrupt 0"), "{scraped}");
    let log = c.log_tail(f, 400);
    assert!(
        log.contains("DIVERGENCE ALARM") && log.contains("majority"),
        "the log names the index and both digests: {log}"
    );
    // The leader knows.
    wait_for("the leader to list the alarmed member", STEP, || async {
        let s = c.status(leader).await?;
        if s.alarmed_members.contains(&f) {
            Ok(())
        } else {
            Err(format!("alarmed members {:?}", s.alarmed_members))
        }
    })
    .await;

    // The others serve, and never had the diverged key.
    for id in [leader, healthy] {
        assert_eq!(
            resp_try(&c, id, &["SET", "after", "1"]).await,
            Ok(Some("OK".into()))
        );
        assert_eq!(resp_try(&c, id, &["GET", DIVERGED_KEY]).await, Ok(None));
        assert_eq!(
            resp_try(&c, id, &["GET", "k-39"]).await,
            Ok(Some("v".into()))
        );
    }
    // The alarmed member still replicates the log: the cluster keeps its quorum if the
    // healthy follower goes.
    c.kill(healthy);
    assert_eq!(
        resp_try(&c, leader, &["SET", "two-of-three", "1"]).await,
        Ok(Some("OK".into()))
    );
    c.restart(healthy);

    // A restart keeps the alarm.
    c.kill(f);
    c.restart(f);
    let s = wait_alarm(&c, f).await;
    assert!(s.alarm.contains("diverged at log index"), "{}", s.alarm);
    assert_fenced_out(&c, f).await;
    assert_ne!(c.status_ok(f).await.state, "leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_leader_fences_itself_and_a_healthy_member_takes_over() {
    enable_test_hooks();
    let c = TestCluster::start("alarm-leader", &["--digest-interval", "8"]);
    let first = c.wait_for_leader(LEADER_TIMEOUT).await;
    writes(&c, first, "warm", 3).await;
    // Node 1 diverges; a hand-off goes to the caught-up voter with the lowest id, so step
    // down until node 1 leads (before the hook's index is reached: nothing else writes).
    let at = c.status_ok(first).await.last_applied + 30;
    c.kill(1);
    c.restart_with(1, &["--unsafe-test-diverge-at-index", &at.to_string()]);
    let mut leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    for _ in 0..10 {
        if leader == 1 {
            break;
        }
        c.wait_all_caught_up(leader, STEP).await;
        let _ = c.client_of(leader).leader_step_down().await;
        leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    }
    assert_eq!(leader, 1, "node 1 never became the leader");
    assert!(c.status_ok(1).await.last_applied < at);

    // Through a follower: node 1 stops serving mid-way, and the follower's forwarded writes
    // wait for the next leader.
    writes(&c, 2, "k", 50).await;
    let s = wait_alarm(&c, 1).await;
    assert!(s.alarm.contains("found by member 1"), "{}", s.alarm);
    let new = wait_for("a healthy leader", STEP, || async {
        for id in [2, 3] {
            if let Ok(s) = c.status(id).await {
                if s.state == "leader" && s.leader == id {
                    return Ok(id);
                }
            }
        }
        Err("no leader among 2 and 3".to_string())
    })
    .await;
    assert_fenced_out(&c, 1).await;
    assert_eq!(
        resp_try(&c, new, &["SET", "after", "1"]).await,
        Ok(Some("OK".into()))
    );
    assert_eq!(resp_try(&c, new, &["GET", DIVERGED_KEY]).await, Ok(None));
    // Node 1 never leads again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_ne!(c.status_ok(1).await.state, "leader");
}

/// The newest apply rules (`Semantics::NEWEST`).
const NEWEST: u32 = fenced_core::Semantics::NEWEST.0 as u32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_stamps_deterministic_rules_only_while_every_member_runs_them() {
    enable_test_hooks();
    let c = TestCluster::start("alarm-semantics", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let stamped = |want: u32| {
        let c = &c;
        async move {
            let s = c.status(leader).await?;
            if s.state == "leader" && s.semantics == want {
                Ok(())
            } else {
                Err(format!("state {} semantics {}", s.state, s.semantics))
            }
        }
    };
    wait_for("the leader stamping the newest rules", STEP, || {
        stamped(NEWEST)
    })
    .await;
    // One member advertises the older rules (as older code would).
    let f = follower_of(leader);
    c.kill(f);
    c.restart_with(f, &["--unsafe-test-advertise-semantics", "0"]);
    wait_for("the leader back on rules 0", STEP, || stamped(0)).await;
    c.wait_all_caught_up(leader, STEP).await;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = c.status_ok(leader).await;
        assert_eq!(s.semantics, 0, "a member runs older rules: {s:?}");
    }
    // Upgraded: every member runs the newest rules again.
    c.kill(f);
    c.restart(f);
    wait_for("the leader stamping the newest rules again", STEP, || {
        stamped(NEWEST)
    })
    .await;
    writes(&c, leader, "k", 3).await;

    // Once switched, a member that is down does not switch a new leader back to the old
    // rules: it starts from the rules of the last entry.
    c.wait_all_caught_up(leader, STEP).await;
    c.kill(f);
    let _ = c.client_of(leader).leader_step_down().await;
    let new = wait_for("a new leader", STEP, || async {
        let s = c.status(leader).await?;
        match s.leader {
            l if l != 0 && l != leader => Ok(l),
            l => Err(format!("leader {l}")),
        }
    })
    .await;
    let s = wait_for("the new leader in office", STEP, || async {
        let s = c.status(new).await?;
        if s.state == "leader" {
            Ok(s)
        } else {
            Err(s.state)
        }
    })
    .await;
    assert_eq!(s.semantics, NEWEST, "{s:?}");
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(c.status_ok(new).await.semantics, NEWEST);
    }
    writes(&c, new, "after", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_hooks_are_refused_without_the_environment_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(support::bin())
        .args(["serve", "--unsafe-test-diverge-at-index", "5", "--data-dir"])
        .arg(dir.path())
        .env_remove("FENCED_UNSAFE_TEST_HOOKS")
        .output()
        .expect("running fenced");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FENCED_UNSAFE_TEST_HOOKS=1"), "{err}");
}
