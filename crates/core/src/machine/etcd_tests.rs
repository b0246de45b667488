//! The etcd keyspace applied through [`Command::Etcd`].

use super::StateMachine;
use crate::command::*;
use crate::etcd::{
    CompareResult, CompareTarget, DeleteRangeRequest, EtcdError, KeyRange, PutRequest,
    RangeRequest, RequestOp, TxnRequest,
};
use crate::kv::KvCommand;
use crate::CoreError;

/// One replica, fed one command per entry (shared with `quota_tests`).
pub(super) struct Log {
    pub(super) sm: StateMachine,
    pub(super) index: Index,
    pub(super) semantics: Semantics,
}

impl Log {
    pub(super) fn new() -> Log {
        Log {
            sm: StateMachine::new(),
            index: 0,
            semantics: Semantics::ETCD,
        }
    }

    /// `cmd` in an entry of its own: its response and events.
    pub(super) fn apply(&mut self, client: Option<RequestId>, cmd: Command) -> AppliedBatch {
        self.index += 1;
        let batch = Batch {
            requests: vec![Request {
                time_ms: 1_000 + self.index,
                client,
                cmd,
            }],
            semantics: self.semantics,
        };
        self.sm.apply_batch(self.index, &batch)
    }

    fn run(&mut self, client: Option<RequestId>, cmd: Command) -> Response {
        let mut out = self.apply(client, cmd);
        out.responses.pop().expect("one response")
    }

    pub(super) fn etcd(&mut self, cmd: EtcdCommand) -> Response {
        self.run(None, Command::Etcd(cmd))
    }

    fn put(&mut self, key: &str, value: &str) -> Revision {
        match self.etcd(EtcdCommand::Put(PutRequest::new(key, value))) {
            Response::Etcd {
                revision,
                wrote: true,
                ..
            } => revision,
            other => panic!("put {key}: {other:?}"),
        }
    }

    fn redis(&mut self, args: &[&str]) -> Response {
        let argv = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        self.run(None, Command::Kv(KvCommand::Batch(vec![argv])))
    }
}

fn get(sm: &StateMachine, key: &str) -> Option<(Vec<u8>, Revision)> {
    let r = sm
        .etcd_range(&RangeRequest::new(KeyRange::key(key)))
        .expect("range");
    r.kvs.first().map(|kv| (kv.value.clone(), kv.mod_revision))
}

