//! The cluster-wide `CORRUPT` alarm in the replicated state ([`Semantics::CLUSTER_ALARM`],
//! issue 39 item 3): raised and cleared by a logged command, the first raise kept, refused
//! in older entries, carried by snapshot body 6 (and older bodies still load).

use super::etcd_tests::Log;
use super::StateMachine;
use crate::command::*;
use crate::CoreError;

fn alarm(index: u64) -> CorruptAlarm {
    CorruptAlarm {
        index,
        raised_by: 1,
        detail: format!("no majority at {index}"),
    }
}

fn one(log: &mut Log, cmd: Command) -> Response {
    log.apply(None, cmd).responses.pop().expect("one response")
}

#[test]
fn the_alarm_is_raised_once_kept_across_a_snapshot_and_cleared() {
    let mut log = Log::new();
    log.semantics = Semantics::CLUSTER_ALARM;
    one(&mut log, Command::OpenSession { ttl_ms: 60_000 });
    let plain = log.sm.body_version();
    assert!(plain < 6, "no alarm: the body earlier builds wrote");
    let raise = |i| Command::ClusterAlarm {
        raise: Some(alarm(i)),
    };
    assert_eq!(
        one(&mut log, raise(10)),
        Response::ClusterAlarm {
            before: None,
            after: Some(alarm(10)),
        }
    );
    // A second raise keeps the first.
    one(&mut log, raise(20));
    assert_eq!(log.sm.cluster_alarm(), Some(&alarm(10)));
    assert_eq!(log.sm.body_version(), 6);
    let back = StateMachine::from_bytes(&log.sm.to_bytes()).expect("decodes");
    assert_eq!(back, log.sm);
    assert_eq!(back.digest(), log.sm.digest());
    let mut body = Vec::new();
    log.sm
        .write_body(super::body::options(), &mut body)
        .expect("encodes");
    let read = StateMachine::read_body(6, super::body::options(), body.as_slice()).expect("v6");
    assert_eq!(read.cluster_alarm(), Some(&alarm(10)));
    // Disarmed: the body goes back to what it was.
    assert_eq!(
        one(&mut log, Command::ClusterAlarm { raise: None }),
        Response::ClusterAlarm {
            before: Some(alarm(10)),
            after: None,
        }
    );
    assert_eq!(log.sm.cluster_alarm(), None);
    assert_eq!(log.sm.body_version(), plain);
    log.sm.check_invariants().expect("invariants");
}

#[test]
fn older_entries_refuse_the_alarm() {
    let mut log = Log::new();
    log.semantics = Semantics::LUA_IDS;
    assert!(matches!(
        one(
            &mut log,
            Command::ClusterAlarm {
                raise: Some(alarm(1))
            }
        ),
        Response::Rejected(CoreError::NotUpgraded { needs: 10, .. })
    ));
    assert_eq!(log.sm.cluster_alarm(), None);
    assert_eq!(
        Semantics::needed_by(&Command::ClusterAlarm { raise: None }),
        Semantics::CLUSTER_ALARM
    );
}

/// `cmd` alone in the next entry, at log time `time_ms` (a request of client 7).
fn at(log: &mut Log, time_ms: u64, cmd: Command) -> Response {
    log.index += 1;
    let batch = Batch {
        requests: vec![Request {
            time_ms,
            client: Some(RequestId {
                client_id: 7,
                seq: log.index,
            }),
            cmd,
        }],
        semantics: log.semantics,
    };
    let mut out = log.sm.apply_batch(log.index, &batch);
    log.sm.check_invariants().expect("invariants");
    out.responses.pop().expect("one response")
}

