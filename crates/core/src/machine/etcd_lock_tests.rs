//! etcd's `Lock` and `Election` on the lock table ([`Semantics::ELECTIONS`]): a grant puts
//! `name/<lease hex>` at its token's revision, every end deletes it, a hand-over does both at
//! one revision, waiters stay out of the keyspace and wait as long as their lease lives.

use super::{lock_key, StateMachine};
use crate::command::*;
use crate::etcd::{EventKind, KeyRange, RangeRequest};
use crate::CoreError;

struct Log {
    sm: StateMachine,
    index: Index,
    now: Millis,
    semantics: Semantics,
    seq: u64,
}

impl Log {
    fn new() -> Log {
        Log {
            sm: StateMachine::new(),
            index: 0,
            now: 1_000,
            semantics: Semantics::ELECTIONS,
            seq: 0,
        }
    }

    fn rid(&mut self) -> RequestId {
        self.seq += 1;
        RequestId {
            client_id: 7,
            seq: self.seq,
        }
    }

    fn apply(&mut self, client: Option<RequestId>, cmd: Command) -> (Response, Vec<Event>) {
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
        self.sm.check_invariants().expect("invariants");
        (out.responses.pop().expect("one response"), out.events)
    }

    fn lease(&mut self, ttl_ms: Millis) -> SessionId {
        match self.apply(None, Command::OpenLease { ttl_ms }).0 {
            Response::SessionOpened { session, .. } => session,
            other => panic!("lease: {other:?}"),
        }
    }

    fn lock(&mut self, name: &str, lease: SessionId, value: &str) -> (RequestId, Response) {
        let rid = self.rid();
        let cmd = Command::EtcdLock {
            name: name.into(),
            lease,
            value: value.into(),
        };
        (rid, self.apply(Some(rid), cmd).0)
    }

    fn unlock(
        &mut self,
        name: &str,
        lease: SessionId,
        token: Option<Token>,
    ) -> (Response, Vec<Event>) {
        let cmd = Command::EtcdUnlock {
            name: name.into(),
            lease,
            token,
        };
        self.apply(None, cmd)
    }

    /// (value, create_revision, mod_revision, lease) of `key`.
    fn key(&self, name: &str, lease: SessionId) -> Option<(String, Revision, Revision, i64)> {
        let r = self
            .sm
            .etcd_range(&RangeRequest::new(KeyRange::key(lock_key(name, lease))))
            .expect("range");
        r.kvs.first().map(|kv| {
            (
                String::from_utf8_lossy(&kv.value).into_owned(),
                kv.create_revision,
                kv.mod_revision,
                kv.lease,
            )
        })
    }

