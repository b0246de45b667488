//! Rate limiters through the state machine (`Command::Limit`): exactly-once on retry, typed
//! errors, and property tests per algorithm against simple reference models driven by the
//! same log times:
//! * the decisions equal the model's (so no over- and no under-admission: every rounding in
//!   a decision is exact);
//! * admitted units never exceed the policy's bound over any span of time;
//! * expiry of idle state never changes a decision: a run where the key expires (and is
//!   recreated) gives exactly the same decisions as one where `PERSIST` keeps it forever.

use std::collections::BTreeMap;

use fenced_core::kv::{KvCommand, Reply};
use fenced_core::*;
use proptest::prelude::*;

const KEY: &[u8] = b"rl";

struct Run {
    sm: StateMachine,
    index: u64,
    seq: u64,
    /// `PERSIST` the key after every request (its state then never expires).
    persist: bool,
}

impl Run {
    fn new(persist: bool) -> Run {
        Run {
            sm: StateMachine::default(),
            index: 0,
            seq: 0,
            persist,
        }
    }

    fn apply(&mut self, time_ms: u64, client: Option<RequestId>, cmd: Command) -> Response {
        self.index += 1;
        self.sm
            .apply(
                self.index,
                &Request {
                    time_ms,
                    client,
                    cmd,
                },
            )
            .response
    }

    fn limit(&mut self, t: u64, policy: &Policy, quantity: u64, mode: LimitMode) -> Decision {
        self.seq += 1;
        let rid = RequestId {
            client_id: 7,
            seq: self.seq,
        };
        let cmd = Command::Limit {
            key: KEY.to_vec(),
            policy: policy.clone(),
            quantity,
            mode,
        };
        let d = match self.apply(t, Some(rid), cmd) {
            Response::Limited(d) => d,
            other => panic!("{other:?}"),
        };
        if self.persist {
            let persist = vec![b"PERSIST".to_vec(), KEY.to_vec()];
            self.apply(t, None, Command::Kv(KvCommand::Batch(vec![persist])));
        }
        d
    }
}

const T0: u64 = 1_000_000;

#[test]
fn a_retried_request_is_answered_once_and_consumes_once() {
    let mut run = Run::new(false);
    let policy = Policy::token_bucket(10, 1, 60_000);
    let rid = RequestId {
        client_id: 1,
        seq: 1,
    };
    let cmd = Command::Limit {
        key: KEY.to_vec(),
        policy: policy.clone(),
        quantity: 4,
        mode: LimitMode::Check,
    };
    let first = run.apply(T0, Some(rid), cmd.clone());
    // The retry arrives later (after a leader change, say): the same answer, nothing consumed.
    let again = run.apply(T0 + 5, Some(rid), cmd);
    assert_eq!(first, again);
    let Response::Limited(d) = first else {
        panic!("{first:?}")
    };
    assert!(d.allowed);
    assert_eq!(d.remaining, 6);
    let peek = run.limit(T0 + 10, &policy, 1, LimitMode::Peek);
    assert_eq!((peek.allowed, peek.remaining), (true, 5), "consumed once");
    // A new request id does consume.
    let next = run.limit(T0 + 10, &policy, 6, LimitMode::Check);
    assert_eq!((next.allowed, next.remaining), (true, 0));
    let denied = run.limit(T0 + 10, &policy, 1, LimitMode::Check);
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms, Some(60_000 - 10));
}

