//! Sessions belong to the user who opened them ([`Semantics::SESSION_OWNERS`], issue 49
//! defect 4): another user cannot keep them alive, close them, acquire in them or take an
//! etcd lock for them; administrators can; sessions opened outside a user's command are
//! open to all, as before; the owners survive a snapshot and leave with their sessions.

use super::etcd_tests::Log;
use super::StateMachine;
use crate::command::*;
use crate::etcd::PutRequest;
use crate::CoreError;

fn log() -> Log {
    let mut log = Log::new();
    log.semantics = Semantics::SESSION_OWNERS;
    log
}

fn one(log: &mut Log, rid: Option<RequestId>, cmd: Command) -> Response {
    let mut out = log.apply(rid, cmd);
    out.responses.pop().expect("one response")
}

fn open(log: &mut Log, user: &str) -> SessionId {
    match one(
        log,
        None,
        Command::OpenSession { ttl_ms: 60_000 }.as_user(user, false),
    ) {
        Response::SessionOpened { session, .. } => session,
        other => panic!("open: {other:?}"),
    }
}

fn acquire_in(name: &str, owner: &str, session: SessionId) -> Command {
    Command::Acquire {
        name: name.into(),
        owner: owner.into(),
        ttl_ms: 0,
        session: Some(session),
        wait_ms: 0,
    }
}

fn refused(session: SessionId) -> Response {
    Response::Rejected(CoreError::NotSessionOwner { session })
}

#[test]
fn another_user_cannot_use_a_session_and_its_owner_can() {
    let mut log = log();
    let bob = open(&mut log, "bob");
    assert_eq!(log.sm.session_owner(bob), Some("bob"));
    assert!(matches!(
        one(
            &mut log,
            None,
            acquire_in("lock:bs", "bob", bob).as_user("bob", false)
        ),
        Response::Granted { .. }
    ));
    let revision = log.sm.revision();
    // alice: keep-alive, acquire in it, an etcd lock for it, an etcd key attached to it,
    // close: each refused, nothing done (the command only takes its revision).
    let mut p = PutRequest::new("k", "v");
    p.lease = bob as i64;
    for cmd in [
        Command::KeepAlive { session: bob },
        acquire_in("lock:a1", "alice", bob),
        Command::EtcdLock {
            name: "job".into(),
            lease: bob,
            value: vec![],
        },
        Command::Etcd(EtcdCommand::Put(p)),
        Command::CloseSession { session: bob },
    ] {
        let kind = cmd.kind();
        assert_eq!(
            one(&mut log, None, cmd.as_user("alice", false)),
            refused(bob),
            "{kind}"
        );
    }
    assert_eq!(log.sm.revision(), revision + 5);
    let info = log
        .sm
        .session_info(bob, log.sm.now())
        .expect("bob's session is still there");
    assert_eq!(info.locks, vec!["lock:bs".to_string()]);
    // A keep-alive of several answers "not alive" for bob's, and keeps alice's own.
    let alice = open(&mut log, "alice");
    let many = Command::KeepAliveMany {
        sessions: vec![bob, alice],
    };
    match one(&mut log, None, many.as_user("alice", false)) {
        Response::SessionsAlive { alive } => {
            assert!(alive[0].is_none() && alive[1].is_some(), "{alive:?}");
        }
        other => panic!("{other:?}"),
    }
    // bob keeps his session alive and closes it; his owner record goes with it.
    assert!(matches!(
        one(
            &mut log,
            None,
            Command::KeepAlive { session: bob }.as_user("bob", false)
        ),
        Response::SessionAlive { .. }
    ));
    assert_eq!(
        one(
            &mut log,
            None,
            Command::CloseSession { session: bob }.as_user("bob", false)
        ),
        Response::SessionClosed
    );
    assert_eq!(log.sm.session_owner(bob), None);
    log.sm.check_invariants().expect("invariants");
}

#[test]
fn administrators_and_unowned_sessions_are_as_before() {
    let mut log = log();
    let bob = open(&mut log, "bob");
    // An administrator may act on any session.
    assert!(matches!(
        one(
            &mut log,
            None,
            Command::KeepAlive { session: bob }.as_user("admin", true)
        ),
        Response::SessionAlive { .. }
    ));
    // A session opened without a user belongs to nobody: everyone may use it.
    let free = match one(&mut log, None, Command::OpenSession { ttl_ms: 60_000 }) {
        Response::SessionOpened { session, .. } => session,
        other => panic!("{other:?}"),
    };
    assert_eq!(log.sm.session_owner(free), None);
    assert!(matches!(
        one(
            &mut log,
            None,
            acquire_in("x", "alice", free).as_user("alice", false)
        ),
        Response::Granted { .. }
    ));
    // Commands that name no session are not wrapped at all.
    let release = Command::Release {
        name: "x".into(),
        owner: "alice".into(),
        token: 1,
    };
    assert!(!matches!(
        release.clone().as_user("alice", false),
        Command::AsUser { .. }
    ));
    assert_eq!(
        release.as_user("alice", false).without_user().kind(),
        "release"
    );
}

#[test]
fn a_session_expires_with_its_owner_record() {
    let mut log = log();
    let bob = match one(
        &mut log,
        None,
        Command::OpenSession { ttl_ms: 10 }.as_user("bob", false),
    ) {
        Response::SessionOpened { session, .. } => session,
        other => panic!("{other:?}"),
    };
    log.index += 1;
    let tick = Batch {
        requests: vec![Request {
            time_ms: 1_000_000,
            client: None,
            cmd: Command::Tick,
        }],
        semantics: log.semantics,
    };
    log.sm.apply_batch(log.index, &tick);
    assert!(log.sm.session_info(bob, log.sm.now()).is_none());
    assert_eq!(log.sm.session_owner(bob), None);
    log.sm.check_invariants().expect("invariants");
}

#[test]
fn owners_survive_a_snapshot_in_body_version_5() {
    let mut log = log();
    let bob = open(&mut log, "bob");
    assert_eq!(log.sm.body_version(), 5);
    let back = StateMachine::from_bytes(&log.sm.to_bytes()).expect("decodes");
    assert_eq!(back, log.sm);
    assert_eq!(back.session_owner(bob), Some("bob"));
    let mut body = Vec::new();
    log.sm
        .write_body(super::body::options(), &mut body)
        .expect("encodes");
    let read = StateMachine::read_body(5, super::body::options(), body.as_slice()).expect("reads");
    assert_eq!(read.session_owner(bob), Some("bob"));
    // Without owners the body is what earlier builds wrote.
    let mut plain = Log::new();
    plain.semantics = Semantics::SESSION_OWNERS;
    one(&mut plain, None, Command::OpenSession { ttl_ms: 60_000 });
    assert_eq!(plain.sm.body_version(), 1);
}

#[test]
fn older_entries_refuse_a_users_command() {
    let mut log = log();
    log.semantics = Semantics::BOUNDED;
    assert!(matches!(
        one(
            &mut log,
            None,
            Command::OpenSession { ttl_ms: 1_000 }.as_user("bob", false)
        ),
        Response::Rejected(CoreError::NotUpgraded { needs: 8, .. })
    ));
    assert_eq!(
        Semantics::needed_by(&Command::OpenSession { ttl_ms: 1 }.as_user("bob", false)),
        Semantics::SESSION_OWNERS
    );
}
