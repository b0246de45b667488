//! One Redis: `SET key value NX PX ttl` with a random value, release by a Lua
//! compare-and-delete, extend by a Lua compare-and-`PEXPIRE` (the pattern from the Redis docs).
//! Lost on failover of that one server; no fencing token — except as
//! [`RedisLock::fenced_setnx`], the same pattern pointed at fenced's RESP front end, whose token
//! is `FENCE.TOKEN key value`.
//!
//! Neither this nor [`Redlock`](crate::Redlock) waits server-side: a busy lock is retried with
//! random jitter ([`RetryPolicy`]) until the caller's `wait` runs out, and every retry is
//! counted in [`DistLock::failed_attempts`].
//!
//! Also the redis-rs plumbing shared with [`fenced_resp`](crate::fenced_resp) and
//! [`redlock`](crate::redlock): [`connect`] runs the client with its own retries off (a
//! connection manager with zero reconnect retries and explicit connect/response timeouts), so
//! one call is one attempt on the wire; the compare-and-delete and compare-and-`PEXPIRE`
//! scripts; the mapping of redis-rs errors to [`LockError`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use crate::{random_id, DistLock, Grant, LockError, RetryPolicy};

/// Options of [`RedisLock`].
#[derive(Clone, Copy, Debug)]
pub struct RedisConfig {
    /// Connect and response timeout of one command.
    pub timeout: Duration,
    /// Pause between attempts on a busy lock.
    pub retry: RetryPolicy,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            timeout: Duration::from_secs(1),
            retry: RetryPolicy::default(),
        }
    }
}

/// A lock client on one Redis server (or on anything speaking Redis: see
/// [`RedisLock::fenced_setnx`]).
pub struct RedisLock {
    name: &'static str,
    /// Ask `FENCE.TOKEN key` after a successful `SET NX` (fenced's RESP front end only).
    fence_token: bool,
    conn: ConnectionManager,
    cfg: RedisConfig,
    unlock: Script,
    extend: Script,
    failed: AtomicU64,
}

impl RedisLock {
    /// `addr`: `host:port` or `redis://` URL. Connects lazily. `name` labels the backend in
    /// reports (`redis`, `redis-aof`, ...).
    pub fn new(name: &'static str, addr: &str, cfg: RedisConfig) -> Result<RedisLock, LockError> {
        Ok(RedisLock {
            name,
            fence_token: false,
            conn: connect(addr, Some(cfg.timeout), cfg.timeout)?,
            cfg,
            unlock: Script::new(UNLOCK_SCRIPT),
            extend: Script::new(EXTEND_SCRIPT),
            failed: AtomicU64::new(0),
        })
    }

    /// The plain Redis pattern against fenced's RESP front end (`addr` = a node's RESP
    /// address), named `fenced-setnx`: the same `SET NX PX` and Lua scripts, and after a
    /// successful `SET` one `FENCE.TOKEN key` — the key's create revision, i.e. a fencing
    /// token for a lock taken with plain `SET NX`. Busy locks are retried like Redis.
    pub fn fenced_setnx(addr: &str, cfg: RedisConfig) -> Result<RedisLock, LockError> {
        let mut l = RedisLock::new("fenced-setnx", addr, cfg)?;
        l.fence_token = true;
        Ok(l)
    }

    /// `FENCE.TOKEN key value`: the token of *our* grant — nil if the lease already ran out
    /// (asking without the value could return the next holder's token).
    async fn fence_token(&self, key: &str, value: &str) -> Result<Option<u64>, LockError> {
        let mut c = self.conn.clone();
        let t: Option<i64> = redis::cmd("FENCE.TOKEN")
            .arg(key)
            .arg(value)
            .query_async(&mut c)
            .await
            .map_err(|e| map_redis(self.name, e))?;
        Ok(t.filter(|t| *t > 0).map(|t| t as u64))
    }

    /// One `SET NX PX` attempt. `true` if the key was set.
    async fn try_set(&self, key: &str, value: &str, ttl_ms: u64) -> Result<bool, LockError> {
        let mut c = self.conn.clone();
        let r: Option<String> = set_nx_px(key, value, ttl_ms)
            .query_async(&mut c)
            .await
            .map_err(|e| map_redis(self.name, e))?;
        Ok(r.is_some())
    }
}

#[async_trait]
impl DistLock for RedisLock {
    fn name(&self) -> &'static str {
        self.name
    }

    fn issues_tokens(&self) -> bool {
        self.fence_token
    }

    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let ms = ttl_ms(ttl)?;
        let value = random_id(20);
        let start = Instant::now();
        loop {
            let sent = Instant::now();
            if self.try_set(key, &value, ms).await? {
                let token = if self.fence_token {
                    match self.fence_token(key, &value).await? {
                        Some(t) => Some(t),
                        // The lease ran out before we learned the token: not ours any more.
                        None => {
                            return Err(LockError::Backend {
                                backend: self.name,
                                message: format!(
                                    "FENCE.TOKEN {key}: the lease ran out right after SET NX"
                                ),
                            })
                        }
                    }
                } else {
                    None
                };
                return Ok(Some(Grant {
                    key: key.to_owned(),
                    handle: value,
                    token,
                    validity: ttl,
                    acquired_at: sent,
                }));
            }
            self.failed.fetch_add(1, Ordering::Relaxed);
            let pause = self.cfg.retry.next_pause();
            if start.elapsed() + pause > wait {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool, LockError> {
        let mut c = self.conn.clone();
        let n: i64 = self
            .unlock
            .key(&grant.key)
            .arg(&grant.handle)
            .invoke_async(&mut c)
            .await
            .map_err(|e| map_redis(self.name, e))?;
        Ok(n == 1)
    }

    async fn extend(&self, grant: &Grant, ttl: Duration) -> Result<bool, LockError> {
        let ms = ttl_ms(ttl)?;
        let mut c = self.conn.clone();
        let n: i64 = self
            .extend
            .key(&grant.key)
            .arg(&grant.handle)
            .arg(ms)
            .invoke_async(&mut c)
            .await
            .map_err(|e| map_redis(self.name, e))?;
        Ok(n == 1)
    }

    fn failed_attempts(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// Release only if the key still holds our value (compare-and-delete).
pub const UNLOCK_SCRIPT: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
else
    return 0
end"#;

/// Extend only if the key still holds our value (compare-and-`PEXPIRE`). `ARGV[2]` = ttl in ms.
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

/// A redis-rs error as a [`LockError`]: transport trouble, and fenced's `-TIMEOUT` (the entry
/// may still commit) and `-TRYAGAIN` replies, are `Unavailable` (outcome unknown); any other
/// server reply is a definite `Backend` answer.
/// `SET key value NX PX ttl_ms`: take `key` if it is free (the lock of one Redis).
pub(crate) fn set_nx_px(key: &str, value: &str, ttl_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(value).arg("NX").arg("PX").arg(ttl_ms);
    cmd
}

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
