//! Property tests of the lock family over random command sequences: exclusive, read-write and
//! semaphore locks, atomic multi-locks, sessions, lock-delay and force-unlock.
//!
//! The view of who holds what is rebuilt from responses and events only (not from the
//! machine's internals), and checked for: mutual exclusion, reader/writer exclusion, permit
//! count, FIFO order, all-or-nothing multi-locks, strictly increasing tokens and lock-delay.

use std::collections::{BTreeMap, BTreeSet};

use fenced_core::*;
use proptest::prelude::*;

/// Lock names and the mode each is used with.
const LOCKS: [(&str, Mode); 5] = [
    ("E1", Mode::Exclusive),
    ("E2", Mode::Exclusive),
    ("E3", Mode::Exclusive),
    ("RW", Mode::Read), // Read or Write, chosen per op
    ("S", Mode::Permit { permits: 2 }),
];
const OWNERS: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        lock: usize,
        write: bool,
        owner: usize,
        ttl_ms: u64,
        session: Option<usize>,
        wait_ms: u64,
        delay_ms: u64,
    },
    Multi {
        names: Vec<usize>,
        owner: usize,
        ttl_ms: u64,
        wait_ms: u64,
    },
    Release {
        lock: usize,
        owner: usize,
    },
    ReleaseMulti {
        owner: usize,
    },
    Force {
        lock: usize,
    },
    Open {
        ttl_ms: u64,
    },
    KeepAlive {
        session: usize,
    },
    Close {
        session: usize,
    },
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..5usize, any::<bool>(), 0..4usize, 1..600u64, proptest::option::weighted(0.3, 0..3usize), prop_oneof![Just(0u64), 1..1200u64], prop_oneof![3 => Just(0u64), 1 => 1..400u64])
            .prop_map(|(lock, write, owner, ttl_ms, session, wait_ms, delay_ms)| Op::Acquire { lock, write, owner, ttl_ms, session, wait_ms, delay_ms }),
        2 => (proptest::sample::subsequence(vec![0usize, 1, 2], 2..=3), 0..4usize, 1..600u64, prop_oneof![Just(0u64), 1..1200u64])
            .prop_map(|(names, owner, ttl_ms, wait_ms)| Op::Multi { names, owner, ttl_ms, wait_ms }),
        4 => (0..5usize, 0..4usize).prop_map(|(lock, owner)| Op::Release { lock, owner }),
        1 => (0..4usize).prop_map(|owner| Op::ReleaseMulti { owner }),
        1 => (0..5usize).prop_map(|lock| Op::Force { lock }),
        1 => (1..800u64).prop_map(|ttl_ms| Op::Open { ttl_ms }),
        1 => (0..3usize).prop_map(|session| Op::KeepAlive { session }),
        1 => (0..3usize).prop_map(|session| Op::Close { session }),
        2 => Just(Op::Tick),
    ]
}

/// A grant as seen from outside: (owner, session, token, mode).
type Grant = (String, Option<u64>, Token, Mode);

#[derive(Default)]
struct View {
    holders: BTreeMap<String, Vec<Grant>>,
    /// Queued requests per lock, in arrival order.
    queues: BTreeMap<String, Vec<RequestId>>,
    specs: BTreeMap<RequestId, AcquireSpec>,
    /// Revision of the step (expiry or command) that made the last grant of each lock.
    last_grant_step: BTreeMap<String, Revision>,
    last_token: BTreeMap<String, Token>,
    /// Lock-delay in force: no grant before this log time.
    delayed_until: BTreeMap<String, Millis>,
}

impl View {
    fn grant(
        &mut self,
        name: &str,
        g: Grant,
        step: Revision,
        now: Millis,
    ) -> Result<(), TestCaseError> {
        let held = self.holders.entry(name.to_owned()).or_default();
        let mode = g.3;
        match mode {
            Mode::Exclusive | Mode::Write => prop_assert!(
                held.is_empty(),
                "{name}: {mode:?} granted while held by {held:?}"
            ),
            Mode::Read => prop_assert!(
                held.iter().all(|h| h.3 == Mode::Read),
                "{name}: read granted beside a writer {held:?}"
            ),
            Mode::Permit { permits } => prop_assert!(
                held.len() < permits as usize,
                "{name}: permit {} of {permits}",
                held.len() + 1
            ),
        }
        prop_assert_eq!(g.2, step, "token is the granting step's revision");
        if let Some(prev) = self.last_token.get(name) {
            prop_assert!(g.2 >= *prev, "{}: token {} after {}", name, g.2, prev);
            if self.last_grant_step.get(name) != Some(&step) {
                prop_assert!(
                    g.2 > *prev,
                    "{}: token {} repeated in a later step",
                    name,
                    g.2
                );
            }
        }
        if let Some(until) = self.delayed_until.get(name) {
            prop_assert!(
                now >= *until,
                "{name}: granted at {now} during lock-delay until {until}"
            );
        }
        self.last_token.insert(name.to_owned(), g.2);
        self.last_grant_step.insert(name.to_owned(), step);
        held.push(g);
        Ok(())
    }

