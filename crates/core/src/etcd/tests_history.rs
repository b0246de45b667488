//! etcd-visible behaviour of the history: compaction, the change feed, the encoding.

use super::tests::{del, get, pairs, put, put_op, txn};
use super::*;

#[test]
fn compaction_keeps_what_reads_at_or_above_see() {
    let mut s = EtcdStore::new();
    put(&mut s, 1, "a", "1");
    put(&mut s, 2, "a", "2");
    put(&mut s, 3, "b", "1");
    del(&mut s, 4, KeyRange::key("b"));
    put(&mut s, 6, "a", "3");
    put(&mut s, 7, "c", "1");
    del(&mut s, 8, KeyRange::key("c"));
    let bytes = s.history_bytes();
    assert_eq!(
        s.compact(9, 8),
        Err(EtcdError::FutureRevision { current: 8 })
    );
    let stats = s.compact(5, 8).expect("compact");
    // a@1 goes (a@2 is the newest at or below 5); b's history ends in a tombstone: all gone.
    assert_eq!(stats.removed, 3);
    assert_eq!(s.history_bytes(), bytes - stats.freed_bytes);
    assert_eq!(s.compact_revision(), 5);
    assert_eq!(get(&s, KeyRange::all(), 5, 8), pairs(&[("a", "2")]));
    assert_eq!(
        get(&s, KeyRange::all(), 7, 8),
        pairs(&[("a", "3"), ("c", "1")])
    );
    assert_eq!(
        s.compact(5, 8),
        Err(EtcdError::Compacted {
            compact_revision: 5
        })
    );
    assert_eq!(
        s.events_since(3, &KeyRange::all(), 0, false),
        Err(EtcdError::Compacted {
            compact_revision: 5
        })
    );
    let ev = s
        .events_since(5, &KeyRange::all(), 0, true)
        .expect("events");
    assert_eq!(ev.events.len(), 3);
    assert_eq!(
        ev.events[0].prev_kv.as_ref().map(|kv| kv.mod_revision),
        Some(2)
    );
    s.compact(8, 8).expect("compact");
    assert_eq!(s.version_count(), 1);
    assert_eq!(get(&s, KeyRange::all(), 0, 8), pairs(&[("a", "3")]));
}

#[test]
fn events_pages_never_split_a_revision() {
    let mut s = EtcdStore::new();
    put(&mut s, 2, "a", "1");
    let req = TxnRequest {
        success: vec![put_op("b", "1"), put_op("c", "1"), put_op("x", "1")],
        ..TxnRequest::default()
    };
    txn(&mut s, 4, &req).expect("txn");
    put(&mut s, 7, "a", "2");
    del(&mut s, 9, KeyRange::key("a"));
    let page = s.events_since(0, &KeyRange::all(), 2, true).expect("page");
    // The limit is reached inside revision 4: the page takes all of it.
    assert_eq!(page.events.len(), 4);
    assert_eq!((page.resume_after, page.more), (4, true));
    let page = s
        .events_since(4, &KeyRange::prefix("a"), 1, true)
        .expect("page");
    assert_eq!(page.events.len(), 1);
    assert_eq!(
        page.events[0].prev_kv.as_ref().map(|kv| kv.mod_revision),
        Some(2)
    );
    assert_eq!((page.resume_after, page.more), (7, true));
    let page = s
        .events_since(7, &KeyRange::prefix("a"), 1, true)
        .expect("page");
    let e = &page.events[0];
    assert_eq!(e.kind, EventKind::Delete);
    assert_eq!(
        e.kv,
        KeyValue {
            key: b"a".to_vec(),
            mod_revision: 9,
            ..KeyValue::default()
        }
    );
    assert_eq!(
        e.prev_kv.as_ref().map(|kv| kv.value.as_slice()),
        Some(&b"2"[..])
    );
    assert_eq!((page.resume_after, page.more), (9, false));
    let page = s.events_since(9, &KeyRange::all(), 1, true).expect("page");
    assert!(page.events.is_empty());
    assert_eq!((page.resume_after, page.more), (9, false));
    // A watch from a future revision: nothing yet, and it stays where it asked.
    let page = s.events_since(20, &KeyRange::all(), 1, true).expect("page");
    assert_eq!((page.events.len(), page.resume_after), (0, 20));
}

#[test]
fn encoding_rebuilds_the_indexes() {
    let mut s = EtcdStore::new();
    put(&mut s, 1, "a", "1");
    put(&mut s, 3, "b", "1");
    put(&mut s, 4, "a", "2");
    del(&mut s, 5, KeyRange::key("b"));
    s.compact(2, 5).expect("compact");
    let bytes = bincode::serialize(&s).expect("encode");
    let back: EtcdStore = bincode::deserialize(&bytes).expect("decode");
    assert_eq!(back, s);
    assert_eq!(back.history_bytes(), s.history_bytes());
    assert_eq!(bincode::serialize(&back).expect("encode"), bytes);
    // Only the history is encoded: the snapshot of an empty store is tiny.
    assert_eq!(
        bincode::serialize(&EtcdStore::new()).expect("encode").len(),
        25
    );
}

