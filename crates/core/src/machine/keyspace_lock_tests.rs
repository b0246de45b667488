//! etcd's locks on the keyspace ([`Semantics::KEYSPACE_LOCKS`]): the lock-table
//! `EtcdLock` commands retired, the migration of what they left at the first entry under the
//! new rules, and a property test of the recipe the front end runs (`api/etcd/queue.rs`):
//! random interleavings of lock puts, compared deletes (unlock, withdrawal of an abandoned
//! call), plain KV deletes of the holder's key, lease ends — and, before the switch, the old
//! lock-table commands — on one name: at most one holder at every revision, tokens (the
//! holder key's create revision) increasing in grant order, replicas byte-identical.

use proptest::prelude::*;

use super::{lock_key, StateMachine};
use crate::command::*;
use crate::etcd::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyRange, KeyValue, PutRequest,
    RangeRequest, RequestOp, TxnRequest,
};
use crate::CoreError;

struct Log {
    sm: StateMachine,
    index: Index,
    now: Millis,
    semantics: Semantics,
    seq: u64,
    /// Every batch applied, to replay on a second replica.
    batches: Vec<(Index, Batch)>,
}

impl Log {
    fn new(semantics: Semantics) -> Log {
        Log {
            sm: StateMachine::new(),
            index: 0,
            now: 1_000,
            semantics,
            seq: 0,
            batches: Vec::new(),
        }
    }

    fn rid(&mut self) -> RequestId {
        self.seq += 1;
        RequestId {
            client_id: 7,
            seq: self.seq,
        }
    }

    fn apply(&mut self, client: Option<RequestId>, cmd: Command) -> Response {
        self.index += 1;
        let batch = Batch {
            requests: vec![Request {
                time_ms: self.now,
                client,
                cmd,
            }],
            semantics: self.semantics,
        };
        let mut out = self.sm.apply_batch(self.index, &batch);
        self.batches.push((self.index, batch));
        self.sm.check_invariants().expect("invariants");
        out.responses.pop().expect("one response")
    }

    fn lease(&mut self, ttl_ms: Millis) -> SessionId {
        match self.apply(None, Command::OpenLease { ttl_ms }) {
            Response::SessionOpened { session, .. } => session,
            other => panic!("lease: {other:?}"),
        }
    }

    fn etcd(&mut self, cmd: EtcdCommand) -> Response {
        self.apply(None, Command::Etcd(cmd))
    }

    /// The front end's enqueue: put `name/<lease>` on the lease unless it exists.
    fn enqueue(&mut self, name: &str, lease: SessionId) -> Response {
        let key = lock_key(name, lease);
        let mut put = PutRequest::new(key.clone(), Vec::new());
        put.lease = lease as i64;
        self.etcd(EtcdCommand::Txn(TxnRequest {
            compare: vec![Compare {
                range: KeyRange::key(key.clone()),
                result: CompareResult::Equal,
                target: CompareTarget::CreateRevision(0),
            }],
            success: vec![RequestOp::Put(put)],
            failure: vec![RequestOp::Range(RangeRequest::new(KeyRange::key(key)))],
        }))
    }

    /// Unlock / withdrawal / Resign: delete the key if it is generation `create_revision`.
    fn delete_generation(&mut self, key: Vec<u8>, create_revision: Revision) -> Response {
        self.etcd(EtcdCommand::Txn(TxnRequest {
            compare: vec![Compare {
                range: KeyRange::key(key.clone()),
                result: CompareResult::Equal,
                target: CompareTarget::CreateRevision(create_revision as i64),
            }],
            success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::key(key),
                prev_kv: false,
            })],
            failure: Vec::new(),
        }))
    }

    fn key(&self, key: &[u8]) -> Option<KeyValue> {
        self.sm
            .etcd_range(&RangeRequest::new(KeyRange::key(key.to_vec())))
            .expect("range")
            .kvs
            .into_iter()
            .next()
    }

    /// The lock's holder as etcd defines it: the live key under `name/` with the lowest
    /// create revision.
    fn holder(&self, name: &str) -> Option<KeyValue> {
        self.sm
            .etcd_range(&RangeRequest::new(KeyRange::prefix(format!("{name}/"))))
            .expect("range")
            .kvs
            .into_iter()
            .min_by_key(|kv| kv.create_revision)
    }
}

