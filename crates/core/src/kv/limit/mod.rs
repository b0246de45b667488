//! Rate limiters evaluated inside the state machine: GCRA (redis-cell's `CL.THROTTLE`), token
//! bucket, leaky bucket, fixed window, sliding window (counter approximation) and sliding log
//! with several policies checked together.
//!
//! Rules every algorithm keeps:
//! * **Log time only.** `now` is the command's log time (ms); nothing reads a clock.
//! * **Exact integers.** Rates are kept as fractions with integer numerators and
//!   denominators (`u128` where products could pass `u64`); no float takes part in a
//!   decision. Where a time or count is reported it is rounded in the caller's safe direction:
//!   `retry_after_ms`/`reset_after_ms` up to the next millisecond, `remaining` down.
//! * **Idle state expires by itself.** A state written by an admitted request gets the key
//!   expiry at which it becomes indistinguishable from a fresh limiter, so one-off keys do not
//!   grow memory, and the expiry never changes a decision (property-tested in
//!   `crates/core/tests/limiter.rs`).
//! * **Nothing consumed unless admitted.** A denied check, a peek and every error leave the
//!   key (value, expiry, revision) as it was.
//!
//! [`Keyspace::limit`] is the one entry point, shared by the typed [`crate::Command::Limit`]
//! and the RESP rows (`kv/cmd/limit.rs`).

mod bucket;
mod gcra;
mod log;
mod window;

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::store::{Keyspace, Value};
use crate::{Millis, Revision};

/// Longest period or window a policy may have: one day.
pub const MAX_PERIOD_MS: u64 = 24 * 60 * 60 * 1000;
/// Largest count, burst, capacity, refill amount or window limit.
pub const MAX_COUNT: u64 = 1_000_000_000;
/// Largest limit of one sliding-log policy: the log keeps at most this many entries.
pub const MAX_LOG_LIMIT: u64 = 10_000;
/// Most policies checked together by one sliding log.
pub const MAX_LOG_POLICIES: usize = 8;

/// One window of a [`Policy::SlidingLog`]: at most `limit` units in any `window_ms`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogPolicy {
    pub window_ms: u64,
    pub limit: u64,
}

/// A rate-limiting policy. The limiter's state is kept under a key; the policy travels with
/// every request (as with redis-cell), so it is not stored.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// GCRA as redis-cell: `count` per `period_ms`, bursts of `max_burst` on top of one
    /// (limit = `max_burst + 1`).
    Gcra {
        max_burst: u64,
        count: u64,
        period_ms: u64,
    },
    /// A bucket of `capacity` tokens, `refill_tokens` put back every `refill_period_ms` in
    /// whole steps (the step clock restarts when the bucket is full).
    TokenBucket {
        capacity: u64,
        refill_tokens: u64,
        refill_period_ms: u64,
    },
    /// A leaky bucket as a meter: each admitted unit adds one to a level of at most
    /// `capacity`, which drains continuously at `leak_tokens` per `leak_period_ms`.
    LeakyBucket {
        capacity: u64,
        leak_tokens: u64,
        leak_period_ms: u64,
    },
    /// At most `limit` units per window; windows are aligned to multiples of `window_ms` of
    /// log time.
    FixedWindow { limit: u64, window_ms: u64 },
    /// Fixed windows with the previous window's count weighted by how much of it still
    /// overlaps the sliding window ending now (the counter approximation).
    SlidingWindow { limit: u64, window_ms: u64 },
    /// A log of admitted units with their times; every policy must hold. The first violated
    /// policy's index is reported.
    SlidingLog { policies: Vec<LogPolicy> },
}

/// What a [`crate::Command::Limit`] does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitMode {
    /// Decide, and consume `quantity` if admitted.
    Check,
    /// The decision `Check` would make, consuming nothing.
    Peek,
    /// Forget the key's state (the answer is a fresh limiter's, for quantity 0).
    Reset,
}

/// The outcome of a limiter request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The policy's limit: GCRA's `max_burst + 1`, a bucket's capacity, a window's limit; for
    /// a sliding log, the limit of the policy `remaining` is counted against.
    pub limit: u64,
    /// Units that could still be admitted now (after this request, if it was admitted).
    pub remaining: u64,
    /// When denied: how long until the same request would be admitted if nothing else
    /// happened. `None` when admitted, or when the request can never be admitted (GCRA with a
    /// quantity above its limit, as redis-cell).
    pub retry_after_ms: Option<u64>,
    /// How long until the limiter is back to its fresh state (0 if it is).
    pub reset_after_ms: u64,
    /// Sliding log: the index of the first policy the request would violate.
    pub violated: Option<u32>,
}

