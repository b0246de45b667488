//! Membership changes on a running cluster (`fenced member …`, `fenced serve --join`): a dead
//! node replaced while clients take locks, and every bad change refused with nothing changed.
//!
//! Run: `cargo test -p fenced-server --test membership`.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fenced_client::{Client, ClientError};
use fenced_proto::v1 as pb;
use support::{wait_for, within, TestCluster, LEADER_TIMEOUT};

const CALL: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(60);

fn ids(members: &[pb::Member], voter: bool) -> Vec<u64> {
    members
        .iter()
        .filter(|m| m.voter == voter)
        .map(|m| m.id)
        .collect()
}

fn refused(r: Result<Vec<pb::Member>, ClientError>, what: &str, needle: &str) {
    match r {
        Ok(m) => panic!("{what}: accepted, members now {m:?}"),
        Err(ClientError::Rejected(s)) => assert!(
            s.message().contains(needle),
            "{what}: refused with {:?}, expected it to mention {needle:?}",
            s.message()
        ),
        Err(e) => panic!("{what}: {e} (expected a refusal mentioning {needle:?})"),
    }
}

/// Acquire and release lock `name` over and over until `stop`, checking that every grant's
/// token is larger than the one before. Returns the number of grants.
async fn churn(client: Client, name: String, stop: Arc<AtomicBool>) -> u64 {
    let mut last = 0;
    let mut grants = 0;
    while !stop.load(Ordering::Relaxed) && grants < 100_000 {
        match client.acquire(&name, "churn", TTL, Duration::ZERO, 0).await {
            Ok(Some(g)) => {
                assert!(g.token > last, "{name}: token {} after {last}", g.token);
                last = g.token;
                grants += 1;
                // A failed release (leader change) leaves the lock to its lease; a new owner
                // would have to wait, so keep trying the release.
                for _ in 0..50 {
                    if client.release(&name, "churn", g.token).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
            // Unavailable during the changes: retried, as a client would.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    grants
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_a_dead_node_while_clients_take_locks() {
    let c = TestCluster::start("membership", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client();
    let held = within(
        "first grant",
        CALL,
        client.acquire("held", "keeper", TTL, Duration::ZERO, 0),
    )
    .await
    .expect("acquire")
    .expect("granted");

    // Bad changes first: each refused, the membership unchanged.
    refused(
        client
            .member_add(1, &c.grpc_addr(4), true, Duration::ZERO)
            .await,
        "adding an existing id",
        "already a voter",
    );
    refused(
        client
            .member_add(4, &c.grpc_addr(2), true, Duration::ZERO)
            .await,
        "adding an existing address",
        "already member 2's address",
    );
    refused(
        client.member_promote(4).await,
        "promoting a non-member",
        "not in the cluster",
    );
    refused(
        client.member_remove(9).await,
        "removing a non-member",
        "not in the cluster",
    );
    // Through a follower alone (its endpoint list lacks the leader): the follower passes the
    // change to the leader, whose refusal comes back.
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    refused(
        c.client_of(support::follower_of(leader))
            .member_remove(9)
            .await,
        "removing a non-member through a follower",
        "not in the cluster",
    );
    // A learner that never started cannot be promoted; it can be removed.
    let m = client
        .member_add(5, &c.grpc_addr(5), true, Duration::ZERO)
        .await
        .expect("adding learner 5");
    assert_eq!(ids(&m, false), [5], "5 is a learner: {m:?}");
    refused(
        client.member_promote(5).await,
        "promoting a learner that never answered",
        "has not caught up",
    );
    let m = client.member_remove(5).await.expect("removing learner 5");
    assert_eq!(ids(&m, true), [1, 2, 3]);
    assert!(ids(&m, false).is_empty(), "{m:?}");

    // Load: two clients take and release locks through everything below.
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = ["x", "y"]
        .into_iter()
        .map(|n| tokio::spawn(churn(c.client(), n.to_string(), stop.clone())))
        .collect();

    // Node 3's disk dies for good.
    c.kill(3);
    // With 3 gone, removing a live voter would leave {3, other}: no reachable majority.
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let other = [1, 2].into_iter().find(|id| *id != leader).unwrap_or(1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    refused(
        client.member_remove(other).await,
        "removing a live voter while another is dead",
        "answered the leader",
    );
    let m = within(
        "member add 4",
        CALL,
        client.member_add(4, &c.grpc_addr(4), true, Duration::ZERO),
    )
    .await
    .expect("adding learner 4");
    assert_eq!(ids(&m, false), [4]);
    // `fenced member list` shows it as a learner.
    let out = std::process::Command::new(support::bin())
        .args(["member", "list", "--endpoints", &c.endpoints().join(",")])
        .output()
        .expect("fenced member list");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "member list: {listed} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        listed.contains(r#""id":4"#) && listed.contains(r#""role":"learner""#),
        "member list: {listed}"
    );
    c.spawn_joiner(4);
    // It catches up (log or snapshot), then votes.
    let m = wait_for(
        "learner 4 caught up and promoted",
        Duration::from_secs(60),
        || async { client.member_promote(4).await.map_err(|e| e.to_string()) },
    )
    .await;
    assert_eq!(ids(&m, true), [1, 2, 3, 4]);
    let m = within("member remove 3", CALL, client.member_remove(3))
        .await
        .expect("removing dead member 3");
    assert_eq!(ids(&m, true), [1, 2, 4]);
    // Its id is never used again.
    refused(
        client
            .member_add(3, &c.grpc_addr(3), true, Duration::ZERO)
            .await,
        "re-adding removed member 3",
        "used before",
    );

    // Node 4 counts towards the quorum: with one of 1 and 2 down, the cluster still grants.
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let victim = if leader == 1 { 2 } else { 1 };
    c.kill(victim);
    let g = within(
        "a grant with node 4 in the quorum",
        CALL,
        client.acquire("after", "o", TTL, Duration::ZERO, 0),
    )
    .await
    .expect("acquire with 4 voting")
    .expect("granted");
    assert!(
        g.token > held.token,
        "tokens grow: {} after {}",
        g.token,
        held.token
    );
    // The lock taken before the changes is still held, with its token.
    let info = within("info held", CALL, client.info("held"))
        .await
        .expect("info")
        .expect("held is still held");
    assert_eq!(info.token, held.token);

    stop.store(true, Ordering::Relaxed);
    for (i, ch) in churners.into_iter().enumerate() {
        let grants = within("churner stops", CALL, ch).await.expect("churner");
        assert!(grants > 0, "churner {i} never got its lock");
    }

    // Down to the last voter, which is refused.
    c.restart(victim);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    for id in [1, 2, 4].into_iter().filter(|id| *id != leader) {
        wait_for(&format!("removing {id}"), CALL, || async {
            client.member_remove(id).await.map_err(|e| e.to_string())
        })
        .await;
    }
    refused(
        client.member_remove(leader).await,
        "removing the last voter",
        "last voter",
    );
}

/// `fenced serve --join` for a member the cluster does not list: refused before it starts,
/// naming the command that adds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_without_being_added_is_refused() {
    let c = TestCluster::start("membership_join", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    c.spawn_joiner(4);
    let status = c.wait_exit(4, Duration::from_secs(30)).await;
    assert!(!status.success(), "node 4 started without being added");
    let log = c.log_tail(4, 20);
    assert!(
        log.contains("is not in the membership") && log.contains("fenced member add 4"),
        "{log}"
    );
    assert!(
        !c.data_dir(4).exists()
            || std::fs::read_dir(c.data_dir(4)).map_or(true, |mut d| d.next().is_none()),
        "a refused join created a data dir"
    );
}
