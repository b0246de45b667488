//! [`Command::Withdraw`] ([`Semantics::WITHDRAWALS`], issue 38 item 2): a waiting acquire
//! whose client went away is taken back whichever command is applied first, and never
//! becomes a holder nobody knows about; a grant it already got is ended only when no other
//! attempt can have told a client.

use super::etcd_tests::Log;
use crate::command::*;
use crate::CoreError;

fn rid(seq: u64) -> RequestId {
    RequestId { client_id: 7, seq }
}

fn acquire(owner: &str, wait_ms: Millis) -> Command {
    Command::Acquire {
        name: "L".into(),
        owner: owner.into(),
        ttl_ms: 60_000,
        session: None,
        wait_ms,
    }
}

fn withdraw(request: RequestId, owner: &str, grant: bool) -> Command {
    Command::Withdraw {
        request,
        names: vec!["L".into()],
        owner: owner.into(),
        grant,
    }
}

fn one(log: &mut Log, client: Option<RequestId>, cmd: Command) -> Response {
    log.apply(client, cmd)
        .responses
        .pop()
        .expect("one response")
}

fn token(r: &Response) -> Token {
    match r {
        Response::Granted { token, .. } => *token,
        other => panic!("not granted: {other:?}"),
    }
}

fn holder(log: &Log) -> Option<String> {
    log.sm.lock_info("L").map(|i| i.owner)
}

fn newest() -> Log {
    let mut log = Log::new();
    log.semantics = Semantics::NEWEST;
    log
}

#[test]
fn a_withdrawn_wait_never_becomes_the_holder() {
    let mut log = newest();
    let y = token(&one(&mut log, Some(rid(1)), acquire("y", 0)));
    assert_eq!(
        one(&mut log, Some(rid(2)), acquire("x", 30_000)),
        Response::Pending
    );
    // x's client went away: its front end withdraws the wait.
    let out = log.apply(None, withdraw(rid(2), "x", true));
    assert_eq!(out.responses, vec![Response::Released { holds: 0 }]);
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, Event::WaiterGaveUp { request, .. } if *request == rid(2))));
    let released = log.apply(
        Some(rid(3)),
        Command::Release {
            name: "L".into(),
            owner: "y".into(),
            token: y,
        },
    );
    assert!(
        released
            .events
            .iter()
            .all(|e| !matches!(e, Event::WaiterGranted { .. })),
        "{:?}",
        released.events
    );
    assert_eq!(holder(&log), None, "nobody holds L after y's release");
    // A retry of the withdrawn request, on any member, learns it was not granted.
    assert_eq!(
        one(&mut log, Some(rid(2)), acquire("x", 30_000)),
        Response::NotGranted
    );
    // And a third caller gets L at once.
    let w = token(&one(&mut log, Some(rid(4)), acquire("w", 0)));
    assert!(w > y);
}

#[test]
fn a_withdrawal_applied_first_keeps_its_acquire_from_acting() {
    let mut log = newest();
    assert_eq!(
        one(&mut log, None, withdraw(rid(1), "x", true)),
        Response::NotHeld
    );
    assert_eq!(
        one(&mut log, Some(rid(1)), acquire("x", 30_000)),
        Response::NotGranted
    );
    assert_eq!(holder(&log), None);
}

#[test]
fn a_grant_is_ended_only_when_no_other_attempt_can_have_told_a_client() {
    let mut log = newest();
    let y = token(&one(&mut log, Some(rid(1)), acquire("y", 0)));
    one(&mut log, Some(rid(2)), acquire("x", 30_000));
    one(&mut log, Some(rid(3)), acquire("z", 30_000));
    one(
        &mut log,
        Some(rid(4)),
        Command::Release {
            name: "L".into(),
            owner: "y".into(),
            token: y,
        },
    );
    assert_eq!(holder(&log).as_deref(), Some("x"));
    // A client-chosen id: a retry elsewhere may have been told the grant; it stays.
    assert_eq!(
        one(&mut log, None, withdraw(rid(2), "x", false)),
        Response::NotHeld
    );
    assert_eq!(holder(&log).as_deref(), Some("x"));
    // The front end's own id: nobody was told; the grant ends and goes to z.
    let out = log.apply(None, withdraw(rid(2), "x", true));
    assert_eq!(out.responses, vec![Response::Released { holds: 0 }]);
    assert_eq!(holder(&log).as_deref(), Some("z"));
    // Its record now says not granted: no stale token for a retry.
    assert_eq!(
        one(&mut log, Some(rid(2)), acquire("x", 30_000)),
        Response::NotGranted
    );
    // Withdrawn twice: nothing more.
    assert_eq!(
        one(&mut log, None, withdraw(rid(2), "x", true)),
        Response::NotHeld
    );
    assert_eq!(holder(&log).as_deref(), Some("z"));
}

#[test]
fn a_withdrawal_naming_another_owner_or_lock_does_nothing() {
    let mut log = newest();
    token(&one(&mut log, Some(rid(1)), acquire("y", 0)));
    one(&mut log, Some(rid(2)), acquire("x", 30_000));
    assert_eq!(
        one(&mut log, None, withdraw(rid(2), "y", true)),
        Response::NotHeld
    );
    assert_eq!(log.sm.lock_info("L").map(|i| i.waiters), Some(1));
}

#[test]
fn older_entries_refuse_a_withdrawal() {
    let mut log = newest();
    log.semantics = Semantics::ALARM_HOLDS_LEASES;
    one(&mut log, Some(rid(1)), acquire("y", 0));
    one(&mut log, Some(rid(2)), acquire("x", 30_000));
    match one(&mut log, None, withdraw(rid(2), "x", true)) {
        Response::Rejected(CoreError::NotUpgraded { needs, .. }) => {
            assert_eq!(needs, Semantics::WITHDRAWALS.0)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(log.sm.lock_info("L").map(|i| i.waiters), Some(1));
    assert_eq!(
        Semantics::needed_by(&withdraw(rid(2), "x", true)),
        Semantics::WITHDRAWALS
    );
}
