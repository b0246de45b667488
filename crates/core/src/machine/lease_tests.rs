//! etcd leases as sessions ([`Semantics::LEASES`]): keys attached by a put, moved, detached,
//! and deleted when the session ends, by any path, at that command's revision.

use super::etcd_tests::Log;
use super::StateMachine;
use crate::command::*;
use crate::etcd::{
    EtcdError, EventKind, KeyRange, PutRequest, RangeRequest, RequestOp, TxnRequest,
    MAX_LEASE_TTL_S,
};
use crate::CoreError;

fn leases_log() -> Log {
    let mut log = Log::new();
    log.semantics = Semantics::LEASES;
    log
}

fn one(log: &mut Log, cmd: Command) -> (Response, Vec<Event>) {
    let mut out = log.apply(None, cmd);
    (out.responses.pop().expect("one response"), out.events)
}

fn grant(log: &mut Log, ttl_ms: Millis) -> SessionId {
    match one(log, Command::OpenLease { ttl_ms }).0 {
        Response::SessionOpened { session, .. } => session,
        other => panic!("grant: {other:?}"),
    }
}

fn put_leased(log: &mut Log, key: &str, lease: SessionId) -> Response {
    let mut p = PutRequest::new(key, "v");
    p.lease = lease as i64;
    log.etcd(EtcdCommand::Put(p))
}

fn lease_of(sm: &StateMachine, key: &str) -> Option<i64> {
    let r = sm
        .etcd_range(&RangeRequest::new(KeyRange::key(key)))
        .expect("range");
    r.kvs.first().map(|kv| kv.lease)
}

/// The change feed after `after`: (kind, key, revision).
fn feed(sm: &StateMachine, after: Revision) -> Vec<(EventKind, String, Revision)> {
    sm.etcd_events_since(after, &KeyRange::all(), 1_000, false)
        .expect("events")
        .events
        .into_iter()
        .map(|e| {
            (
                e.kind,
                String::from_utf8_lossy(&e.kv.key).into_owned(),
                e.kv.mod_revision,
            )
        })
        .collect()
}

#[test]
fn a_put_attaches_moves_detaches_and_ignore_lease_keeps() {
    let mut log = leases_log();
    let a = grant(&mut log, 10_000);
    let b = grant(&mut log, 10_000);
    assert!(matches!(
        put_leased(&mut log, "k", a),
        Response::Etcd { wrote: true, .. }
    ));
    assert_eq!(lease_of(&log.sm, "k"), Some(a as i64));
    assert_eq!(log.sm.lease_keys(a), vec![b"k".to_vec()]);
    // Another lease moves it.
    put_leased(&mut log, "k", b);
    assert_eq!(lease_of(&log.sm, "k"), Some(b as i64));
    assert!(log.sm.lease_keys(a).is_empty());
    assert_eq!(log.sm.lease_keys(b), vec![b"k".to_vec()]);
    // ignore_lease keeps it.
    let mut keep = PutRequest::new("k", "w");
    keep.ignore_lease = true;
    log.etcd(EtcdCommand::Put(keep));
    assert_eq!(lease_of(&log.sm, "k"), Some(b as i64));
    // No lease detaches it: b's end leaves it alone.
    log.etcd(EtcdCommand::Put(PutRequest::new("k", "x")));
    assert_eq!(lease_of(&log.sm, "k"), Some(0));
    assert!(log.sm.lease_keys(b).is_empty());
    one(&mut log, Command::CloseSession { session: b });
    assert_eq!(lease_of(&log.sm, "k"), Some(0));
    // An unknown lease is refused.
    assert_eq!(
        put_leased(&mut log, "k", b),
        Response::Rejected(CoreError::Etcd(EtcdError::LeaseNotFound {
            lease: b as i64
        }))
    );
    log.sm.check_invariants().expect("consistent");
}