#[test]
fn compaction_in_bounded_steps() {
    let mut s = EtcdStore::new();
    // A hot key with a long history, and a few others.
    for rev in 1..=100 {
        put(&mut s, rev, "hot", &rev.to_string());
    }
    put(&mut s, 101, "a", "1");
    del(&mut s, 102, KeyRange::key("a"));
    put(&mut s, 103, "b", "1");
    let all_at_once = {
        let mut c = s.clone();
        c.compact(102, 103).expect("compact");
        c
    };
    let reads = |s: &EtcdStore| {
        (102..=103)
            .map(|r| get(s, KeyRange::all(), r, 103))
            .collect::<Vec<_>>()
    };
    let want = reads(&all_at_once);
    s.begin_compact(102, 103).expect("begin");
    assert!(s.compaction_pending());
    assert_eq!(
        reads(&s),
        want,
        "reads at or above it do not wait for the steps"
    );
    assert_eq!(
        s.events_since(100, &KeyRange::all(), 0, false),
        Err(EtcdError::Compacted {
            compact_revision: 102
        })
    );
    let mut steps = 0;
    loop {
        let stats = s.compact_step(10);
        assert!(stats.removed <= 10);
        steps += 1;
        assert!(steps < 100, "every step makes progress");
        assert_eq!(reads(&s), want);
        if !stats.pending {
            break;
        }
    }
    assert!(steps >= 10, "99 versions of one key take several steps");
    assert_eq!(s, all_at_once);
    assert_eq!(
        bincode::serialize(&s).ok(),
        bincode::serialize(&all_at_once).ok()
    );
    assert_eq!((s.version_count(), s.compaction_pending()), (2, false));
    // A compaction begun while one is unfinished carries on to the new revision.
    put(&mut s, 104, "b", "2");
    put(&mut s, 105, "b", "3");
    s.begin_compact(104, 105).expect("begin");
    s.compact_step(1);
    s.begin_compact(105, 105).expect("begin");
    for _ in 0..10 {
        if !s.compact_step(1).pending {
            break;
        }
    }
    assert!(!s.compaction_pending(), "a budget of 1 makes progress");
    assert_eq!(s.version_count(), 2);
    assert_eq!(
        get(&s, KeyRange::all(), 105, 105),
        pairs(&[("b", "3"), ("hot", "100")])
    );
}

#[test]
fn a_watch_may_start_at_the_compact_revision_and_gets_its_puts_but_not_its_deletes() {
    let mut s = EtcdStore::new();
    put(&mut s, 1, "a", "1");
    put(&mut s, 2, "b", "1");
    // Revision 5 puts a and deletes b.
    let req = TxnRequest {
        success: vec![
            put_op("a", "2"),
            RequestOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::key("b"),
                prev_kv: false,
            }),
        ],
        ..TxnRequest::default()
    };
    txn(&mut s, 5, &req).expect("txn");
    put(&mut s, 7, "c", "1");
    let at_5 = |s: &EtcdStore| -> Vec<(EventKind, Revision)> {
        s.events_since(4, &KeyRange::all(), 0, false)
            .expect("a watch from the compact revision")
            .events
            .iter()
            .map(|e| (e.kind, e.kv.mod_revision))
            .collect()
    };
    // Before compaction revision 5 has both changes.
    assert_eq!(
        at_5(&s),
        [
            (EventKind::Put, 5),
            (EventKind::Delete, 5),
            (EventKind::Put, 7)
        ]
    );
    // Compacting to 5 in steps: the delete at 5 is left out at once, before the step that
    // removes its tombstone, and after.
    s.begin_compact(5, 7).expect("begin");
    assert_eq!(at_5(&s), [(EventKind::Put, 5), (EventKind::Put, 7)]);
    while s.compaction_pending() {
        s.compact_step(1);
    }
    assert_eq!(at_5(&s), [(EventKind::Put, 5), (EventKind::Put, 7)]);
    // Below it: compacted.
    assert_eq!(
        s.events_since(3, &KeyRange::all(), 0, false),
        Err(EtcdError::Compacted {
            compact_revision: 5
        })
    );
}

/// Issue 38, item 3: compaction at a revision taken by commands that are not etcd writes
/// (lock grants, keep-alives) cancels no synced watcher — it missed nothing — while one that
/// had not seen a write now compacted is still cancelled, and so is a new watch below it.
#[test]
fn a_synced_watcher_survives_a_compaction_past_it_that_removed_no_write_it_missed() {
    let mut s = EtcdStore::new();
    put(&mut s, 2, "a", "1");
    put(&mut s, 5, "b", "1");
    // Revisions 6..=40 are lock commands; compaction at 40, then a write at 41.
    s.compact(40, 40).expect("compact");
    put(&mut s, 41, "a", "2");
    let range = KeyRange::prefix("");
    // Caught up at 30 (after the write at 5): it may read on from 40 and sees the put at 41.
    let from = s.synced_position(30);
    assert_eq!(from, 40);
    let page = s
        .events_since(from, &range, 0, false)
        .expect("not compacted");
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].kv.mod_revision, 41);
    // Caught up exactly at the last compacted write.
    assert_eq!(s.synced_position(5), 40);
    // At 4 it had not seen the write at 5, which compaction removed: cancelled.
    assert_eq!(s.synced_position(4), 4);
    assert_eq!(
        s.events_since(4, &range, 0, false).map(|_| ()),
        Err(EtcdError::Compacted {
            compact_revision: 40
        })
    );
    // A later compaction that removes the write at 41 cancels the watcher still at 40.
    s.compact(45, 45).expect("compact");
    assert_eq!(s.synced_position(40), 40);
    assert_eq!(s.synced_position(41), 45);
    // Decoded (a snapshot install, a restart), the store cannot tell: conservative.
    let bytes = bincode::serialize(&s).expect("encode");
    let back: EtcdStore = bincode::deserialize(&bytes).expect("decode");
    assert_eq!(
        back, s,
        "the local knowledge is no part of the replicated state"
    );
    assert_eq!(
        back.synced_position(41),
        45,
        "last write 41 is below the compact revision"
    );
    let mut later = back.clone();
    put(&mut later, 50, "c", "1");
    let back: EtcdStore =
        bincode::deserialize(&bincode::serialize(&later).expect("encode")).expect("decode");
    assert_eq!(
        back.synced_position(42),
        42,
        "writes after 45 exist: unknown below it"
    );
}