#[test]
fn a_put_takes_the_next_revision_and_its_key_carries_it() {
    let mut log = Log::new();
    let r1 = log.put("a", "1");
    assert_eq!(r1, 1);
    assert_eq!(log.sm.revision(), 1);
    let lock = log.run(
        None,
        Command::Acquire {
            name: "L".into(),
            owner: "o".into(),
            ttl_ms: 60_000,
            session: None,
            wait_ms: 0,
        },
    );
    assert!(
        matches!(lock, Response::Granted { token: 2, .. }),
        "{lock:?}"
    );
    let prev = PutRequest {
        prev_kv: true,
        ..PutRequest::new("a", "2")
    };
    match log.etcd(EtcdCommand::Put(prev)) {
        Response::Etcd {
            revision: 3,
            wrote: true,
            reply: EtcdReply::Put(p),
        } => {
            let prev = p.prev_kv.expect("prev kv");
            assert_eq!((prev.value.as_slice(), prev.mod_revision), (&b"1"[..], 1));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(get(&log.sm, "a"), Some((b"2".to_vec(), 3)));
    assert_eq!(log.sm.etcd().last_write(), 3);
}

#[test]
fn a_refused_call_takes_a_revision_and_changes_nothing_else() {
    let mut log = Log::new();
    log.put("a", "1");
    let etcd_before = log.sm.etcd().clone();
    let before = log.sm.revision();
    let r = log.etcd(EtcdCommand::Put(PutRequest::new("", "x")));
    assert_eq!(r, Response::Rejected(CoreError::Etcd(EtcdError::EmptyKey)));
    assert_eq!(log.sm.revision(), before + 1, "like any refused command");
    assert_eq!(log.sm.etcd(), &etcd_before);
    // A lease that does not exist (no leases yet).
    let leased = PutRequest {
        lease: 7,
        ..PutRequest::new("b", "x")
    };
    let r = log.etcd(EtcdCommand::Put(leased));
    assert!(
        matches!(
            r,
            Response::Rejected(CoreError::Etcd(EtcdError::LeaseNotFound { lease: 7 }))
        ),
        "{r:?}"
    );
    // A compaction at a revision to come.
    let r = log.etcd(EtcdCommand::Compact { revision: 99 });
    assert!(
        matches!(
            r,
            Response::Rejected(CoreError::Etcd(EtcdError::FutureRevision { .. }))
        ),
        "{r:?}"
    );
    assert_eq!(log.sm.etcd(), &etcd_before);
    assert_eq!(log.sm.revision(), before + 3);
}

#[test]
fn a_call_that_writes_nothing_still_takes_its_revision() {
    let mut log = Log::new();
    log.put("a", "1");
    let etcd_before = log.sm.etcd().clone();
    let r = log.etcd(EtcdCommand::DeleteRange(DeleteRangeRequest {
        range: KeyRange::key("nope"),
        prev_kv: false,
    }));
    match r {
        Response::Etcd {
            revision: 2,
            wrote: false,
            reply: EtcdReply::DeleteRange(d),
        } => assert_eq!(d.deleted, 0),
        other => panic!("{other:?}"),
    }
    assert_eq!(log.sm.etcd(), &etcd_before);
    // A txn whose branch only reads: the same.
    let txn = TxnRequest {
        compare: vec![crate::etcd::Compare {
            range: KeyRange::key("a"),
            result: CompareResult::Equal,
            target: CompareTarget::Value(b"1".to_vec()),
        }],
        success: vec![RequestOp::Range(RangeRequest::new(KeyRange::key("a")))],
        failure: vec![RequestOp::Put(PutRequest::new("a", "other"))],
    };
    let r = log.etcd(EtcdCommand::Txn(txn.clone()));
    assert!(
        matches!(r, Response::Etcd { revision: 3, wrote: false, reply: EtcdReply::Txn(ref t) } if t.succeeded),
        "{r:?}"
    );
    // The read path gives the same answer.
    let read = log.sm.etcd_txn_read_only(&txn).expect("read-only txn");
    assert!(read.succeeded);
    assert_eq!(log.sm.etcd(), &etcd_before);
    // Every write after it carries a later revision.
    assert_eq!(log.put("a", "2"), 4);
}

#[test]
fn a_retried_etcd_call_answers_its_first_outcome_and_writes_once() {
    let mut log = Log::new();
    let rid = Some(RequestId {
        client_id: 9,
        seq: 1,
    });
    let cmd = Command::Etcd(EtcdCommand::Put(PutRequest::new("k", "v")));
    let first = log.run(rid, cmd.clone());
    let versions = log.sm.etcd().version_count();
    let again = log.run(rid, cmd);
    assert_eq!(first, again);
    assert_eq!(log.sm.etcd().version_count(), versions);
}

#[test]
fn redis_commands_never_touch_the_etcd_keyspace() {
    let mut log = Log::new();
    let mut plain = Log::new();
    log.put("k", "etcd");
    plain.run(None, Command::Tick);
    for args in [
        &["SET", "k", "redis", "PX", "10"][..],
        &["GET", "k"],
        &["FLUSHALL"],
        &["SET", "x", "1"],
    ] {
        assert_eq!(log.redis(args), plain.redis(args), "{args:?}");
    }
    // Expiry of the Redis key and FLUSHALL left the etcd key alone.
    log.run(None, Command::Tick);
    plain.run(None, Command::Tick);
    assert_eq!(get(&log.sm, "k"), Some((b"etcd".to_vec(), 1)));
    assert_eq!(log.sm.revision(), plain.sm.revision());
    assert_eq!(log.sm.kv(), plain.sm.kv());
}

#[test]
fn an_etcd_command_in_an_entry_of_older_rules_is_refused() {
    let mut log = Log::new();
    log.semantics = Semantics::DETERMINISTIC;
    let r = log.etcd(EtcdCommand::Put(PutRequest::new("k", "v")));
    assert!(
        matches!(
            r,
            Response::Rejected(CoreError::NotUpgraded { needs: 3, .. })
        ),
        "{r:?}"
    );
    assert!(log.sm.etcd().is_untouched());
    assert_eq!(log.sm.body_version(), 1);
    assert_eq!(log.sm.revision(), 1);
}

#[test]
fn a_large_compaction_finishes_in_steps_over_later_commands() {
    let mut log = Log::new();
    // About 2 units of work per version (walk, removal): several steps.
    let n = 3 * super::COMPACT_STEP_BUDGET;
    for i in 0..n {
        log.put(&format!("k{}", i % 10), &i.to_string());
    }
    let last = log.sm.revision();
    match log.etcd(EtcdCommand::Compact { revision: last }) {
        Response::Etcd {
            wrote: false,
            reply: EtcdReply::Compact(stats),
            ..
        } => assert!(stats.pending, "{stats:?}"),
        other => panic!("{other:?}"),
    }
    // Reads and watches below the compact revision fail from the command on.
    let old = RangeRequest {
        revision: last - 1,
        ..RangeRequest::new(KeyRange::key("k0"))
    };
    assert!(matches!(
        log.sm.etcd_range(&old),
        Err(EtcdError::Compacted { .. })
    ));
    assert!(log.sm.etcd().compaction_pending());
    // Any later command (a Redis one too) does a step.
    let mut steps = 0;
    while log.sm.etcd().compaction_pending() {
        log.redis(&["PING"]);
        steps += 1;
        assert!(steps < 20, "compaction does not progress");
    }
    assert!(steps >= 2, "{steps} steps");
    assert_eq!(log.sm.etcd().version_count(), 10);
    assert_eq!(
        get(&log.sm, "k9"),
        Some(((n - 1).to_string().into_bytes(), last))
    );
    log.sm.check_invariants().expect("consistent");
}

#[test]
fn watch_catch_up_reads_the_change_feed_of_a_state_clone() {
    let mut log = Log::new();
    let r1 = log.put("w/a", "1");
    log.redis(&["SET", "x", "1"]);
    let r2 = log.put("w/b", "2");
    log.etcd(EtcdCommand::DeleteRange(DeleteRangeRequest {
        range: KeyRange::prefix("w/"),
        prev_kv: false,
    }));
    let clone = log.sm.clone();
    log.put("w/c", "3");
    let page = clone
        .etcd_events_since(r1, &KeyRange::prefix("w/"), 0, true)
        .expect("events");
    let revs: Vec<Revision> = page.events.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(revs, vec![r2, r2 + 1, r2 + 1]);
    assert_eq!(page.resume_after, r2 + 1);
}

#[test]
fn snapshot_bodies_round_trip_and_the_digest_covers_the_etcd_keyspace() {
    let mut a = Log::new();
    let mut b = Log::new();
    for log in [&mut a, &mut b] {
        log.redis(&["SET", "x", "1"]);
    }
    // Untouched: the body and the digest of before the etcd keyspace (version 1).
    assert_eq!(a.sm.body_version(), 1);
    assert_eq!(
        a.sm.to_bytes(),
        bincode::serialize(&a.sm).expect("encodes"),
        "a state without etcd keys encodes as before"
    );
    a.put("k", "1");
    b.put("k", "2");
    assert_eq!(a.sm.body_version(), 2);
    assert_ne!(a.sm.digest(), b.sm.digest(), "etcd values differ");
    assert_eq!(a.sm.revision(), b.sm.revision());
    let bytes = a.sm.to_bytes();
    let back = StateMachine::from_bytes(&bytes).expect("decodes");
    assert_eq!(back, a.sm);
    assert_eq!(back.digest(), a.sm.digest());
    let read = StateMachine::read_body(2, super::body::options(), bytes.as_slice()).expect("v2");
    assert_eq!(read, a.sm);
    assert!(matches!(
        StateMachine::read_body(
            super::BODY_VERSION + 1,
            super::body::options(),
            bytes.as_slice()
        ),
        Err(crate::SnapshotError::Decode(e))
            if e.to_string().contains(&format!("body version {}", super::BODY_VERSION + 1))
    ));
    // The derived indexes come back: reads on the decoded state are the same.
    assert_eq!(get(&back, "k"), get(&a.sm, "k"));
}

#[test]
fn restore_marks_the_etcd_history_compacted_at_the_bumped_revision() {
    let mut log = Log::new();
    let r1 = log.put("a", "1");
    log.put("a", "2");
    log.put("b", "1");
    log.etcd(EtcdCommand::DeleteRange(DeleteRangeRequest {
        range: KeyRange::key("b"),
        prev_kv: false,
    }));
    let before = log.sm.revision();
    let restored = log.sm.prepare_restore(1_000).expect("fits");
    assert_eq!(restored.etcd_keys, 1);
    assert_eq!(restored.etcd_compact_revision, before + 1_000);
    assert_eq!(log.sm.etcd().compact_revision(), before + 1_000);
    // Live keys stay, history goes: one version left.
    assert_eq!(log.sm.etcd().version_count(), 1);
    assert_eq!(get(&log.sm, "a"), Some((b"2".to_vec(), r1 + 1)));
    // A watch resuming from before the restore must start over.
    assert!(matches!(
        log.sm.etcd_events_since(before, &KeyRange::all(), 0, false),
        Err(EtcdError::Compacted { compact_revision }) if compact_revision == before + 1_000
    ));
    let at_old = RangeRequest {
        revision: before,
        ..RangeRequest::new(KeyRange::key("a"))
    };
    assert!(matches!(
        log.sm.etcd_range(&at_old),
        Err(EtcdError::Compacted { .. })
    ));
    let page = log
        .sm
        .etcd_events_since(before + 1_000, &KeyRange::all(), 0, false)
        .expect("from the bump on");
    assert!(page.events.is_empty());
    // Writes go on above the bump; a state that never had etcd keys stays untouched.
    log.index = 0;
    assert_eq!(log.put("c", "1"), before + 1_001);
    let mut plain = StateMachine::new();
    plain.prepare_restore(1_000).expect("fits");
    assert!(plain.etcd().is_untouched());
    assert_eq!(plain.body_version(), 1);
}

#[test]
fn etcd_writes_and_compactions_wake_watches_and_nothing_else_does() {
    let mut log = Log::new();
    let events_of = |log: &mut Log, cmd: Command| log.apply(None, cmd).events;
    let put = events_of(
        &mut log,
        Command::Etcd(EtcdCommand::Put(PutRequest::new("a", "1"))),
    );
    let rev = log.sm.revision();
    assert_eq!(put, [Event::EtcdChanged { revision: rev }]);
    // A delete that matches nothing writes nothing: no wake-up.
    let none = events_of(
        &mut log,
        Command::Etcd(EtcdCommand::DeleteRange(DeleteRangeRequest {
            range: KeyRange::key("missing"),
            prev_kv: false,
        })),
    );
    assert!(none.is_empty(), "{none:?}");
    // Neither do other commands.
    assert!(events_of(&mut log, Command::Tick).is_empty());
    let compact = events_of(
        &mut log,
        Command::Etcd(EtcdCommand::Compact { revision: rev }),
    );
    assert_eq!(
        compact,
        [Event::EtcdChanged {
            revision: log.sm.revision()
        }],
        "a compaction wakes watches (those below it are cancelled)"
    );
}