#[test]
fn typed_errors_and_reset() {
    let mut run = Run::new(false);
    let reject = |r: Response| match r {
        Response::Rejected(CoreError::Limit(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        Policy::token_bucket(0, 1, 1000).validate(),
        Err(LimitError::OutOfRange {
            param: "capacity".into(),
            value: 0,
            min: 1,
            max: 1_000_000_000
        })
    );
    assert!(Policy::gcra(0, 1, 1).validate().is_ok());
    assert!(Policy::gcra(0, 1, 86_400_001).validate().is_err());
    assert!(Policy::sliding_log(&[]).validate().is_err());
    let limit = |policy: Policy, quantity| Command::Limit {
        key: KEY.to_vec(),
        policy,
        quantity,
        mode: LimitMode::Check,
    };
    assert_eq!(
        reject(run.apply(T0, None, limit(Policy::fixed_window(3, 0), 1))),
        LimitError::OutOfRange {
            param: "window_ms".into(),
            value: 0,
            min: 1,
            max: 86_400_000
        }
    );
    assert_eq!(
        reject(run.apply(T0, None, limit(Policy::fixed_window(3, 1000), 4))),
        LimitError::QuantityTooLarge {
            quantity: 4,
            max: 3
        }
    );
    // GCRA answers an oversized quantity like redis-cell: denied, never retriable.
    let Response::Limited(d) = run.apply(T0, None, limit(Policy::gcra(2, 1, 1000), 4)) else {
        panic!()
    };
    assert_eq!((d.allowed, d.retry_after_ms, d.remaining), (false, None, 3));
    // Another type under the key.
    let set = vec![b"SET".to_vec(), b"s".to_vec(), b"v".to_vec()];
    run.apply(T0, None, Command::Kv(KvCommand::Batch(vec![set])));
    let on_string = Command::Limit {
        key: b"s".to_vec(),
        policy: Policy::fixed_window(3, 1000),
        quantity: 1,
        mode: LimitMode::Check,
    };
    assert_eq!(
        reject(run.apply(T0, None, on_string)),
        LimitError::WrongType
    );
    // Reset forgets the state.
    let p = Policy::fixed_window(1, 60_000);
    assert!(run.limit(T0, &p, 1, LimitMode::Check).allowed);
    assert!(!run.limit(T0, &p, 1, LimitMode::Check).allowed);
    let fresh = run.limit(T0, &p, 0, LimitMode::Reset);
    assert_eq!(
        (fresh.allowed, fresh.remaining, fresh.reset_after_ms),
        (true, 1, 0)
    );
    assert!(run.limit(T0, &p, 1, LimitMode::Check).allowed);
    let get = vec![b"TYPE".to_vec(), KEY.to_vec()];
    assert_eq!(
        run.sm.kv().read(T0, &get),
        Some(Reply::Status("ratelimit".into()))
    );
}

// ---- reference models -------------------------------------------------------------------

/// The simplest statement of each algorithm, without expiry or cleverness.
enum Model {
    /// A level (in units of 1/den tokens) that drains `rate` per ms; GCRA and the leaky
    /// bucket are both this (GCRA's limit is max_burst + 1).
    Meter {
        cap: u128,
        den: u128,
        rate: u128,
        level: u128,
        at: u64,
    },
    /// Tokens come back in steps, on a timer that starts when a full bucket is first used.
    Bucket {
        cap: u64,
        refill: u64,
        period: u64,
        tokens: u64,
        next: Option<u64>,
    },
    Fixed {
        limit: u64,
        w: u64,
        counts: BTreeMap<u64, u64>,
    },
    Sliding {
        limit: u64,
        w: u64,
        counts: BTreeMap<u64, u64>,
    },
    Log {
        policies: Vec<(u64, u64)>,
        history: Vec<(u64, u64)>,
    },
}

impl Model {
    fn new(p: &Policy) -> Model {
        match p {
            Policy::Gcra {
                max_burst,
                count,
                period_ms,
            } => Model::Meter {
                cap: (*max_burst as u128 + 1) * *period_ms as u128,
                den: *period_ms as u128,
                rate: *count as u128,
                level: 0,
                at: 0,
            },
            Policy::LeakyBucket {
                capacity,
                leak_tokens,
                leak_period_ms,
            } => Model::Meter {
                cap: *capacity as u128 * *leak_period_ms as u128,
                den: *leak_period_ms as u128,
                rate: *leak_tokens as u128,
                level: 0,
                at: 0,
            },
            Policy::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => Model::Bucket {
                cap: *capacity,
                refill: *refill_tokens,
                period: *refill_period_ms,
                tokens: *capacity,
                next: None,
            },
            Policy::FixedWindow { limit, window_ms } => Model::Fixed {
                limit: *limit,
                w: *window_ms,
                counts: BTreeMap::new(),
            },
            Policy::SlidingWindow { limit, window_ms } => Model::Sliding {
                limit: *limit,
                w: *window_ms,
                counts: BTreeMap::new(),
            },
            Policy::SlidingLog { policies } => Model::Log {
                policies: policies.iter().map(|p| (p.window_ms, p.limit)).collect(),
                history: Vec::new(),
            },
        }
    }

    /// Whether `q` is admitted at `now`; consumes if `consume` and admitted.
    fn offer(&mut self, now: u64, q: u64, consume: bool) -> bool {
        match self {
            Model::Meter {
                cap,
                den,
                rate,
                level,
                at,
            } => {
                *level = level.saturating_sub((now - *at) as u128 * *rate);
                *at = now;
                let ok = *level + q as u128 * *den <= *cap;
                if ok && consume {
                    *level += q as u128 * *den;
                }
                ok
            }
            Model::Bucket {
                cap,
                refill,
                period,
                tokens,
                next,
            } => {
                while let Some(t) = *next {
                    if t > now {
                        break;
                    }
                    *tokens = (*tokens + *refill).min(*cap);
                    *next = (*tokens < *cap).then_some(t + *period);
                }
                let ok = q <= *tokens;
                if ok && consume && q > 0 {
                    if *tokens == *cap {
                        *next = Some(now + *period);
                    }
                    *tokens -= q;
                }
                ok
            }
            Model::Fixed { limit, w, counts } => {
                let c = counts.entry(now / *w).or_default();
                let ok = *c + q <= *limit;
                if ok && consume {
                    *c += q;
                }
                ok
            }
            Model::Sliding { limit, w, counts } => {
                let i = now / *w;
                let prev = i
                    .checked_sub(1)
                    .and_then(|p| counts.get(&p))
                    .copied()
                    .unwrap_or(0) as u128;
                let cur = counts.get(&i).copied().unwrap_or(0) as u128;
                let (w128, e) = (*w as u128, (now % *w) as u128);
                let ok = prev * (w128 - e) + (cur + q as u128) * w128 <= *limit as u128 * w128;
                if ok && consume {
                    *counts.entry(i).or_default() += q;
                }
                ok
            }
            Model::Log { policies, history } => {
                let ok = policies.iter().all(|(w, n)| {
                    let used: u64 = history
                        .iter()
                        .filter(|(t, _)| t + w > now)
                        .map(|(_, q)| q)
                        .sum();
                    used + q <= *n
                });
                if ok && consume {
                    history.push((now, q));
                }
                ok
            }
        }
    }
}

/// Most units the policy may admit in any closed span of `d` ms (for the window bound).
fn bound(p: &Policy, d: u64) -> Option<u64> {
    Some(match p {
        Policy::Gcra {
            max_burst,
            count,
            period_ms,
        } => max_burst + 1 + d * count / period_ms,
        Policy::LeakyBucket {
            capacity,
            leak_tokens,
            leak_period_ms,
        } => capacity + d * leak_tokens / leak_period_ms,
        Policy::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        } => capacity + refill_tokens * d.div_ceil(*refill_period_ms),
        // Windows are checked per aligned window / per policy window below.
        _ => return None,
    })
}

/// Admitted `(time, units)` never exceed the policy's bound.
fn check_bounds(p: &Policy, admitted: &[(u64, u64)]) -> Result<(), TestCaseError> {
    match p {
        Policy::FixedWindow { limit, window_ms } | Policy::SlidingWindow { limit, window_ms } => {
            let mut per: BTreeMap<u64, u64> = BTreeMap::new();
            for (t, q) in admitted {
                *per.entry(t / window_ms).or_default() += q;
            }
            for (w, n) in per {
                prop_assert!(n <= *limit, "window {w}: {n} > {limit}");
            }
        }
        Policy::SlidingLog { policies } => {
            for (j, (tj, _)) in admitted.iter().enumerate() {
                for lp in policies {
                    let n: u64 = admitted[..=j]
                        .iter()
                        .filter(|(t, _)| t + lp.window_ms > *tj)
                        .map(|(_, q)| q)
                        .sum();
                    prop_assert!(n <= lp.limit, "{n} in {} ms before {tj}", lp.window_ms);
                }
            }
        }
        _ => {
            for i in 0..admitted.len() {
                let mut sum = 0;
                for j in i..admitted.len() {
                    sum += admitted[j].1;
                    let d = admitted[j].0 - admitted[i].0;
                    let max = bound(p, d).unwrap_or(u64::MAX);
                    prop_assert!(sum <= max, "{sum} units in {d} ms > {max}");
                }
            }
        }
    }
    Ok(())
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        (0..6u64, 1..5u64, 1..3000u64).prop_map(|(b, c, p)| Policy::gcra(b, c, p)),
        (1..8u64, 1..4u64, 1..2000u64).prop_map(|(c, r, p)| Policy::token_bucket(c, r, p)),
        (1..8u64, 1..4u64, 1..2000u64).prop_map(|(c, l, p)| Policy::leaky_bucket(c, l, p)),
        (1..8u64, 1..2000u64).prop_map(|(n, w)| Policy::fixed_window(n, w)),
        (1..8u64, 1..2000u64).prop_map(|(n, w)| Policy::sliding_window(n, w)),
        proptest::collection::vec((1..3000u64, 1..8u64), 1..4)
            .prop_map(|ps| Policy::sliding_log(&ps)),
    ]
}

