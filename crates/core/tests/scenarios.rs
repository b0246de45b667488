//! Scenario tests of the lock state machine: one behaviour per test.

use bincode::Options;
use fenced_core::limits::*;
use fenced_core::*;

struct Harness {
    sm: StateMachine,
    index: Index,
    time: Millis,
    seq: u64,
}

impl Harness {
    fn new() -> Self {
        Harness {
            sm: StateMachine::new(),
            index: 0,
            time: 1_000,
            seq: 0,
        }
    }

    fn at(&mut self, time: Millis) -> &mut Self {
        self.time = time;
        self
    }

    /// Apply as client `client` with a fresh seq.
    fn run(&mut self, client: u64, cmd: Command) -> Applied {
        self.seq += 1;
        let rid = RequestId {
            client_id: client,
            seq: self.seq,
        };
        self.run_as(Some(rid), cmd)
    }

    fn run_as(&mut self, client: Option<RequestId>, cmd: Command) -> Applied {
        self.index += 1;
        let out = self.sm.apply(
            self.index,
            &Request {
                time_ms: self.time,
                client,
                cmd,
            },
        );
        self.sm.check_invariants().expect("invariants");
        out
    }

    fn tick(&mut self) -> Applied {
        self.run_as(None, Command::Tick)
    }
}

