//! fenced through its RESP front end (design.md §4.2), with an unchanged Redis client:
//!
//! * [`FencedResp`]: the native commands `LOCK.ACQUIRE name owner ttl_ms [WAIT ms]` (waiting
//!   server-side, FIFO; the reply is the fencing token), `LOCK.RELEASE name owner token`,
//!   `LOCK.RENEW name owner token ttl_ms`;
//! * the plain Redis pattern against fenced is [`RedisLock::fenced_setnx`](crate::RedisLock):
//!   `SET NX PX` + Lua release/extend, plus `FENCE.TOKEN key` for the token (the key's create
//!   revision).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fenced_dlock::{random_id, DistLock, Grant, LockError};
use redis::aio::ConnectionManager;

use crate::{connect, map_redis, ttl_ms};

const NAME: &str = "fenced-resp";

/// A fenced client speaking RESP `LOCK.*` commands, with one owner identity.
pub struct FencedResp {
    conn: ConnectionManager,
    owner: String,
    timeout: Duration,
    failed: AtomicU64,
}

impl FencedResp {
    /// `addr`: a node's RESP `host:port` (any node; writes are forwarded to the leader).
    /// `timeout` bounds one call beyond its server-side wait.
    pub fn new(addr: &str, timeout: Duration) -> Result<FencedResp, LockError> {
        Ok(FencedResp {
            // No response timeout on the connection: LOCK.ACQUIRE ... WAIT blocks by design;
            // each call is bounded by `wait + timeout` below instead.
            conn: connect(addr, None, timeout)?,
            owner: format!("resp-{}", random_id(8)),
            timeout,
            failed: AtomicU64::new(0),
        })
    }

    async fn bounded<T>(
        &self,
        limit: Duration,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r.map_err(|e| map_redis(NAME, e)),
            Err(_) => Err(LockError::Unavailable {
                backend: NAME,
                message: format!("no answer within {limit:?}"),
            }),
        }
    }

    fn token_of(grant: &Grant) -> Result<u64, LockError> {
        grant
            .token
            .ok_or_else(|| LockError::Invalid("fenced grant without a token".into()))
    }
}

#[async_trait]
impl DistLock for FencedResp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn issues_tokens(&self) -> bool {
        true
    }

    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let ms = ttl_ms(ttl)?;
        let sent = Instant::now();
        let mut c = self.conn.clone();
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(key).arg(&self.owner).arg(ms);
        if !wait.is_zero() {
            cmd.arg("WAIT").arg(wait.as_millis() as u64);
        }
        let token: Option<i64> = self
            .bounded(wait + self.timeout, cmd.query_async(&mut c))
            .await?;
        match token {
            Some(t) if t > 0 => Ok(Some(Grant {
                key: key.to_owned(),
                handle: self.owner.clone(),
                token: Some(t as u64),
                validity: ttl,
                acquired_at: sent,
            })),
            Some(t) => Err(LockError::Backend {
                backend: NAME,
                message: format!("LOCK.ACQUIRE answered token {t}"),
            }),
            None => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool, LockError> {
        let token = Self::token_of(grant)?;
        let mut c = self.conn.clone();
        let mut cmd = redis::cmd("LOCK.RELEASE");
        cmd.arg(&grant.key).arg(&grant.handle).arg(token);
        let n: i64 = self.bounded(self.timeout, cmd.query_async(&mut c)).await?;
        Ok(n == 1)
    }

    async fn extend(&self, grant: &Grant, ttl: Duration) -> Result<bool, LockError> {
        let token = Self::token_of(grant)?;
        let ms = ttl_ms(ttl)?;
        let mut c = self.conn.clone();
        let mut cmd = redis::cmd("LOCK.RENEW");
        cmd.arg(&grant.key).arg(&grant.handle).arg(token).arg(ms);
        let n: i64 = self.bounded(self.timeout, cmd.query_async(&mut c)).await?;
        Ok(n == 1)
    }

    fn failed_attempts(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}
