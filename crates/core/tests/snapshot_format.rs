//! The snapshot format does not change by accident: a state with every kind of record (each
//! lock kind, readers and permits past the small-map threshold, waiters, sessions, lock-delay,
//! dedup records, keys of every type with expiries, fences, scripts) encodes to exactly the
//! bytes stored in `tests/data/snapshot-format2.bin`, written by the build that introduced
//! format 2, and those bytes decode to the same state.
//!
//! That state has no etcd keys, so it is still written as snapshot body version 1. The same
//! state with an etcd keyspace (puts, a txn, deletes, a compaction still in progress) is body
//! version 2: `tests/data/snapshot-body2.bin`, written by the build that introduced it. With
//! an etcd space quota set and its `NOSPACE` alarm raised, body version 3:
//! `tests/data/snapshot-body3.bin`.
//!
//! `FENCED_BLESS=1 cargo test -p fenced-core --test snapshot_format` rewrites the files — only
//! for a deliberate format change, which also needs a new body version.

use fenced_core::etcd::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyRange, PutRequest, RangeRequest,
    RequestOp, TxnRequest,
};
use fenced_core::kv::KvCommand;
use fenced_core::{
    AcquireSpec, Batch, Command, EtcdCommand, Mode, Request, RequestId, Semantics, StateMachine,
};

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/snapshot-format2.bin"
);
const GOLDEN_BODY2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/snapshot-body2.bin");
const GOLDEN_BODY3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/snapshot-body3.bin");

fn opts() -> impl bincode::Options + Clone {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
}

fn rich_state() -> StateMachine {
    let mut sm = StateMachine::default();
    let mut seq = 0;
    let mut index = 0;
    let mut apply = |sm: &mut StateMachine, time_ms: u64, cmds: Vec<Command>| {
        index += 1;
        let requests = cmds
            .into_iter()
            .map(|cmd| {
                seq += 1;
                Request {
                    time_ms,
                    client: Some(RequestId {
                        client_id: 1 + seq % 3,
                        seq,
                    }),
                    cmd,
                }
            })
            .collect();
        sm.apply_batch(
            index,
            &Batch {
                requests,
                semantics: Semantics::REVISIONS,
            },
        );
    };
    let acquire = |name: &str, owner: &str, wait_ms: u64| Command::Acquire {
        name: name.into(),
        owner: owner.into(),
        ttl_ms: 600_000,
        session: None,
        wait_ms,
    };
    let spec = |names: &[&str], owner: &str, mode: Mode, session: Option<u64>, ttl_ms| {
        Command::AcquireWith(Box::new(AcquireSpec {
            names: names.iter().map(|n| n.to_string()).collect(),
            owner: owner.into(),
            mode,
            ttl_ms,
            session,
            wait_ms: 500_000,
            lock_delay_ms: 100_000,
        }))
    };
    let kv = |args: &[&str]| {
        Command::Kv(KvCommand::Batch(vec![args
            .iter()
            .map(|a| a.as_bytes().to_vec())
            .collect()]))
    };
    apply(
        &mut sm,
        1_000,
        vec![
            acquire("a", "o1", 0),
            acquire("a", "o2", 500_000),
            acquire("b", "o1", 0),
            acquire("b", "o1", 0),
            Command::OpenSession { ttl_ms: 600_000 },
        ],
    );
    let session = sm.revision();
    apply(
        &mut sm,
        1_100,
        vec![
            spec(
                &["m1", "m2", "m3"],
                "multi",
                Mode::Exclusive,
                Some(session),
                0,
            ),
            spec(&["rw"], "writer", Mode::Write, None, 600_000),
            spec(&["rw"], "reader0", Mode::Read, Some(session), 0),
        ],
    );
    let readers = (0..20)
        .map(|i| spec(&["r"], &format!("reader{i}"), Mode::Read, None, 600_000))
        .collect();
    apply(&mut sm, 1_200, readers);
    let permits = (0..18)
        .map(|i| {
            let permit = Mode::Permit { permits: 20 };
            spec(&["sem"], &format!("p{i}"), permit, None, 600_000)
        })
        .collect();
    apply(&mut sm, 1_300, permits);
    apply(
        &mut sm,
        1_400,
        vec![
            kv(&["SET", "s", "v", "PX", "500000"]),
            kv(&["HSET", "h", "f1", "1", "f2", "2"]),
            kv(&["RPUSH", "l", "x", "y", "z"]),
            kv(&["ZADD", "z", "1", "one", "2.5", "two"]),
            kv(&["FENCE.SET", "acct", "100", "7"]),
            kv(&["SCRIPT", "LOAD", "return redis.call('GET', KEYS[1])"]),
            kv(&["INCRBY", "n", "41"]),
        ],
    );
    // A lease that ran out with a lock-delay, and time moving on.
    apply(
        &mut sm,
        40_000,
        vec![
            spec(&["late"], "x", Mode::Exclusive, None, 1_000),
            Command::Tick,
        ],
    );
    apply(&mut sm, 75_000, vec![Command::Tick, acquire("c", "o3", 0)]);
    sm
}

