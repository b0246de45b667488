//! Rate-limiter decisions for the load generator's `--workload throttle` (issue 14's
//! benchmark), behind [`DistLock`] so that the same measuring loop, CPU accounting and tables
//! serve: `acquire` makes **one decision** — admitted or limited, both count — and `release`
//! does nothing (no call). [`DistLock::failed_attempts`] counts limited decisions.
//!
//! * [`Throttle::cl_throttle`]: redis-cell's `CL.THROTTLE key max_burst count period 1`, as
//!   fenced serves it (decided with the leader's log time, replicated and fsynced);
//! * [`Throttle::token_bucket`]: fenced's `LIMIT.TOKENBUCKET key capacity rate 1000 1`;
//! * [`Throttle::lua_token_bucket`]: Spring Cloud Gateway's token-bucket script
//!   (`tests/resp/token_bucket.lua`, unchanged), `now` from this client's clock, against Redis
//!   or against fenced's RESP port.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redis::aio::ConnectionManager;

use crate::redis::{connect, map_redis};
use crate::{DistLock, Grant, LockError};

/// Spring Cloud Gateway's `request_rate_limiter.lua`, as in the repository's tests.
const TOKEN_BUCKET_LUA: &str = include_str!("../../../tests/resp/token_bucket.lua");

enum Algo {
    /// `CL.THROTTLE key burst count period 1`.
    ClThrottle {
        burst: u64,
        count: u64,
        period_s: u64,
    },
    /// fenced's `LIMIT.TOKENBUCKET key capacity refill_tokens refill_period_ms 1`.
    TokenBucketCmd {
        capacity: u64,
        refill_tokens: u64,
        refill_period_ms: u64,
    },
    /// The Lua token bucket: `rate` tokens/s, `capacity`.
    LuaTokenBucket {
        script: redis::Script,
        rate: u64,
        capacity: u64,
    },
}

/// One client making rate-limit decisions.
pub struct Throttle {
    name: &'static str,
    conn: ConnectionManager,
    algo: Algo,
    timeout: Duration,
    limited: AtomicU64,
}

impl Throttle {
    /// `CL.THROTTLE` against `addr` (fenced's RESP port): `count` per `period_s` seconds with
    /// a burst of `burst`.
    pub fn cl_throttle(
        name: &'static str,
        addr: &str,
        burst: u64,
        count: u64,
        period_s: u64,
    ) -> Result<Throttle, LockError> {
        Throttle::new(
            name,
            addr,
            Algo::ClThrottle {
                burst,
                count,
                period_s,
            },
        )
    }

    /// fenced's `LIMIT.TOKENBUCKET` against `addr`: `capacity`, `rate` tokens back per second.
    pub fn token_bucket(
        name: &'static str,
        addr: &str,
        capacity: u64,
        rate: u64,
    ) -> Result<Throttle, LockError> {
        Throttle::new(
            name,
            addr,
            Algo::TokenBucketCmd {
                capacity,
                refill_tokens: rate,
                refill_period_ms: 1_000,
            },
        )
    }

    /// The Lua token bucket against `addr` (Redis or fenced): `rate` tokens/s, `capacity`.
    pub fn lua_token_bucket(
        name: &'static str,
        addr: &str,
        rate: u64,
        capacity: u64,
    ) -> Result<Throttle, LockError> {
        Throttle::new(
            name,
            addr,
            Algo::LuaTokenBucket {
                script: redis::Script::new(TOKEN_BUCKET_LUA),
                rate,
                capacity,
            },
        )
    }

    fn new(name: &'static str, addr: &str, algo: Algo) -> Result<Throttle, LockError> {
        let timeout = Duration::from_secs(10);
        Ok(Throttle {
            name,
            conn: connect(addr, Some(timeout), timeout)?,
            algo,
            timeout,
            limited: AtomicU64::new(0),
        })
    }

    /// One decision on `key`: `true` if admitted. The key is prefixed with this backend's
    /// name: two backends of one run (say `CL.THROTTLE` and `LIMIT.TOKENBUCKET` against the
    /// same fenced) never share a limiter, which fenced would refuse as the wrong kind.
    pub async fn decide(&self, key: &str) -> Result<bool, LockError> {
        let key = &format!("{}:{key}", self.name);
        let mut conn = self.conn.clone();
        let call = async {
            match &self.algo {
                Algo::ClThrottle {
                    burst,
                    count,
                    period_s,
                } => {
                    let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
                        .arg(key)
                        .arg(burst)
                        .arg(count)
                        .arg(period_s)
                        .arg(1)
                        .query_async(&mut conn)
                        .await?;
                    Ok(reply.first() == Some(&0))
                }
                Algo::TokenBucketCmd {
                    capacity,
                    refill_tokens,
                    refill_period_ms,
                } => {
                    let reply: Vec<i64> = redis::cmd("LIMIT.TOKENBUCKET")
                        .arg(key)
                        .arg(capacity)
                        .arg(refill_tokens)
                        .arg(refill_period_ms)
                        .arg(1)
                        .query_async(&mut conn)
                        .await?;
                    Ok(reply.first() == Some(&1))
                }
                Algo::LuaTokenBucket {
                    script,
                    rate,
                    capacity,
                } => {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs());
                    let reply: Vec<i64> = script
                        .key(format!("{key}.tokens"))
                        .key(format!("{key}.timestamp"))
                        .arg(rate)
                        .arg(capacity)
                        .arg(now)
                        .arg(1)
                        .invoke_async(&mut conn)
                        .await?;
                    Ok(reply.first() == Some(&1))
                }
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(|e: redis::RedisError| map_redis(self.name, e)),
            Err(_) => Err(LockError::Unavailable {
                backend: self.name,
                message: format!("no answer within {:?}", self.timeout),
            }),
        }
    }
}

#[async_trait]
impl DistLock for Throttle {
    fn name(&self) -> &'static str {
        self.name
    }

    fn issues_tokens(&self) -> bool {
        false
    }

    /// One decision; always a "grant" (limited decisions are counted, not failed).
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        _wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let acquired_at = Instant::now();
        if !self.decide(key).await? {
            self.limited.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(Grant {
            key: key.to_owned(),
            handle: String::new(),
            token: None,
            validity: ttl,
            acquired_at,
        }))
    }

    async fn release(&self, _grant: &Grant) -> Result<bool, LockError> {
        Ok(true)
    }

    async fn extend(&self, _grant: &Grant, _ttl: Duration) -> Result<bool, LockError> {
        Ok(true)
    }

    fn failed_attempts(&self) -> u64 {
        self.limited.load(Ordering::Relaxed)
    }
}
