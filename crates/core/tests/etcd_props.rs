//! Property tests of the etcd keyspace (`fenced_core::etcd`) against a plain reference model
//! (a `BTreeMap` per revision and a list of changes), over random puts, deletes, txns,
//! compactions and revisions taken by other commands:
//! (a) a range at revision r equals the model's state at r;
//! (b) the events after r are exactly the model's changes after r, in order, also when read
//!     in pages and restricted to a key range;
//! (c) compaction never changes reads at or above the compact revision, and reads and
//!     watches below it fail with `Compacted` — also while a compaction made in small steps
//!     is unfinished;
//! (d) two stores fed the same calls — one of them decoded from a snapshot half way —
//!     encode to the same bytes;
//! (e) a refused txn, or one that writes nothing, changes nothing.

use std::collections::BTreeMap;

use fenced_core::etcd::*;
use fenced_core::Revision;
use proptest::prelude::*;

const KEYS: [&str; 6] = ["a", "ab", "abc", "b", "ba", "c"];

fn key(i: usize) -> Vec<u8> {
    KEYS[i].as_bytes().to_vec()
}

/// A key range of the model: one key, a prefix, or `[from, to)` by index.
#[derive(Clone, Copy, Debug)]
enum R {
    Key(usize),
    Prefix(usize),
    Between(usize, usize),
}

impl R {
    fn range(self) -> KeyRange {
        match self {
            R::Key(i) => KeyRange::key(key(i)),
            R::Prefix(i) => KeyRange::prefix(key(i)),
            R::Between(a, b) => KeyRange::new(key(a), key(b)),
        }
    }

    /// The model's own test, independent of `KeyRange`.
    fn holds(self, k: &[u8]) -> bool {
        match self {
            R::Key(i) => k == key(i).as_slice(),
            R::Prefix(i) => k.starts_with(&key(i)),
            R::Between(a, b) => k >= key(a).as_slice() && k < key(b).as_slice(),
        }
    }
}

#[derive(Clone, Debug)]
enum TOp {
    Put(usize, u8),
    /// A put with `ignore_value` (refused if the key is absent).
    PutKeep(usize),
    Delete(R),
    Range(R),
    /// A range at the txn's revision minus this (0 = the txn's own: a future one; the
    /// revision 0 itself = current).
    RangeAt(R, u8),
}

#[derive(Clone, Debug)]
enum Op {
    Put(usize, u8),
    Delete(R),
    /// `compare: version(KEYS[key]) == version`.
    Txn {
        key: usize,
        version: i64,
        success: Vec<TOp>,
        failure: Vec<TOp>,
    },
    /// Other commands of the state machine take this many revisions.
    Skip(u8),
    /// Compact this many revisions below the current one.
    Compact(u8),
}

fn r() -> impl Strategy<Value = R> {
    prop_oneof![
        (0..KEYS.len()).prop_map(R::Key),
        (0..KEYS.len()).prop_map(R::Prefix),
        (0..KEYS.len(), 0..KEYS.len()).prop_map(|(a, b)| R::Between(a, b)),
    ]
}