    /// The change feed under `name/` after `after`: (kind, key, revision).
    fn feed(&self, name: &str, after: Revision) -> Vec<(EventKind, String, Revision)> {
        self.sm
            .etcd_events_since(after, &KeyRange::prefix(format!("{name}/")), 1_000, false)
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
}

fn token(r: &Response) -> Token {
    match r {
        Response::Granted { token, .. } => *token,
        other => panic!("not granted: {other:?}"),
    }
}

fn granted_event(events: &[Event], rid: RequestId) -> Token {
    events
        .iter()
        .find_map(|e| match e {
            Event::WaiterGranted { request, token, .. } if *request == rid => Some(*token),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{rid:?} not granted in {events:?}"))
}

#[test]
fn a_grant_puts_the_key_at_its_token_and_is_idempotent() {
    let mut log = Log::new();
    let a = log.lease(60_000);
    let (_, r) = log.lock("job", a, "");
    let t = token(&r);
    assert_eq!(t, log.sm.revision(), "granted at this command's revision");
    assert_eq!(lock_key("job", a), format!("job/{a:x}").into_bytes());
    assert_eq!(log.key("job", a), Some((String::new(), t, t, a as i64)));
    // The same lease again: the same grant, no second hold, no write.
    let before = log.sm.etcd().last_write();
    let (_, again) = log.lock("job", a, "");
    assert_eq!(
        again,
        Response::Granted {
            token: t,
            holds: 1,
            deadline_ms: None
        }
    );
    assert_eq!(log.sm.etcd().last_write(), before);
    // It is one lock with the lock table's: LOCK.INFO sees the lease's grant.
    let info = log.sm.lock_info("job").expect("held");
    assert_eq!((info.token, info.owner), (t, format!("{a:x}")));
}

#[test]
fn waiters_stay_out_of_the_keyspace_and_a_hand_over_is_one_revision() {
    let mut log = Log::new();
    let a = log.lease(60_000);
    let b = log.lease(60_000);
    let c = log.lease(60_000);
    let ta = token(&log.lock("job", a, "A").1);
    let (rb, pb) = log.lock("job", b, "B");
    let (rc, pc) = log.lock("job", c, "C");
    assert_eq!((pb, pc), (Response::Pending, Response::Pending));
    assert_eq!(log.key("job", b), None, "a waiter puts no key");
    assert_eq!(log.feed("job", 0).len(), 1, "only the holder's key");
    // Unlock: a's key deleted and b's put at the unlock's revision, in that order.
    let (r, events) = log.unlock("job", a, None);
    assert_eq!(r, Response::Released { holds: 0 });
    let rev = log.sm.revision();
    let tb = granted_event(&events, rb);
    assert_eq!(tb, rev);
    assert!(tb > ta);
    assert_eq!(
        log.feed("job", ta),
        vec![
            (EventKind::Delete, format!("job/{a:x}"), rev),
            (EventKind::Put, format!("job/{b:x}"), rev),
        ]
    );
    assert_eq!(log.key("job", b), Some(("B".into(), tb, tb, b as i64)));
    assert!(events.contains(&Event::EtcdChanged { revision: rev }));
    // Resign with another token refuses; with its own hands to c.
    assert_eq!(log.unlock("job", b, Some(ta)).0, Response::NotHeld);
    let (r, events) = log.unlock("job", b, Some(tb));
    assert_eq!(r, Response::Released { holds: 0 });
    let tc = granted_event(&events, rc);
    assert_eq!(log.key("job", c).map(|k| k.1), Some(tc));
    assert_eq!(log.key("job", b), None);
    // Unlocking what is not held is NotHeld, and writes nothing.
    assert_eq!(log.unlock("job", a, None).0, Response::NotHeld);
}

#[test]
fn a_lapsed_lease_hands_over_and_a_wait_lasts_as_long_as_its_lease() {
    let mut log = Log::new();
    let a = log.lease(5_000);
    let b = log.lease(3 * 60 * 60 * 1000);
    let ta = token(&log.lock("job", a, "").1);
    let (rb, _) = log.lock("job", b, "");
    // Past a's TTL: the expiry step deletes a's key (its lease's) and grants b.
    log.now += 6_000;
    let (_, events) = log.apply(None, Command::Tick);
    let tb = granted_event(&events, rb);
    assert!(tb > ta);
    assert_eq!(log.key("job", a), None);
    assert_eq!(log.key("job", b).map(|k| k.1), Some(tb));
    let rev = tb;
    let kinds: Vec<EventKind> = log.feed("job", ta).iter().map(|e| e.0).collect();
    assert_eq!(kinds, vec![EventKind::Delete, EventKind::Put]);
    assert!(log.feed("job", ta).iter().all(|e| e.2 == rev));
    // A waiter of a long lease outlives MAX_WAIT_MS (an hour): only its lease ends it.
    let c = log.lease(3 * 60 * 60 * 1000);
    let (rc, _) = log.lock("job", c, "");
    log.now += 2 * 60 * 60 * 1000;
    log.apply(None, Command::KeepAlive { session: b });
    let (_, events) = log.apply(None, Command::KeepAlive { session: c });
    assert!(events.is_empty(), "{events:?}");
    let (_, events) = log.unlock("job", b, None);
    assert!(granted_event(&events, rc) > tb);
    // The lease's end withdraws a wait: d waits, d's lease is revoked.
    let d = log.lease(60_000);
    let (rd, _) = log.lock("job", d, "");
    let (_, events) = log.apply(None, Command::CloseSession { session: d });
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::WaiterGaveUp { request, .. } if *request == rd)));
}

