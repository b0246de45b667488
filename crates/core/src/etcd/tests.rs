//! etcd-visible behaviour of each operation, and its errors.

use super::*;

pub(super) fn no_lease(_: LeaseId) -> bool {
    false
}

pub(super) fn put(s: &mut EtcdStore, rev: Revision, key: &str, value: &str) -> PutResponse {
    let mut req = PutRequest::new(key, value);
    req.prev_kv = true;
    s.put(&req, rev, &no_lease).expect("put").response
}

pub(super) fn del(
    s: &mut EtcdStore,
    rev: Revision,
    range: KeyRange,
) -> Outcome<DeleteRangeResponse> {
    s.delete_range(
        &DeleteRangeRequest {
            range,
            prev_kv: true,
        },
        rev,
    )
    .expect("delete")
}

pub(super) fn get(
    s: &EtcdStore,
    range: KeyRange,
    at: Revision,
    current: Revision,
) -> Vec<(String, String)> {
    let mut req = RangeRequest::new(range);
    req.revision = at;
    s.range(&req, current)
        .expect("range")
        .kvs
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8(kv.key).expect("utf8"),
                String::from_utf8(kv.value).expect("utf8"),
            )
        })
        .collect()
}

pub(super) fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn one(s: &EtcdStore, key: &str, current: Revision) -> Option<KeyValue> {
    s.range(&RangeRequest::new(KeyRange::key(key)), current)
        .expect("range")
        .kvs
        .pop()
}

#[test]
fn put_versions_generations_and_prev_kv() {
    let mut s = EtcdStore::new();
    assert_eq!(put(&mut s, 3, "a", "1").prev_kv, None);
    let prev = put(&mut s, 7, "a", "2").prev_kv.expect("prev");
    assert_eq!(
        (prev.value.as_slice(), prev.mod_revision, prev.version),
        (&b"1"[..], 3, 1)
    );
    let kv = one(&s, "a", 7).expect("a");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version, kv.lease),
        (3, 7, 2, 0)
    );
    // A delete ends the generation; the next put starts one at version 1.
    let d = del(&mut s, 9, KeyRange::key("a"));
    assert!(d.wrote);
    assert_eq!(d.response.deleted, 1);
    assert_eq!(d.response.prev_kvs[0].version, 2);
    assert_eq!(one(&s, "a", 9), None);
    put(&mut s, 12, "a", "3");
    let kv = one(&s, "a", 12).expect("a");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (12, 12, 1)
    );
    // Older revisions still read as they were.
    assert_eq!(one(&s, "a", 8).map(|kv| kv.value), Some(b"2".to_vec()));
    assert_eq!(one(&s, "a", 10), None);
    let mut req = RangeRequest::new(KeyRange::key("a"));
    req.revision = 5;
    assert_eq!(s.range(&req, 12).expect("range").kvs[0].value, b"1");
    req.revision = 2;
    assert!(s.range(&req, 12).expect("range").kvs.is_empty());
    assert_eq!(
        (s.key_count(), s.version_count(), s.last_write()),
        (1, 4, 12)
    );
}

#[test]
fn put_errors_and_ignore_flags() {
    let mut s = EtcdStore::new();
    let err = |s: &mut EtcdStore, req: PutRequest, rev| s.put(&req, rev, &no_lease).unwrap_err();
    assert_eq!(
        err(&mut s, PutRequest::new("", "v"), 1),
        EtcdError::EmptyKey
    );
    let mut req = PutRequest::new("k", "");
    req.ignore_value = true;
    assert_eq!(err(&mut s, req.clone(), 1), EtcdError::KeyNotFound);
    req.value = b"x".to_vec();
    assert_eq!(err(&mut s, req, 1), EtcdError::ValueProvided);
    let mut req = PutRequest::new("k", "v");
    req.ignore_lease = true;
    req.lease = 5;
    assert_eq!(err(&mut s, req.clone(), 1), EtcdError::LeaseProvided);
    req.ignore_lease = false;
    assert_eq!(
        err(&mut s, req.clone(), 1),
        EtcdError::LeaseNotFound { lease: 5 }
    );
    assert_eq!(
        EtcdError::LeaseNotFound { lease: 5 }.to_string(),
        "etcdserver: requested lease not found"
    );
    // With a lease that exists.
    s.put(&req, 2, &|l| l == 5).expect("put");
    assert_eq!(one(&s, "k", 2).expect("k").lease, 5);
    // ignore_value keeps the value, ignore_lease the lease.
    let mut req = PutRequest::new("k", "");
    req.ignore_value = true;
    s.put(&req, 3, &no_lease).expect("put");
    let kv = one(&s, "k", 3).expect("k");
    assert_eq!(
        (kv.value.as_slice(), kv.lease, kv.version),
        (&b"v"[..], 0, 2)
    );
    put(&mut s, 4, "k", "w");
    let mut req = PutRequest::new("k", "");
    req.ignore_value = true;
    req.ignore_lease = true;
    s.put(&req, 5, &no_lease).expect("put");
    assert_eq!(one(&s, "k", 5).expect("k").value, b"w");
    let big = PutRequest::new("k", vec![0u8; MAX_REQUEST_BYTES]);
    assert!(matches!(
        err(&mut s, big, 6),
        EtcdError::RequestTooLarge { .. }
    ));
    assert_eq!(
        err(&mut s, PutRequest::new("k", "v"), 5),
        EtcdError::RevisionNotIncreasing { rev: 5, last: 5 }
    );
    assert_eq!(s.last_write(), 5, "nothing refused was written");
}

