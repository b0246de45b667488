//! Multi-process cluster tests: three real `fenced serve` processes per test, SIGKILLed and
//! restarted. Each test has its own loopback range (see `support`), so they run in parallel.
//!
//! Run: `cargo test -p fenced-server --test cluster`. Node logs of a failing test are printed.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use fenced_proto::v1 as pb;
use support::{wait_for, within, TestCluster, CATCH_UP_TIMEOUT, LEADER_TIMEOUT};

const LONG_TTL: Duration = Duration::from_secs(120);
const NO_WAIT: Duration = Duration::ZERO;
const CALL: Duration = Duration::from_secs(30);

/// `info` of `name` sent to node `id` alone (a linearizable read served from that node's
/// own state machine after the read-index barrier).
async fn info_on(c: &TestCluster, id: u64, name: &str) -> Option<pb::InfoResponse> {
    within(
        &format!("info {name} on node {id}"),
        CALL,
        c.client_of(id).info(name),
    )
    .await
    .unwrap_or_else(|e| panic!("info {name} on node {id}: {e}"))
}

/// Assert that every node in `ids` reports `name` held by `owner` with `token` and `holds`.
async fn assert_held_everywhere(
    c: &TestCluster,
    ids: &[u64],
    name: &str,
    owner: &str,
    token: u64,
    holds: u32,
) {
    for &id in ids {
        let info = info_on(c, id, name)
            .await
            .unwrap_or_else(|| panic!("{name} should be held by {owner} but node {id} says free"));
        assert_eq!(info.owner, owner, "owner of {name} on node {id}");
        assert_eq!(info.token, token, "token of {name} on node {id}");
        assert_eq!(info.holds, holds, "holds of {name} on node {id}");
    }
}