#[test]
fn a_repeated_wait_takes_the_earlier_ones_place() {
    let mut log = Log::new();
    let a = log.lease(60_000);
    let b = log.lease(60_000);
    let c = log.lease(60_000);
    log.lock("job", a, "");
    let (rb1, _) = log.lock("job", b, "old");
    let (rc, _) = log.lock("job", c, "");
    // b calls again (a retry on a new connection): its place in front of c is kept.
    let rb2 = log.rid();
    let (r, events) = log.apply(
        Some(rb2),
        Command::EtcdLock {
            name: "job".into(),
            lease: b,
            value: "new".into(),
        },
    );
    assert_eq!(r, Response::Pending);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::WaiterGaveUp { request, .. } if *request == rb1)));
    let (_, events) = log.unlock("job", a, None);
    granted_event(&events, rb2);
    assert_eq!(log.key("job", b).map(|k| k.0), Some("new".into()));
    let (_, events) = log.unlock("job", b, None);
    granted_event(&events, rc);
    // A withdrawn wait (a cancelled Lock): gone from the queue, the next still waits.
    let d = log.lease(60_000);
    let e = log.lease(60_000);
    let (_rd, _) = log.lock("job", d, "");
    let (re, _) = log.lock("job", e, "");
    assert_eq!(
        log.unlock("job", d, None).0,
        Response::Released { holds: 0 }
    );
    let (_, events) = log.unlock("job", c, None);
    granted_event(&events, re);
}

#[test]
fn one_lock_with_the_lock_tables_and_force_unlock_deletes_the_key() {
    let mut log = Log::new();
    let a = log.lease(60_000);
    // A plain acquire holds the name: the etcd Lock queues behind it, FIFO.
    let rid = log.rid();
    let plain = log.apply(
        Some(rid),
        Command::Acquire {
            name: "job".into(),
            owner: "x".into(),
            ttl_ms: 10_000,
            session: None,
            wait_ms: 0,
        },
    );
    let tx = token(&plain.0);
    let (ra, r) = log.lock("job", a, "");
    assert_eq!(r, Response::Pending);
    let (_, events) = log.apply(
        None,
        Command::Release {
            name: "job".into(),
            owner: "x".into(),
            token: tx,
        },
    );
    let ta = granted_event(&events, ra);
    assert_eq!(log.key("job", a).map(|k| k.1), Some(ta));
    let (_, events) = log.apply(None, Command::ForceUnlock { name: "job".into() });
    assert!(events.contains(&Event::EtcdChanged {
        revision: log.sm.revision()
    }));
    assert_eq!(log.key("job", a), None);
    // A read-write lock of the name refuses an etcd Lock (etcd's are exclusive).
    let rid = log.rid();
    log.apply(
        Some(rid),
        Command::AcquireWith(Box::new(AcquireSpec {
            names: vec!["rw".into()],
            owner: "x".into(),
            mode: Mode::Read,
            ttl_ms: 10_000,
            session: None,
            wait_ms: 0,
            lock_delay_ms: 0,
        })),
    );
    assert!(matches!(
        log.lock("rw", a, "").1,
        Response::Rejected(CoreError::WrongKind { .. })
    ));
    // An unknown lease is refused.
    assert_eq!(
        log.lock("job", 999_999, "").1,
        Response::Rejected(CoreError::NoSuchSession(999_999))
    );
}

