//! Redlock, as published in the Redis docs ("Distributed Locks with Redis"):
//!
//! 1. Take the current time.
//! 2. Try `SET key value NX PX ttl` on all N independent masters (concurrently — the docs'
//!    "multiplexing" advice), each with a timeout much smaller than the TTL, so a dead instance
//!    costs little.
//! 3. elapsed = now − start. The lock is acquired only if a **majority** (N/2 + 1) said yes and
//!    the **validity** = TTL − elapsed − drift is positive, drift = TTL·0.01 + 2 ms.
//! 4. Otherwise release on **all** instances (also those that seemed to fail: the reply may
//!    have been lost) and retry after a random delay, while the caller's wait allows.
//! 5. Unlock releases on all instances; extend runs compare-and-`PEXPIRE` on all and succeeds
//!    on a majority within the (new) validity.
//!
//! The decision of steps 3 is the pure function [`evaluate`], tested on its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use redis::aio::ConnectionManager;
use redis::Script;

use crate::redis::{connect, set_nx_px, ttl_ms, EXTEND_SCRIPT, UNLOCK_SCRIPT};
use crate::{random_id, DistLock, Grant, LockError, RetryPolicy};

/// Clock drift factor of the published algorithm.
pub const CLOCK_DRIFT_FACTOR: f64 = 0.01;
/// Constant part of the drift allowance.
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// Instances needed: N/2 + 1.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// drift = TTL·0.01 + 2 ms (reference clients truncate TTL·0.01 to whole milliseconds).
pub fn drift(ttl: Duration) -> Duration {
    let ms = (ttl.as_millis() as f64 * CLOCK_DRIFT_FACTOR) as u64;
    Duration::from_millis(ms) + DRIFT_FLOOR
}

/// validity = TTL − elapsed − drift, `None` when that is not positive.
pub fn validity(ttl: Duration, elapsed: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)
        .and_then(|v| v.checked_sub(drift(ttl)))
        .filter(|v| !v.is_zero())
}

/// Outcome of one round over the instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A majority, with this much validity left.
    Acquired { validity: Duration },
    /// Fewer than a majority agreed.
    NoQuorum { successes: usize, quorum: usize },
    /// A majority agreed, but too late: TTL − elapsed − drift ≤ 0.
    ValidityExhausted { successes: usize, elapsed: Duration },
}

impl Verdict {
    pub fn is_acquired(&self) -> bool {
        matches!(self, Verdict::Acquired { .. })
    }
}

/// Step 3 of the algorithm: `successes` of `n` instances agreed within `elapsed`.
pub fn evaluate(n: usize, successes: usize, ttl: Duration, elapsed: Duration) -> Verdict {
    let q = quorum(n);
    if successes < q {
        return Verdict::NoQuorum {
            successes,
            quorum: q,
        };
    }
    match validity(ttl, elapsed) {
        Some(v) => Verdict::Acquired { validity: v },
        None => Verdict::ValidityExhausted { successes, elapsed },
    }
}

/// Options of [`Redlock`].
#[derive(Clone, Copy, Debug)]
pub struct RedlockConfig {
    /// Per-instance timeout (connect and response). Keep it much smaller than the TTLs you
    /// use — the docs suggest 5–50 ms for a 10 s TTL. It is used as given, never clamped.
    pub instance_timeout: Duration,
    /// Pause between rounds after a failed round.
    pub retry: RetryPolicy,
}

impl Default for RedlockConfig {
    fn default() -> Self {
        RedlockConfig {
            instance_timeout: Duration::from_millis(50),
            retry: RetryPolicy::default(),
        }
    }
}

/// The result of one round, for observers (tests, harnesses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    pub verdict: Verdict,
    /// Instances that answered at all (yes or no).
    pub answered: usize,
}

/// A Redlock client over N masters.
pub struct Redlock {
    instances: Vec<ConnectionManager>,
    cfg: RedlockConfig,
    unlock: Script,
    extend: Script,
    failed: AtomicU64,
}

