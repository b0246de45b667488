//! Kleppmann's scenario end to end ("How to do distributed locking", 2016): client A takes
//! the lock and is paused past its lease; client B takes the lock and writes; A wakes up and
//! writes with its old token. The storage rejects A's write as stale and B's data survives.
//!
//! Run twice: against a storage service that embeds `fenced_fence_check::FenceStore`, and against
//! the same write *without* token validation, to show what fencing prevents.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use fenced_client::{Client, Grant};
use fenced_fence_check::{FenceStore, GuardError};
use support::TestCluster;

const LEASE: Duration = Duration::from_millis(800);

/// Client A takes the lock and is paused (GC, SIGSTOP, a network stall) past its lease —
/// it sends nothing meanwhile; client B then takes the lock. Returns both clients and grants.
async fn a_paused_b_took_over(c: &TestCluster) -> (Client, Client, Grant, Grant) {
    c.wait_for_leader(Duration::from_secs(20)).await;
    let a = Client::connect(c.endpoints()).expect("client a");
    let b = Client::connect(c.endpoints()).expect("client b");
    let ga = a
        .acquire("file", "client-a", LEASE, Duration::ZERO, 0)
        .await
        .expect("a acquires")
        .expect("granted");
    tokio::time::sleep(LEASE * 3).await;
    let gb = b
        .acquire("file", "client-b", LEASE * 10, Duration::from_secs(10), 0)
        .await
        .expect("b acquires")
        .expect("granted after A's lease ran out");
    assert!(
        gb.token > ga.token,
        "tokens went backwards: {} then {}",
        ga.token,
        gb.token
    );
    (a, b, ga, gb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_write_is_rejected_and_the_new_holders_data_survives() {
    let c = TestCluster::start("kleppmann", &[]);
    let storage_dir = tempfile::tempdir().expect("tempdir");
    let storage = FenceStore::open(storage_dir.path()).expect("storage");
    let (a, _b, ga, gb) = a_paused_b_took_over(&c).await;

    // B writes.
    storage
        .put("file", b"written by B", gb.token)
        .expect("B's write is accepted");

    // A wakes up, still believing it holds the lock, and writes with its token.
    match storage.put("file", b"written by A", ga.token) {
        Err(GuardError::Stale {
            presented, highest, ..
        }) => assert_eq!((presented, highest), (ga.token, gb.token)),
        other => panic!("the paused client's write was not rejected: {other:?}"),
    }
    assert_eq!(
        storage.get("file").expect("read"),
        Some((b"written by B".to_vec(), gb.token)),
        "B's data did not survive"
    );
    // And fenced itself says A no longer holds it.
    assert!(!a
        .release("file", "client-a", ga.token)
        .await
        .expect("release"));

    // Without validation, the same interleaving loses B's write: the reason for fencing.
    let unfenced = FenceStore::open(storage_dir.path().join("unfenced")).expect("unfenced");
    unfenced.put_unfenced("file", b"written by B").expect("B");
    unfenced.put_unfenced("file", b"written by A").expect("A");
    assert_eq!(
        unfenced.get("file").expect("read").map(|(v, _)| v),
        Some(b"written by A".to_vec()),
        "the unfenced store should show the lost update"
    );
}

/// The same scenario with fenced's own keyspace as the protected storage (`FencedPut`, the
/// gRPC twin of RESP's `FENCE.SET`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_keyspace_rejects_the_paused_holders_write() {
    let c = TestCluster::start("kleppmann_kv", &[]);
    let (a, b, ga, gb) = a_paused_b_took_over(&c).await;
    b.fenced_put("file", b"written by B", gb.token)
        .await
        .expect("call")
        .expect("B's write is accepted");
    let stale = a
        .fenced_put("file", b"written by A", ga.token)
        .await
        .expect("call")
        .expect_err("the paused client's write was accepted");
    assert_eq!((stale.presented, stale.highest), (ga.token, gb.token));
    assert_eq!(
        a.get("file").await.expect("get"),
        Some((b"written by B".to_vec(), gb.token)),
        "B's data did not survive"
    );
}