fn top() -> impl Strategy<Value = TOp> {
    prop_oneof![
        3 => (0..KEYS.len(), any::<u8>()).prop_map(|(k, v)| TOp::Put(k, v)),
        1 => r().prop_map(TOp::Delete),
        1 => r().prop_map(TOp::Range),
        1 => (0..KEYS.len()).prop_map(TOp::PutKeep),
        1 => (r(), 0u8..8).prop_map(|(r, back)| TOp::RangeAt(r, back)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS.len(), any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => r().prop_map(Op::Delete),
        3 => (
            0..KEYS.len(),
            0i64..3,
            proptest::collection::vec(top(), 0..4),
            proptest::collection::vec(top(), 0..4)
        )
            .prop_map(|(key, version, success, failure)| Op::Txn {
                key,
                version,
                success,
                failure
            }),
        1 => (1u8..4).prop_map(Op::Skip),
        1 => (0u8..8).prop_map(Op::Compact),
    ]
}

/// The reference: every state by revision and every change, the obvious way.
#[derive(Default)]
struct Model {
    now: BTreeMap<Vec<u8>, KeyValue>,
    /// The state after each revision that wrote.
    states: Vec<(Revision, BTreeMap<Vec<u8>, KeyValue>)>,
    events: Vec<Event>,
    compacted: Revision,
}

impl Model {
    fn at(&self, rev: Revision) -> BTreeMap<Vec<u8>, KeyValue> {
        self.states
            .iter()
            .rev()
            .find(|(r, _)| *r <= rev)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }

    fn put(&mut self, k: Vec<u8>, v: u8, rev: Revision) -> Option<KeyValue> {
        let prev = self.now.get(&k).cloned();
        let kv = KeyValue {
            key: k.clone(),
            create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value: vec![v],
            lease: 0,
        };
        self.now.insert(k, kv.clone());
        self.events.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: prev.clone(),
        });
        prev
    }

    fn delete(&mut self, r: R, rev: Revision) -> Vec<KeyValue> {
        let doomed: Vec<Vec<u8>> = self.now.keys().filter(|k| r.holds(k)).cloned().collect();
        let mut prev = Vec::new();
        for k in doomed {
            let p = self.now.remove(&k).expect("live");
            self.events.push(Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key: k,
                    mod_revision: rev,
                    ..KeyValue::default()
                },
                prev_kv: Some(p.clone()),
            });
            prev.push(p);
        }
        prev
    }

    fn range(&self, r: R) -> Vec<KeyValue> {
        self.now
            .values()
            .filter(|kv| r.holds(&kv.key))
            .cloned()
            .collect()
    }
}

/// Whether etcd refuses a branch of flat ops as writing a key twice.
fn duplicate(ops: &[TOp]) -> bool {
    let dels: Vec<R> = ops
        .iter()
        .filter_map(|o| match o {
            TOp::Delete(r) => Some(*r),
            _ => None,
        })
        .collect();
    let mut puts = Vec::new();
    for o in ops {
        if let TOp::Put(k, _) | TOp::PutKeep(k) = o {
            if puts.contains(k) || dels.iter().any(|r| r.holds(&key(*k))) {
                return true;
            }
            puts.push(*k);
        }
    }
    false
}

fn req_of(o: &TOp, rev: Revision) -> RequestOp {
    match o {
        TOp::Put(k, v) => RequestOp::Put(PutRequest {
            prev_kv: true,
            ..PutRequest::new(key(*k), vec![*v])
        }),
        TOp::Delete(r) => RequestOp::DeleteRange(DeleteRangeRequest {
            range: r.range(),
            prev_kv: true,
        }),
        TOp::Range(r) => RequestOp::Range(RangeRequest::new(r.range())),
        TOp::PutKeep(k) => RequestOp::Put(PutRequest {
            prev_kv: true,
            ignore_value: true,
            ..PutRequest::new(key(*k), Vec::new())
        }),
        TOp::RangeAt(r, back) => RequestOp::Range(RangeRequest {
            revision: rev.saturating_sub(u64::from(*back)),
            ..RangeRequest::new(r.range())
        }),
    }
}

fn no_lease(_: LeaseId) -> bool {
    false
}

fn bytes(s: &EtcdStore) -> Vec<u8> {
    bincode::serialize(s).expect("encode")
}