    fn release(&mut self, name: &str, owner: &str, token: Token) -> Result<(), TestCaseError> {
        let held = self.holders.entry(name.to_owned()).or_default();
        let pos = held.iter().position(|g| g.0 == owner && g.2 == token);
        prop_assert!(
            pos.is_some(),
            "{name}: release of unknown grant {owner}/{token}"
        );
        if let Some(p) = pos {
            held.remove(p);
        }
        Ok(())
    }

    /// FIFO: a queued request is granted only if no request queued before it on any of its
    /// locks is still queued.
    fn check_fifo(&self, rid: RequestId, names: &[String]) -> Result<(), TestCaseError> {
        for n in names {
            let q = self.queues.get(n).cloned().unwrap_or_default();
            if let Some(pos) = q.iter().position(|r| *r == rid) {
                prop_assert!(pos == 0, "{n}: {rid:?} granted ahead of {:?}", &q[..pos]);
            }
        }
        Ok(())
    }

    fn dequeue(&mut self, rid: RequestId) {
        for q in self.queues.values_mut() {
            q.retain(|r| *r != rid);
        }
    }
}

fn run_and_check(ops: &[(Op, u64)]) -> Result<(), TestCaseError> {
    let mut sm = StateMachine::new();
    let mut view = View::default();
    let mut sessions: Vec<u64> = Vec::new();
    let mut multi_grants: BTreeMap<String, (Vec<String>, Token)> = BTreeMap::new();
    let mut delays: BTreeMap<(String, String, Token), Millis> = BTreeMap::new();
    let mut time = 0;
    for (i, (op, dt)) in ops.iter().enumerate() {
        time += dt;
        let index = i as u64 + 1;
        let rid = RequestId {
            client_id: 1,
            seq: index,
        };
        let cmd = match op {
            Op::Acquire {
                lock,
                write,
                owner,
                ttl_ms,
                session,
                wait_ms,
                delay_ms,
            } => {
                let (name, mode) = LOCKS[*lock];
                let mode = match (mode, write) {
                    (Mode::Read, true) => Mode::Write,
                    (m, _) => m,
                };
                Command::AcquireWith(Box::new(AcquireSpec {
                    names: vec![name.into()],
                    owner: OWNERS[*owner].into(),
                    mode,
                    ttl_ms: *ttl_ms,
                    session: session.and_then(|s| sessions.get(s).copied()),
                    wait_ms: *wait_ms,
                    lock_delay_ms: *delay_ms,
                }))
            }
            Op::Multi {
                names,
                owner,
                ttl_ms,
                wait_ms,
            } => Command::AcquireWith(Box::new(AcquireSpec {
                names: names.iter().map(|n| LOCKS[*n].0.to_owned()).collect(),
                owner: format!("m{owner}"),
                mode: Mode::Exclusive,
                ttl_ms: *ttl_ms,
                session: None,
                wait_ms: *wait_ms,
                lock_delay_ms: 0,
            })),
            Op::Release { lock, owner } => {
                let name = LOCKS[*lock].0;
                let token = view
                    .holders
                    .get(name)
                    .and_then(|h| h.iter().find(|g| g.0 == OWNERS[*owner]).map(|g| g.2))
                    .unwrap_or(index);
                Command::Release {
                    name: name.into(),
                    owner: OWNERS[*owner].into(),
                    token,
                }
            }
            Op::ReleaseMulti { owner } => {
                let o = format!("m{owner}");
                let (names, token) = multi_grants
                    .get(&o)
                    .cloned()
                    .unwrap_or((vec!["E1".into()], 0));
                Command::ReleaseAll {
                    names,
                    owner: o,
                    token,
                }
            }
            Op::Force { lock } => Command::ForceUnlock {
                name: LOCKS[*lock].0.into(),
            },
            Op::Open { ttl_ms } => Command::OpenSession { ttl_ms: *ttl_ms },
            Op::KeepAlive { session } => Command::KeepAlive {
                session: sessions.get(*session).copied().unwrap_or(0),
            },
            Op::Close { session } => Command::CloseSession {
                session: sessions.get(*session).copied().unwrap_or(0),
            },
            Op::Tick => Command::Tick,
        };
        let spec = match &cmd {
            Command::AcquireWith(s) => Some((**s).clone()),
            _ => None,
        };
        let out = sm.apply(
            index,
            &Request {
                time_ms: time,
                client: Some(rid),
                cmd: cmd.clone(),
            },
        );
        sm.check_invariants().map_err(TestCaseError::fail)?;
        let now = sm.now();
        // The command took the last revision; an expiry step before it (if anything was due)
        // the one before. Events come in order: the expiry step's (releases, give-ups, then
        // its hand-overs), then the command's own grant, then the command's releases and
        // hand-overs. Replay them in that order.
        let cmd_rev = sm.revision();
        let mut granted_now = false;
        for e in &out.events {
            match e {
                Event::LockReleased {
                    name,
                    owner,
                    token,
                    reason,
                    ..
                } => {
                    view.release(name, owner, *token)?;
                    if let Some(d) = delays.remove(&(name.clone(), owner.clone(), *token)) {
                        if matches!(
                            reason,
                            ReleaseReason::Expired | ReleaseReason::SessionExpired
                        ) {
                            let until = view
                                .delayed_until
                                .get(name)
                                .copied()
                                .unwrap_or(0)
                                .max(now + d);
                            view.delayed_until.insert(name.clone(), until);
                        }
                    }
                }
                Event::WaiterGaveUp { request, .. } => view.dequeue(*request),
                Event::Kv(_) | Event::EtcdChanged { .. } => {}
                Event::WaiterGranted { request, token, .. } => {
                    // The command's own grant (if any) precedes its hand-overs.
                    if !granted_now && *token == cmd_rev {
                        granted_now = true;
                        grant_response(
                            &mut view,
                            &spec,
                            rid,
                            &out.response,
                            cmd_rev,
                            now,
                            &mut multi_grants,
                            &mut delays,
                        )?;
                    }
                    // Before the command: the expiry step's hand-overs.
                    let step = if granted_now { cmd_rev } else { cmd_rev - 1 };
                    let w = view
                        .specs
                        .get(request)
                        .cloned()
                        .ok_or_else(|| TestCaseError::fail("grant of unknown waiter"))?;
                    view.check_fifo(*request, &w.names)?;
                    view.dequeue(*request);
                    let existing = view.holders.get(&w.names[0]).and_then(|h| {
                        h.iter()
                            .find(|g| g.0 == w.owner && g.1 == w.session)
                            .cloned()
                    });
                    if let Some(g) = existing {
                        // A second queued acquire of a holder: one more hold of its grant.
                        prop_assert_eq!(g.2, *token, "a reentrant grant keeps its token");
                        continue;
                    }
                    for n in &w.names {
                        view.grant(n, (w.owner.clone(), w.session, *token, w.mode), step, now)?;
                        if w.lock_delay_ms > 0 {
                            delays.insert((n.clone(), w.owner.clone(), *token), w.lock_delay_ms);
                        }
                    }
                    if w.names.len() > 1 {
                        multi_grants.insert(w.owner.clone(), (w.names.clone(), *token));
                    }
                }
            }
        }
        if !granted_now {
            grant_response(
                &mut view,
                &spec,
                rid,
                &out.response,
                cmd_rev,
                now,
                &mut multi_grants,
                &mut delays,
            )?;
        }
        if let Response::SessionOpened { session, .. } = &out.response {
            sessions.push(*session);
        }
        // Expired lock-delays no longer matter.
        view.delayed_until.retain(|_, until| *until > now);
        // Our view agrees with the machine's.
        for (name, _) in LOCKS {
            let mut seen: Vec<(String, Token)> = sm
                .lock_info(name)
                .map(|i| i.holders.into_iter().map(|h| (h.owner, h.token)).collect())
                .unwrap_or_default();
            let mut ours: Vec<(String, Token)> = view
                .holders
                .get(name)
                .map(|h| h.iter().map(|g| (g.0.clone(), g.2)).collect())
                .unwrap_or_default();
            seen.sort();
            ours.sort();
            prop_assert_eq!(ours, seen, "holders of {}", name);
        }
    }
    Ok(())
}

