//! Redis-protocol lock backends kept for comparison with fenced — the *unsafe baselines*:
//!
//! * [`RedisLock`]: one Redis, `SET key value NX PX ttl` with a random value, release by a Lua
//!   compare-and-delete, extend by a Lua compare-and-`PEXPIRE` (the pattern from the Redis
//!   docs). Lost on failover of that one server; no fencing token.
//! * [`Redlock`]: the published Redlock algorithm over N independent masters (default 5) —
//!   see [`redlock`] for the arithmetic. No fencing token either.
//!
//! Both implement [`fenced_dlock::DistLock`]. Neither waits server-side: a busy lock is retried
//! with random jitter ([`fenced_dlock::RetryPolicy`]) until the caller's `wait` runs out, and
//! every retry is counted in [`DistLock::failed_attempts`](fenced_dlock::DistLock).
//!
//! The redis-rs client runs with its own retries off: a connection manager with zero reconnect
//! retries and explicit connect/response timeouts, so one call is one attempt on the wire.
//!
//! fenced's own RESP front end is reached the same way: [`FencedResp`] (`LOCK.ACQUIRE` /
//! `LOCK.RELEASE` / `LOCK.RENEW`, token = the integer reply) and [`RedisLock::fenced_setnx`]
//! (the plain `SET NX PX` + Lua pattern above, pointed at fenced, token = `FENCE.TOKEN key`).

use std::time::Duration;

use fenced_dlock::LockError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

pub mod fenced_resp;
pub mod redlock;
pub mod single;

pub use fenced_resp::FencedResp;
pub use redlock::{Redlock, RedlockConfig, Verdict};
pub use single::{RedisConfig, RedisLock};

/// Release only if the key still holds our value (compare-and-delete).
pub const UNLOCK_SCRIPT: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
else
    return 0
end"#;

/// Extend only if the key still holds our value (compare-and-`PEXPIRE`). ARGV[2] = ttl in ms.
pub const EXTEND_SCRIPT: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("pexpire", KEYS[1], ARGV[2])
else
    return 0
end"#;

/// A lazily connecting Redis connection for `addr` (`host:port` or a `redis://` URL) with
/// redis-rs's own retries off: reconnects once per failed call, never resends a command.
/// `response_timeout` `None`: replies may take arbitrarily long (blocking commands).
pub fn connect(
    addr: &str,
    response_timeout: Option<Duration>,
    connect_timeout: Duration,
) -> Result<ConnectionManager, LockError> {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("redis://{addr}/")
    };
    let client =
        redis::Client::open(url.as_str()).map_err(|e| LockError::Invalid(format!("{url}: {e}")))?;
    let cfg = ConnectionManagerConfig::new()
        .set_number_of_retries(0)
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(response_timeout);
    ConnectionManager::new_lazy_with_config(client, cfg)
        .map_err(|e| LockError::Invalid(format!("{url}: {e}")))
}

/// Map a redis-rs error: transport problems are `Unavailable` (outcome unknown).
/// A redis-rs error as a [`LockError`]: transport trouble, and fenced's `-TIMEOUT` (the entry
/// may still commit) and `-TRYAGAIN` replies, are `Unavailable` (outcome unknown); any other
/// server reply is a definite `Backend` answer.
pub(crate) fn map_redis(backend: &'static str, e: redis::RedisError) -> LockError {
    if e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(e.code(), Some("TIMEOUT" | "TRYAGAIN"))
    {
        LockError::Unavailable {
            backend,
            message: e.to_string(),
        }
    } else {
        LockError::Backend {
            backend,
            message: e.to_string(),
        }
    }
}

/// TTL in whole milliseconds, at least 1.
pub(crate) fn ttl_ms(ttl: Duration) -> Result<u64, LockError> {
    let ms = ttl.as_millis();
    if ms == 0 || ms > i64::MAX as u128 {
        return Err(LockError::Invalid(format!("ttl {ttl:?} out of range")));
    }
    Ok(ms as u64)
}