#[test]
fn close_deletes_every_attached_key_at_its_revision_and_wakes_watches() {
    let mut log = leases_log();
    let a = grant(&mut log, 10_000);
    put_leased(&mut log, "x", a);
    put_leased(&mut log, "y", a);
    log.etcd(EtcdCommand::Put(PutRequest::new("z", "free")));
    // A txn's put attaches too.
    let mut p = PutRequest::new("t", "v");
    p.lease = a as i64;
    let txn = TxnRequest {
        success: vec![RequestOp::Put(p)],
        ..TxnRequest::default()
    };
    assert!(matches!(
        log.etcd(EtcdCommand::Txn(txn)),
        Response::Etcd { wrote: true, .. }
    ));
    assert_eq!(log.sm.lease_keys(a).len(), 3);
    let before = log.sm.revision();
    let (r, events) = one(&mut log, Command::CloseSession { session: a });
    assert_eq!(r, Response::SessionClosed);
    let at = log.sm.revision();
    assert!(
        events.contains(&Event::EtcdChanged { revision: at }),
        "{events:?}"
    );
    assert_eq!(
        feed(&log.sm, before),
        vec![
            (EventKind::Delete, "t".into(), at),
            (EventKind::Delete, "x".into(), at),
            (EventKind::Delete, "y".into(), at),
        ]
    );
    assert_eq!(lease_of(&log.sm, "z"), Some(0), "an unattached key stays");
    assert_eq!(log.sm.etcd().key_count(), 1);
    log.sm.check_invariants().expect("consistent");
}

#[test]
fn expiry_deletes_the_keys_of_every_lapsed_lease_at_the_expiry_steps_revision() {
    let mut log = leases_log();
    // Same deadline for both (granted in one entry).
    let batch = Batch {
        requests: vec![
            Request {
                time_ms: 1_000,
                client: None,
                cmd: Command::OpenLease { ttl_ms: 5_000 },
            },
            Request {
                time_ms: 1_000,
                client: None,
                cmd: Command::OpenLease { ttl_ms: 5_000 },
            },
        ],
        semantics: Semantics::LEASES,
    };
    log.index += 1;
    let out = log.sm.apply_batch(log.index, &batch);
    let ids: Vec<SessionId> = out
        .responses
        .iter()
        .map(|r| match r {
            Response::SessionOpened { session, .. } => *session,
            other => panic!("{other:?}"),
        })
        .collect();
    put_leased(&mut log, "a1", ids[0]);
    put_leased(&mut log, "a2", ids[0]);
    put_leased(&mut log, "b1", ids[1]);
    let before = log.sm.revision();
    // A tick after the deadline: one expiry step (one revision) ends both.
    let tick = Batch {
        requests: vec![Request {
            time_ms: 10_000,
            client: None,
            cmd: Command::Tick,
        }],
        semantics: Semantics::LEASES,
    };
    log.index += 1;
    let out = log.sm.apply_batch(log.index, &tick);
    let step = before + 1;
    assert_eq!(log.sm.revision(), before + 2, "the step, then the tick");
    assert!(out.events.contains(&Event::EtcdChanged { revision: step }));
    assert_eq!(
        feed(&log.sm, before),
        vec![
            (EventKind::Delete, "a1".into(), step),
            (EventKind::Delete, "a2".into(), step),
            (EventKind::Delete, "b1".into(), step),
        ]
    );
    let events = log
        .sm
        .etcd_events_since(before, &KeyRange::all(), 10, false)
        .expect("events");
    let subs: Vec<_> = events.events.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(subs.len(), 3);
    assert_eq!(log.sm.etcd().key_count(), 0);
    assert!(log.sm.session_ids().is_empty());
    log.sm.check_invariants().expect("consistent");
}

#[test]
fn keep_alive_many_answers_per_session_and_extends_each() {
    let mut log = leases_log();
    let a = grant(&mut log, 5_000);
    let b = grant(&mut log, 60_000);
    let (r, _) = one(
        &mut log,
        Command::KeepAliveMany {
            sessions: vec![a, 999_999, b],
        },
    );
    let now = log.sm.now();
    assert_eq!(
        r,
        Response::SessionsAlive {
            alive: vec![
                Some(SessionLife {
                    deadline_ms: now + 5_000,
                    ttl_ms: 5_000
                }),
                None,
                Some(SessionLife {
                    deadline_ms: now + 60_000,
                    ttl_ms: 60_000
                }),
            ]
        }
    );
    log.sm.check_invariants().expect("consistent");
}

#[test]
fn a_lease_takes_etcds_ttl_limit_not_the_sessions_day() {
    let mut log = leases_log();
    let week = 7 * 24 * 3_600_000;
    let a = grant(&mut log, week);
    assert_eq!(
        log.sm.session_info(a, log.sm.now()).map(|i| i.ttl_ms),
        Some(week)
    );
    let too_long = MAX_LEASE_TTL_S as u64 * 1000 + 1;
    assert!(matches!(
        one(&mut log, Command::OpenLease { ttl_ms: too_long }).0,
        Response::Rejected(CoreError::InvalidTtl { .. })
    ));
    // A plain session keeps its cap.
    assert!(matches!(
        one(&mut log, Command::OpenSession { ttl_ms: week }).0,
        Response::Rejected(CoreError::InvalidTtl { .. })
    ));
}