/// A limiter's state: the value of a rate-limit key (`TYPE` says `ratelimit`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Limiter {
    /// Theoretical arrival time, in units of `1/den` ms (`den` = the policy's `count`).
    Gcra { tat: u128, den: u64 },
    /// Tokens left and the time of the last refill step.
    TokenBucket { tokens: u64, last_ms: Millis },
    /// Level in units of `1/den` tokens (`den` = `leak_period_ms`), as of `at_ms`.
    LeakyBucket {
        level: u128,
        den: u64,
        at_ms: Millis,
    },
    /// Units counted in the window starting at `start_ms`.
    FixedWindow {
        window_ms: u64,
        start_ms: Millis,
        count: u64,
    },
    /// Units in the window starting at `start_ms` and in the one before it.
    SlidingWindow {
        window_ms: u64,
        start_ms: Millis,
        count: u64,
        previous: u64,
    },
    /// Admitted `(time, units)`, oldest first, one entry per distinct time.
    SlidingLog { entries: VecDeque<(Millis, u64)> },
}

impl Limiter {
    /// The algorithm's name, as error texts and docs use it.
    pub fn kind(&self) -> &'static str {
        match self {
            Limiter::Gcra { .. } => "gcra",
            Limiter::TokenBucket { .. } => "token-bucket",
            Limiter::LeakyBucket { .. } => "leaky-bucket",
            Limiter::FixedWindow { .. } => "fixed-window",
            Limiter::SlidingWindow { .. } => "sliding-window",
            Limiter::SlidingLog { .. } => "sliding-log",
        }
    }
}

/// Why a limiter request was refused. Nothing was consumed. `Display` is the text after
/// `ERR ` (or the full `WRONGTYPE` text) that RESP answers.
#[derive(thiserror::Error, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// The key holds a value that is not a limiter.
    #[error("{}", super::error::WRONGTYPE)]
    WrongType,
    /// A parameter outside its documented range.
    #[error("{param} must be in {min}..={max}, got {value}")]
    OutOfRange {
        param: String,
        value: i64,
        min: i64,
        max: i64,
    },
    /// A quantity no state of the policy could ever admit.
    #[error("quantity {quantity} is above the limiter's capacity {max}")]
    QuantityTooLarge { quantity: u64, max: u64 },
    /// The key holds another algorithm's state.
    #[error("the key holds a {existing} limiter, not a {requested} one (LIMIT.RESET it first)")]
    WrongLimiter { existing: String, requested: String },
    /// A window limiter's window changed; its counts would mean something else.
    #[error("the key's window is {existing_ms} ms, not {requested_ms} ms (LIMIT.RESET it first)")]
    WindowChanged { existing_ms: u64, requested_ms: u64 },
    /// A sliding log needs 1..=MAX_LOG_POLICIES policies.
    #[error("a sliding log takes 1..={max} policies, got {got}")]
    Policies { got: usize, max: usize },
}

fn range(param: &str, value: u64, min: u64, max: u64) -> Result<(), LimitError> {
    if value < min || value > max {
        return Err(LimitError::OutOfRange {
            param: param.into(),
            value: i64::try_from(value).unwrap_or(i64::MAX),
            min: min as i64,
            max: max as i64,
        });
    }
    Ok(())
}