/// `(gap ms, quantity 0..=max (0 is clamped to 1 for checks), peek?)`.
fn steps() -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    proptest::collection::vec(
        (
            prop_oneof![6 => 0..200u64, 3 => 0..2000u64, 1 => 2000..10_000u64],
            1..9u64,
            prop::bool::weighted(0.15),
        ),
        1..80,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn limiters_match_their_models_and_expiry_changes_nothing(
        p in policy(), steps in steps(), start in 0..5000u64
    ) {
        let max = p.max_quantity();
        let mut model = Model::new(&p);
        let mut expiring = Run::new(false);
        let mut persisted = Run::new(true);
        let mut now = T0 + start;
        let mut admitted = Vec::new();
        for (gap, q, peek) in steps {
            now += gap;
            let q = 1 + (q - 1) % max;
            let mode = if peek { LimitMode::Peek } else { LimitMode::Check };
            let d = expiring.limit(now, &p, q, mode);
            let kept = persisted.limit(now, &p, q, mode);
            prop_assert_eq!(&d, &kept, "expiry changed a decision at {}", now);
            let want = model.offer(now, q, !peek);
            prop_assert_eq!(d.allowed, want, "model disagrees at {} (q {})", now, q);
            prop_assert_eq!(d.retry_after_ms.is_none(), d.allowed);
            if let Some(r) = d.retry_after_ms {
                prop_assert!(r > 0);
            }
            if d.allowed && !peek {
                admitted.push((now, q));
            }
        }
        check_bounds(&p, &admitted)?;
    }

    /// `retry_after_ms` is exact: with no traffic in between, the request is denied a ms
    /// before it and admitted at it.
    #[test]
    fn retry_after_is_exact(p in policy(), steps in steps(), start in 0..5000u64) {
        let max = p.max_quantity();
        let mut run = Run::new(false);
        let mut now = T0 + start;
        for (gap, q, _) in steps {
            now += gap;
            let q = 1 + (q - 1) % max;
            let d = run.limit(now, &p, q, LimitMode::Check);
            if let Some(r) = d.retry_after_ms {
                let before = run.limit(now + r - 1, &p, q, LimitMode::Peek);
                prop_assert!(!before.allowed, "admitted 1 ms before retry_after {}", r);
                let at = run.limit(now + r, &p, q, LimitMode::Peek);
                prop_assert!(at.allowed, "not admitted after retry_after {}", r);
                // The state machine's clock has moved on to the peeks' time.
                now += r;
            }
        }
    }
}