/// The effect of the command itself: a grant on arrival, or joining the queues.
#[allow(clippy::too_many_arguments)]
fn grant_response(
    view: &mut View,
    spec: &Option<AcquireSpec>,
    rid: RequestId,
    response: &Response,
    cmd_rev: Revision,
    now: Millis,
    multi: &mut BTreeMap<String, (Vec<String>, Token)>,
    delays: &mut BTreeMap<(String, String, Token), Millis>,
) -> Result<(), TestCaseError> {
    if let (Some(s), Response::Pending) = (spec, response) {
        for n in &s.names {
            view.queues.entry(n.clone()).or_default().push(rid);
        }
        view.specs.insert(rid, s.clone());
        return Ok(());
    }
    let (
        Some(s),
        Response::Granted {
            token, holds: 1, ..
        },
    ) = (spec, response)
    else {
        return Ok(());
    };
    if *token != cmd_rev {
        return Ok(()); // a reentrant acquire: one more hold of an existing grant
    }
    // Fair: a request is granted on arrival only if nobody queues for any of its locks.
    for n in &s.names {
        let queued = view.queues.get(n).cloned().unwrap_or_default();
        prop_assert!(
            queued.is_empty(),
            "{n}: granted on arrival ahead of {queued:?}"
        );
    }
    // All-or-nothing: every name is granted by this command.
    for n in &s.names {
        view.grant(
            n,
            (s.owner.clone(), s.session, *token, s.mode),
            cmd_rev,
            now,
        )?;
        if s.lock_delay_ms > 0 {
            delays.insert((n.clone(), s.owner.clone(), *token), s.lock_delay_ms);
        }
    }
    if s.names.len() > 1 {
        multi.insert(s.owner.clone(), (s.names.clone(), *token));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn lock_family_invariants(ops in proptest::collection::vec((op(), 0..250u64), 1..150)) {
        run_and_check(&ops)?;
    }
}

#[test]
fn distinct_lock_names_are_used() {
    let names: BTreeSet<&str> = LOCKS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names.len(), LOCKS.len());
}
