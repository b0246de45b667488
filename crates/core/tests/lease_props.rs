//! Property tests of etcd leases as sessions (`Semantics::LEASES`), at the state machine,
//! over random grants, puts with and without a lease (and `ignore_lease`), deletes, closes,
//! coalesced keep-alives and time passing (expiry by `Tick`), against a reference model of
//! which key is attached to which lease:
//! (a) a key is live with the lease the model says, and a key attached to a lease that ended
//!     is gone — by close or by expiry;
//! (b) the keys a lease's end deleted are delete events at one revision, with an
//!     `EtcdChanged` wake-up at it;
//! (c) no live key names a session that does not exist (`check_invariants`);
//! (d) two replicas fed the same entries — one decoded from a snapshot half way — end with
//!     the same bytes (the lease index is derived, and rebuilt on decode).

use std::collections::BTreeMap;

use fenced_core::etcd::{EventKind, KeyRange, PutRequest, RangeRequest};
use fenced_core::{
    Batch, Command, EtcdCommand, Event, Millis, Request, Response, Semantics, SessionId,
    StateMachine,
};
use proptest::prelude::*;

const KEYS: [&str; 5] = ["a", "b", "c", "d", "e"];

#[derive(Clone, Debug)]
enum Op {
    Grant(u8),
    /// Put key with the lease of slot (`None`: no lease), or with `ignore_lease`.
    Put(usize, Option<usize>),
    PutKeepLease(usize),
    Delete(usize),
    Close(usize),
    KeepAlive(Vec<usize>),
    /// Let this many ms of log time pass (a `Tick`).
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1u8..5).prop_map(Op::Grant),
        4 => (0..KEYS.len(), proptest::option::weighted(0.8, 0usize..6))
            .prop_map(|(k, s)| Op::Put(k, s)),
        1 => (0..KEYS.len()).prop_map(Op::PutKeepLease),
        1 => (0..KEYS.len()).prop_map(Op::Delete),
        1 => (0usize..6).prop_map(Op::Close),
        2 => proptest::collection::vec(0usize..6, 1..4).prop_map(Op::KeepAlive),
        2 => (0u16..4_000).prop_map(Op::Advance),
    ]
}

struct Replica {
    sm: StateMachine,
    index: u64,
}

impl Replica {
    fn apply(&mut self, time: Millis, cmd: Command) -> (Response, Vec<Event>) {
        self.index += 1;
        let batch = Batch {
            requests: vec![Request {
                time_ms: time,
                client: None,
                cmd,
            }],
            semantics: Semantics::LEASES,
        };
        let mut out = self.sm.apply_batch(self.index, &batch);
        (out.responses.pop().expect("one response"), out.events)
    }
}

fn lease_of(sm: &StateMachine, key: &str) -> Option<i64> {
    sm.etcd_range(&RangeRequest::new(KeyRange::key(key)))
        .expect("range")
        .kvs
        .first()
        .map(|kv| kv.lease)
}