impl Policy {
    /// GCRA (redis-cell): `count` per `period_ms` with bursts of `max_burst` on top of one.
    pub fn gcra(max_burst: u64, count: u64, period_ms: u64) -> Policy {
        Policy::Gcra {
            max_burst,
            count,
            period_ms,
        }
    }
    /// Token bucket: `capacity` tokens, `refill_tokens` back every `refill_period_ms`.
    pub fn token_bucket(capacity: u64, refill_tokens: u64, refill_period_ms: u64) -> Policy {
        Policy::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        }
    }
    /// Leaky bucket (meter): level up to `capacity`, draining `leak_tokens` per
    /// `leak_period_ms`.
    pub fn leaky_bucket(capacity: u64, leak_tokens: u64, leak_period_ms: u64) -> Policy {
        Policy::LeakyBucket {
            capacity,
            leak_tokens,
            leak_period_ms,
        }
    }
    /// Fixed window: `limit` units per aligned `window_ms`.
    pub fn fixed_window(limit: u64, window_ms: u64) -> Policy {
        Policy::FixedWindow { limit, window_ms }
    }
    /// Sliding window (counter approximation): `limit` units per `window_ms`.
    pub fn sliding_window(limit: u64, window_ms: u64) -> Policy {
        Policy::SlidingWindow { limit, window_ms }
    }
    /// Sliding log: every `(window_ms, limit)` must hold.
    pub fn sliding_log(policies: &[(u64, u64)]) -> Policy {
        Policy::SlidingLog {
            policies: policies
                .iter()
                .map(|&(window_ms, limit)| LogPolicy { window_ms, limit })
                .collect(),
        }
    }

    /// Whether every parameter is within its documented range.
    pub fn validate(&self) -> Result<(), LimitError> {
        match self {
            Policy::Gcra {
                max_burst,
                count,
                period_ms,
            } => {
                range("max_burst", *max_burst, 0, MAX_COUNT)?;
                range("count", *count, 1, MAX_COUNT)?;
                range("period_ms", *period_ms, 1, MAX_PERIOD_MS)
            }
            Policy::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => {
                range("capacity", *capacity, 1, MAX_COUNT)?;
                range("refill_tokens", *refill_tokens, 1, MAX_COUNT)?;
                range("refill_period_ms", *refill_period_ms, 1, MAX_PERIOD_MS)
            }
            Policy::LeakyBucket {
                capacity,
                leak_tokens,
                leak_period_ms,
            } => {
                range("capacity", *capacity, 1, MAX_COUNT)?;
                range("leak_tokens", *leak_tokens, 1, MAX_COUNT)?;
                range("leak_period_ms", *leak_period_ms, 1, MAX_PERIOD_MS)
            }
            Policy::FixedWindow { limit, window_ms }
            | Policy::SlidingWindow { limit, window_ms } => {
                range("limit", *limit, 1, MAX_COUNT)?;
                range("window_ms", *window_ms, 1, MAX_PERIOD_MS)
            }
            Policy::SlidingLog { policies } => {
                if policies.is_empty() || policies.len() > MAX_LOG_POLICIES {
                    return Err(LimitError::Policies {
                        got: policies.len(),
                        max: MAX_LOG_POLICIES,
                    });
                }
                for p in policies {
                    range("window_ms", p.window_ms, 1, MAX_PERIOD_MS)?;
                    range("limit", p.limit, 1, MAX_LOG_LIMIT)?;
                }
                Ok(())
            }
        }
    }

    /// The largest quantity one request may ask for: what a fresh limiter admits at once.
    pub fn max_quantity(&self) -> u64 {
        match self {
            Policy::Gcra { max_burst, .. } => max_burst + 1,
            Policy::TokenBucket { capacity, .. } | Policy::LeakyBucket { capacity, .. } => {
                *capacity
            }
            Policy::FixedWindow { limit, .. } | Policy::SlidingWindow { limit, .. } => *limit,
            Policy::SlidingLog { policies } => policies.iter().map(|p| p.limit).min().unwrap_or(0),
        }
    }

    /// The algorithm's name (as [`Limiter::kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Policy::Gcra { .. } => "gcra",
            Policy::TokenBucket { .. } => "token-bucket",
            Policy::LeakyBucket { .. } => "leaky-bucket",
            Policy::FixedWindow { .. } => "fixed-window",
            Policy::SlidingWindow { .. } => "sliding-window",
            Policy::SlidingLog { .. } => "sliding-log",
        }
    }

    /// The `LIMIT.*` command of this algorithm: what a typed request (gRPC's `Limiter`)
    /// stands for when a user's permissions are checked.
    pub fn command(&self) -> &'static str {
        match self {
            Policy::Gcra { .. } => "LIMIT.GCRA",
            Policy::TokenBucket { .. } => "LIMIT.TOKENBUCKET",
            Policy::LeakyBucket { .. } => "LIMIT.LEAKYBUCKET",
            Policy::FixedWindow { .. } => "LIMIT.FIXEDWINDOW",
            Policy::SlidingWindow { .. } => "LIMIT.SLIDINGWINDOW",
            Policy::SlidingLog { .. } => "LIMIT.LOG",
        }
    }
}

/// What an algorithm decided: the answer, and the state to store with its expiry (only when
/// units were consumed).
pub(crate) struct Outcome {
    pub decision: Decision,
    pub store: Option<(Limiter, Millis)>,
}

