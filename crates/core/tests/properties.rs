//! Property tests over random command sequences: mutual exclusion, token monotonicity,
//! deterministic replay, snapshot equivalence and retry idempotency.

use std::collections::BTreeMap;

use fenced_core::*;
use proptest::prelude::*;

const NAMES: [&str; 3] = ["A", "B", "C"];
const OWNERS: [&str; 3] = ["x", "y", "z"];

/// A step before it is bound to concrete sessions/tokens of the run.
#[derive(Clone, Debug)]
enum Op {
    Acquire {
        name: usize,
        owner: usize,
        ttl_ms: u64,
        session: Option<usize>,
        wait_ms: u64,
    },
    /// Release the current grant (if `honest`) or a wrong token.
    Release {
        name: usize,
        owner: usize,
        honest: bool,
    },
    Renew {
        name: usize,
        owner: usize,
        ttl_ms: u64,
        honest: bool,
    },
    OpenSession {
        ttl_ms: u64,
    },
    KeepAlive {
        session: usize,
    },
    CloseSession {
        session: usize,
    },
    Tick,
    /// Send an earlier request again, with its request id.
    Retry {
        which: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..3usize, 1..800u64, proptest::option::of(0..4usize), prop_oneof![Just(0u64), 1..1500u64])
            .prop_map(|(name, owner, ttl_ms, session, wait_ms)| Op::Acquire { name, owner, ttl_ms, session, wait_ms }),
        3 => (0..3usize, 0..3usize, any::<bool>()).prop_map(|(name, owner, honest)| Op::Release { name, owner, honest }),
        1 => (0..3usize, 0..3usize, 1..800u64, any::<bool>()).prop_map(|(name, owner, ttl_ms, honest)| Op::Renew { name, owner, ttl_ms, honest }),
        1 => (1..1000u64).prop_map(|ttl_ms| Op::OpenSession { ttl_ms }),
        1 => (0..4usize).prop_map(|session| Op::KeepAlive { session }),
        1 => (0..4usize).prop_map(|session| Op::CloseSession { session }),
        1 => Just(Op::Tick),
        1 => (0..64usize).prop_map(|which| Op::Retry { which }),
    ]
}

/// Turn ops into concrete requests, consulting the machine for current tokens/sessions.
/// Returns the log and the applied outcomes.
fn run(ops: &[(Op, u64)]) -> (Vec<Request>, Vec<Applied>, StateMachine) {
    let mut sm = StateMachine::new();
    let mut log: Vec<Request> = Vec::new();
    let mut out = Vec::new();
    let mut sessions: Vec<SessionId> = Vec::new();
    let mut time = 0u64;
    let mut seqs: BTreeMap<u64, u64> = BTreeMap::new();
    for (op, dt) in ops {
        time += dt;
        let owner_client = |o: usize| o as u64 + 1;
        let mut next_rid = |client: u64| {
            let s = seqs.entry(client).or_insert(0);
            *s += 1;
            Some(RequestId {
                client_id: client,
                seq: *s,
            })
        };
        let (client, cmd) = match op {
            Op::Acquire {
                name,
                owner,
                ttl_ms,
                session,
                wait_ms,
            } => (
                next_rid(owner_client(*owner)),
                Command::Acquire {
                    name: NAMES[*name].into(),
                    owner: OWNERS[*owner].into(),
                    ttl_ms: *ttl_ms,
                    session: session.and_then(|s| sessions.get(s).copied()),
                    wait_ms: *wait_ms,
                },
            ),
            Op::Release {
                name,
                owner,
                honest,
            } => {
                let token = sm.lock_info(NAMES[*name]).map_or(1, |i| i.token);
                (
                    next_rid(owner_client(*owner)),
                    Command::Release {
                        name: NAMES[*name].into(),
                        owner: OWNERS[*owner].into(),
                        token: if *honest {
                            token
                        } else {
                            token.saturating_sub(1)
                        },
                    },
                )
            }
            Op::Renew {
                name,
                owner,
                ttl_ms,
                honest,
            } => {
                let token = sm.lock_info(NAMES[*name]).map_or(1, |i| i.token);
                (
                    next_rid(owner_client(*owner)),
                    Command::Renew {
                        name: NAMES[*name].into(),
                        owner: OWNERS[*owner].into(),
                        token: if *honest { token } else { token + 1 },
                        ttl_ms: *ttl_ms,
                    },
                )
            }
            Op::OpenSession { ttl_ms } => (next_rid(10), Command::OpenSession { ttl_ms: *ttl_ms }),
            Op::KeepAlive { session } => (
                next_rid(10),
                Command::KeepAlive {
                    session: sessions.get(*session).copied().unwrap_or(999),
                },
            ),
            Op::CloseSession { session } => (
                next_rid(10),
                Command::CloseSession {
                    session: sessions.get(*session).copied().unwrap_or(999),
                },
            ),
            Op::Tick => (None, Command::Tick),
            Op::Retry { which } => {
                let earlier: Vec<&Request> = log.iter().filter(|r| r.client.is_some()).collect();
                if earlier.is_empty() {
                    (None, Command::Tick)
                } else {
                    let r = earlier[which % earlier.len()];
                    (r.client, r.cmd.clone())
                }
            }
        };
        let req = Request {
            time_ms: time,
            client,
            cmd,
        };
        let index = log.len() as u64 + 1;
        let applied = sm.apply(index, &req);
        if let Response::SessionOpened { session, .. } = applied.response {
            sessions.push(session);
        }
        log.push(req);
        out.push(applied);
    }
    (log, out, sm)
}