fn acquire(name: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> Command {
    Command::Acquire {
        name: name.into(),
        owner: owner.into(),
        ttl_ms,
        session: None,
        wait_ms,
    }
}

fn release(name: &str, owner: &str, token: Token) -> Command {
    Command::Release {
        name: name.into(),
        owner: owner.into(),
        token,
    }
}

fn token_of(r: &Response) -> Token {
    match r {
        Response::Granted { token, .. } => *token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn token_is_the_granting_commands_revision() {
    let mut h = Harness::new();
    h.tick();
    h.tick();
    let out = h.run(1, acquire("L", "a", 5_000, 0));
    assert_eq!(h.sm.revision(), 3, "every command takes the next revision");
    assert_eq!(
        out.response,
        Response::Granted {
            token: 3,
            holds: 1,
            deadline_ms: Some(6_000)
        }
    );
    let info = h.sm.lock_info("L").expect("held");
    assert_eq!((info.owner.as_str(), info.token, info.holds), ("a", 3, 1));
}

#[test]
fn second_owner_is_refused_without_wait() {
    let mut h = Harness::new();
    h.run(1, acquire("L", "a", 5_000, 0));
    assert_eq!(
        h.run(2, acquire("L", "b", 5_000, 0)).response,
        Response::NotGranted
    );
}

#[test]
fn reentrant_acquire_keeps_token_and_counts_holds() {
    let mut h = Harness::new();
    let t = token_of(&h.run(1, acquire("L", "a", 5_000, 0)).response);
    let again = h.run(1, acquire("L", "a", 5_000, 0)).response;
    assert_eq!(
        again,
        Response::Granted {
            token: t,
            holds: 2,
            deadline_ms: Some(6_000)
        }
    );
    assert_eq!(
        h.run(1, release("L", "a", t)).response,
        Response::Released { holds: 1 }
    );
    assert!(h.sm.lock_info("L").is_some());
    assert_eq!(
        h.run(1, release("L", "a", t)).response,
        Response::Released { holds: 0 }
    );
    assert!(h.sm.lock_info("L").is_none());
}

#[test]
fn release_needs_owner_and_token() {
    let mut h = Harness::new();
    let t = token_of(&h.run(1, acquire("L", "a", 5_000, 0)).response);
    assert_eq!(h.run(2, release("L", "b", t)).response, Response::NotHeld);
    assert_eq!(
        h.run(1, release("L", "a", t + 1)).response,
        Response::NotHeld
    );
    assert_eq!(
        h.run(1, release("nope", "a", t)).response,
        Response::NotHeld
    );
    assert!(h.sm.lock_info("L").is_some());
}

#[test]
fn lease_expires_at_its_deadline_not_before() {
    let mut h = Harness::new();
    h.run(1, acquire("L", "a", 500, 0));
    h.at(1_499).tick();
    assert!(h.sm.lock_info("L").is_some(), "expired early");
    let out = h.at(1_500).tick();
    assert!(h.sm.lock_info("L").is_none());
    assert!(matches!(
        out.events.as_slice(),
        [Event::LockReleased {
            reason: ReleaseReason::Expired,
            ..
        }]
    ));
}

#[test]
fn log_time_never_goes_backwards() {
    let mut h = Harness::new();
    h.at(5_000).tick();
    h.at(1_000).run(1, acquire("L", "a", 100, 0));
    assert_eq!(h.sm.now(), 5_000);
    assert_eq!(h.sm.lock_info("L").map(|i| i.deadline_ms), Some(5_100));
}

#[test]
fn renew_extends_only_the_named_grant() {
    let mut h = Harness::new();
    let t = token_of(&h.run(1, acquire("L", "a", 500, 0)).response);
    let renew = |token| Command::Renew {
        name: "L".into(),
        owner: "a".into(),
        token,
        ttl_ms: 2_000,
    };
    assert_eq!(h.at(1_200).run(1, renew(t - 1)).response, Response::NotHeld);
    assert_eq!(
        h.run(1, renew(t)).response,
        Response::Renewed { deadline_ms: 3_200 }
    );
    h.at(3_199).tick();
    assert!(h.sm.lock_info("L").is_some());
    h.at(3_200).tick();
    assert!(h.sm.lock_info("L").is_none());
}

#[test]
fn waiters_are_granted_in_fifo_order_with_larger_tokens() {
    let mut h = Harness::new();
    let t1 = token_of(&h.run(1, acquire("L", "a", 5_000, 0)).response);
    assert_eq!(
        h.run(2, acquire("L", "b", 5_000, 10_000)).response,
        Response::Pending
    );
    assert_eq!(
        h.run(3, acquire("L", "c", 5_000, 10_000)).response,
        Response::Pending
    );
    let out = h.run(1, release("L", "a", t1));
    let granted: Vec<_> = out
        .events
        .iter()
        .filter_map(|e| match e {
            Event::WaiterGranted { request, token, .. } => Some((request.client_id, *token)),
            _ => None,
        })
        .collect();
    assert_eq!(
        granted,
        vec![(2, h.sm.revision())],
        "the release's revision"
    );
    let info = h.sm.lock_info("L").expect("passed on");
    assert_eq!(info.owner, "b");
    assert!(info.token > t1);
    // Expiry hands it to c.
    let out = h.at(6_000).tick();
    assert!(out.events.iter().any(|e| matches!(
        e,
        Event::WaiterGranted { request, .. } if request.client_id == 3
    )));
    assert_eq!(h.sm.lock_info("L").map(|i| i.owner), Some("c".into()));
}

#[test]
fn wait_runs_out_and_retry_sees_the_outcome() {
    let mut h = Harness::new();
    h.run(1, acquire("L", "a", 60_000, 0));
    let rid = RequestId {
        client_id: 9,
        seq: 1,
    };
    let first = h.run_as(Some(rid), acquire("L", "b", 5_000, 2_000));
    assert_eq!(first.response, Response::Pending);
    let out = h.at(3_000).tick();
    assert!(matches!(
        out.events.as_slice(),
        [Event::WaiterGaveUp { request, .. }] if *request == rid
    ));
    let retry = h.run_as(Some(rid), acquire("L", "b", 5_000, 2_000));
    assert_eq!(retry.response, Response::NotGranted);
    assert_eq!(h.sm.lock_info("L").map(|i| i.waiters), Some(0));
}

#[test]
fn retried_acquire_after_grant_returns_first_result_and_does_not_regrant() {
    let mut h = Harness::new();
    let rid = RequestId {
        client_id: 7,
        seq: 1,
    };
    let first = h.run_as(Some(rid), acquire("L", "a", 5_000, 0));
    let retry = h.run_as(Some(rid), acquire("L", "a", 5_000, 0));
    assert_eq!(first.response, retry.response);
    assert_eq!(h.sm.lock_info("L").map(|i| i.holds), Some(1), "acted twice");
}

#[test]
fn retry_of_a_waiting_acquire_gets_the_grant() {
    let mut h = Harness::new();
    let t = token_of(&h.run(1, acquire("L", "a", 5_000, 0)).response);
    let rid = RequestId {
        client_id: 9,
        seq: 1,
    };
    assert_eq!(
        h.run_as(Some(rid), acquire("L", "b", 5_000, 9_000))
            .response,
        Response::Pending
    );
    h.run(1, release("L", "a", t));
    let granted_at = h.sm.revision();
    let retry = h.run_as(Some(rid), acquire("L", "b", 5_000, 9_000));
    assert_eq!(token_of(&retry.response), granted_at);
}

#[test]
fn requests_older_than_the_window_are_refused() {
    let mut h = Harness::new();
    // Pruning is amortized: past twice the window the oldest are certainly gone.
    for seq in 1..=2 * DEDUP_WINDOW + 1 {
        h.run_as(Some(RequestId { client_id: 5, seq }), Command::Tick);
    }
    let out = h.run_as(
        Some(RequestId {
            client_id: 5,
            seq: 1,
        }),
        acquire("L", "a", 1_000, 0),
    );
    assert!(matches!(
        out.response,
        Response::Rejected(CoreError::RequestTooOld { .. })
    ));
    assert!(h.sm.lock_info("L").is_none());
}

#[test]
fn session_expiry_releases_its_locks_and_hands_them_on() {
    let mut h = Harness::new();
    let Response::SessionOpened { session, .. } =
        h.run(1, Command::OpenSession { ttl_ms: 1_000 }).response
    else {
        panic!()
    };
    let locked = h.run(
        1,
        Command::Acquire {
            name: "L".into(),
            owner: "a".into(),
            ttl_ms: 0,
            session: Some(session),
            wait_ms: 0,
        },
    );
    let t1 = token_of(&locked.response);
    h.run(2, acquire("L", "b", 5_000, 60_000));
    // Keep-alive at 1.8 s pushes the deadline to 2.8 s.
    h.at(1_800).run(1, Command::KeepAlive { session });
    h.at(2_799).tick();
    assert_eq!(h.sm.lock_info("L").map(|i| i.owner), Some("a".into()));
    let out = h.at(2_800).tick();
    assert!(out.events.iter().any(|e| matches!(
        e,
        Event::LockReleased {
            reason: ReleaseReason::SessionExpired,
            ..
        }
    )));
    let info = h.sm.lock_info("L").expect("handed on");
    assert_eq!(info.owner, "b");
    assert!(info.token > t1);
    assert_eq!(
        h.run(1, Command::KeepAlive { session }).response,
        Response::NoSuchSession
    );
}

#[test]
fn closing_a_session_releases_locks_and_withdraws_waiters() {
    let mut h = Harness::new();
    let open = |h: &mut Harness| match h.run(1, Command::OpenSession { ttl_ms: 10_000 }).response {
        Response::SessionOpened { session, .. } => session,
        other => panic!("{other:?}"),
    };
    let s1 = open(&mut h);
    let s2 = open(&mut h);
    let with = |owner: &str, s| Command::Acquire {
        name: "L".into(),
        owner: owner.into(),
        ttl_ms: 0,
        session: Some(s),
        wait_ms: 60_000,
    };
    h.run(1, with("a", s1));
    assert_eq!(h.run(2, with("b", s2)).response, Response::Pending);
    h.run(3, acquire("L", "c", 1_000, 60_000));
    // b's session closes: its wait is withdrawn.
    h.run(2, Command::CloseSession { session: s2 });
    assert_eq!(h.sm.lock_info("L").map(|i| i.waiters), Some(1));
    // a's session closes: c gets the lock.
    h.run(1, Command::CloseSession { session: s1 });
    assert_eq!(h.sm.lock_info("L").map(|i| i.owner), Some("c".into()));
}

#[test]
fn waiter_of_an_expiring_session_is_not_granted() {
    let mut h = Harness::new();
    let Response::SessionOpened { session, .. } =
        h.run(1, Command::OpenSession { ttl_ms: 1_000 }).response
    else {
        panic!()
    };
    h.run(1, acquire("L", "a", 1_000, 0));
    h.run(
        2,
        Command::Acquire {
            name: "L".into(),
            owner: "b".into(),
            ttl_ms: 0,
            session: Some(session),
            wait_ms: 60_000,
        },
    );
    // Lease and session end at the same instant: the lock must not go to b's dead session.
    h.at(2_000).tick();
    assert!(h.sm.lock_info("L").is_none());
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let mut h = Harness::new();
    let long = "x".repeat(MAX_NAME_LEN + 1);
    let cases = vec![
        acquire("", "a", 1_000, 0),
        acquire(&long, "a", 1_000, 0),
        acquire("L", "", 1_000, 0),
        acquire("L", &"o".repeat(MAX_OWNER_LEN + 1), 1_000, 0),
        acquire("L", "a", 0, 0),
        acquire("L", "a", MAX_TTL_MS + 1, 0),
        acquire("L", "a", 1_000, MAX_WAIT_MS + 1),
        Command::Acquire {
            name: "L".into(),
            owner: "a".into(),
            ttl_ms: 1_000,
            session: Some(424_242),
            wait_ms: 0,
        },
        Command::OpenSession { ttl_ms: 0 },
    ];
    for cmd in cases {
        let out = h.run(1, cmd.clone());
        assert!(
            matches!(out.response, Response::Rejected(_)),
            "{cmd:?} → {:?}",
            out.response
        );
    }
    assert_eq!(h.sm.lock_count(), 0);
    assert_eq!(h.sm.session_count(), 0);
}

#[test]
fn waiting_without_request_id_is_rejected() {
    let mut h = Harness::new();
    h.run(1, acquire("L", "a", 1_000, 0));
    let out = h.run_as(None, acquire("L", "b", 1_000, 1_000));
    assert_eq!(
        out.response,
        Response::Rejected(CoreError::WaitNeedsRequestId)
    );
}

#[test]
fn snapshot_round_trip_is_identical() {
    let mut h = Harness::new();
    h.run(1, acquire("L", "a", 1_000, 0));
    h.run(2, acquire("L", "b", 1_000, 5_000));
    h.run(3, Command::OpenSession { ttl_ms: 3_000 });
    let restored = StateMachine::from_bytes(&h.sm.to_bytes()).expect("decode");
    assert_eq!(restored, h.sm);
    assert!(StateMachine::from_bytes(b"\x01garbage").is_err());
}

#[test]
fn a_queued_acquire_outlives_the_dedup_window() {
    let mut h = Harness::new();
    let t = token_of(&h.run(1, acquire("L", "a", 60_000, 0)).response);
    let waiting = RequestId {
        client_id: 5,
        seq: 1,
    };
    h.run_as(Some(waiting), acquire("L", "b", 5_000, 30_000));
    for seq in 2..=DEDUP_WINDOW * 2 {
        h.run_as(Some(RequestId { client_id: 5, seq }), Command::Tick);
    }
    h.run(1, release("L", "a", t));
    let granted_at = h.sm.revision();
    let retry = h.run_as(Some(waiting), acquire("L", "b", 5_000, 30_000));
    assert_eq!(token_of(&retry.response), granted_at);
}

// ---- revisions: one per command, whatever the entries ----------------------------------------

fn req(client: Option<RequestId>, time_ms: Millis, cmd: Command) -> Request {
    Request {
        time_ms,
        client,
        cmd,
    }
}

fn rid(client_id: u64, seq: u64) -> Option<RequestId> {
    Some(RequestId { client_id, seq })
}

fn kv(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

#[test]
fn commands_of_one_entry_take_distinct_revisions() {
    let mut sm = StateMachine::new();
    let permit = |owner: &str| {
        Command::AcquireWith(Box::new(AcquireSpec {
            names: vec!["S".into()],
            owner: owner.into(),
            mode: Mode::Permit { permits: 3 },
            ttl_ms: 5_000,
            session: None,
            wait_ms: 0,
            lock_delay_ms: 0,
        }))
    };
    let batch = Batch {
        requests: vec![
            req(rid(1, 1), 1_000, Command::OpenSession { ttl_ms: 5_000 }),
            req(rid(2, 1), 1_000, Command::OpenSession { ttl_ms: 5_000 }),
            req(rid(3, 1), 1_000, permit("a")),
            req(rid(4, 1), 1_000, permit("b")),
            req(rid(5, 1), 1_000, acquire("L", "c", 5_000, 0)),
        ],
        semantics: Semantics::REVISIONS,
    };
    let out = sm.apply_batch(1, &batch);
    let sessions: Vec<_> = out.responses[..2]
        .iter()
        .map(|r| match r {
            Response::SessionOpened { session, .. } => *session,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sessions, vec![1, 2], "two sessions opened in one entry");
    let tokens: Vec<_> = out.responses[2..].iter().map(token_of).collect();
    assert_eq!(tokens, vec![3, 4, 5], "permits of separate commands differ");
    assert_eq!(sm.revision(), 5);
    assert_eq!(sm.last_index(), 1);
    sm.check_invariants().expect("invariants");
}

#[test]
fn a_retry_inside_one_entry_returns_the_first_outcome() {
    let mut sm = StateMachine::new();
    let batch = Batch {
        requests: vec![
            req(rid(1, 1), 1_000, acquire("L", "a", 5_000, 0)),
            req(rid(1, 1), 1_000, acquire("L", "a", 5_000, 0)),
        ],
        semantics: Semantics::REVISIONS,
    };
    let out = sm.apply_batch(1, &batch);
    assert_eq!(out.responses[0], out.responses[1]);
    assert_eq!(sm.lock_info("L").map(|i| i.holds), Some(1), "acted twice");
    assert_eq!(sm.revision(), 1, "a retry takes no revision");
}

#[test]
fn a_pipeline_is_several_commands_multi_is_one() {
    let mut sm = StateMachine::new();
    let pipeline = Command::Kv(kv::KvCommand::Batch(vec![
        kv(&["SET", "k", "a", "NX", "PX", "5000"]),
        kv(&["FENCE.TOKEN", "k"]),
        kv(&["DEL", "k"]),
        kv(&["SET", "k", "b", "NX", "PX", "5000"]),
    ]));
    let out = sm.apply(1, &req(rid(1, 1), 1_000, pipeline));
    let Response::Kv(r) = out.response else {
        panic!("{:?}", out.response)
    };
    assert_eq!(r.replies[1], kv::Reply::Int(1));
    assert_eq!(sm.revision(), 4, "one revision per pipelined command");
    let created = sm.kv().get(b"k", 1_000).map(|e| e.create_revision);
    assert_eq!(
        created,
        Some(4),
        "the second SET NX has its own create revision"
    );

    let multi = Command::Kv(kv::KvCommand::Multi {
        watches: vec![],
        cmds: vec![kv(&["SET", "x", "1"]), kv(&["SET", "y", "1"])],
    });
    sm.apply(2, &req(rid(1, 2), 1_000, multi));
    assert_eq!(sm.revision(), 5, "MULTI/EXEC is one command");
    for key in [&b"x"[..], b"y"] {
        assert_eq!(sm.kv().get(key, 1_000).map(|e| e.mod_revision), Some(5));
    }
}

#[test]
fn an_expiry_takes_its_own_revision_before_the_command() {
    let mut sm = StateMachine::new();
    let t1 = token_of(
        &sm.apply(1, &req(rid(1, 1), 1_000, acquire("L", "a", 100, 0)))
            .response,
    );
    let queued = sm.apply(2, &req(rid(2, 1), 1_000, acquire("L", "b", 5_000, 10_000)));
    assert_eq!(queued.response, Response::Pending);
    // The lease ends at 1_100; the next command (at 2_000) first expires it (revision 3, the
    // hand-over to b), then runs itself (revision 4).
    let out = sm.apply(
        3,
        &req(rid(3, 1), 2_000, Command::ForceUnlock { name: "L".into() }),
    );
    let granted: Vec<Token> = out
        .events
        .iter()
        .filter_map(|e| match e {
            Event::WaiterGranted { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(granted, vec![3]);
    assert!(granted[0] > t1);
    assert_eq!(sm.revision(), 4);
    // The force-unlock at revision 4 ended b's grant of revision 3.
    assert!(out.events.iter().any(|e| matches!(
        e,
        Event::LockReleased {
            token: 3,
            reason: ReleaseReason::ForceUnlocked,
            ..
        }
    )));
    sm.check_invariants().expect("invariants");
}

#[test]
fn entries_from_before_revisions_keep_their_index_tokens() {
    let mut sm = StateMachine::new();
    // Written by an older fenced: tokens were log indexes (with gaps for blank and
    // membership entries).
    let old = |cmd| Batch::legacy(req(rid(1, 0), 1_000, cmd));
    let mut legacy = |index, seq, cmd| {
        let mut b = old(cmd);
        b.requests[0].client = rid(1, seq);
        sm.apply_batch(index, &b)
    };
    let t = token_of(&legacy(7, 1, acquire("L", "a", 5_000, 0)).responses[0]);
    assert_eq!(t, 7);
    let out = legacy(9, 2, Command::OpenSession { ttl_ms: 5_000 });
    assert!(matches!(
        out.responses[0],
        Response::SessionOpened { session: 9, .. }
    ));
    let out = legacy(
        10,
        3,
        Command::Kv(kv::KvCommand::Batch(vec![
            kv(&["SET", "x", "1"]),
            kv(&["SET", "y", "1"]),
        ])),
    );
    assert!(matches!(out.responses[0], Response::Kv(_)));
    assert_eq!(
        sm.revision(),
        10,
        "an old pipeline shared its entry's index"
    );
    assert_eq!(sm.kv().get(b"y", 1_000).map(|e| e.mod_revision), Some(10));
    // The first entry after the upgrade continues above every old token.
    let r = sm.apply(11, &req(rid(1, 4), 1_000, release("L", "a", 7)));
    assert_eq!(r.response, Response::Released { holds: 0 });
    let t2 = token_of(
        &sm.apply(12, &req(rid(1, 5), 1_000, acquire("L", "b", 5_000, 0)))
            .response,
    );
    assert_eq!(t2, 12);
    assert!(t2 > t);
    sm.check_invariants().expect("invariants");
}

#[test]
fn a_snapshot_from_before_revisions_starts_the_revision_at_its_index() {
    // The old snapshot layout is the new one without the revision (the 8 bytes after `now`
    // and `last_index`): rebuild one from a state at index 7.
    let mut sm = StateMachine::new();
    sm.apply_batch(
        7,
        &Batch::legacy(req(rid(1, 1), 1_000, acquire("L", "a", 5_000, 0))),
    );
    let new = sm.to_bytes();
    let mut old = new[..16].to_vec();
    old.extend_from_slice(&new[24..]);
    let restored = StateMachine::from_legacy_bytes(&old).expect("decodes");
    assert_eq!(restored.revision(), 7);
    assert_eq!(restored, sm);
}

/// `FencedPut` and `FENCE.SET` share one check (`Keyspace::fence_set`): the same marks, the
/// typed answer carries the mark a stale write was checked against, and a retry is answered
/// from the dedup table.
#[test]
fn fenced_put_is_fence_set_with_a_typed_answer() {
    let mut h = Harness::new();
    let put = |token| Command::FencedPut {
        key: b"file".to_vec(),
        value: format!("v{token}").into_bytes(),
        token,
    };
    let out = h.run(1, put(7));
    assert_eq!(
        out.response,
        Response::Fenced {
            accepted: true,
            highest: 7
        }
    );
    let stale = h.run(1, put(5));
    assert_eq!(
        stale.response,
        Response::Fenced {
            accepted: false,
            highest: 7
        }
    );
    assert_eq!(
        h.sm.kv().get(b"file", h.time).map(|e| &e.value),
        Some(&kv::Value::Str(b"v7".to_vec()))
    );
    // FENCE.SET sees the mark FencedPut left, and the other way round.
    let fence_set = |token: &str| {
        Command::Kv(kv::KvCommand::Batch(vec![kv(&[
            "FENCE.SET",
            "file",
            "x",
            token,
        ])]))
    };
    let Response::Kv(r) = h.run(1, fence_set("6")).response else {
        panic!("not a kv response")
    };
    assert_eq!(
        r.replies[0],
        kv::Reply::err("STALE token 6 is older than 7")
    );
    let Response::Kv(r) = h.run(1, fence_set("9")).response else {
        panic!("not a kv response")
    };
    assert_eq!(r.replies[0], kv::Reply::ok());
    assert_eq!(
        h.run(1, put(8)).response,
        Response::Fenced {
            accepted: false,
            highest: 9
        }
    );
    // Too large: refused, nothing written, the mark unchanged.
    let big = Command::FencedPut {
        key: b"file".to_vec(),
        value: vec![0; kv::MAX_VALUE_LEN + 1],
        token: 10,
    };
    assert!(matches!(
        h.run(1, big).response,
        Response::Rejected(CoreError::ValueTooLarge { .. })
    ));
    assert_eq!(h.sm.kv().fence(b"file"), 9);
    // A retried request gets its first answer, even after the mark moved on.
    let rid = RequestId {
        client_id: 2,
        seq: 1,
    };
    let first = h.run_as(Some(rid), put(20)).response;
    h.run(1, put(30));
    assert_eq!(h.run_as(Some(rid), put(20)).response, first);
    assert_eq!(h.sm.kv().fence(b"file"), 30, "the retry did not act again");
}

/// Issue 49: a request id reused for a different command is refused, naming `REQID`; it
/// does not answer the first command's outcome (a grant of another lock), acts on nothing,
/// takes no revision, and leaves the first outcome for a true retry. The refusal survives
/// a snapshot; an entry stamped older than the rule answers as it always did.
#[test]
fn a_request_id_reused_for_another_command_is_refused() {
    let mut h = Harness::new();
    let rid = RequestId {
        client_id: 11,
        seq: 1,
    };
    let first = h.run_as(Some(rid), acquire("a", "o", 5_000, 0));
    let token = token_of(&first.response);
    let revision = h.sm.revision();
    let reused = h.run_as(Some(rid), acquire("b", "o", 5_000, 0));
    assert!(
        matches!(&reused.response, Response::Rejected(e) if e.to_string().contains("REQID")),
        "a REQID reused for lock b answered {:?} (the grant of lock a, token {token})",
        reused.response
    );
    assert!(h.sm.lock_info("b").is_none(), "lock b granted");
    assert_eq!(h.sm.revision(), revision, "the refusal took a revision");
    let retry = h.run_as(Some(rid), acquire("a", "o", 5_000, 0));
    assert_eq!(retry.response, first.response, "a true retry");

    // The digests travel in the snapshot body.
    let mut body = Vec::new();
    h.sm.write_body(
        bincode::DefaultOptions::new().with_fixint_encoding(),
        &mut body,
    )
    .expect("encode");
    let version = h.sm.body_version();
    let mut restored = StateMachine::read_body(
        version,
        bincode::DefaultOptions::new().with_fixint_encoding(),
        &body[..],
    )
    .expect("decode");
    assert_eq!(restored, h.sm);
    let again = restored.apply(
        100,
        &Request {
            time_ms: 2_000,
            client: Some(rid),
            cmd: acquire("b", "o", 5_000, 0),
        },
    );
    assert!(matches!(again.response, Response::Rejected(_)), "{again:?}");

    // Under the older rules, the stored outcome is answered (the old behaviour, replayed).
    let mut old = h.sm.clone();
    let mut batch = Batch::one(Request {
        time_ms: 2_000,
        client: Some(RequestId {
            client_id: 12,
            seq: 1,
        }),
        cmd: acquire("c", "o", 5_000, 0),
    });
    batch.semantics = Semantics::LUA_IDS;
    let c = old.apply_batch(200, &batch);
    batch.requests[0].cmd = acquire("d", "o", 5_000, 0);
    let d = old.apply_batch(201, &batch);
    assert_eq!(c.responses, d.responses, "older rules: the stored outcome");
}