#[test]
fn range_ends_prefixes_and_empty_ranges() {
    let mut s = EtcdStore::new();
    for (i, k) in ["a", "ab", "abc", "b", "c\u{7f}"].iter().enumerate() {
        put(&mut s, i as u64 + 1, k, k);
    }
    let cur = 5;
    let keys = |r| {
        get(&s, r, 0, cur)
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(KeyRange::key("ab")), ["ab"]);
    assert_eq!(keys(KeyRange::prefix("ab")), ["ab", "abc"]);
    assert_eq!(keys(KeyRange::new("ab", "b")), ["ab", "abc"]);
    assert_eq!(keys(KeyRange::new("abc", vec![0])), ["abc", "b", "c\u{7f}"]);
    assert_eq!(keys(KeyRange::all()).len(), 5);
    assert!(keys(KeyRange::new("b", "a")).is_empty());
    assert!(keys(KeyRange::new("b", "b")).is_empty());
    assert_eq!(prefix_end(b"a\xff"), b"b");
    assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    assert_eq!(prefix_end(b""), vec![0]);
    assert_eq!(
        s.range(&RangeRequest::new(KeyRange::key("")), cur),
        Err(EtcdError::EmptyKey)
    );
    // The same at an older revision (the history walk).
    let mut req = RangeRequest::new(KeyRange::prefix("a"));
    req.revision = 2;
    assert_eq!(s.range(&req, cur).expect("range").count, 2);
    req.range = KeyRange::new("b", "a");
    assert_eq!(s.range(&req, cur).expect("range").count, 0);
}

#[test]
fn range_limit_count_sort_filters() {
    let mut s = EtcdStore::new();
    // k0..k4 at revisions 10, 20, ..; k1 rewritten at 60, k3 at 70.
    for i in 0..5u64 {
        put(
            &mut s,
            10 * (i + 1),
            &format!("k{i}"),
            &format!("v{}", 4 - i),
        );
    }
    put(&mut s, 60, "k1", "z");
    put(&mut s, 70, "k3", "a");
    let base = RangeRequest::new(KeyRange::prefix("k"));
    let run = |f: &dyn Fn(&mut RangeRequest)| {
        let mut req = base.clone();
        f(&mut req);
        let r = s.range(&req, 70).expect("range");
        let keys: Vec<String> = r
            .kvs
            .iter()
            .map(|kv| String::from_utf8(kv.key.clone()).expect("utf8"))
            .collect();
        (keys, r.count, r.more)
    };
    let (keys, count, more) = run(&|r| r.limit = 2);
    assert_eq!(
        (keys, count, more),
        (vec!["k0".into(), "k1".into()], 5, true)
    );
    let (keys, _, more) = run(&|r| r.limit = 5);
    assert_eq!((keys.len(), more), (5, false));
    let (keys, count, _) = run(&|r| r.count_only = true);
    assert_eq!((keys.len(), count), (0, 5));
    let r = s
        .range(
            &RangeRequest {
                keys_only: true,
                ..base.clone()
            },
            70,
        )
        .expect("range");
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty() && kv.version > 0));
    let (keys, _, _) = run(&|r| r.sort_order = SortOrder::Descend);
    assert_eq!(keys, ["k4", "k3", "k2", "k1", "k0"]);
    // Another target with no order sorts ascending (etcd); ties stay in key order.
    let (keys, _, _) = run(&|r| r.sort_target = SortTarget::Mod);
    assert_eq!(keys, ["k0", "k2", "k4", "k1", "k3"]);
    let (keys, _, _) = run(&|r| {
        r.sort_target = SortTarget::Version;
        r.sort_order = SortOrder::Descend;
    });
    assert_eq!(keys, ["k1", "k3", "k0", "k2", "k4"]);
    let (keys, _, _) = run(&|r| {
        r.sort_target = SortTarget::Value;
        r.keys_only = true;
        r.limit = 2;
    });
    // etcd's quirk, kept: with no sort order given, it fetches `limit + 1` keys in key order
    // first, and sorts only those.
    assert_eq!(keys, ["k2", "k0"]);
    let (keys, _, _) = run(&|r| {
        r.sort_target = SortTarget::Value;
        r.sort_order = SortOrder::Ascend;
        r.limit = 2;
    });
    assert_eq!(keys, ["k3", "k4"]);
    // Filters apply before the limit; count ignores them (etcd).
    let (keys, count, more) = run(&|r| {
        r.min_mod_revision = 30;
        r.limit = 2;
    });
    assert_eq!(
        (keys, count, more),
        (vec!["k1".into(), "k2".into()], 5, true)
    );
    let (keys, _, _) = run(&|r| r.max_mod_revision = 30);
    assert_eq!(keys, ["k0", "k2"]);
    let (keys, _, _) = run(&|r| {
        r.min_create_revision = 20;
        r.max_create_revision = 40;
    });
    assert_eq!(keys, ["k1", "k2", "k3"]);
}