/// `ceil(a / b)` for `b > 0`.
pub(crate) fn div_ceil(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

/// A `u128` quantity of milliseconds as `u64` (saturating; bounded parameters keep it far
/// below).
pub(crate) fn ms(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Decide `quantity` under `policy` at `now` given the stored `state` (`None`: fresh).
/// `consume`: whether an admitted request's state should be returned for storing. The policy
/// must be valid.
pub(crate) fn decide(
    policy: &Policy,
    state: Option<&Limiter>,
    now: Millis,
    quantity: u64,
    consume: bool,
) -> Result<Outcome, LimitError> {
    if let Some(s) = state {
        if s.kind() != policy.kind() {
            return Err(LimitError::WrongLimiter {
                existing: s.kind().into(),
                requested: policy.kind().into(),
            });
        }
    }
    let out = match policy {
        Policy::Gcra {
            max_burst,
            count,
            period_ms,
        } => gcra::decide(*max_burst, *count, *period_ms, state, now, quantity),
        Policy::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        } => bucket::token(
            *capacity,
            *refill_tokens,
            *refill_period_ms,
            state,
            now,
            quantity,
        ),
        Policy::LeakyBucket {
            capacity,
            leak_tokens,
            leak_period_ms,
        } => bucket::leaky(
            *capacity,
            *leak_tokens,
            *leak_period_ms,
            state,
            now,
            quantity,
        ),
        Policy::FixedWindow { limit, window_ms } => {
            window::fixed(*limit, *window_ms, state, now, quantity)?
        }
        Policy::SlidingWindow { limit, window_ms } => {
            window::sliding(*limit, *window_ms, state, now, quantity)?
        }
        Policy::SlidingLog { policies } => log::decide(policies, state, now, quantity),
    };
    Ok(Outcome {
        store: if consume && out.decision.allowed && quantity > 0 {
            out.store
        } else {
            None
        },
        ..out
    })
}

impl Keyspace {
    /// A limiter request on `key` at log time `now` (the command's revision `revision`):
    /// the one implementation behind `CL.THROTTLE`, the `LIMIT.*` commands and
    /// [`crate::Command::Limit`]. An admitted [`LimitMode::Check`] stores the new state with
    /// its expiry; nothing else writes. A quantity above [`Policy::max_quantity`] is an error,
    /// except for GCRA, which answers it like redis-cell (denied, `retry_after_ms` `None`).
    pub fn limit(
        &mut self,
        revision: Revision,
        now: Millis,
        key: &[u8],
        policy: &Policy,
        quantity: u64,
        mode: LimitMode,
    ) -> Result<Decision, LimitError> {
        let state = self.limiter(key, now, policy, quantity)?;
        match mode {
            LimitMode::Peek => Ok(decide(policy, state, now, quantity, false)?.decision),
            LimitMode::Check => {
                let out = decide(policy, state, now, quantity, true)?;
                if let Some((state, expire_at)) = out.store {
                    self.put(revision, key, Value::Limiter(state), Some(expire_at), false);
                }
                Ok(out.decision)
            }
            LimitMode::Reset => {
                if state.is_some() {
                    self.remove(key);
                }
                Ok(decide(policy, None, now, 0, false)?.decision)
            }
        }
    }

    /// [`LimitMode::Peek`] on a shared keyspace (a read at the leader's log time).
    pub fn limit_peek(
        &self,
        now: Millis,
        key: &[u8],
        policy: &Policy,
        quantity: u64,
    ) -> Result<Decision, LimitError> {
        let state = self.limiter(key, now, policy, quantity)?;
        Ok(decide(policy, state, now, quantity, false)?.decision)
    }

    /// Remove `key` if it holds a limiter: whether it did. `WRONGTYPE` for other values.
    pub fn limit_reset(&mut self, key: &[u8], now: Millis) -> Result<bool, LimitError> {
        match self.get(key, now).map(|e| &e.value) {
            None => Ok(false),
            Some(Value::Limiter(_)) => Ok(self.remove(key).is_some()),
            Some(_) => Err(LimitError::WrongType),
        }
    }

    /// The checks every request makes before deciding: a valid policy, a quantity it can
    /// admit, and a key that is absent or holds a limiter.
    fn limiter(
        &self,
        key: &[u8],
        now: Millis,
        policy: &Policy,
        quantity: u64,
    ) -> Result<Option<&Limiter>, LimitError> {
        policy.validate()?;
        let max = policy.max_quantity();
        if quantity > max && !matches!(policy, Policy::Gcra { .. }) {
            return Err(LimitError::QuantityTooLarge { quantity, max });
        }
        match self.get(key, now).map(|e| &e.value) {
            None => Ok(None),
            Some(Value::Limiter(l)) => Ok(Some(l)),
            Some(_) => Err(LimitError::WrongType),
        }
    }
}
