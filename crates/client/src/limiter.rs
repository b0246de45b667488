//! Rate limiters ([`Client::limiter`]): the limiters of RESP's `CL.THROTTLE` / `LIMIT.*`
//! through the `fenced.v1.Limiter` service. Decisions are made in the replicated state
//! machine with the leader's log time — a client's clock does not matter — and a retried
//! request never consumes twice (it carries the same request id).
//!
//! ```no_run
//! # async fn demo(client: fenced_client::Client) -> Result<(), fenced_client::ClientError> {
//! use std::time::Duration;
//! use fenced_client::Policy;
//! let api = client.limiter("api:alice", Policy::token_bucket(100, 10, Duration::from_secs(1)));
//! let d = api.try_acquire(1).await?;
//! if !d.allowed {
//!     println!("slow down: retry in {:?}", d.retry_after);
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use fenced_proto::v1 as pb;
use fenced_proto::v1::limiter_client::LimiterClient;

use crate::{Client, ClientError};

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

/// A limiter's policy. It travels with every request (as with redis-cell); the server keeps
/// only the state, which expires once idle.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy(pb::LimitPolicy);

impl Policy {
    fn of(kind: pb::limit_policy::Kind) -> Policy {
        Policy(pb::LimitPolicy { kind: Some(kind) })
    }

    /// GCRA as redis-cell's `CL.THROTTLE`: `count` per `period`, bursts of `max_burst` on top
    /// of one.
    pub fn gcra(max_burst: u64, count: u64, period: Duration) -> Policy {
        Policy::of(pb::limit_policy::Kind::Gcra(pb::GcraPolicy {
            max_burst,
            count,
            period_ms: ms(period),
        }))
    }

    /// A bucket of `capacity` tokens; `refill_tokens` come back every `refill_every`.
    pub fn token_bucket(capacity: u64, refill_tokens: u64, refill_every: Duration) -> Policy {
        Policy::of(pb::limit_policy::Kind::TokenBucket(pb::TokenBucketPolicy {
            capacity,
            refill_tokens,
            refill_period_ms: ms(refill_every),
        }))
    }

    /// A leaky bucket (a meter) of `capacity`, draining `leak_tokens` every `leak_every`.
    pub fn leaky_bucket(capacity: u64, leak_tokens: u64, leak_every: Duration) -> Policy {
        Policy::of(pb::limit_policy::Kind::LeakyBucket(pb::LeakyBucketPolicy {
            capacity,
            leak_tokens,
            leak_period_ms: ms(leak_every),
        }))
    }

    /// At most `limit` per fixed window of `window` (aligned to log time).
    pub fn fixed_window(limit: u64, window: Duration) -> Policy {
        Policy::of(pb::limit_policy::Kind::FixedWindow(pb::WindowPolicy {
            limit,
            window_ms: ms(window),
        }))
    }

    /// At most about `limit` per sliding `window` (the previous window weighted).
    pub fn sliding_window(limit: u64, window: Duration) -> Policy {
        Policy::of(pb::limit_policy::Kind::SlidingWindow(pb::WindowPolicy {
            limit,
            window_ms: ms(window),
        }))
    }

    /// Exact sliding log with several `(limit, window)` policies checked together.
    pub fn sliding_log(policies: &[(u64, Duration)]) -> Policy {
        Policy::of(pb::limit_policy::Kind::SlidingLog(pb::SlidingLogPolicy {
            policies: policies
                .iter()
                .map(|(limit, window)| pb::WindowPolicy {
                    limit: *limit,
                    window_ms: ms(*window),
                })
                .collect(),
        }))
    }
}

/// A limiter's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The policy's limit (GCRA: `max_burst + 1`; a bucket's capacity; a window's limit).
    pub limit: u64,
    /// Units that could still be admitted now.
    pub remaining: u64,
    /// When denied: how long until the same request would be admitted. `None` when admitted,
    /// or when it can never be (a quantity above the limit).
    pub retry_after: Option<Duration>,
    /// How long until the limiter is back to its fresh state.
    pub reset_after: Duration,
    /// Sliding log: the index of the first violated policy.
    pub violated: Option<usize>,
}

impl From<pb::LimitDecision> for Decision {
    fn from(d: pb::LimitDecision) -> Decision {
        Decision {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            retry_after: u64::try_from(d.retry_after_ms)
                .ok()
                .map(Duration::from_millis),
            reset_after: Duration::from_millis(d.reset_after_ms),
            violated: usize::try_from(d.violated).ok(),
        }
    }
}

/// One limiter: a key and its policy ([`Client::limiter`]).
#[derive(Clone)]
pub struct Limiter {
    client: Client,
    key: String,
    policy: Policy,
}

#[derive(Clone, Copy)]
enum Call {
    Acquire,
    Peek,
    Reset,
}

impl Limiter {
    /// Ask for `n` units (0 counts as 1): admitted units are consumed.
    pub async fn try_acquire(&self, n: u64) -> Result<Decision, ClientError> {
        self.call(Call::Acquire, n).await
    }

    /// The decision `try_acquire(n)` would get now; consumes nothing.
    pub async fn peek(&self, n: u64) -> Result<Decision, ClientError> {
        self.call(Call::Peek, n).await
    }

    /// Forget the limiter's state (it starts afresh).
    pub async fn reset(&self) -> Result<Decision, ClientError> {
        self.call(Call::Reset, 0).await
    }

    async fn call(&self, which: Call, n: u64) -> Result<Decision, ClientError> {
        let req = pb::LimitRequest {
            request: Some(self.client.next_request_id()),
            key: self.key.clone(),
            policy: Some(self.policy.0.clone()),
            quantity: n,
        };
        self.client
            .call(Duration::ZERO, |ch| {
                let mut c = LimiterClient::new(ch);
                let req = req.clone();
                async move {
                    match which {
                        Call::Acquire => c.acquire(req).await,
                        Call::Peek => c.peek(req).await,
                        Call::Reset => c.reset(req).await,
                    }
                }
            })
            .await
            .map(Decision::from)
    }
}

impl Client {
    /// The limiter under keyspace key `key` with `policy` (the same state RESP's
    /// `CL.THROTTLE` / `LIMIT.*` see under that key).
    pub fn limiter(&self, key: &str, policy: Policy) -> Limiter {
        Limiter {
            client: self.clone(),
            key: key.to_owned(),
            policy,
        }
    }
}
