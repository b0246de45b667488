//! One lock interface ([`DistLock`]) and every backend the project compares behind it:
//!
//! * [`fenced_grpc`]: fenced over gRPC ([`FencedGrpc`], through `fenced-client`);
//! * [`fenced_resp`]: fenced over RESP, with an unchanged Redis client ([`FencedResp`]:
//!   `LOCK.ACQUIRE/RELEASE/RENEW`, token = the integer reply);
//! * [`redis`]: one Redis ([`RedisLock`]: `SET NX PX` + Lua release), used for Redis with and
//!   without AOF (only the server's configuration differs), and pointed at fenced's RESP front
//!   end as [`RedisLock::fenced_setnx`] (token = `FENCE.TOKEN key value`); also the redis-rs
//!   connection and scripts shared with [`fenced_resp`] and [`redlock`];
//! * [`redlock`]: Redlock over N independent Redis masters ([`Redlock`]);
//! * [`redisson`]: read-write locks and permit semaphores on one Redis with Lua scripts
//!   modelled on Redisson's `RedissonReadLock`/`RedissonWriteLock` and
//!   `RedissonPermitExpirableSemaphore` ([`Redisson`]);
//! * [`etcd`]: etcd's session lease and mutex protocol ([`EtcdLock`]);
//! * [`etcd_lock`]: etcd's server-side lock service `v3lockpb.Lock` on the same session lease
//!   ([`EtcdLockService`]), against etcd (`etcd-lock`) or fenced's gRPC port
//!   (`fenced-etcdlock`);
//! * [`throttle`]: rate-limiter decisions (`CL.THROTTLE`, the Lua token bucket) for the load
//!   generator's throttle workload ([`Throttle`]).
//!
//! Read-write locks and semaphores ([`LockMode`]) go through [`DistLock::acquire_mode`]
//! (fenced over RESP and gRPC, [`Redisson`]); [`WithMode`] makes a backend's plain
//! `acquire` take one mode, for load generators that only call `acquire`.
//!
//! The trait is object-safe (`Box<dyn DistLock>`), so a load generator or a fault-injection
//! harness can hold any backend behind one type. A backend is one *client*: it owns its
//! connections, and a benchmark makes one per simulated client.
//!
//! [`Grant::token`] is `Some` only where the backend really issues fencing tokens (fenced,
//! etcd). Redis and Redlock grants have no token: nothing they return lets protected storage
//! reject a paused former holder.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use rand::Rng;

pub mod etcd;
pub mod etcd_lock;
pub mod fenced_grpc;
pub mod fenced_resp;
pub mod redis;
pub mod redisson;
pub mod redlock;
pub mod throttle;

pub use crate::redis::{RedisConfig, RedisLock};
pub use etcd::EtcdLock;
pub use etcd_lock::{EtcdLockService, TokenFrom};
pub use fenced_grpc::FencedGrpc;
pub use fenced_resp::FencedResp;
pub use redisson::Redisson;
pub use redlock::{Redlock, RedlockConfig, Verdict};
pub use throttle::Throttle;

/// Errors of a lock backend. `Ok(None)`/`Ok(false)` mean "definitely not"; an error means the
/// outcome is unknown or the backend is unusable.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The backend could not be reached or did not answer in time: outcome unknown.
    #[error("{backend}: unavailable: {message}")]
    Unavailable {
        backend: &'static str,
        message: String,
    },
    /// The backend refused the request or answered something unexpected.
    #[error("{backend}: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
    /// Bad arguments or configuration (caught before anything was sent).
    #[error("invalid: {0}")]
    Invalid(String),
}

/// A granted lock. Hand it back to [`DistLock::release`] / [`DistLock::extend`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lock's name (key) as given to `acquire`.
    pub key: String,
    /// What identifies this holder to the backend: the random value stored under the key
    /// (Redis, Redlock), the owner string (fenced), the owner key (etcd).
    pub handle: String,
    /// Fencing token: `Some` only if the backend issues one.
    pub token: Option<u64>,
    /// How long the holder may assume it holds the lock, counted from `acquired_at`
    /// (Redlock: the validity time; others: the TTL asked for, measured from before sending).
    pub validity: Duration,
    /// Local instant from which `validity` runs (taken *before* the acquire was sent).
    pub acquired_at: Instant,
}

impl Grant {
    /// The fencing token, if the backend issues them.
    pub fn token(&self) -> Option<u64> {
        self.token
    }

    /// The local deadline after which the holder must assume the lock is lost.
    pub fn valid_until(&self) -> Instant {
        self.acquired_at + self.validity
    }
}

/// What kind of grant an acquire asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// The exclusive lock ([`DistLock::acquire`]).
    Exclusive,
    /// The shared side of a read-write lock.
    Read,
    /// The exclusive side of a read-write lock.
    Write,
    /// One permit of a counting semaphore of `permits` permits, with its own lease.
    Permit { permits: u32 },
}

