//! `StateMachine::apply_quarantined`: an entry the operator quarantined is applied as a
//! no-op that every member computes alike.

use fenced_core::*;

fn acquire(name: &str, owner: &str) -> Command {
    Command::Acquire {
        name: name.into(),
        owner: owner.into(),
        ttl_ms: 10_000,
        session: None,
        wait_ms: 0,
    }
}

fn request(client_id: u64, seq: u64, time_ms: u64, cmd: Command) -> Request {
    Request {
        time_ms,
        client: Some(RequestId { client_id, seq }),
        cmd,
    }
}

fn batch(requests: Vec<Request>) -> Batch {
    Batch {
        requests,
        semantics: Semantics::NEWEST,
    }
}

#[test]
fn a_quarantined_entry_changes_nothing_but_its_index_and_the_dedup_answers() {
    let mut sm = StateMachine::new();
    let first = sm.apply_batch(1, &batch(vec![request(7, 1, 1_000, acquire("a", "x"))]));
    assert!(matches!(first.responses[..], [Response::Granted { .. }]));
    let (revision, now) = (sm.revision(), sm.now());

    let poison = batch(vec![
        // A retry of a request already applied keeps its first outcome.
        request(7, 1, 9_000, acquire("a", "x")),
        request(7, 2, 9_000, acquire("b", "x")),
        Request {
            time_ms: 9_000,
            client: None,
            cmd: Command::Tick,
        },
    ]);
    let mut replica = sm.clone();
    let out = sm.apply_quarantined(2, &poison);
    let quarantined = Response::Rejected(CoreError::Quarantined { index: 2 });
    assert_eq!(out.responses.len(), 3);
    assert!(matches!(out.responses[0], Response::Granted { .. }));
    assert_eq!(out.responses[1], quarantined);
    assert_eq!(out.responses[2], quarantined);
    assert!(out.events.is_empty());
    assert_eq!(sm.last_index(), 2);
    assert_eq!(sm.revision(), revision, "no revision is taken");
    assert_eq!(sm.now(), now, "time does not move");
    assert!(sm.lock_info("b").is_none(), "the command did not run");

    // A replica that quarantined the same index holds the same state.
    replica.apply_quarantined(2, &poison);
    assert_eq!(replica.digest(), sm.digest());
    // One that applied the entry instead differs, which the divergence alarm sees.
    let mut normal = StateMachine::new();
    normal.apply_batch(1, &batch(vec![request(7, 1, 1_000, acquire("a", "x"))]));
    normal.apply_batch(2, &poison);
    assert_ne!(normal.digest(), sm.digest());

    // A retry of the quarantined request learns the quarantine, and does not run.
    let retry = sm.apply_batch(3, &batch(vec![request(7, 2, 9_500, acquire("b", "x"))]));
    assert_eq!(retry.responses, vec![quarantined]);
    assert!(sm.lock_info("b").is_none());
    // Later requests apply as usual.
    let later = replica.apply_batch(3, &batch(vec![request(7, 3, 9_500, acquire("b", "x"))]));
    assert!(matches!(later.responses[..], [Response::Granted { .. }]));
}
