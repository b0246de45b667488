//! Leadership hand-off and rolling restarts: `fenced leader step-down` and SIGTERM on the
//! leader pass leadership to a caught-up voter, and a rolling restart of every node under a
//! running load costs clients no error — every call succeeds after the client's own retries —
//! while tokens keep growing and no lock is granted twice.
//!
//! Run: `cargo test -p fenced-server --test handoff`.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_client::Client;
use support::{within, TestCluster, LEADER_TIMEOUT};

const TTL: Duration = Duration::from_secs(30);
/// How long each node stays down in the rolling restart.
const DOWN: Duration = Duration::from_millis(1500);

/// What one load client saw.
#[derive(Debug, Default)]
struct Seen {
    grants: u64,
    errors: Vec<String>,
    /// The slowest acquire + release pair.
    slowest: Duration,
}

/// Take and release `name` (this client's own lock) until `stop`. Every acquire must be
/// granted at once (nobody else takes the lock) with a token above the one before; every
/// error the client returns (after its own retries) is recorded.
async fn load(client: Client, name: String, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let mut last = 0;
    while !stop.load(Ordering::Relaxed) && seen.grants < 1_000_000 {
        let started = Instant::now();
        match client.acquire(&name, "load", TTL, Duration::ZERO, 0).await {
            Ok(Some(g)) => {
                assert!(g.token > last, "{name}: token {} after {last}", g.token);
                last = g.token;
                seen.grants += 1;
                if let Err(e) = client.release(&name, "load", g.token).await {
                    seen.errors.push(format!("release: {e}"));
                    // The grant stays until its lease ends; the next acquire would queue.
                    tokio::time::sleep(TTL).await;
                }
            }
            Ok(None) => seen.errors.push(format!("{name} was not free")),
            Err(e) => seen.errors.push(format!("acquire: {e}")),
        }
        seen.slowest = seen.slowest.max(started.elapsed());
    }
    seen
}

fn start_load(
    c: &TestCluster,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> (Client, Vec<tokio::task::JoinHandle<Seen>>) {
    let client = c.client();
    let tasks = (0..n)
        .map(|i| tokio::spawn(load(client.clone(), format!("load-{i}"), stop.clone())))
        .collect();
    (client, tasks)
}

async fn stop_load(stop: &AtomicBool, tasks: Vec<tokio::task::JoinHandle<Seen>>) -> Vec<Seen> {
    stop.store(true, Ordering::Relaxed);
    let mut out = Vec::new();
    for t in tasks {
        out.push(
            within("a load client to stop", Duration::from_secs(60), t)
                .await
                .expect("load task"),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn step_down_hands_leadership_to_a_voter_and_clients_see_no_error() {
    let c = TestCluster::start("handoff_step_down", &[]);
    let old = c.wait_for_leader(LEADER_TIMEOUT).await;
    c.wait_all_caught_up(old, Duration::from_secs(30)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (client, tasks) = start_load(&c, 4, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Through a follower alone: it passes the call to the leader.
    let admin = c.client_of(support::follower_of(old));
    let r = admin.leader_step_down().await.expect("step-down");
    assert_eq!(r.from, old);
    assert_ne!(r.to, old);
    assert!(
        r.took_ms < 3_000,
        "the hand-off took {} ms (the lease is 450 ms)",
        r.took_ms
    );
    let new = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_eq!(new, r.to, "the leader is the one handed to");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = stop_load(&stop, tasks).await;
    let errors: Vec<_> = seen.iter().flat_map(|s| s.errors.clone()).collect();
    assert!(errors.is_empty(), "clients saw errors: {errors:?}");
    let slowest = seen.iter().map(|s| s.slowest).max().unwrap_or_default();
    println!(
        "step-down {} -> {} in {} ms; slowest acquire+release {slowest:?}; client retries {}",
        r.from,
        r.to,
        r.took_ms,
        client.retries()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_under_load_costs_clients_no_error() {
    let c = TestCluster::start("handoff_rolling", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    c.wait_all_caught_up(leader, Duration::from_secs(30)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (client, tasks) = start_load(&c, 4, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Followers first, the leader last, as an operator would; each one SIGTERMed, restarted
    // and caught up before the next.
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut order: Vec<u64> = c.ids().filter(|id| *id != leader).collect();
    order.push(leader);
    let mut stops = Vec::new();
    for id in order {
        let was_leader = c.status(id).await.is_ok_and(|s| s.leader == id);
        let t = Instant::now();
        let status = c.terminate(id, Duration::from_secs(20)).await;
        assert!(
            status.success(),
            "node {id} exited with {status} on SIGTERM"
        );
        stops.push((id, was_leader, t.elapsed()));
        if was_leader {
            // It handed off before it exited (the alternative: the followers elect a leader
            // once the election timeout has passed, and every client retries).
            let log = c.log_tail(id, 40);
            assert!(
                log.contains("handed off leadership"),
                "node {id} stopped as leader without a hand-off:\n{log}"
            );
        }
        // Down for a while, as for an upgrade (a leader back within its lease would simply
        // lead again).
        tokio::time::sleep(DOWN).await;
        c.restart(id);
        let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
        c.wait_all_caught_up(leader, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let seen = stop_load(&stop, tasks).await;
    let grants: u64 = seen.iter().map(|s| s.grants).sum();
    let errors: Vec<_> = seen.iter().flat_map(|s| s.errors.clone()).collect();
    let slowest = seen.iter().map(|s| s.slowest).max().unwrap_or_default();
    println!(
        "rolling restart: {grants} grants, {} client-visible errors, {} retries inside the \
         client, slowest acquire+release {slowest:?}, stops {stops:?}",
        errors.len(),
        client.retries()
    );
    assert!(grants > 20, "only {grants} grants");
    assert!(errors.is_empty(), "clients saw errors: {errors:?}");
    assert!(
        stops.iter().any(|(_, was_leader, _)| *was_leader),
        "the leader was never restarted: {stops:?}"
    );
}