#[test]
fn reads_refuse_future_and_compacted_revisions() {
    let mut s = EtcdStore::new();
    put(&mut s, 1, "a", "1");
    put(&mut s, 4, "a", "2");
    let mut req = RangeRequest::new(KeyRange::key("a"));
    req.revision = 6;
    let future = s.range(&req, 5).unwrap_err();
    assert_eq!(future, EtcdError::FutureRevision { current: 5 });
    assert_eq!(
        future.to_string(),
        "mvcc: required revision is a future revision"
    );
    s.compact(3, 5).expect("compact");
    req.revision = 2;
    let compacted = s.range(&req, 5).unwrap_err();
    assert_eq!(
        compacted,
        EtcdError::Compacted {
            compact_revision: 3
        }
    );
    assert_eq!(
        compacted.to_string(),
        "mvcc: required revision has been compacted"
    );
    req.revision = 3;
    assert_eq!(s.range(&req, 5).expect("range").kvs[0].value, b"1");
}

#[test]
fn delete_ranges_and_no_write_deletes() {
    let mut s = EtcdStore::new();
    for (i, k) in ["a", "b1", "b2", "c"].iter().enumerate() {
        put(&mut s, i as u64 + 1, k, "v");
    }
    let none = del(&mut s, 10, KeyRange::key("zz"));
    assert!(!none.wrote);
    assert_eq!(none.response.deleted, 0);
    assert_eq!(s.last_write(), 4, "an empty delete writes nothing");
    let d = del(&mut s, 10, KeyRange::prefix("b"));
    assert!(d.wrote);
    let keys: Vec<_> = d
        .response
        .prev_kvs
        .iter()
        .map(|kv| kv.key.clone())
        .collect();
    assert_eq!(keys, [b"b1".to_vec(), b"b2".to_vec()]);
    // One revision, two sub revisions, in key order.
    let ev = s
        .events_since(4, &KeyRange::all(), 0, false)
        .expect("events");
    assert_eq!(ev.events.len(), 2);
    assert!(ev
        .events
        .iter()
        .all(|e| e.kind == EventKind::Delete && e.kv.mod_revision == 10));
    assert_eq!(ev.events[0].kv.key, b"b1");
    let d = del(&mut s, 11, KeyRange::new("a", vec![0]));
    assert_eq!(d.response.deleted, 2);
    assert_eq!(s.key_count(), 0);
    assert_eq!(
        s.delete_range(&DeleteRangeRequest::default(), 12),
        Err(EtcdError::EmptyKey)
    );
}

pub(super) fn cmp(key: &str, result: CompareResult, target: CompareTarget) -> Compare {
    Compare {
        range: KeyRange::key(key),
        result,
        target,
    }
}

pub(super) fn put_op(key: &str, value: &str) -> RequestOp {
    RequestOp::Put(PutRequest::new(key, value))
}