#[test]
fn under_older_rules_a_lease_put_is_refused_and_an_old_log_replays_as_before() {
    // The same commands stamped QUOTA: a put naming a live session is refused as before, the
    // lease commands are refused by the entry, and nothing else changes.
    let mut log = Log::new();
    log.semantics = Semantics::QUOTA;
    let s = match one(&mut log, Command::OpenSession { ttl_ms: 10_000 }).0 {
        Response::SessionOpened { session, .. } => session,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        put_leased(&mut log, "k", s),
        Response::Rejected(CoreError::Etcd(EtcdError::LeaseNotFound {
            lease: s as i64
        }))
    );
    assert!(matches!(
        one(&mut log, Command::OpenLease { ttl_ms: 10_000 }).0,
        Response::Rejected(CoreError::NotUpgraded { needs: 5, .. })
    ));
    assert!(matches!(
        one(&mut log, Command::KeepAliveMany { sessions: vec![s] }).0,
        Response::Rejected(CoreError::NotUpgraded { needs: 5, .. })
    ));
    let (r, events) = one(&mut log, Command::CloseSession { session: s });
    assert_eq!(r, Response::SessionClosed);
    assert!(events.is_empty());
    assert_eq!(log.sm.etcd().key_count(), 0);
}

#[test]
fn the_gate_names_leases_for_lease_puts_only() {
    let plain = Command::Etcd(EtcdCommand::Put(PutRequest::new("k", "v")));
    assert_eq!(Semantics::needed_by(&plain), Semantics::ETCD);
    let mut p = PutRequest::new("k", "v");
    p.lease = 7;
    let leased = Command::Etcd(EtcdCommand::Put(p.clone()));
    assert_eq!(Semantics::needed_by(&leased), Semantics::LEASES);
    assert_eq!(Semantics::defined_by(&leased), Semantics::ETCD);
    let nested = TxnRequest {
        failure: vec![RequestOp::Txn(TxnRequest {
            success: vec![RequestOp::Put(p)],
            ..TxnRequest::default()
        })],
        ..TxnRequest::default()
    };
    assert_eq!(
        Semantics::needed_by(&Command::Etcd(EtcdCommand::Txn(nested))),
        Semantics::LEASES
    );
    assert_eq!(
        Semantics::needed_by(&Command::OpenLease { ttl_ms: 1 }),
        Semantics::LEASES
    );
    assert_eq!(
        Semantics::needed_by(&Command::KeepAliveMany { sessions: vec![] }),
        Semantics::LEASES
    );
    assert!(Semantics::NEWEST.leases());
}

#[test]
fn the_lease_index_is_rebuilt_from_a_snapshot_and_changes_no_body() {
    let mut log = leases_log();
    let a = grant(&mut log, 10_000);
    put_leased(&mut log, "k1", a);
    put_leased(&mut log, "k2", a);
    assert_eq!(
        log.sm.body_version(),
        2,
        "no new body: the index is derived"
    );
    let back = StateMachine::from_bytes(&log.sm.to_bytes()).expect("decode");
    assert_eq!(back, log.sm);
    assert_eq!(back.lease_keys(a), log.sm.lease_keys(a));
    // The decoded state ends the lease the same way.
    let mut other = Log {
        sm: back,
        index: log.index,
        semantics: Semantics::LEASES,
    };
    one(&mut log, Command::CloseSession { session: a });
    one(&mut other, Command::CloseSession { session: a });
    assert_eq!(other.sm, log.sm);
    assert_eq!(other.sm.to_bytes(), log.sm.to_bytes());
}

#[test]
fn a_restore_deletes_the_keys_of_the_sessions_it_drops() {
    let mut log = leases_log();
    let a = grant(&mut log, 10_000);
    put_leased(&mut log, "leased", a);
    log.etcd(EtcdCommand::Put(PutRequest::new("free", "v")));
    let r = log.sm.prepare_restore(100).expect("fits");
    assert_eq!(r.etcd_keys, 1);
    assert_eq!(lease_of(&log.sm, "leased"), None);
    assert_eq!(lease_of(&log.sm, "free"), Some(0));
    log.sm.check_invariants().expect("consistent");
}