fn steps() -> impl Strategy<Value = Vec<(Op, u64)>> {
    proptest::collection::vec((op(), 0..300u64), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Replaying the responses and events: a lock is never granted while someone holds it,
    /// grants of a lock carry strictly increasing tokens, and indexes stay consistent.
    #[test]
    fn mutual_exclusion_and_increasing_tokens(ops in steps()) {
        let mut sm = StateMachine::new();
        let (log, outs, _) = run(&ops);
        let mut holder: BTreeMap<String, (String, Token)> = BTreeMap::new();
        let mut last_token: BTreeMap<String, Token> = BTreeMap::new();
        let mut grant = |holder: &mut BTreeMap<String, (String, Token)>, name: &str, owner: String, token: Token| -> Result<(), TestCaseError> {
            prop_assert!(!holder.contains_key(name), "{name} granted to {owner} while held by {:?}", holder.get(name));
            if let Some(prev) = last_token.get(name) {
                prop_assert!(token > *prev, "{name}: token {token} after {prev}");
            }
            last_token.insert(name.to_owned(), token);
            holder.insert(name.to_owned(), (owner, token));
            Ok(())
        };
        for (i, (req, applied)) in log.iter().zip(&outs).enumerate() {
            let index = i as u64 + 1;
            let before = sm.revision();
            prop_assert_eq!(&sm.apply(index, req), applied);
            sm.check_invariants().map_err(TestCaseError::fail)?;
            // The command's revision (if it ran: a retry does not), and the expiry step's
            // before it (if anything was due).
            let cmd_rev = sm.revision();
            prop_assert!(cmd_rev >= before && cmd_rev <= before + 2, "revision {before} -> {cmd_rev}");
            for e in &applied.events {
                match e {
                    Event::LockReleased { name, token, owner, .. } => {
                        prop_assert_eq!(holder.remove(name), Some((owner.clone(), *token)));
                    }
                    Event::WaiterGranted { name, token, request, .. } => {
                        prop_assert!(*token > before && *token <= cmd_rev, "hand-over token {token} outside ({before}, {cmd_rev}]");
                        // The waiter's owner, from its acquire in the log (a grant of the
                        // expiry step may be ended again by the command that follows it).
                        let owner = log[..=i]
                            .iter()
                            .find_map(|r| match (&r.cmd, r.client) {
                                (Command::Acquire { owner, .. }, Some(c)) if c == *request => Some(owner.clone()),
                                _ => None,
                            })
                            .unwrap_or_default();
                        grant(&mut holder, name, owner, *token)?;
                    }
                    Event::WaiterGaveUp { .. } => {}
                    Event::Kv(_) | Event::EtcdChanged { .. } => {}
                }
            }
            if let (Command::Acquire { name, owner, .. }, Response::Granted { token, holds: 1, .. }) = (&req.cmd, &applied.response) {
                // A retry answers with the first outcome and grants nothing.
                let retry = req.client.is_some() && log[..i].iter().any(|r| r.client == req.client);
                if *token == cmd_rev && !retry {
                    grant(&mut holder, name, owner.clone(), *token)?;
                }
            }
            // Our view agrees with the machine's.
            for name in NAMES {
                let seen = sm.lock_info(name).map(|l| (l.owner, l.token));
                prop_assert_eq!(holder.get(name).cloned(), seen, "view of {}", name);
            }
        }
    }

    /// The same log applied twice gives the same state, responses and events.
    #[test]
    fn replay_is_deterministic(ops in steps()) {
        let (log, outs, end) = run(&ops);
        let mut sm = StateMachine::new();
        for (i, req) in log.iter().enumerate() {
            prop_assert_eq!(&sm.apply(i as u64 + 1, req), &outs[i]);
        }
        prop_assert_eq!(sm, end);
    }

    /// Snapshot at any point, restore, apply the rest: same as never snapshotting.
    #[test]
    fn snapshot_restore_is_equivalent(ops in steps(), cut in any::<prop::sample::Index>()) {
        let (log, outs, end) = run(&ops);
        let cut = cut.index(log.len() + 1);
        let mut sm = StateMachine::new();
        for (i, req) in log[..cut].iter().enumerate() {
            sm.apply(i as u64 + 1, req);
        }
        let mut restored = StateMachine::from_bytes(&sm.to_bytes()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&restored, &sm);
        for (i, req) in log.iter().enumerate().skip(cut) {
            prop_assert_eq!(&restored.apply(i as u64 + 1, req), &outs[i]);
        }
        prop_assert_eq!(restored, end);
    }

    /// Applying a log cut into batches (several requests per entry) gives the same
    /// responses, events and state as applying its requests one per entry: a command's
    /// revision does not depend on how commands are grouped into entries.
    #[test]
    fn batches_apply_like_their_commands_one_by_one(
        ops in steps(),
        cuts in proptest::collection::vec(1..8usize, 1..40),
    ) {
        let (log, _, _) = run(&ops);
        let mut batched = StateMachine::new();
        let mut single = StateMachine::new();
        let (mut at, mut index) = (0, 0);
        for n in cuts.iter().cycle() {
            if at >= log.len() {
                break;
            }
            let end = (at + n).min(log.len());
            index += 1;
            let batch = Batch { requests: log[at..end].to_vec(), semantics: Semantics::NEWEST };
            let out = batched.apply_batch(index, &batch);
            let mut responses = Vec::new();
            let mut events = Vec::new();
            for req in &log[at..end] {
                let one = single.apply(index, req);
                responses.push(one.response);
                events.extend(one.events);
            }
            prop_assert_eq!(&out.responses, &responses);
            prop_assert_eq!(&out.events, &events);
            batched.check_invariants().map_err(TestCaseError::fail)?;
            at = end;
        }
        prop_assert_eq!(batched, single);
    }

    /// A retried request returns its first result (or, for a queued acquire, its resolution)
    /// and never acts again.
    #[test]
    fn retry_returns_first_result(ops in steps()) {
        let (log, outs, _) = run(&ops);
        let mut first: BTreeMap<RequestId, (usize, Response)> = BTreeMap::new();
        for (i, (req, applied)) in log.iter().zip(&outs).enumerate() {
            let Some(rid) = req.client else { continue };
            match first.get(&rid) {
                None => { first.insert(rid, (i, applied.response.clone())); }
                Some((_, Response::Pending)) => {
                    prop_assert!(matches!(applied.response, Response::Pending | Response::NotGranted | Response::Granted { .. }), "{:?}", applied.response);
                }
                Some((_, r)) => prop_assert_eq!(&applied.response, r),
            }
            if first.get(&rid).map(|(j, _)| *j) != Some(i) {
                // A retry never produces grants or releases of its own.
                let acted = applied.events.iter().any(|e| matches!(e, Event::LockReleased { reason: ReleaseReason::Released | ReleaseReason::SessionClosed, .. }));
                prop_assert!(!acted, "retry acted: {:?}", applied.events);
            }
        }
    }
}