/// Apply `op` at the next revision to `store` and to the model `m`, checking what the
/// store answers against the model. Returns the new current revision.
fn apply(
    store: &mut EtcdStore,
    m: &mut Model,
    op: &Op,
    current: Revision,
    stepwise: bool,
) -> Result<Revision, TestCaseError> {
    let rev = current + 1;
    let before = bytes(store);
    let wrote = match op {
        Op::Put(k, v) => {
            let req = PutRequest {
                prev_kv: true,
                ..PutRequest::new(key(*k), vec![*v])
            };
            let out = store.put(&req, rev, &no_lease).expect("put");
            let prev = m.put(key(*k), *v, rev);
            prop_assert_eq!(out.response.prev_kv, prev);
            prop_assert!(out.wrote);
            true
        }
        Op::Delete(r) => {
            let req = DeleteRangeRequest {
                range: r.range(),
                prev_kv: true,
            };
            let out = store.delete_range(&req, rev).expect("delete");
            let prev = m.delete(*r, rev);
            prop_assert_eq!(&out.response.prev_kvs, &prev);
            prop_assert_eq!(out.wrote, !prev.is_empty());
            out.wrote
        }
        Op::Txn {
            key: ck,
            version,
            success,
            failure,
        } => {
            let req = TxnRequest {
                compare: vec![Compare {
                    range: KeyRange::key(key(*ck)),
                    result: CompareResult::Equal,
                    target: CompareTarget::Version(*version),
                }],
                success: success.iter().map(|o| req_of(o, rev)).collect(),
                failure: failure.iter().map(|o| req_of(o, rev)).collect(),
            };
            let out = store.txn(&req, rev, &no_lease);
            if duplicate(success) || duplicate(failure) {
                prop_assert_eq!(out, Err(EtcdError::DuplicateKey));
                prop_assert_eq!(
                    bytes(store),
                    before.clone(),
                    "a refused txn changed the store"
                );
                false
            } else {
                let holds = m.now.get(&key(*ck)).map_or(0, |kv| kv.version) == *version;
                let ops = if holds { success } else { failure };
                // The first refusal on the chosen branch, judged before anything is written.
                let refusal = ops.iter().find_map(|o| match o {
                    TOp::PutKeep(k) if !m.now.contains_key(&key(*k)) => {
                        Some(EtcdError::KeyNotFound)
                    }
                    TOp::RangeAt(_, back) => {
                        let at = rev.saturating_sub(u64::from(*back));
                        if at > current {
                            Some(EtcdError::FutureRevision { current })
                        } else if at != 0 && at < m.compacted {
                            Some(EtcdError::Compacted {
                                compact_revision: m.compacted,
                            })
                        } else {
                            None
                        }
                    }
                    _ => None,
                });
                if let Some(refusal) = refusal {
                    prop_assert_eq!(out, Err(refusal));
                    prop_assert_eq!(bytes(store), before, "a refused txn changed the store");
                    return Ok(current);
                }
                let out = out.expect("txn");
                prop_assert_eq!(out.response.succeeded, holds);
                prop_assert_eq!(out.response.responses.len(), ops.len());
                let mut wrote = false;
                for (o, resp) in ops.iter().zip(&out.response.responses) {
                    match (o, resp) {
                        (TOp::Put(k, v), ResponseOp::Put(p)) => {
                            let prev = m.put(key(*k), *v, rev);
                            prop_assert_eq!(&p.prev_kv, &prev);
                            wrote = true;
                        }
                        (TOp::PutKeep(k), ResponseOp::Put(p)) => {
                            let v = m.now[&key(*k)].value[0];
                            let prev = m.put(key(*k), v, rev);
                            prop_assert_eq!(&p.prev_kv, &prev);
                            wrote = true;
                        }
                        (TOp::RangeAt(r, back), ResponseOp::Range(got)) => {
                            let at = rev.saturating_sub(u64::from(*back));
                            let want: Vec<KeyValue> = if at == 0 {
                                m.range(*r)
                            } else {
                                m.at(at)
                                    .into_values()
                                    .filter(|kv| r.holds(&kv.key))
                                    .collect()
                            };
                            prop_assert_eq!(&got.kvs, &want);
                        }
                        (TOp::Delete(r), ResponseOp::DeleteRange(d)) => {
                            let prev = m.delete(*r, rev);
                            prop_assert_eq!(&d.prev_kvs, &prev);
                            wrote |= !prev.is_empty();
                        }
                        (TOp::Range(r), ResponseOp::Range(got)) => {
                            prop_assert_eq!(&got.kvs, &m.range(*r));
                        }
                        _ => prop_assert!(false, "response {:?} for {:?}", resp, o),
                    }
                }
                prop_assert_eq!(out.wrote, wrote);
                wrote
            }
        }
        Op::Skip(n) => return Ok(current + u64::from(*n)),
        Op::Compact(back) => {
            let c = current.saturating_sub(u64::from(*back));
            let got = if stepwise {
                store
                    .begin_compact(c, current)
                    .map(|()| CompactStats::default())
            } else {
                store.compact(c, current)
            };
            if c <= m.compacted {
                prop_assert_eq!(
                    got,
                    Err(EtcdError::Compacted {
                        compact_revision: m.compacted
                    })
                );
                prop_assert_eq!(bytes(store), before);
            } else {
                got.expect("compact");
                m.compacted = c;
            }
            return Ok(current);
        }
    };
    if wrote {
        m.states.push((rev, m.now.clone()));
        Ok(rev)
    } else {
        prop_assert_eq!(
            bytes(store),
            before,
            "a txn that wrote nothing changed the store"
        );
        // The revision is not consumed: the next call reuses it.
        Ok(current)
    }
}