#[test]
fn the_first_entry_under_keyspace_locks_migrates_the_lock_tables_etcd_locks() {
    let mut log = Log::new(Semantics::ELECTIONS);
    let a = log.lease(60_000);
    let b = log.lease(60_000);
    let ra = log.rid();
    let granted = log.apply(
        Some(ra),
        Command::EtcdLock {
            name: "job".into(),
            lease: a,
            value: b"va".to_vec(),
        },
    );
    let Response::Granted { token: ta, .. } = granted else {
        panic!("a: {granted:?}");
    };
    let rb = log.rid();
    let waiting = log.apply(
        Some(rb),
        Command::EtcdLock {
            name: "job".into(),
            lease: b,
            value: vec![],
        },
    );
    assert_eq!(waiting, Response::Pending);
    // A lock-table client of the same name waits behind the etcd holder (one lock then).
    let rx = log.rid();
    let x = log.apply(
        Some(rx),
        Command::Acquire {
            name: "job".into(),
            owner: "x".into(),
            ttl_ms: 10_000,
            session: None,
            wait_ms: 600_000,
        },
    );
    assert_eq!(x, Response::Pending);
    let ka = log.key(&lock_key("job", a)).expect("a's projected key");
    assert_eq!((ka.create_revision, ka.lease), (ta, a as i64));

    // Rules 13 from here: the first entry migrates.
    log.semantics = Semantics::KEYSPACE_LOCKS;
    let before = log.sm.revision();
    assert_eq!(log.apply(None, Command::Tick), Response::Ticked);
    assert!(log.sm.etcd_locks.is_empty(), "lock-table records left");
    // a holds on the keyspace: its key, same lease, created at its token.
    let ka2 = log.key(&lock_key("job", a)).expect("a's key survives");
    assert_eq!(ka2, ka);
    assert_eq!(log.holder("job").map(|kv| kv.create_revision), Some(ta));
    // b's wait was withdrawn: resolved NotGranted, no key.
    assert_eq!(
        log.apply(
            Some(rb),
            Command::EtcdLock {
                name: "job".into(),
                lease: b,
                value: vec![],
            }
        ),
        Response::NotGranted
    );
    assert_eq!(log.key(&lock_key("job", b)), None);
    // The lock-table lock `job` is a separate namespace now: x holds it, at the migration's
    // revision (above every token issued before).
    let info = log
        .sm
        .lock_info("job")
        .expect("x holds the lock-table lock");
    assert_eq!(info.owner, "x");
    assert_eq!(info.token, before + 1);
    assert_eq!(
        log.sm
            .dedup_lookup(rx)
            .map(|r| matches!(r, Response::Granted { .. })),
        Some(true)
    );
    // The old commands are refused under the new rules.
    let r = log.apply(
        None,
        Command::EtcdUnlock {
            name: "job".into(),
            lease: a,
            token: None,
        },
    );
    assert!(
        matches!(r, Response::Rejected(CoreError::Retired { since: 13, .. })),
        "{r:?}"
    );
    assert!(
        log.key(&lock_key("job", a)).is_some(),
        "a refused unlock deleted the key"
    );
    // The recipe: b queues behind a's key; a's key deleted (its lease revoked) hands over.
    log.enqueue("job", b);
    let kb = log.key(&lock_key("job", b)).expect("b's key");
    assert!(kb.create_revision > ta);
    assert_eq!(log.holder("job").map(|kv| kv.lease), Some(a as i64));
    assert_eq!(
        log.apply(None, Command::CloseSession { session: a }),
        Response::SessionClosed
    );
    assert_eq!(log.holder("job").map(|kv| kv.lease), Some(b as i64));
}