#[test]
fn snapshot_bytes_are_the_format_2_bytes() {
    let state = rich_state();
    // The state holds what the scenario means it to.
    let info = |n: &str| state.lock_info(n).unwrap_or_else(|| panic!("{n} is held"));
    assert_eq!((info("a").owner.as_str(), info("a").waiters), ("o1", 1));
    assert_eq!(info("b").holds, 2);
    assert_eq!(info("r").holders.len(), 20);
    assert_eq!(info("sem").holders.len(), 18);
    assert_eq!(info("rw").owner, "writer");
    assert!(info("m2").session.is_some());
    assert!(
        state.lock_info("late").is_none(),
        "expired, in its lock-delay"
    );
    assert_eq!(state.kv().len(state.now()), 6);
    assert_eq!(state.kv().fence(b"acct"), 7);
    let bytes = state.to_bytes();
    if std::env::var_os("FENCED_BLESS").is_some() {
        std::fs::create_dir_all(std::path::Path::new(GOLDEN).parent().expect("dir"))
            .expect("mkdir");
        std::fs::write(GOLDEN, &bytes).expect("write golden");
        return;
    }
    let golden = std::fs::read(GOLDEN).expect("tests/data/snapshot-format2.bin");
    assert_eq!(state.body_version(), 1);
    let decoded = StateMachine::read_body(1, opts(), golden.as_slice()).expect("body 1 reads");
    assert_eq!(decoded, state, "read as body version 1");
    let decoded = StateMachine::from_bytes(&golden).expect("golden decodes");
    assert_eq!(
        decoded, state,
        "the stored snapshot decodes to another state"
    );
    assert!(bytes == golden, "this build encodes the state differently");
    assert_eq!(
        decoded.to_bytes(),
        golden,
        "decoding and encoding again changes it"
    );
}

/// [`rich_state`] with an etcd keyspace, applied under [`Semantics::ETCD`].
fn rich_state_with_etcd() -> StateMachine {
    let mut sm = rich_state();
    let mut index = 100;
    let mut seq = 1_000;
    let mut apply = |sm: &mut StateMachine, cmds: Vec<EtcdCommand>| {
        index += 1;
        let requests = cmds
            .into_iter()
            .map(|cmd| {
                seq += 1;
                Request {
                    time_ms: 80_000,
                    client: Some(RequestId { client_id: 7, seq }),
                    cmd: Command::Etcd(cmd),
                }
            })
            .collect();
        sm.apply_batch(
            index,
            &Batch {
                requests,
                semantics: Semantics::ETCD,
            },
        );
    };
    let put = |k: &str, v: &str| EtcdCommand::Put(PutRequest::new(k, v));
    apply(
        &mut sm,
        vec![
            put("/a", "1"),
            put("/b", "1"),
            put("/a", "2"),
            put("/c", "x"),
        ],
    );
    let first = sm.revision() - 3;
    apply(
        &mut sm,
        vec![
            EtcdCommand::Txn(TxnRequest {
                compare: vec![Compare {
                    range: KeyRange::key("/a"),
                    result: CompareResult::Equal,
                    target: CompareTarget::Version(2),
                }],
                success: vec![
                    RequestOp::Put(PutRequest::new("/b", "2")),
                    RequestOp::DeleteRange(DeleteRangeRequest {
                        range: KeyRange::key("/c"),
                        prev_kv: true,
                    }),
                    RequestOp::Range(RangeRequest::new(KeyRange::prefix("/"))),
                ],
                failure: vec![],
            }),
            put("/d", &"v".repeat(300)),
            // Removes /a's first version (the position of a walk still in progress is
            // covered by the unit tests).
            EtcdCommand::Compact { revision: first },
            put("/a", "3"),
        ],
    );
    sm
}