fn read(
    store: &EtcdStore,
    range: KeyRange,
    at: Revision,
    current: Revision,
) -> Result<Vec<KeyValue>, EtcdError> {
    let req = RangeRequest {
        revision: at,
        ..RangeRequest::new(range)
    };
    store.range(&req, current).map(|r| r.kvs)
}

/// Every page of `events_since(after, range)` with page size `limit`, concatenated.
fn all_pages(
    store: &EtcdStore,
    after: Revision,
    range: &KeyRange,
    limit: usize,
) -> Result<Vec<Event>, TestCaseError> {
    let mut out = Vec::new();
    let mut from = after;
    loop {
        let page = store
            .events_since(from, range, limit, true)
            .expect("events");
        prop_assert!(page.resume_after >= from);
        if let Some(last) = page.events.last() {
            prop_assert!(last.kv.mod_revision <= page.resume_after);
        }
        out.extend(page.events);
        if !page.more {
            return Ok(out);
        }
        from = page.resume_after;
    }
}

/// (a) every revision reads as the model's state at it, over the whole keyspace and over
/// ranges; below the compact revision, Compacted; above the current, Future.
/// (b) the changes after every revision, whole or paged, all keys or a range.
fn check_reads(
    store: &EtcdStore,
    model: &Model,
    current: Revision,
    limit: usize,
) -> Result<(), TestCaseError> {
    for r in 0..=current + 1 {
        let got = read(store, KeyRange::all(), r, current);
        if r > current {
            prop_assert_eq!(got, Err(EtcdError::FutureRevision { current }));
            continue;
        }
        let at = if r == 0 { current } else { r };
        if at < model.compacted {
            prop_assert_eq!(
                got,
                Err(EtcdError::Compacted {
                    compact_revision: model.compacted
                })
            );
            continue;
        }
        let state = model.at(at);
        prop_assert_eq!(
            got.expect("read"),
            state.values().cloned().collect::<Vec<_>>()
        );
        for rg in RANGES {
            let want: Vec<KeyValue> = state
                .values()
                .filter(|kv| rg.holds(&kv.key))
                .cloned()
                .collect();
            let req = RangeRequest {
                revision: r,
                limit: limit as u64,
                ..RangeRequest::new(rg.range())
            };
            let got = store.range(&req, current).expect("read");
            prop_assert_eq!(got.count, want.len() as u64);
            prop_assert_eq!(got.more, want.len() > limit);
            prop_assert_eq!(&got.kvs[..], &want[..want.len().min(limit)]);
        }
    }

    for after in 0..=current + 1 {
        if after.saturating_add(1) < model.compacted {
            prop_assert_eq!(
                store.events_since(after, &KeyRange::all(), 0, true),
                Err(EtcdError::Compacted {
                    compact_revision: model.compacted
                })
            );
            continue;
        }
        // A watch from the compact revision itself (etcd's rule): its puts without a
        // previous kv, not its deletes.
        let at_compact =
            |e: &Event| after < model.compacted && e.kv.mod_revision == model.compacted;
        let want: Vec<Event> = model
            .events
            .iter()
            .filter(|e| e.kv.mod_revision > after)
            .filter(|e| !(at_compact(e) && e.kind == EventKind::Delete))
            .map(|e| {
                let mut e = e.clone();
                if at_compact(&e) {
                    e.prev_kv = None;
                }
                e
            })
            .collect();
        let page = store
            .events_since(after, &KeyRange::all(), 0, true)
            .expect("events");
        prop_assert!(!page.more);
        prop_assert_eq!(&page.events, &want);
        prop_assert_eq!(&all_pages(store, after, &KeyRange::all(), limit)?, &want);
        for rg in RANGES {
            let want: Vec<Event> = want
                .iter()
                .filter(|e| rg.holds(&e.kv.key))
                .cloned()
                .collect();
            prop_assert_eq!(&all_pages(store, after, &rg.range(), limit)?, &want);
        }
    }
    Ok(())
}