impl LockMode {
    /// `exclusive`, `read`, `write`, `permit` (histories and reports).
    pub fn name(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Read => "read",
            LockMode::Write => "write",
            LockMode::Permit { .. } => "permit",
        }
    }
}

impl std::fmt::Display for LockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockMode::Permit { permits } => write!(f, "permit of {permits}"),
            m => f.write_str(m.name()),
        }
    }
}

/// A distributed lock client.
#[async_trait]
pub trait DistLock: Send + Sync {
    /// Short backend name (`fenced`, `redis`, `redlock`, `etcd`, ...).
    fn name(&self) -> &'static str;

    /// Whether grants carry fencing tokens.
    fn issues_tokens(&self) -> bool;

    /// Take `key` for `ttl`. `wait` zero: one attempt. Otherwise keep trying up to `wait` —
    /// server-side where the backend queues waiters (fenced, etcd), by retrying with random
    /// jitter where it cannot (Redis, Redlock). `Ok(None)`: not granted within `wait`.
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError>;

    /// [`DistLock::acquire`] for a grant of `mode`. Backends without read-write locks or
    /// semaphores answer [`LockError::Invalid`] for any mode but `Exclusive`. Release and
    /// extend take the grant as for an exclusive one.
    async fn acquire_mode(
        &self,
        key: &str,
        mode: LockMode,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        match mode {
            LockMode::Exclusive => self.acquire(key, ttl, wait).await,
            m => Err(LockError::Invalid(format!(
                "{} offers no {} locks",
                self.name(),
                m.name()
            ))),
        }
    }

    /// Give the lock up. `Ok(false)`: it was no longer held by this grant.
    async fn release(&self, grant: &Grant) -> Result<bool, LockError>;

    /// Extend the grant's lease to `ttl` from now. `Ok(false)`: no longer held (or, for
    /// Redlock, not extended on a majority within the validity time).
    async fn extend(&self, grant: &Grant, ttl: Duration) -> Result<bool, LockError>;

    /// Attempts that found the lock taken and had to be retried (client-side polling), plus
    /// attempts that gave up; cumulative over this client's life. Backends that queue
    /// waiters server-side count only acquires that returned `None`.
    fn failed_attempts(&self) -> u64;
}

/// A backend whose `acquire` takes grants of one [`LockMode`] (a load generator that calls
/// only `acquire` then measures read locks or permits).
pub struct WithMode {
    pub inner: Box<dyn DistLock>,
    pub mode: LockMode,
}

#[async_trait]
impl DistLock for WithMode {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn issues_tokens(&self) -> bool {
        self.inner.issues_tokens()
    }

    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.inner.acquire_mode(key, self.mode, ttl, wait).await
    }

    async fn acquire_mode(
        &self,
        key: &str,
        mode: LockMode,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.inner.acquire_mode(key, mode, ttl, wait).await
    }

    async fn release(&self, grant: &Grant) -> Result<bool, LockError> {
        self.inner.release(grant).await
    }

    async fn extend(&self, grant: &Grant, ttl: Duration) -> Result<bool, LockError> {
        self.inner.extend(grant, ttl).await
    }

    fn failed_attempts(&self) -> u64 {
        self.inner.failed_attempts()
    }
}

/// How backends without server-side waiting retry a busy lock: sleep `delay` plus a uniformly
/// random extra in `[0, jitter]`, so clients desynchronise (Redlock §"Retry on failure").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub delay: Duration,
    pub jitter: Duration,
}

impl Default for RetryPolicy {
    /// 0–1 ms: tight enough that a contended benchmark measures the store, not idle sleeps.
    /// Reference Redlock clients use 200 ms + 100–200 ms jitter; set that for realism.
    fn default() -> Self {
        RetryPolicy {
            delay: Duration::ZERO,
            jitter: Duration::from_millis(1),
        }
    }
}

impl RetryPolicy {
    /// One randomised pause.
    pub fn next_pause(&self) -> Duration {
        let j = self.jitter.as_micros() as u64;
        let extra = if j == 0 {
            0
        } else {
            rand::thread_rng().gen_range(0..=j)
        };
        self.delay + Duration::from_micros(extra)
    }
}

/// A random hex string of `bytes` random bytes: lock values and owner ids.
pub fn random_id(bytes: usize) -> String {
    let mut rng = rand::thread_rng();
    (0..bytes)
        .map(|_| format!("{:02x}", rng.gen::<u8>()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_within_bounds() {
        let p = RetryPolicy {
            delay: Duration::from_millis(5),
            jitter: Duration::from_millis(3),
        };
        for _ in 0..1000 {
            let d = p.next_pause();
            assert!(d >= Duration::from_millis(5) && d <= Duration::from_millis(8));
        }
        let z = RetryPolicy {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
        };
        assert_eq!(z.next_pause(), Duration::ZERO);
    }

    #[test]
    fn ids_are_hex_and_distinct() {
        let a = random_id(20);
        let b = random_id(20);
        assert_eq!(a.len(), 40);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