/// The reset time is when the limiter is fresh again: a peek then equals a fresh key's.
#[test]
fn reset_after_reaches_a_fresh_state() {
    let policies = [
        Policy::gcra(3, 2, 1000),
        Policy::token_bucket(5, 2, 700),
        Policy::leaky_bucket(5, 2, 700),
        Policy::fixed_window(5, 700),
        Policy::sliding_window(5, 700),
        Policy::sliding_log(&[(700, 5), (2000, 7)]),
    ];
    for p in policies {
        let mut run = Run::new(false);
        let mut d = run.limit(T0 + 123, &p, 2, LimitMode::Check);
        d = if d.allowed {
            run.limit(T0 + 150, &p, 1, LimitMode::Check)
        } else {
            d
        };
        let at = T0 + 150 + d.reset_after_ms;
        let seen = run.limit(at, &p, 1, LimitMode::Peek);
        let fresh = Run::new(false).limit(at, &p, 1, LimitMode::Peek);
        assert_eq!(seen, fresh, "{p:?}");
        let key = [b"EXISTS".to_vec(), KEY.to_vec()];
        assert_eq!(run.sm.kv().read(at, &key), Some(Reply::Int(0)), "{p:?}");
    }
}

/// Every policy names a `LIMIT.*` command of the table (the gRPC API checks permissions as it).
#[test]
fn every_policy_names_a_command_of_the_table() {
    for p in [
        Policy::gcra(1, 1, 1_000),
        Policy::token_bucket(1, 1, 1_000),
        Policy::leaky_bucket(1, 1, 1_000),
        Policy::fixed_window(1, 1_000),
        Policy::sliding_window(1, 1_000),
        Policy::sliding_log(&[(1_000, 1)]),
    ] {
        let spec = fenced_core::kv::lookup(p.command().as_bytes())
            .unwrap_or_else(|| panic!("{} is not in the command table", p.command()));
        assert_eq!(spec.name, p.command());
    }
}