pub(super) fn txn(
    s: &mut EtcdStore,
    rev: Revision,
    req: &TxnRequest,
) -> Result<Outcome<TxnResponse>, EtcdError> {
    s.txn(req, rev, &no_lease)
}

#[test]
fn txn_compares_every_target() {
    use CompareResult::*;
    use CompareTarget::*;
    let mut s = EtcdStore::new();
    put(&mut s, 5, "k", "m");
    put(&mut s, 8, "k", "n");
    let holds = |s: &EtcdStore, c: Compare| s.compare(&c, 8);
    assert!(holds(&s, cmp("k", Equal, Version(2))));
    assert!(holds(&s, cmp("k", Greater, Version(1))));
    assert!(holds(&s, cmp("k", Less, Version(3))));
    assert!(!holds(&s, cmp("k", NotEqual, Version(2))));
    assert!(holds(&s, cmp("k", Equal, CreateRevision(5))));
    assert!(holds(&s, cmp("k", Equal, ModRevision(8))));
    assert!(holds(&s, cmp("k", Greater, ModRevision(-1))));
    assert!(holds(&s, cmp("k", Equal, Lease(0))));
    assert!(holds(&s, cmp("k", Equal, Value(b"n".to_vec()))));
    assert!(holds(&s, cmp("k", Greater, Value(b"m".to_vec()))));
    assert!(holds(&s, cmp("k", Less, Value(b"na".to_vec()))));
    // An absent key: zero fields, no value compare holds.
    assert!(holds(&s, cmp("x", Equal, Version(0))));
    assert!(holds(&s, cmp("x", Equal, CreateRevision(0))));
    assert!(!holds(&s, cmp("x", Equal, Value(Vec::new()))));
    assert!(!holds(&s, cmp("x", NotEqual, Value(Vec::new()))));
    // Over a range: every key must satisfy it.
    put(&mut s, 9, "k2", "n");
    let mut c = cmp("k", Equal, Value(b"n".to_vec()));
    c.range = KeyRange::prefix("k");
    assert!(s.compare(&c, 9));
    c.target = Version(1);
    assert!(!s.compare(&c, 9));
}

#[test]
fn txn_branches_one_revision_and_reads_of_own_writes() {
    let mut s = EtcdStore::new();
    put(&mut s, 1, "k", "v");
    let req = TxnRequest {
        compare: vec![cmp(
            "k",
            CompareResult::Equal,
            CompareTarget::Value(b"v".to_vec()),
        )],
        success: vec![
            RequestOp::Range(RangeRequest::new(KeyRange::key("a"))),
            put_op("a", "1"),
            RequestOp::Range(RangeRequest::new(KeyRange::key("a"))),
            RequestOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::key("k"),
                prev_kv: true,
            }),
            put_op("b", "2"),
        ],
        failure: vec![put_op("f", "x")],
    };
    let out = txn(&mut s, 5, &req).expect("txn");
    assert!(out.wrote && out.response.succeeded);
    let r = &out.response.responses;
    assert!(matches!(&r[0], ResponseOp::Range(r) if r.count == 0));
    assert!(matches!(&r[2], ResponseOp::Range(r) if r.kvs[0].mod_revision == 5));
    assert!(matches!(&r[3], ResponseOp::DeleteRange(d) if d.prev_kvs[0].value == b"v"));
    let ev = s.events_since(1, &KeyRange::all(), 0, false).expect("ev");
    let order: Vec<_> = ev
        .events
        .iter()
        .map(|e| (e.kv.key.clone(), e.kv.mod_revision))
        .collect();
    assert_eq!(
        order,
        [(b"a".to_vec(), 5), (b"k".to_vec(), 5), (b"b".to_vec(), 5)]
    );
    // The compare now fails (k is gone): the failure branch runs.
    let out = txn(&mut s, 6, &req).expect("txn");
    assert!(!out.response.succeeded && out.wrote);
    assert_eq!(one(&s, "f", 6).expect("f").mod_revision, 6);
}

#[test]
fn txn_that_writes_nothing_changes_nothing() {
    let mut s = EtcdStore::new();
    put(&mut s, 1, "k", "v");
    let before = bincode::serialize(&s).expect("encode");
    let req = TxnRequest {
        compare: vec![cmp("k", CompareResult::Equal, CompareTarget::Version(9))],
        success: vec![put_op("k", "w")],
        failure: vec![
            RequestOp::Range(RangeRequest::new(KeyRange::key("k"))),
            RequestOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::key("absent"),
                prev_kv: false,
            }),
        ],
    };
    let out = txn(&mut s, 2, &req).expect("txn");
    assert!(!out.wrote && !out.response.succeeded);
    assert!(matches!(&out.response.responses[0], ResponseOp::Range(r) if r.count == 1));
    assert_eq!(bincode::serialize(&s).expect("encode"), before);
    // The same revision can then be used by the next write.
    put(&mut s, 2, "k", "w");
}