/// A session (deadline 11000), a lock on a lease of its own (11001), a lock held by the
/// session and a waiter on the leased lock (wait until 11003); the alarm raised at 2000.
fn alarmed_with_leases(semantics: Semantics) -> (Log, SessionId) {
    let mut log = Log::new();
    log.semantics = semantics;
    let Response::SessionOpened { session, .. } =
        at(&mut log, 1_000, Command::OpenSession { ttl_ms: 10_000 })
    else {
        panic!("no session");
    };
    let acquire = |owner: &str, name: &str, session, wait_ms| Command::Acquire {
        name: name.into(),
        owner: owner.into(),
        ttl_ms: 10_000,
        session,
        wait_ms,
    };
    assert!(matches!(
        at(&mut log, 1_001, acquire("o", "a", None, 0)),
        Response::Granted { .. }
    ));
    assert!(matches!(
        at(&mut log, 1_002, acquire("s", "b", Some(session), 0)),
        Response::Granted { .. }
    ));
    assert_eq!(
        at(&mut log, 1_003, acquire("w", "a", None, 10_000)),
        Response::Pending
    );
    at(
        &mut log,
        2_000,
        Command::ClusterAlarm {
            raise: Some(alarm(10)),
        },
    );
    (log, session)
}

#[test]
fn the_alarm_holds_sessions_leases_and_waits_until_it_is_disarmed() {
    let (mut log, session) = alarmed_with_leases(Semantics::NEWEST);
    // Time passes while the cluster serves nothing: nobody can keep alive, nothing expires.
    for t in [12_000, 30_000] {
        assert_eq!(at(&mut log, t, Command::Tick), Response::Ticked);
        let s = log.sm.session_info(session, log.sm.now());
        assert!(
            s.is_some(),
            "session expired at {t} while the alarm was raised"
        );
        assert_eq!(log.sm.lock_info("a").map(|l| l.owner), Some("o".into()));
        assert_eq!(log.sm.lock_info("b").map(|l| l.owner), Some("s".into()));
        assert_eq!(log.sm.waiter_count("a"), 1, "the wait ran out at {t}");
    }
    // The clock of the replicated state stood still at the raise (and a snapshot keeps it).
    assert_eq!(log.sm.now(), 2_000);
    let back = StateMachine::from_bytes(&log.sm.to_bytes()).expect("decodes");
    assert_eq!(back, log.sm);
    // The disarm at 40000 moves every deadline by the 38000 ms the alarm held them.
    at(&mut log, 40_000, Command::ClusterAlarm { raise: None });
    assert_eq!(log.sm.now(), 40_000);
    let s = log.sm.session_info(session, 40_000).expect("alive");
    assert_eq!(s.deadline_ms, 49_000);
    let a = log.sm.lock_info("a").expect("held");
    assert_eq!(a.deadline_ms, 49_001);
    assert_eq!(log.sm.next_deadline(), Some(49_000));
    // Then they run out as they would have, 9000 ms after the raise's 2000... +38000.
    at(&mut log, 48_999, Command::Tick);
    assert!(log.sm.session_info(session, 48_999).is_some());
    at(&mut log, 49_000, Command::Tick);
    assert!(log.sm.session_info(session, 49_000).is_none());
    assert!(
        log.sm.lock_info("b").is_none(),
        "the session's lock ended with it"
    );
    at(&mut log, 49_001, Command::Tick);
    assert_eq!(
        log.sm.lock_info("a").map(|l| l.owner),
        Some("w".into()),
        "the waiter (wait until 11003 + 38000) got the lock when the lease ran out"
    );
}

#[test]
fn older_entries_expire_while_the_alarm_is_raised() {
    let older = Semantics(Semantics::ALARM_HOLDS_LEASES.0 - 1);
    let (mut log, session) = alarmed_with_leases(older);
    at(&mut log, 12_000, Command::Tick);
    assert_eq!(log.sm.now(), 12_000);
    assert!(log.sm.session_info(session, 12_000).is_none());
    assert!(log.sm.lock_info("b").is_none());
    // The lease ran out at 11001, and the wait at 11003 before the step's hand-over.
    assert!(log.sm.lock_info("a").is_none());
    assert_eq!(log.sm.waiter_count("a"), 0);
}