#[test]
fn the_snapshot_body_carries_them_as_version_4_only_while_there_are_some() {
    let mut log = Log::new();
    let a = log.lease(60_000);
    let b = log.lease(60_000);
    log.lock("job", a, "");
    let (rb, _) = log.lock("job", b, "B");
    assert_eq!(log.sm.body_version(), 4);
    let bytes = log.sm.to_bytes();
    let back = StateMachine::from_bytes(&bytes).expect("decode");
    assert_eq!(back, log.sm);
    assert_eq!(back.digest(), log.sm.digest());
    let mut read = Vec::new();
    log.sm
        .write_body(super::body::options(), &mut read)
        .expect("write");
    let again = StateMachine::read_body(4, super::body::options(), &read[..]).expect("read");
    assert_eq!(again, log.sm);
    // The restored state goes on as the original: the hand-over projects b's value.
    log.sm = again;
    let (_, events) = log.unlock("job", a, None);
    granted_event(&events, rb);
    assert_eq!(log.key("job", b).map(|k| k.0), Some("B".into()));
    log.unlock("job", b, None);
    assert_eq!(log.sm.body_version(), 2, "back to the etcd keyspace alone");
}

#[test]
fn older_entries_refuse_them() {
    let mut log = Log::new();
    log.semantics = Semantics::LEASES;
    let a = log.lease(60_000);
    assert!(matches!(
        log.lock("job", a, "").1,
        Response::Rejected(CoreError::NotUpgraded { needs: 6, .. })
    ));
    assert_eq!(
        Semantics::needed_by(&Command::EtcdUnlock {
            name: "job".into(),
            lease: a,
            token: None
        }),
        Semantics::ELECTIONS
    );
    assert!(Semantics::NEWEST.elections());
}

#[test]
fn a_cancel_undoes_its_request_in_either_order() {
    let mut log = Log::new();
    let a = log.lease(60_000);
    let b = log.lease(60_000);
    let cancel = |rid| Command::EtcdCancel {
        name: "job".into(),
        lease: b,
        request: rid,
    };
    log.lock("job", a, "");
    // Applied after its Lock: the wait is withdrawn.
    let (rb, _) = log.lock("job", b, "");
    assert_eq!(
        log.apply(None, cancel(rb)).0,
        Response::Released { holds: 0 }
    );
    assert!(log
        .unlock("job", a, None)
        .1
        .iter()
        .all(|e| !matches!(e, Event::WaiterGranted { .. })));
    // Applied before its Lock (the Lock was still on its way): the Lock never acts.
    let late = log.rid();
    assert_eq!(log.apply(None, cancel(late)).0, Response::NotHeld);
    let lock = Command::EtcdLock {
        name: "job".into(),
        lease: b,
        value: vec![],
    };
    assert_eq!(log.apply(Some(late), lock).0, Response::NotGranted);
    assert!(log.sm.lock_info("job").is_none());
    // After a grant: the grant it got ends (and only that one).
    let (rg, r) = log.lock("job", b, "");
    let t = token(&r);
    assert_eq!(
        log.apply(None, cancel(rg)).0,
        Response::Released { holds: 0 }
    );
    assert_eq!(log.key("job", b), None);
    let (_, r) = log.lock("job", b, "");
    assert!(token(&r) > t);
    assert_eq!(
        log.apply(None, cancel(rg)).0,
        Response::NotHeld,
        "an older grant's cancel"
    );
    assert!(log.key("job", b).is_some());
}

#[test]
fn a_retry_that_got_the_grant_again_owns_it() {
    let mut log = Log::new();
    let a = log.lease(60_000);
    let b = log.lease(60_000);
    let cancel = |request| Command::EtcdCancel {
        name: "job".into(),
        lease: a,
        request,
    };
    log.lock("job", b, "");
    let (first, r) = log.lock("job", a, "");
    assert_eq!(r, Response::Pending);
    let (_, events) = log.unlock("job", b, None);
    let t = granted_event(&events, first);
    // The first call's client went away; its retry (another request) gets the grant again.
    let (retry, again) = log.lock("job", a, "");
    assert_eq!(token(&again), t);
    // The first call's cancel now ends nothing; the retry's own cancel ends the grant.
    assert_eq!(log.apply(None, cancel(first)).0, Response::NotHeld);
    assert_eq!(log.key("job", a).map(|k| k.1), Some(t));
    assert_eq!(
        log.apply(None, cancel(retry)).0,
        Response::Released { holds: 0 }
    );
    assert_eq!(log.key("job", a), None);
}