#[test]
fn read_only_txns_on_the_read_path() {
    let mut s = EtcdStore::new();
    put(&mut s, 3, "k", "v");
    let read = |key: &str| RequestOp::Range(RangeRequest::new(KeyRange::key(key)));
    let req = TxnRequest {
        compare: vec![cmp("k", CompareResult::Equal, CompareTarget::Version(1))],
        success: vec![
            read("k"),
            RequestOp::Txn(TxnRequest {
                success: vec![read("x")],
                ..TxnRequest::default()
            }),
        ],
        failure: vec![read("x")],
    };
    assert!(req.is_read_only());
    let before = s.clone();
    let r = s.txn_read_only(&req, 5).expect("txn");
    assert!(r.succeeded);
    assert!(matches!(&r.responses[0], ResponseOp::Range(r) if r.kvs[0].value == b"v"));
    assert_eq!(s, before);
    let mut writes = req.clone();
    writes.failure.push(RequestOp::Txn(TxnRequest {
        failure: vec![put_op("x", "1")],
        ..TxnRequest::default()
    }));
    assert!(!writes.is_read_only());
    let mut bad = req;
    bad.success.push(RequestOp::Range(RangeRequest {
        revision: 6,
        ..RangeRequest::new(KeyRange::key("k"))
    }));
    assert_eq!(
        s.txn_read_only(&bad, 5),
        Err(EtcdError::FutureRevision { current: 5 })
    );
}

#[test]
fn txn_refusals_change_nothing() {
    let mut s = EtcdStore::new();
    put(&mut s, 1, "k", "v");
    let before = s.clone();
    let dup = |success: Vec<RequestOp>| TxnRequest {
        success,
        ..TxnRequest::default()
    };
    let del_op = |r: KeyRange| {
        RequestOp::DeleteRange(DeleteRangeRequest {
            range: r,
            prev_kv: false,
        })
    };
    let nested = |success: Vec<RequestOp>, failure: Vec<RequestOp>| {
        RequestOp::Txn(TxnRequest {
            compare: Vec::new(),
            success,
            failure,
        })
    };
    let refused = [
        (
            dup(vec![put_op("a", "1"), put_op("a", "2")]),
            EtcdError::DuplicateKey,
        ),
        (
            dup(vec![put_op("ab", "1"), del_op(KeyRange::prefix("a"))]),
            EtcdError::DuplicateKey,
        ),
        (
            dup(vec![put_op("z", "1"), del_op(KeyRange::new("a", vec![0]))]),
            EtcdError::DuplicateKey,
        ),
        (
            dup(vec![
                put_op("a", "1"),
                nested(vec![put_op("a", "2")], vec![]),
            ]),
            EtcdError::DuplicateKey,
        ),
        (
            dup(vec![
                nested(vec![del_op(KeyRange::key("a"))], vec![]),
                nested(vec![put_op("a", "2")], vec![]),
            ]),
            EtcdError::DuplicateKey,
        ),
        (
            dup(vec![
                nested(vec![put_op("x", "1")], vec![put_op("y", "1")]),
                nested(vec![put_op("y", "2")], vec![]),
            ]),
            EtcdError::DuplicateKey,
        ),
        (dup(vec![put_op("", "1")]), EtcdError::EmptyKey),
        (
            dup((0..=MAX_TXN_OPS)
                .map(|i| put_op(&format!("k{i}"), "v"))
                .collect()),
            EtcdError::TooManyOps { max: MAX_TXN_OPS },
        ),
        (
            dup(vec![
                put_op("a", "1"),
                RequestOp::Put(PutRequest {
                    ignore_value: true,
                    ..PutRequest::new("absent", "")
                }),
            ]),
            EtcdError::KeyNotFound,
        ),
        (
            dup(vec![
                put_op("a", "1"),
                RequestOp::Range(RangeRequest {
                    revision: 2,
                    ..RangeRequest::new(KeyRange::key("a"))
                }),
            ]),
            EtcdError::FutureRevision { current: 1 },
        ),
        (
            dup(vec![
                put_op("a", &"x".repeat(MAX_REQUEST_BYTES / 2)),
                put_op("b", &"x".repeat(MAX_REQUEST_BYTES / 2)),
            ]),
            EtcdError::RequestTooLarge {
                size: MAX_REQUEST_BYTES + 2 + 2 * OP_OVERHEAD,
                max: MAX_REQUEST_BYTES,
            },
        ),
    ];
    for (req, want) in refused {
        assert_eq!(txn(&mut s, 2, &req).unwrap_err(), want, "{req:?}");
        assert_eq!(s, before);
    }
    assert_eq!(
        EtcdError::DuplicateKey.to_string(),
        "etcdserver: duplicate key given in txn request"
    );
    // Allowed: the same key in both branches of a nested txn, overlapping deletes, and a
    // failure branch that writes what the success branch writes.
    let ok = [
        dup(vec![nested(vec![put_op("a", "1")], vec![put_op("a", "2")])]),
        dup(vec![
            del_op(KeyRange::prefix("k")),
            del_op(KeyRange::key("k")),
        ]),
        TxnRequest {
            compare: Vec::new(),
            success: vec![put_op("a", "1")],
            failure: vec![put_op("a", "2")],
        },
    ];
    for (i, req) in ok.iter().enumerate() {
        txn(&mut s, 2 + i as u64, req).expect("allowed");
    }
    // Too deep.
    let mut deep = TxnRequest::default();
    for _ in 0..MAX_TXN_DEPTH {
        deep = TxnRequest {
            success: vec![RequestOp::Txn(deep)],
            ..TxnRequest::default()
        };
    }
    assert_eq!(
        txn(&mut s, 10, &deep).unwrap_err(),
        EtcdError::TxnTooDeep { max: MAX_TXN_DEPTH }
    );
}