/// Per-instance answer: `Some(true)` yes, `Some(false)` no, `None` error or timeout.
type Answer = Option<bool>;

impl Redlock {
    /// `addrs`: the N masters (`host:port` or `redis://` URLs). Connects lazily, so instances
    /// that are down now only count as failures.
    pub fn new<I, S>(addrs: I, cfg: RedlockConfig) -> Result<Redlock, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let instances = addrs
            .into_iter()
            .map(|a| connect(a.as_ref(), Some(cfg.instance_timeout), cfg.instance_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        if instances.is_empty() {
            return Err(LockError::Invalid(
                "redlock needs at least one instance".into(),
            ));
        }
        Ok(Redlock {
            instances,
            cfg,
            unlock: Script::new(UNLOCK_SCRIPT),
            extend: Script::new(EXTEND_SCRIPT),
            failed: AtomicU64::new(0),
        })
    }

    /// Number of masters.
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// Always false (construction needs at least one instance).
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    async fn on_all<F, Fut>(&self, f: F) -> Vec<Answer>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = Result<bool, redis::RedisError>>,
    {
        let t = self.cfg.instance_timeout;
        join_all(self.instances.iter().map(|c| {
            let fut = f(c.clone());
            async move {
                match tokio::time::timeout(t, fut).await {
                    Ok(Ok(b)) => Some(b),
                    Ok(Err(e)) => {
                        tracing::debug!("redlock instance: {e}");
                        None
                    }
                    Err(_) => None,
                }
            }
        }))
        .await
    }

    async fn set_all(&self, key: &str, value: &str, ttl_ms: u64) -> Vec<Answer> {
        self.on_all(|mut c| async move {
            let r: Option<String> = set_nx_px(key, value, ttl_ms).query_async(&mut c).await?;
            Ok(r.is_some())
        })
        .await
    }

    /// Compare-and-delete on every instance.
    async fn unlock_all(&self, key: &str, value: &str) -> Vec<Answer> {
        self.on_all(|mut c| async move {
            let n: i64 = self.unlock.key(key).arg(value).invoke_async(&mut c).await?;
            Ok(n == 1)
        })
        .await
    }

    /// One acquire round: steps 1–4 without the retry. On any verdict but `Acquired` the
    /// key has been released on all instances when this returns.
    pub async fn try_round(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Round, LockError> {
        let ms = ttl_ms(ttl)?;
        let start = Instant::now();
        let answers = self.set_all(key, value, ms).await;
        let elapsed = start.elapsed();
        let successes = answers.iter().filter(|a| **a == Some(true)).count();
        let answered = answers.iter().filter(|a| a.is_some()).count();
        let verdict = evaluate(self.instances.len(), successes, ttl, elapsed);
        if !verdict.is_acquired() {
            self.unlock_all(key, value).await;
        }
        Ok(Round { verdict, answered })
    }

    /// Extend on all instances; returns the new grant if a majority extended within the new
    /// validity, `None` otherwise.
    pub async fn extend_grant(
        &self,
        grant: &Grant,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let ms = ttl_ms(ttl)?;
        let start = Instant::now();
        let (key, value) = (grant.key.as_str(), grant.handle.as_str());
        let answers = self
            .on_all(|mut c| async move {
                let n: i64 = self
                    .extend
                    .key(key)
                    .arg(value)
                    .arg(ms)
                    .invoke_async(&mut c)
                    .await?;
                Ok(n == 1)
            })
            .await;
        let successes = answers.iter().filter(|a| **a == Some(true)).count();
        match evaluate(self.instances.len(), successes, ttl, start.elapsed()) {
            Verdict::Acquired { validity } => Ok(Some(Grant {
                validity,
                acquired_at: start,
                ..grant.clone()
            })),
            _ => Ok(None),
        }
    }
}

#[async_trait]
impl DistLock for Redlock {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn issues_tokens(&self) -> bool {
        false
    }

    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let value = random_id(20);
        let start = Instant::now();
        loop {
            let round_start = Instant::now();
            let round = self.try_round(key, &value, ttl).await?;
            if let Verdict::Acquired { validity } = round.verdict {
                return Ok(Some(Grant {
                    key: key.to_owned(),
                    handle: value,
                    token: None,
                    validity,
                    acquired_at: round_start,
                }));
            }
            self.failed.fetch_add(1, Ordering::Relaxed);
            let pause = self.cfg.retry.next_pause();
            if start.elapsed() + pause > wait {
                if round.answered < quorum(self.instances.len()) {
                    return Err(LockError::Unavailable {
                        backend: "redlock",
                        message: format!(
                            "only {} of {} instances answered",
                            round.answered,
                            self.instances.len()
                        ),
                    });
                }
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Releases on all instances; `true` if a majority still held it with our value.
    async fn release(&self, grant: &Grant) -> Result<bool, LockError> {
        let answers = self.unlock_all(&grant.key, &grant.handle).await;
        let deleted = answers.iter().filter(|a| **a == Some(true)).count();
        Ok(deleted >= quorum(self.instances.len()))
    }

    async fn extend(&self, grant: &Grant, ttl: Duration) -> Result<bool, LockError> {
        Ok(self.extend_grant(grant, ttl).await?.is_some())
    }

    fn failed_attempts(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
    }

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(MS(10_000)), MS(102));
        assert_eq!(drift(MS(1_000)), MS(12));
        assert_eq!(drift(MS(100)), MS(3));
        // 1% of 150 ms is 1.5 ms, truncated like the reference clients.
        assert_eq!(drift(MS(150)), MS(3));
        assert_eq!(drift(MS(1)), MS(2));
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        assert_eq!(validity(MS(10_000), MS(0)), Some(MS(9_898)));
        assert_eq!(validity(MS(10_000), MS(98)), Some(MS(9_800)));
        assert_eq!(validity(MS(10_000), MS(9_897)), Some(MS(1)));
        // Exactly zero left is not a lock.
        assert_eq!(validity(MS(10_000), MS(9_898)), None);
        assert_eq!(validity(MS(10_000), MS(20_000)), None);
        // A TTL below the drift floor can never be valid.
        assert_eq!(validity(MS(2), MS(0)), None);
    }

    #[test]
    fn majority_within_validity_acquires() {
        assert_eq!(
            evaluate(5, 3, MS(10_000), MS(5)),
            Verdict::Acquired {
                validity: MS(9_893)
            }
        );
        assert!(evaluate(5, 5, MS(1_000), MS(100)).is_acquired());
        assert!(evaluate(1, 1, MS(1_000), MS(1)).is_acquired());
    }

    #[test]
    fn minority_never_acquires() {
        assert_eq!(
            evaluate(5, 2, MS(10_000), MS(1)),
            Verdict::NoQuorum {
                successes: 2,
                quorum: 3
            }
        );
        assert_eq!(
            evaluate(4, 2, MS(10_000), MS(1)),
            Verdict::NoQuorum {
                successes: 2,
                quorum: 3
            }
        );
        assert!(!evaluate(5, 0, MS(10_000), MS(0)).is_acquired());
    }

    #[test]
    fn majority_but_validity_exhausted_fails() {
        assert_eq!(
            evaluate(5, 5, MS(1_000), MS(990)),
            Verdict::ValidityExhausted {
                successes: 5,
                elapsed: MS(990)
            }
        );
        // 1000 − 988 − 12 = 0: exhausted exactly at the boundary.
        assert!(!evaluate(5, 3, MS(1_000), MS(988)).is_acquired());
        assert!(evaluate(5, 3, MS(1_000), MS(987)).is_acquired());
        // Quorum is judged first: a late minority is reported as no quorum.
        assert!(matches!(
            evaluate(5, 2, MS(1_000), MS(5_000)),
            Verdict::NoQuorum { .. }
        ));
    }
}
