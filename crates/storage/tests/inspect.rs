//! `fenced_storage::inspect`: a data dir's state rebuilt offline at a log index equals the
//! state the node had when it applied that entry, and the data dir is left as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use fenced_core::{Batch, Command, Event, Request, RequestId};
use fenced_raft_types::{NodeId, TypeConfig};
use fenced_storage::inspect::{state_at, InspectError};
use fenced_storage::open;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftSnapshotBuilder};
use tempfile::TempDir;

fn log_id(index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(2, 1), index)
}

fn acquire(index: u64, name: &str, owner: &str, wait_ms: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Batch::one(Request {
            time_ms: 100 * index,
            client: Some(RequestId {
                client_id: 9,
                seq: index,
            }),
            cmd: Command::Acquire {
                name: name.into(),
                owner: owner.into(),
                ttl_ms: 1_000,
                session: None,
                wait_ms,
            },
        })),
    }
}

/// 0 membership, 1 blank, then acquires whose leases expire as time goes on.
fn history() -> Vec<Entry<TypeConfig>> {
    let voters: BTreeSet<NodeId> = [1].into_iter().collect();
    let mut out = vec![
        Entry {
            log_id: log_id(0),
            payload: EntryPayload::Membership(Membership::new(vec![voters], None)),
        },
        Entry {
            log_id: log_id(1),
            payload: EntryPayload::Blank,
        },
    ];
    for i in 2..=12 {
        out.push(acquire(i, &format!("l{}", i % 3), &format!("o{i}"), 5_000));
    }
    out
}

/// Every file outside sled's own (which `inspect` never opens), with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for sub in ["", "wal", "snapshots"] {
        let Ok(listing) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for item in listing {
            let path = item.expect("entry").path();
            if path.is_file() {
                let name = path
                    .strip_prefix(dir)
                    .expect("inside")
                    .display()
                    .to_string();
                if ["db", "conf"].contains(&name.as_str()) || name.starts_with("snap.") {
                    continue;
                }
                out.insert(name, std::fs::read(&path).expect("read"));
            }
        }
    }
    out
}

#[tokio::test]
async fn rebuilt_state_equals_the_applied_state_at_each_index_and_nothing_is_written() {
    let dir = TempDir::new().expect("tempdir");
    let entries = history();
    let mut digests = BTreeMap::new();
    {
        let (mut log, mut sm) =
            open(dir.path(), Arc::new(|_: &[Event]| {})).expect("open the store");
        log.blocking_append(entries.clone()).await.expect("append");
        log.save_committed(Some(log_id(10))).await.expect("commit");
        for (i, e) in entries.iter().enumerate() {
            sm.apply(vec![e.clone()]).await.expect("apply");
            digests.insert(i as u64, sm.shared().read(|m| m.digest()));
            if i == 5 {
                sm.get_snapshot_builder()
                    .await
                    .build_snapshot()
                    .await
                    .expect("snapshot");
            }
        }
    }
    let before = files(dir.path());
    assert!(
        before.contains_key("hardstate") && before.len() >= 3,
        "{:?}",
        before.keys()
    );

    for index in 5..=12 {
        let r = state_at(dir.path(), Some(index)).expect("rebuild");
        assert_eq!(r.index, index);
        assert_eq!(r.log_id, log_id(index));
        assert_eq!(r.bounds.snapshot, Some(log_id(5)));
        assert_eq!(r.bounds.last, Some(log_id(12)));
        assert_eq!(
            r.machine.digest(),
            digests[&index],
            "the state rebuilt at {index} is the one applied"
        );
    }
    let last = state_at(dir.path(), None).expect("rebuild at the end");
    assert_eq!(last.index, 12);
    assert_eq!(last.machine.digest(), digests[&12]);
    // Digests of different indexes differ (the check would see a replica that lags).
    assert_ne!(digests[&11], digests[&12]);

    match state_at(dir.path(), Some(4)) {
        Err(e @ InspectError::BelowSnapshot { .. }) => {
            assert!(e.to_string().contains("below the snapshot"), "{e}")
        }
        other => panic!("index 4 is below the snapshot: {:?}", other.err()),
    }
    match state_at(dir.path(), Some(13)) {
        Err(InspectError::PastLog {
            index: 13,
            last_index: Some(12),
        }) => {}
        other => panic!("index 13 is past the log: {:?}", other.err()),
    }
    assert_eq!(files(dir.path()), before, "inspect changed the data dir");

    // The node still opens it and sees the same log.
    let (mut log, _sm) = open(dir.path(), Arc::new(|_: &[Event]| {})).expect("reopen");
    let state = log.get_log_state().await.expect("log state");
    assert_eq!(state.last_log_id, Some(log_id(12)));
}