#[test]
fn nested_compares_see_the_store_before_the_txn() {
    let mut s = EtcdStore::new();
    let req = TxnRequest {
        compare: Vec::new(),
        success: vec![
            put_op("a", "1"),
            RequestOp::Txn(TxnRequest {
                // "a" is absent before the txn, even though the outer txn puts it first.
                compare: vec![cmp("a", CompareResult::Equal, CompareTarget::Version(0))],
                success: vec![put_op("yes", "1")],
                failure: vec![put_op("no", "1")],
            }),
        ],
        failure: Vec::new(),
    };
    let out = txn(&mut s, 3, &req).expect("txn");
    assert!(matches!(&out.response.responses[1], ResponseOp::Txn(t) if t.succeeded));
    assert!(one(&s, "yes", 3).is_some() && one(&s, "no", 3).is_none());
}

#[test]
fn a_read_over_the_byte_maximum_is_refused_but_pages_and_writing_txns_are_not() {
    let mut s = EtcdStore::new();
    let mib = vec![b'v'; 1024 * 1024];
    let n = MAX_RANGE_BYTES / mib.len() + 1;
    for i in 0..n {
        let req = PutRequest::new(format!("big/{i:03}"), mib.clone());
        s.put(&req, 10 + i as Revision, &no_lease).expect("put");
    }
    let now = 10 + n as Revision;
    let all = RangeRequest::new(KeyRange::prefix("big/"));
    assert_eq!(
        s.range(&all, now),
        Err(EtcdError::RangeTooLarge {
            max: MAX_RANGE_BYTES
        })
    );
    // A page, the keys alone and the count are served.
    let mut page = all.clone();
    page.limit = 10;
    let got = s.range(&page, now).expect("a page");
    assert_eq!((got.kvs.len(), got.more, got.count), (10, true, n as u64));
    let mut keys = all.clone();
    keys.keys_only = true;
    assert_eq!(s.range(&keys, now).expect("keys only").kvs.len(), n);
    let mut count = all.clone();
    count.count_only = true;
    assert_eq!(s.range(&count, now).expect("count").count, n as u64);
    // A read-only txn with the same range is refused; a txn that writes runs it whole.
    let read = TxnRequest {
        success: vec![RequestOp::Range(all.clone())],
        ..TxnRequest::default()
    };
    assert!(matches!(
        s.txn_read_only(&read, now),
        Err(EtcdError::RangeTooLarge { .. })
    ));
    let write = TxnRequest {
        success: vec![RequestOp::Range(all), put_op("after", "1")],
        ..TxnRequest::default()
    };
    let out = txn(&mut s, now + 1, &write).expect("a writing txn is all or nothing");
    match &out.response.responses[0] {
        ResponseOp::Range(r) => assert_eq!(r.kvs.len(), n),
        other => panic!("{other:?}"),
    }
}