/// One step of the property test, on leases by index.
#[derive(Clone, Debug)]
enum Op {
    /// Old rules: `EtcdLock` (with a fresh request id).
    OldLock(usize),
    /// Old rules: `EtcdUnlock`.
    OldUnlock(usize),
    /// Old rules: cancel the last `EtcdLock` of the lease.
    OldCancel(usize),
    /// New rules: the recipe's enqueue.
    Enqueue(usize),
    /// New rules: Unlock / a withdrawal — the compared delete of the lease's key.
    Withdraw(usize),
    /// A plain KV delete of the current holder's key (an operator's `etcdctl del`).
    DeleteHolder,
    /// The lease ends (revoked); a new lease takes its slot.
    Revoke(usize),
    /// Time passes (leases of 5 s expire unless kept alive).
    Wait(u64),
    KeepAlive(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4usize).prop_map(Op::OldLock),
        1 => (0..4usize).prop_map(Op::OldUnlock),
        1 => (0..4usize).prop_map(Op::OldCancel),
        4 => (0..4usize).prop_map(Op::Enqueue),
        2 => (0..4usize).prop_map(Op::Withdraw),
        1 => Just(Op::DeleteHolder),
        1 => (0..4usize).prop_map(Op::Revoke),
        1 => (100..3_000u64).prop_map(Op::Wait),
        2 => (0..4usize).prop_map(Op::KeepAlive),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn one_holder_at_every_revision_and_tokens_grow_in_grant_order(
        ops in prop::collection::vec(op(), 1..120),
        switch_at in 0..120usize,
    ) {
        let mut log = Log::new(Semantics::LUA_IDS);
        let mut leases: Vec<SessionId> = (0..4).map(|_| log.lease(5_000)).collect();
        let mut last_lock: Vec<Option<RequestId>> = vec![None; 4];
        // The holder seen last (key, create revision) and the grants in order.
        let mut holder: Option<(Vec<u8>, Revision)> = None;
        let mut tokens: Vec<Revision> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if i == switch_at {
                log.semantics = Semantics::KEYSPACE_LOCKS;
            }
            let old = !log.semantics.keyspace_locks();
            match *op {
                Op::OldLock(l) if old => {
                    let rid = log.rid();
                    last_lock[l] = Some(rid);
                    log.apply(Some(rid), Command::EtcdLock {
                        name: "job".into(), lease: leases[l], value: vec![],
                    });
                }
                Op::OldUnlock(l) if old => {
                    log.apply(None, Command::EtcdUnlock {
                        name: "job".into(), lease: leases[l], token: None,
                    });
                }
                Op::OldCancel(l) if old => {
                    if let Some(request) = last_lock[l] {
                        log.apply(None, Command::EtcdCancel {
                            name: "job".into(), lease: leases[l], request,
                        });
                    }
                }
                Op::OldLock(l) | Op::Enqueue(l) if !old => {
                    log.enqueue("job", leases[l]);
                }
                Op::OldUnlock(l) | Op::OldCancel(l) | Op::Withdraw(l) if !old => {
                    let key = lock_key("job", leases[l]);
                    if let Some(kv) = log.key(&key) {
                        log.delete_generation(key, kv.create_revision);
                    }
                }
                Op::DeleteHolder => {
                    if let Some(kv) = log.holder("job") {
                        log.etcd(EtcdCommand::DeleteRange(DeleteRangeRequest {
                            range: KeyRange::key(kv.key), prev_kv: false,
                        }));
                    }
                }
                Op::Revoke(l) => {
                    log.apply(None, Command::CloseSession { session: leases[l] });
                    leases[l] = log.lease(5_000);
                    last_lock[l] = None;
                }
                Op::Wait(ms) => {
                    log.now += ms;
                    log.apply(None, Command::Tick);
                }
                Op::KeepAlive(l) => {
                    log.apply(None, Command::KeepAlive { session: leases[l] });
                }
                _ => {}
            }
            // Under the old rules the lock table is the lock and projects only its
            // holder's key: never two keys. Under the new rules the holder is the oldest.
            let live = log
                .sm
                .etcd_range(&RangeRequest::new(KeyRange::prefix("job/")))
                .expect("range")
                .kvs;
            if old {
                prop_assert!(live.len() <= 1, "two projected holders: {live:?}");
            }
            // Who believes it holds: the keyspace's holder, and any lock-table grant (whose
            // caller was told it holds) of the name.
            let mut holders: Vec<i64> = log.holder("job").map(|kv| kv.lease).into_iter().collect();
            if let Some(info) = log.sm.lock_info("job") {
                for h in info.holders {
                    if let Some(s) = h.session {
                        if !holders.contains(&(s as i64)) {
                            holders.push(s as i64);
                        }
                    }
                }
            }
            prop_assert!(holders.len() <= 1, "two holders {holders:?} (ops {ops:?}, switch {switch_at})");
            let now = log.holder("job").map(|kv| (kv.key, kv.create_revision));
            if now != holder {
                if let Some((_, token)) = &now {
                    if let Some(last) = tokens.last() {
                        prop_assert!(
                            token > last,
                            "token {token} granted after {last} (ops {ops:?}, switch {switch_at})"
                        );
                    }
                    tokens.push(*token);
                }
                holder = now;
            }
        }
        // A replica applying the same entries is byte-identical.
        let mut replica = StateMachine::new();
        for (index, batch) in &log.batches {
            replica.apply_batch(*index, batch);
        }
        prop_assert_eq!(replica.to_bytes(), log.sm.to_bytes());
    }
}