const RANGES: [R; 5] = [
    R::Prefix(0),
    R::Key(3),
    R::Between(1, 4),
    R::Between(4, 1),
    R::Prefix(4),
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn etcd_keyspace_matches_the_model(
        ops in proptest::collection::vec(op(), 1..60),
        split in 0usize..60,
        limit in 1usize..4,
        step_budget in 1usize..5,
    ) {
        let mut store = EtcdStore::new();
        let mut twin = EtcdStore::new();
        let mut twin_model = Model::default();
        let (mut stepper, mut step_model, mut step_current) = (EtcdStore::new(), Model::default(), 0);
        let mut model = Model::default();
        let mut current: Revision = 0;
        let mut twin_current = 0;
        for (i, op) in ops.iter().enumerate() {
            // (c) what compaction must not change: reads and changes above it.
            let kept = if let Op::Compact(back) = op {
                let c = current.saturating_sub(u64::from(*back));
                let reads: Vec<_> = (c.max(model.compacted)..=current)
                    .map(|r| read(&store, KeyRange::all(), r, current))
                    .collect();
                let feed = store.events_since(c.max(model.compacted), &KeyRange::all(), 0, true);
                Some((c.max(model.compacted), reads, feed))
            } else {
                None
            };
            current = apply(&mut store, &mut model, op, current, false)?;
            if let Some((from, reads, feed)) = kept {
                for (r, want) in (from..=current).zip(reads) {
                    prop_assert_eq!(read(&store, KeyRange::all(), r, current), want);
                }
                prop_assert_eq!(
                    store.events_since(from.max(model.compacted), &KeyRange::all(), 0, true),
                    feed.map(|f| Events {
                        events: f.events.into_iter()
                            .filter(|e| e.kv.mod_revision > model.compacted)
                            .collect(),
                        ..f
                    })
                );
            }
            // (d) the twin: the same calls, decoded from a snapshot at `split`.
            if i == split {
                twin = bincode::deserialize(&bytes(&twin)).expect("decode");
            }
            twin_current = apply(&mut twin, &mut twin_model, op, twin_current, false)?;
            // (c) the stepper compacts a little after each call.
            step_current = apply(&mut stepper, &mut step_model, op, step_current, true)?;
            stepper.compact_step(step_budget);
        }
        prop_assert_eq!(twin_current, current);
        prop_assert_eq!(bytes(&twin), bytes(&store));
        prop_assert_eq!(&twin, &store);
        let decoded: EtcdStore = bincode::deserialize(&bytes(&store)).expect("decode");
        prop_assert_eq!(decoded.history_bytes(), store.history_bytes());
        prop_assert_eq!(&decoded, &store);

        check_reads(&store, &model, current, limit)?;
        // The stepper, its compaction possibly unfinished, reads the same; finished, it is
        // the same store.
        prop_assert_eq!(step_current, current);
        check_reads(&stepper, &step_model, current, limit)?;
        let stats = stepper.compact_step(usize::MAX);
        prop_assert!(!stats.pending && !stepper.compaction_pending());
        prop_assert_eq!(bytes(&stepper), bytes(&store));
    }
}