async fn try_acquire(
    client: &fenced_client::Client,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Option<fenced_client::Grant> {
    within(
        &format!("acquire {name} for {owner}"),
        CALL,
        client.acquire(name, owner, ttl, NO_WAIT, 0),
    )
    .await
    .unwrap_or_else(|e| panic!("acquire {name} for {owner}: {e}"))
}

fn others(leader: u64) -> Vec<u64> {
    support::IDS.into_iter().filter(|&i| i != leader).collect()
}

/// 1. A grant made through a follower is held, with the same owner and token, on all three
/// nodes; others are refused; release frees it everywhere; the next grant has a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_is_seen_on_every_node() {
    let c = TestCluster::start("replication", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = others(leader)[0];

    // Through a follower: forwarded to the leader.
    let via_follower = c.client_of(follower);
    let g = try_acquire(&via_follower, "repl", "alice", LONG_TTL)
        .await
        .expect("a free lock is granted");
    assert!(g.token > 0);
    assert_eq!(g.holds, 1);
    // The lease left that a grant reports can't be more than was asked for, whichever node
    // answers (a follower must not compute it from its own, lagging, state machine clock).
    let ttl = Duration::from_secs(5);
    for i in 0..20 {
        let name = format!("ttl-{i}");
        let gt = try_acquire(&via_follower, &name, "alice", ttl)
            .await
            .expect("a free lock is granted");
        assert!(
            gt.ttl_ms > 0 && gt.ttl_ms <= ttl.as_millis() as u64,
            "{name}: a {ttl:?} grant (token {}) answered through follower {follower} reports \
             {} ms left",
            gt.token,
            gt.ttl_ms
        );
    }
    assert_held_everywhere(&c, &[1, 2, 3], "repl", "alice", g.token, 1).await;

    // Info's lease left counts down on an idle cluster too: it is counted from the log
    // time of the read, not from the last applied entry.
    let idle_ttl = Duration::from_secs(10);
    let gi = try_acquire(&c.client_of(leader), "idle", "alice", idle_ttl)
        .await
        .expect("granted");
    let answered = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in c.ids() {
        let idle_for = answered.elapsed();
        let info = info_on(&c, id, "idle").await.expect("idle is held");
        assert_eq!(info.token, gi.token);
        let most = idle_ttl.saturating_sub(idle_for).as_millis() as u64 + 5;
        assert!(
            info.ttl_ms <= most,
            "info on node {id}, {idle_for:?} after a {idle_ttl:?} grant was answered, says \
             {} ms are left (at most {most})",
            info.ttl_ms
        );
    }

    // Every node's own state machine has the entry, too (not only reads through the leader).
    for id in c.ids() {
        c.wait_applied(id, g.token, CATCH_UP_TIMEOUT).await;
    }

    // Another owner is refused through any node.
    for id in c.ids() {
        assert_eq!(
            try_acquire(&c.client_of(id), "repl", "bob", LONG_TTL).await,
            None,
            "bob must not get repl through node {id} while alice holds it"
        );
    }

    // Reentrant through another node: same token, two holds, seen everywhere.
    let g2 = try_acquire(&c.client_of(leader), "repl", "alice", LONG_TTL)
        .await
        .expect("reentrant acquire");
    assert_eq!((g2.token, g2.holds), (g.token, 2));
    assert_held_everywhere(&c, &[1, 2, 3], "repl", "alice", g.token, 2).await;

    // A release naming the wrong token does nothing; two right ones free it.
    let client = c.client();
    assert!(!client
        .release("repl", "alice", g.token + 1000)
        .await
        .unwrap());
    assert!(!client.release("repl", "bob", g.token).await.unwrap());
    assert!(client.release("repl", "alice", g.token).await.unwrap());
    assert_held_everywhere(&c, &[1, 2, 3], "repl", "alice", g.token, 1).await;
    assert!(client.release("repl", "alice", g.token).await.unwrap());
    for id in c.ids() {
        assert_eq!(
            info_on(&c, id, "repl").await,
            None,
            "repl free on node {id}"
        );
    }

    let g3 = try_acquire(&c.client_of(follower), "repl", "bob", LONG_TTL)
        .await
        .expect("bob gets the freed lock");
    assert!(
        g3.token > g.token,
        "token went from {} to {}",
        g.token,
        g3.token
    );
    assert_held_everywhere(&c, &[1, 2, 3], "repl", "bob", g3.token, 1).await;
}

/// 2 + 3a. SIGKILL the leader while a lock with its own lease is held: a new leader keeps the
/// grant; another owner is refused for at least `ttl` from when the acquire was *sent*; then
/// gets it with a larger token. The killed node restarts and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_survives_leader_crash() {
    const TTL: Duration = Duration::from_secs(5);
    let c = TestCluster::start("failover", &[]);
    let old_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let survivors = others(old_leader);
    let client = c.client();

    let sent = Instant::now();
    let g = try_acquire(&client, "failover", "alice", TTL)
        .await
        .expect("a free lock is granted");
    let granted_after = sent.elapsed();
    c.kill(old_leader);

    let new_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(new_leader, old_leader);
    // Still held by alice on the new leader. (Leases continue from the last committed log
    // time, so the election time is not counted: it is held for at least the rest of TTL.)
    let info = info_on(&c, new_leader, "failover").await;
    let read_at = sent.elapsed();
    match info {
        Some(i) => {
            assert_eq!((i.owner.as_str(), i.token), ("alice", g.token));
            assert!(i.ttl_ms <= TTL.as_millis() as u64, "ttl_ms {}", i.ttl_ms);
        }
        None => panic!(
            "the new leader {new_leader} says the lock is free {read_at:?} after the acquire \
             was sent (ttl {TTL:?}, granted after {granted_after:?})"
        ),
    }

    // Bob tries (no wait) through the survivors until he gets it. Every grant must come at
    // least TTL after alice's acquire was sent: a grant reported earlier broke the lease.
    let bob = c.client();
    let mut refusals = 0;
    let mut last_refusal = Duration::ZERO;
    let give_up = sent + TTL + Duration::from_secs(30);
    let g_bob = loop {
        assert!(
            Instant::now() < give_up,
            "bob never got the lock ({refusals} refusals); the lease did not expire"
        );
        let r = try_acquire(&bob, "failover", "bob", TTL).await;
        let answered = sent.elapsed();
        match r {
            None => {
                refusals += 1;
                last_refusal = answered;
            }
            Some(gb) => {
                assert!(
                    answered >= TTL,
                    "bob was granted {answered:?} after alice's acquire was sent, before its \
                     ttl {TTL:?} ran out (alice token {}, bob token {})",
                    g.token,
                    gb.token
                );
                break gb;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "failover: granted after {granted_after:?}, new leader {new_leader} read at {read_at:?}, \
         {refusals} refusals (last answered at {last_refusal:?}), bob granted token {} at {:?}",
        g_bob.token,
        sent.elapsed()
    );
    assert!(refusals > 0, "bob was never refused");
    // The lease was probed up to its end (it stretches by the failover time, so refusals
    // should go on past TTL; a gap here means the test, not the server, is too slow).
    assert!(
        last_refusal + Duration::from_secs(1) >= TTL,
        "bob's last refusal came {last_refusal:?} after the acquire was sent, well before the \
         ttl {TTL:?}; the lease was not probed to its end"
    );
    assert!(
        g_bob.token > g.token,
        "token went backwards: alice {} then bob {}",
        g.token,
        g_bob.token
    );
    assert_held_everywhere(&c, &survivors, "failover", "bob", g_bob.token, 1).await;

    // The killed node restarts and catches up; its own state machine shows bob's grant.
    c.restart(old_leader);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let target = c.status_ok(leader).await.last_applied;
    assert!(target >= g_bob.token);
    let s = c.wait_applied(old_leader, target, CATCH_UP_TIMEOUT).await;
    assert!(s.last_applied >= target);
    assert_held_everywhere(&c, &[old_leader], "failover", "bob", g_bob.token, 1).await;
}

/// 3b. A follower that missed more than the leader keeps in its log catches up by snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_catches_up_by_snapshot() {
    let c = TestCluster::start("snapshot", &["--snapshot-logs", "20", "--keep-logs", "0"]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client();
    // Something to replicate before the follower goes away.
    let before = try_acquire(&client, "snap-before", "alice", LONG_TTL)
        .await
        .expect("granted");
    c.wait_all_caught_up(leader, CATCH_UP_TIMEOUT).await;
    let follower = others(leader)[0];
    let behind = c.status_ok(follower).await.last_applied;
    c.kill(follower);

    // ~100 entries while it is down.
    let alive = others(follower);
    let survivors = fenced_client::Client::connect(c.endpoints_of(&alive)).unwrap();
    let mut max_token = before.token;
    for i in 0..50 {
        let name = format!("snap-{}", i % 5);
        let g = try_acquire(&survivors, &name, "w", LONG_TTL)
            .await
            .unwrap_or_else(|| panic!("{name} is free, round {i}"));
        assert!(g.token > max_token, "token went backwards at round {i}");
        max_token = g.token;
        assert!(survivors.release(&name, "w", g.token).await.unwrap());
    }
    let mut kept = Vec::new();
    for i in 0..3 {
        let name = format!("snap-kept-{i}");
        let g = try_acquire(&survivors, &name, "keeper", LONG_TTL)
            .await
            .expect("granted");
        kept.push((name, g.token));
    }

    // The leader (whoever it is now) has purged what the dead follower would need.
    let (leader, purged) = wait_for(
        "the leader to purge its log past the dead follower",
        CATCH_UP_TIMEOUT,
        || async {
            let l = c.wait_for_leader(LEADER_TIMEOUT).await;
            let s = c.status(l).await?;
            if s.purged_index > behind {
                Ok((l, s))
            } else {
                Err(format!(
                    "leader {l}: purged_index {} snapshot_index {} last_applied {}; follower \
                     stopped at {behind}",
                    s.purged_index, s.snapshot_index, s.last_applied
                ))
            }
        },
    )
    .await;
    assert!(purged.snapshot_index > behind);
    let target = purged.last_applied;

    c.restart(follower);
    let s = c.wait_applied(follower, target, CATCH_UP_TIMEOUT).await;
    assert!(
        s.snapshot_index > 0,
        "follower caught up without a snapshot: {s:?}"
    );
    assert!(
        s.snapshot_index > behind,
        "follower's snapshot {} is not newer than where it stopped ({behind})",
        s.snapshot_index
    );
    // Its own state machine is right.
    assert_held_everywhere(&c, &[follower], "snap-before", "alice", before.token, 1).await;
    for (name, token) in &kept {
        assert_held_everywhere(&c, &[follower], name, "keeper", *token, 1).await;
    }
    for i in 0..5 {
        let name = format!("snap-{i}");
        assert_eq!(info_on(&c, follower, &name).await, None, "{name} is free");
    }
    // And it still serves writes after catching up (forwarded to the leader).
    let g = try_acquire(&c.client_of(follower), "snap-after", "z", LONG_TTL)
        .await
        .expect("granted");
    assert!(g.token > kept.last().unwrap().1);
    let _ = leader;
}

/// 4. SIGKILL all three nodes and restart them from their data dirs: every acknowledged
/// grant (and release) is still there, and new tokens are larger than every old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grants_survive_full_crash() {
    const DOWNTIME: Duration = Duration::from_secs(2);
    let c = TestCluster::start("crash", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client();

    let mut grants = Vec::new();
    for i in 0..4 {
        let (name, owner) = (format!("crash-{i}"), format!("owner-{i}"));
        let g = try_acquire(&client, &name, &owner, LONG_TTL)
            .await
            .expect("granted");
        grants.push((name, owner, g.token, 1u32));
    }
    // A reentrant hold and a released lock must survive as such too.
    let again = try_acquire(&client, "crash-0", "owner-0", LONG_TTL)
        .await
        .expect("reentrant");
    assert_eq!(again.token, grants[0].2);
    grants[0].3 = 2;
    let gone = try_acquire(&client, "crash-released", "r", LONG_TTL)
        .await
        .expect("granted");
    assert!(client
        .release("crash-released", "r", gone.token)
        .await
        .unwrap());
    let max_token = grants.iter().map(|g| g.2).max().unwrap().max(gone.token);
    // Everything acknowledged is applied at least on the leader.
    let applied_before = c.status_ok(leader).await.last_applied;
    // The lease left of crash-1 in log time, as of a fresh entry (the last one before the
    // crash): a grant's answer counts from the log time of the entry that answers it.
    let probe = try_acquire(&client, "crash-1", "owner-1", Duration::from_millis(1))
        .await
        .expect("reentrant probe");
    let left_before = probe.ttl_ms;
    let up_before = Instant::now();
    assert!(client
        .release("crash-1", "owner-1", probe.token)
        .await
        .unwrap());

    for id in c.ids() {
        c.kill(id);
    }
    let down = Instant::now();
    let ran_before = down - up_before;
    // The cluster stays down a while: log time must not count it (docs/architecture.md, "Rules
    // of the core": a new leader continues from the last committed log time on its monotonic
    // clock, never the wall clock).
    tokio::time::sleep(DOWNTIME).await;
    let up_again = Instant::now();
    for id in c.ids() {
        c.restart(id);
    }
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let probe = try_acquire(&client, "crash-1", "owner-1", Duration::from_millis(1))
        .await
        .expect("reentrant probe after the restart");
    let ran_after = up_again.elapsed();
    assert!(client
        .release("crash-1", "owner-1", probe.token)
        .await
        .unwrap());
    let log_time_passed = left_before.saturating_sub(probe.ttl_ms);
    eprintln!(
        "crash: log time passed {log_time_passed} ms; the cluster ran {ran_before:?} + \
         {ran_after:?} and was down {:?}",
        up_again - down
    );
    assert!(
        Duration::from_millis(log_time_passed) <= ran_before + ran_after,
        "log time advanced {log_time_passed} ms across the crash, more than the {:?} the \
         cluster was up: the {:?} it was down were counted against the leases",
        ran_before + ran_after,
        up_again - down
    );

    for (name, owner, token, holds) in &grants {
        assert_held_everywhere(&c, &[1, 2, 3], name, owner, *token, *holds).await;
        assert_eq!(
            try_acquire(&client, name, "intruder", LONG_TTL).await,
            None,
            "{name} was granted to an intruder after the restart"
        );
    }
    for id in c.ids() {
        assert_eq!(
            info_on(&c, id, "crash-released").await,
            None,
            "the acknowledged release of crash-released was lost on node {id}"
        );
    }
    let fresh = try_acquire(&client, "crash-new", "n", LONG_TTL)
        .await
        .expect("granted");
    assert!(
        fresh.token > max_token && fresh.token > applied_before,
        "new token {} is not above the old ones (max token {max_token}, applied {applied_before})",
        fresh.token
    );
    let reused = try_acquire(&client, "crash-released", "r2", LONG_TTL)
        .await
        .expect("granted");
    assert!(reused.token > fresh.token);
}

/// 5. Acquires whose leader is SIGKILLed while they are in flight, retried with the same
/// request ids on the survivors, are granted exactly once; a further retry returns the same
/// token; another owner is still refused. Each round sends several acquires at once, so they
/// share entries (the leader batches what arrives while an entry is in flight): a crash
/// mid-batch must still give each caller its own first outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_acquire_never_grants_twice() {
    const AT_ONCE: u64 = 6;
    let c = TestCluster::start("retry", &[]);
    // Different kill delays hit different points: before the append, between append and
    // commit, after the commit but before the answer.
    for (round, delay_ms) in [0u64, 5, 25].into_iter().enumerate() {
        let round = round as u64;
        let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
        let survivors = others(leader);
        let reqs: Vec<pb::AcquireRequest> = (0..AT_ONCE)
            .map(|i| pb::AcquireRequest {
                request: Some(pb::RequestId {
                    client_id: 0x00fe_17ce_d000 + round * 100 + i,
                    seq: 1,
                }),
                name: format!("retry-{round}-{i}"),
                owner: "alice".into(),
                ttl_ms: LONG_TTL.as_millis() as u64,
                wait_ms: 0,
                session: 0,
                ..Default::default()
            })
            .collect();
        let to_leader = c.raw_lock_client(leader, Duration::from_secs(10));
        // Open the connection first, so the acquires go out at once.
        to_leader
            .clone()
            .info(pb::InfoRequest {
                name: reqs[0].name.clone(),
            })
            .await
            .expect("warm-up info on the leader");

        let sends = futures::future::join_all(reqs.iter().map(|req| {
            let mut lc = to_leader.clone();
            let req = req.clone();
            async move { lc.acquire(req).await.map(|r| r.into_inner()) }
        }));
        let (firsts, ()) = tokio::join!(sends, async {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            c.kill(leader);
        });

        let mut tokens = Vec::new();
        for (req, first) in reqs.iter().zip(firsts) {
            let name = req.name.clone();
            // Retry the identical request on the survivors until one answers.
            let retried = wait_for(
                &format!("{name}: the retried acquire to be answered"),
                LEADER_TIMEOUT,
                || {
                    let req = req.clone();
                    let survivors = survivors.clone();
                    let c = &c;
                    async move {
                        let mut errs = Vec::new();
                        for id in survivors {
                            let mut lc = c.raw_lock_client(id, Duration::from_secs(10));
                            match lc.acquire(req.clone()).await {
                                Ok(r) => return Ok(r.into_inner()),
                                Err(s) => {
                                    errs.push(format!("node {id}: {:?} {}", s.code(), s.message()))
                                }
                            }
                        }
                        Err(errs.join("; "))
                    }
                },
            )
            .await;
            eprintln!(
                "{name} (kill after {delay_ms} ms): first attempt {:?}, retry {retried:?}",
                first.as_ref().map_err(|s| s.code())
            );
            assert!(retried.granted, "{name}: retry not granted: {retried:?}");
            assert_eq!(retried.holds, 1, "{name}");
            assert!(
                retried.ttl_ms <= req.ttl_ms,
                "{name}: the retried grant reports {} ms left of a {} ms lease",
                retried.ttl_ms,
                req.ttl_ms
            );
            if let Ok(f) = &first {
                assert!(f.granted, "{name}: first answer {f:?}");
                assert_eq!(f.token, retried.token, "{name}: two different grants");
            }
            assert_held_everywhere(&c, &survivors, &name, "alice", retried.token, 1).await;
            tokens.push(retried.token);

            // Once more, on the other survivor: the first outcome again, no second hold.
            let mut lc = c.raw_lock_client(survivors[1], Duration::from_secs(10));
            let again = within("the repeated acquire", CALL, lc.acquire(req.clone()))
                .await
                .expect("repeated acquire")
                .into_inner();
            assert!(again.granted);
            assert_eq!(
                (again.token, again.holds),
                (retried.token, retried.holds),
                "{name}: a repeat of the same request acted again"
            );
            assert_held_everywhere(&c, &survivors, &name, "alice", retried.token, 1).await;

            // A second owner is refused.
            assert_eq!(
                try_acquire(&c.client(), &name, "bob", LONG_TTL).await,
                None,
                "{name}: bob got a lock alice holds"
            );
        }

        // Bring the killed node back; the grants and their dedup records are on it too.
        c.restart(leader);
        let l = c.wait_for_leader(LEADER_TIMEOUT).await;
        c.wait_all_caught_up(l, CATCH_UP_TIMEOUT).await;
        for (req, token) in reqs.iter().zip(tokens) {
            let mut lc = c.raw_lock_client(leader, Duration::from_secs(10));
            let third = within(
                "the acquire repeated on the restarted node",
                CALL,
                lc.acquire(req.clone()),
            )
            .await
            .expect("repeated acquire")
            .into_inner();
            assert_eq!((third.granted, third.token), (true, token), "{}", req.name);
            assert_held_everywhere(&c, &[1, 2, 3], &req.name, "alice", token, 1).await;
        }
    }
}

/// 4b. After a full-cluster crash, log time continues from the last committed log time
/// (docs/architecture.md, "Rules of the core"): the downtime is not counted against leases,
/// and the wall clock is not used. The crash comes right after the first timed entry, before
/// any later append flushed a commit index covering it, so the restarted leader's state
/// machine starts at log time 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_clock_skips_full_cluster_downtime() {
    const DOWNTIME: Duration = Duration::from_secs(3);
    let c = TestCluster::start("downtime", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client();
    let g = try_acquire(&client, "dt", "o", LONG_TTL)
        .await
        .expect("granted");
    let up_before = Instant::now();
    for id in c.ids() {
        c.kill(id);
    }
    let down = Instant::now();
    tokio::time::sleep(DOWNTIME).await;
    let up_again = Instant::now();
    for id in c.ids() {
        c.restart(id);
    }
    c.wait_for_leader(LEADER_TIMEOUT).await;
    // A reentrant acquire answers with the lease left as of its own (fresh) entry.
    let probe = try_acquire(&client, "dt", "o", Duration::from_millis(1))
        .await
        .expect("reentrant acquire after the restart");
    let ran = (down - up_before) + up_again.elapsed();
    assert_eq!(probe.token, g.token);
    let passed = g.ttl_ms.saturating_sub(probe.ttl_ms);
    eprintln!(
        "downtime: log time passed {passed} ms; up {ran:?}, down {:?}",
        up_again - down
    );
    assert!(
        Duration::from_millis(passed) <= ran,
        "log time advanced {passed} ms across the crash, more than the {ran:?} the cluster \
         was up: the {:?} it was down were counted (the clock anchored to the wall clock)",
        up_again - down
    );
}

/// Runs `fenced ARGS`, bounded in time; returns (exit code, stdout, stderr).
async fn run_fenced(args: &[&str]) -> (Option<i32>, String, String) {
    let child = tokio::process::Command::new(support::bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting fenced");
    let out = within(
        &format!("fenced {}", args.join(" ")),
        Duration::from_secs(60),
        child.wait_with_output(),
    )
    .await
    .expect("running fenced");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `fenced lock` runs the command with a positive FENCED_TOKEN, passes its exit status
/// through, releases afterwards, and exits 75 when the lock is held elsewhere.
/// `fenced status` prints the cluster as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_lock_and_status() {
    let c = TestCluster::start("cli", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let eps = c.endpoints().join(",");

    let (code, out, err) = run_fenced(&[
        "lock",
        "--endpoints",
        &eps,
        "--ttl-ms",
        "3000",
        "demo",
        "--",
        "sh",
        "-c",
        "echo $FENCED_TOKEN; echo $FENCED_LOCK",
    ])
    .await;
    assert_eq!(code, Some(0), "stdout {out:?} stderr {err}");
    let mut lines = out.lines();
    let token: u64 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("FENCED_TOKEN is not an integer: {out:?}"));
    assert!(token > 0);
    assert_eq!(lines.next(), Some("demo"), "FENCED_LOCK: {out:?}");
    // Released when the command exited.
    assert_eq!(info_on(&c, leader, "demo").await, None, "demo still held");

    // The command's exit status is passed through; the next token is larger.
    let (code, out, err) = run_fenced(&[
        "lock",
        "--endpoints",
        &eps,
        "--ttl-ms",
        "3000",
        "demo",
        "--",
        "sh",
        "-c",
        "echo $FENCED_TOKEN; exit 7",
    ])
    .await;
    assert_eq!(code, Some(7), "stdout {out:?} stderr {err}");
    let token2: u64 = out.trim().parse().expect("token");
    assert!(token2 > token, "token went from {token} to {token2}");
    assert_eq!(info_on(&c, leader, "demo").await, None, "demo still held");

    // Held elsewhere: 75, and the command does not run.
    let holder = try_acquire(&c.client(), "demo", "someone-else", LONG_TTL)
        .await
        .expect("granted");
    let (code, out, err) = run_fenced(&[
        "lock",
        "--endpoints",
        &eps,
        "--ttl-ms",
        "3000",
        "demo",
        "--",
        "sh",
        "-c",
        "echo ran",
    ])
    .await;
    assert_eq!(code, Some(75), "stdout {out:?} stderr {err}");
    assert!(out.is_empty(), "the command ran without the lock: {out:?}");
    assert_held_everywhere(&c, &[leader], "demo", "someone-else", holder.token, 1).await;

    // Waiting: granted once the holder releases within --wait-ms.
    let client = c.client();
    let waiting = [
        "lock",
        "--endpoints",
        &eps,
        "--ttl-ms",
        "3000",
        "--wait-ms",
        "20000",
        "demo",
        "--",
        "sh",
        "-c",
        "echo $FENCED_TOKEN",
    ];
    let (res, ()) = tokio::join!(run_fenced(&waiting), async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(client
            .release("demo", "someone-else", holder.token)
            .await
            .unwrap());
    });
    let (code, out, err) = res;
    assert_eq!(code, Some(0), "stdout {out:?} stderr {err}");
    let token3: u64 = out.trim().parse().expect("token");
    assert!(token3 > holder.token);

    // fenced status: one JSON object.
    let (code, out, err) = run_fenced(&["status", "--endpoints", &eps]).await;
    assert_eq!(code, Some(0), "stderr {err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("status is JSON");
    assert!(
        v["leader"].as_u64().is_some_and(|l| (1..=3).contains(&l)),
        "{v}"
    );
    assert!(v["term"].as_u64().is_some_and(|t| t >= 1), "{v}");
    assert!(v["commit_index"].as_u64().is_some_and(|i| i >= 1), "{v}");
    // Every token issued so far is at most the revision the answering node applied (it
    // answered after its own read of the lock, so it has applied token3's grant).
    assert!(v["revision"].as_u64().is_some_and(|r| r >= token3), "{v}");
    assert_eq!(v["members"].as_array().map(Vec::len), Some(3), "{v}");
}