fn chosen_log(semantics: Semantics) -> Log {
    let mut log = Log::new();
    log.semantics = semantics;
    log
}

/// Issue 38, item 5: a lease id the client chose is granted when free, refused with etcd's
/// "lease already exists" when taken, and ids assigned later skip it — never two sessions
/// under one id, whatever revision reaches it.
#[test]
fn a_chosen_lease_id_is_granted_once_and_assigned_ids_skip_it() {
    let mut log = chosen_log(Semantics::CHOSEN_LEASES);
    let chosen = log.sm.revision() + 2;
    let r = one(
        &mut log,
        Command::GrantLease {
            id: chosen,
            ttl_ms: 60_000,
        },
    )
    .0;
    assert!(
        matches!(r, Response::SessionOpened { session, .. } if session == chosen),
        "{r:?}"
    );
    let again = one(
        &mut log,
        Command::GrantLease {
            id: chosen,
            ttl_ms: 60_000,
        },
    )
    .0;
    assert_eq!(
        again,
        Response::Rejected(CoreError::Etcd(EtcdError::LeaseExists {
            lease: chosen as i64
        }))
    );
    assert_eq!(
        EtcdError::LeaseExists { lease: 1 }.to_string(),
        "etcdserver: lease already exists"
    );
    // The refusal took revision `chosen`: the next grant's revision is past it; one opened
    // *at* a taken id's revision moves on to the next free one.
    let mut log = chosen_log(Semantics::CHOSEN_LEASES);
    let at = log.sm.revision() + 3;
    one(
        &mut log,
        Command::GrantLease {
            id: at,
            ttl_ms: 60_000,
        },
    );
    one(
        &mut log,
        Command::GrantLease {
            id: at + 1,
            ttl_ms: 60_000,
        },
    );
    assert_eq!(
        log.sm.revision() + 1,
        at,
        "the next command is at the taken id"
    );
    let assigned = grant(&mut log, 60_000);
    assert_eq!(assigned, at + 2, "skips the two taken ids");
    let session = match one(&mut log, Command::OpenSession { ttl_ms: 60_000 }).0 {
        Response::SessionOpened { session, .. } => session,
        other => panic!("{other:?}"),
    };
    assert!(session > assigned, "{session} after {assigned}");
    let ids: Vec<SessionId> = [at, at + 1, assigned, session].to_vec();
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(ids, unique, "one session per id");
}

/// Entries of older rules replay as they applied: no chosen ids (refused, not upgraded),
/// assigned ids are the revision.
#[test]
fn older_rules_know_no_chosen_lease_ids() {
    let mut log = chosen_log(Semantics::CLUSTER_ALARM);
    let r = one(
        &mut log,
        Command::GrantLease {
            id: 99,
            ttl_ms: 60_000,
        },
    )
    .0;
    assert!(
        matches!(r, Response::Rejected(CoreError::NotUpgraded { .. })),
        "{r:?}"
    );
    let next = log.sm.revision() + 1;
    assert_eq!(grant(&mut log, 60_000), next);
}

/// etcd's capped applier: while `NOSPACE` is raised a `LeaseGrant` is refused (with or
/// without a chosen id); entries of older rules still open the lease.
#[test]
fn nospace_refuses_lease_grants_under_the_chosen_lease_rules() {
    for (semantics, refused) in [
        (Semantics::CHOSEN_LEASES, true),
        (Semantics::LUA_IDS, false),
    ] {
        let mut log = chosen_log(semantics);
        log.etcd(EtcdCommand::Quota { bytes: 100 });
        let r = log.etcd(EtcdCommand::Put(PutRequest::new("k", "v".repeat(200))));
        assert_eq!(r, Response::Rejected(CoreError::Etcd(EtcdError::NoSpace)));
        assert!(log.sm.etcd_quota().nospace);
        let r = one(&mut log, Command::OpenLease { ttl_ms: 60_000 }).0;
        assert_eq!(
            r == Response::Rejected(CoreError::Etcd(EtcdError::NoSpace)),
            refused,
            "{semantics:?}: {r:?}"
        );
        if refused {
            let r = one(
                &mut log,
                Command::GrantLease {
                    id: 500,
                    ttl_ms: 60_000,
                },
            )
            .0;
            assert_eq!(r, Response::Rejected(CoreError::Etcd(EtcdError::NoSpace)));
        }
    }
}
