//! Ad-hoc timing of `purge` (openraft's `purge_logs_upto`: the durable write of the last
//! purged log id, then the log's segments): the median of [`CALLS`] calls on one store, in a
//! data dir under the system's temp dir. Ignored by default; run with
//! `cargo test -p fenced-storage --test purge_timing -- --ignored --nocapture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftSnapshotBuilder};

const CALLS: u64 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn purge_timing() {
    let dir = tempfile::TempDir::new().unwrap();
    let (mut log, mut sm) =
        fenced_storage::open(dir.path(), Arc::new(|_: &[fenced_core::Event]| {})).unwrap();
    let id = |i: u64| LogId::new(CommittedLeaderId::new(1, 1), i);
    let entries: Vec<Entry<fenced_raft_types::TypeConfig>> = (1..=CALLS + 1)
        .map(|i| Entry {
            log_id: id(i),
            payload: EntryPayload::Blank,
        })
        .collect();
    log.blocking_append(entries.clone()).await.unwrap();
    sm.apply(entries).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let mut took: Vec<Duration> = Vec::new();
    for i in 1..=CALLS {
        let started = Instant::now();
        log.purge(id(i)).await.unwrap();
        took.push(started.elapsed());
    }
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "purge, {CALLS} calls: median {:?}, p10 {:?}, p90 {:?}, max {:?}",
        at(0.5),
        at(0.1),
        at(0.9),
        at(1.0)
    );
}