fn command(op: &Op, leases: &[SessionId]) -> Command {
    let slot = |s: usize| leases.get(s).copied().unwrap_or(1_000_000 + s as u64);
    match op {
        Op::Grant(ttl_s) => Command::OpenLease {
            ttl_ms: u64::from(*ttl_s) * 1000,
        },
        Op::Put(k, s) => {
            let mut p = PutRequest::new(KEYS[*k], "v");
            p.lease = s.map_or(0, |s| slot(s) as i64);
            Command::Etcd(EtcdCommand::Put(p))
        }
        Op::PutKeepLease(k) => {
            let mut p = PutRequest::new(KEYS[*k], "w");
            p.ignore_lease = true;
            Command::Etcd(EtcdCommand::Put(p))
        }
        Op::Delete(k) => Command::Etcd(EtcdCommand::DeleteRange(
            fenced_core::etcd::DeleteRangeRequest {
                range: KeyRange::key(KEYS[*k]),
                prev_kv: false,
            },
        )),
        Op::Close(s) => Command::CloseSession { session: slot(*s) },
        Op::KeepAlive(ss) => Command::KeepAliveMany {
            sessions: ss.iter().map(|s| slot(*s)).collect(),
        },
        Op::Advance(_) => Command::Tick,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn keys_go_with_their_lease(ops in proptest::collection::vec(op(), 1..60), cut in 0usize..60) {
        let mut a = Replica { sm: StateMachine::new(), index: 0 };
        let mut b: Option<Replica> = None;
        let mut leases: Vec<SessionId> = Vec::new();
        // The model: live key → its lease (0: none).
        let mut model: BTreeMap<&str, i64> = BTreeMap::new();
        let mut now: Millis = 1_000;
        for (i, op) in ops.iter().enumerate() {
            if i == cut {
                b = Some(Replica {
                    sm: StateMachine::from_bytes(&a.sm.to_bytes()).expect("decode"),
                    index: a.index,
                });
            }
            if let Op::Advance(ms) = op {
                now += u64::from(*ms);
            }
            let cmd = command(op, &leases);
            let before = a.sm.revision();
            let (r, events) = a.apply(now, cmd.clone());
            if let Some(b) = b.as_mut() {
                let (rb, eb) = b.apply(now, cmd);
                prop_assert_eq!(&rb, &r);
                prop_assert_eq!(&eb, &events);
            }
            // The model follows what was accepted.
            match (op, &r) {
                (Op::Grant(_), Response::SessionOpened { session, .. }) => leases.push(*session),
                (Op::Put(k, _), Response::Etcd { .. }) => {
                    let lease = match &command(op, &leases) {
                        Command::Etcd(EtcdCommand::Put(p)) => p.lease,
                        _ => 0,
                    };
                    model.insert(KEYS[*k], lease);
                }
                (Op::PutKeepLease(k), Response::Etcd { .. }) => {
                    prop_assert!(model.contains_key(KEYS[*k]));
                }
                (Op::Delete(k), Response::Etcd { .. }) => {
                    model.remove(KEYS[*k]);
                }
                _ => {}
            }
            // Sessions that ended (by this command or an expiry step before it) took their
            // keys with them, all at one revision.
            let ended: Vec<i64> = model
                .values()
                .copied()
                .filter(|l| *l != 0 && a.sm.session_info(*l as u64, a.sm.now()).is_none())
                .collect();
            let gone: Vec<&str> = model
                .iter()
                .filter(|(_, l)| ended.contains(l))
                .map(|(k, _)| *k)
                .collect();
            if !gone.is_empty() {
                let feed = a
                    .sm
                    .etcd_events_since(before, &KeyRange::all(), 1_000, false)
                    .expect("events");
                let deletes: Vec<_> = feed
                    .events
                    .iter()
                    .filter(|e| e.kind == EventKind::Delete)
                    .collect();
                let revs: std::collections::BTreeSet<u64> =
                    deletes.iter().map(|e| e.kv.mod_revision).collect();
                prop_assert_eq!(revs.len(), 1, "one revision for a lease's end: {:?}", deletes);
                let at = *revs.iter().next().expect("one");
                let woke = events.contains(&Event::EtcdChanged { revision: at });
                prop_assert!(woke, "no wake-up at {}: {:?}", at, events);
                for k in &gone {
                    prop_assert!(deletes.iter().any(|e| e.kv.key == k.as_bytes()), "{} not deleted", k);
                    model.remove(k);
                }
            }
            for k in KEYS {
                prop_assert_eq!(lease_of(&a.sm, k), model.get(k).copied(), "key {}", k);
            }
            a.sm.check_invariants().map_err(TestCaseError::fail)?;
        }
        if let Some(b) = b {
            prop_assert_eq!(b.sm.to_bytes(), a.sm.to_bytes());
        }
    }
}