#[test]
fn snapshot_bytes_with_etcd_keys_are_the_body_2_bytes() {
    let state = rich_state_with_etcd();
    assert_eq!(state.body_version(), 2);
    assert_eq!(state.etcd().key_count(), 3, "/a /b /d");
    assert!(state.etcd().compact_revision() > 0);
    let bytes = state.to_bytes();
    if std::env::var_os("FENCED_BLESS").is_some() {
        std::fs::write(GOLDEN_BODY2, &bytes).expect("write golden");
        return;
    }
    let golden = std::fs::read(GOLDEN_BODY2).expect("tests/data/snapshot-body2.bin");
    let decoded = StateMachine::read_body(2, opts(), golden.as_slice()).expect("body 2 reads");
    assert_eq!(
        decoded, state,
        "the stored snapshot decodes to another state"
    );
    assert_eq!(decoded.digest(), state.digest());
    assert!(bytes == golden, "this build encodes the state differently");
    assert_eq!(
        decoded.to_bytes(),
        golden,
        "decoding and encoding again changes it"
    );
    assert_eq!(
        StateMachine::from_bytes(&golden).expect("from_bytes reads body 2"),
        state
    );
    // Body 2 is the fields of body 1 followed by the etcd keyspace.
    let fields = bincode::serialize(&state).expect("encodes");
    assert!(golden.starts_with(&fields) && golden.len() > fields.len());
}

#[test]
fn snapshot_bytes_with_an_etcd_quota_are_the_body_3_bytes() {
    let mut state = rich_state_with_etcd();
    let apply = |sm: &mut StateMachine, index, cmd: EtcdCommand| {
        sm.apply_batch(
            index,
            &Batch {
                requests: vec![Request {
                    time_ms: 90_000,
                    client: None,
                    cmd: Command::Etcd(cmd),
                }],
                semantics: Semantics::QUOTA,
            },
        );
    };
    apply(&mut state, 201, EtcdCommand::Quota { bytes: 1_000 });
    // Over the quota: refused, and the alarm raised.
    apply(
        &mut state,
        202,
        EtcdCommand::Put(PutRequest::new("/e", "x".repeat(1_000))),
    );
    assert_eq!(state.body_version(), 3);
    assert_eq!(state.etcd_quota().limit(), 1_000);
    assert!(state.etcd_quota().nospace);
    let bytes = state.to_bytes();
    if std::env::var_os("FENCED_BLESS").is_some() {
        std::fs::write(GOLDEN_BODY3, &bytes).expect("write golden");
        return;
    }
    let golden = std::fs::read(GOLDEN_BODY3).expect("tests/data/snapshot-body3.bin");
    let decoded = StateMachine::read_body(3, opts(), golden.as_slice()).expect("body 3 reads");
    assert_eq!(
        decoded, state,
        "the stored snapshot decodes to another state"
    );
    assert_eq!(decoded.digest(), state.digest());
    assert!(bytes == golden, "this build encodes the state differently");
    assert_eq!(
        StateMachine::from_bytes(&golden).expect("from_bytes reads body 3"),
        state
    );
    // Body 3 is body 2 followed by the quota: `{ bytes: u64, nospace: bool }`.
    let mut body2 = bincode::serialize(&state).expect("encodes");
    body2.extend(bincode::serialize(state.etcd()).expect("encodes"));
    assert_eq!(&golden[..body2.len()], body2.as_slice());
    let mut tail = 1_000u64.to_le_bytes().to_vec();
    tail.push(1);
    assert_eq!(&golden[body2.len()..], tail.as_slice());
}
