//! fenced through its RESP front end (README, "Redis clients (RESP)"), with an unchanged Redis client:
//!
//! * [`FencedResp`]: the native commands `LOCK.ACQUIRE name owner ttl_ms [WAIT ms]` (waiting
//!   server-side, FIFO; the reply is the fencing token) — or, through
//!   [`DistLock::acquire_mode`], `LOCK.READ`, `LOCK.WRITE`, `LOCK.PERMIT name owner permits
//!   ttl_ms` — `LOCK.RELEASE name owner token`, `LOCK.RENEW name owner token ttl_ms`;
//! * the plain Redis pattern against fenced is [`RedisLock::fenced_setnx`](crate::RedisLock):
//!   `SET NX PX` + Lua release/extend, plus `FENCE.TOKEN key value` for the token (the key's create
//!   revision).
//!
//! fenced's own error prefixes are mapped by their meaning, not by redis-rs's kind (in
//! `map_redis`, shared with `fenced_setnx`):
//! `-TIMEOUT outcome unknown: …` (the entry may or may not commit) is
//! [`LockError::Unavailable`], like a client-side timeout; so is `-TRYAGAIN cluster
//! unavailable: …` (no leader or quorum in time), which — like gRPC's `UNAVAILABLE` — can
//! follow an attempt inside the node whose outcome the node could not learn.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::ConnectionManager;

use crate::redis::{connect, map_redis, ttl_ms};
use crate::{random_id, DistLock, Grant, LockError, LockMode};

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
        self.acquire_mode(key, LockMode::Exclusive, ttl, wait).await
    }

    /// `LOCK.ACQUIRE`, `LOCK.READ`, `LOCK.WRITE` or `LOCK.PERMIT name owner permits ttl`;
    /// `LOCK.RELEASE`/`LOCK.RENEW` take every kind of grant.
    async fn acquire_mode(
        &self,
        key: &str,
        mode: LockMode,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let ms = ttl_ms(ttl)?;
        let sent = Instant::now();
        let mut c = self.conn.clone();
        let mut cmd = redis::cmd(match mode {
            LockMode::Exclusive => "LOCK.ACQUIRE",
            LockMode::Read => "LOCK.READ",
            LockMode::Write => "LOCK.WRITE",
            LockMode::Permit { .. } => "LOCK.PERMIT",
        });
        cmd.arg(key).arg(&self.owner);
        if let LockMode::Permit { permits } = mode {
            cmd.arg(permits);
        }
        cmd.arg(ms);
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
                message: format!("{mode} lock answered token {t}"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    /// Read one RESP array of bulk strings (a command); `None` at end of stream.
    async fn read_command<R: AsyncBufReadExt + Unpin>(r: &mut R) -> Option<Vec<String>> {
        let mut line = String::new();
        if r.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            line.clear();
            r.read_line(&mut line).await.ok()?;
            let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
            let mut buf = vec![0; len + 2];
            r.read_exact(&mut buf).await.ok()?;
            buf.truncate(len);
            args.push(String::from_utf8_lossy(&buf).into_owned());
        }
        Some(args)
    }

    /// A RESP server answering every `LOCK.*` command with `reply` (connection set-up
    /// commands get `+OK`).
    async fn fake_node(reply: &'static str) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (r, mut w) = s.into_split();
                    let mut r = BufReader::new(r);
                    while let Some(cmd) = read_command(&mut r).await {
                        let out = if cmd[0].starts_with("LOCK.") {
                            reply
                        } else {
                            "+OK\r\n"
                        };
                        if w.write_all(out.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn grant() -> Grant {
        Grant {
            key: "L".into(),
            handle: "me".into(),
            token: Some(7),
            validity: Duration::from_secs(1),
            acquired_at: Instant::now(),
        }
    }

    #[tokio::test]
    async fn fenced_timeout_and_tryagain_replies_are_outcome_unknown() {
        for reply in [
            "-TIMEOUT outcome unknown: raft write timed out\r\n",
            "-TRYAGAIN cluster unavailable: not the leader (leader: unknown)\r\n",
        ] {
            let l = FencedResp::new(&fake_node(reply).await, Duration::from_secs(2)).expect("new");
            let ttl = Duration::from_secs(1);
            let e = l.acquire("L", ttl, Duration::ZERO).await.expect_err(reply);
            assert!(matches!(e, LockError::Unavailable { .. }), "{reply}: {e:?}");
            let e = l.release(&grant()).await.expect_err(reply);
            assert!(matches!(e, LockError::Unavailable { .. }), "{reply}: {e:?}");
            let e = l.extend(&grant(), ttl).await.expect_err(reply);
            assert!(matches!(e, LockError::Unavailable { .. }), "{reply}: {e:?}");
        }
        // Any other error reply is a definite answer.
        let l = FencedResp::new(
            &fake_node("-ERR too many waiters\r\n").await,
            Duration::from_secs(2),
        )
        .expect("new");
        let e = l
            .acquire("L", Duration::from_secs(1), Duration::ZERO)
            .await
            .expect_err("ERR");
        assert!(matches!(e, LockError::Backend { .. }), "{e:?}");
    }
}
