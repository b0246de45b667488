//! Read-write locks and permit semaphores on one Redis, the way Redisson does them: Lua
//! scripts modelled on `RedissonReadLock`/`RedissonWriteLock` (`tryLockInnerAsync`,
//! `unlockInnerAsync`) and `RedissonPermitExpirableSemaphore` (`tryAcquireAsync`,
//! `releaseAsync`), Redisson 3.x. What is kept, because it is what the server does per call:
//!
//! * **read-write**: one hash per lock, field `mode` (`read`/`write`) and one field per holder
//!   counting its holds (`<id>` for readers, `<id>:write` for the writer); each read hold also
//!   sets a timeout key `{name}:<id>:rwlock_timeout:<n>` with the lease, and the hash's own
//!   TTL is the longest of them. A read release scans every holder's timeout keys to shrink
//!   the hash's TTL (Redisson's `maxRemainTime` loop); the last release deletes the hash and
//!   publishes on the lock's channel.
//! * **semaphore**: a string with the permits available (initialised once with `SET … NX`,
//!   Redisson's `trySetPermits`) and a sorted set `{name}:timeout` of permit ids scored by
//!   their expiry in **the client's wall-clock milliseconds** (Redisson passes
//!   `System.currentTimeMillis()`); an acquire first returns the expired permits to the pool.
//!
//! Left out: Redisson's pub/sub wait (clients here retry with jitter, like [`RedisLock`]),
//! its watchdog, and the write lock's reentrant read. No fencing tokens: nothing these
//! scripts return lets storage refuse a paused former holder.
//!
//! The grant's `handle` says what to release: `read:<id>`, `write:<id>` or `permit:<permit id>`.
//!
//! [`RedisLock`]: crate::RedisLock

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::Script;

use crate::redis::{connect, map_redis, ttl_ms, RedisConfig};
use crate::{random_id, DistLock, Grant, LockError, LockMode};

/// `RedissonReadLock.tryLockInnerAsync`. KEYS: lock, timeout prefix `{lock}:<id>:rwlock_timeout`.
/// ARGV: lease ms, holder id, the holder's write-lock name. nil when granted, else the lock's
/// PTTL.
pub const READ_LOCK_LUA: &str = r#"local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
  redis.call('hset', KEYS[1], 'mode', 'read');
  redis.call('hset', KEYS[1], ARGV[2], 1);
  redis.call('set', KEYS[2] .. ':1', 1);
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1]);
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return nil;
end;
if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1);
  local key = KEYS[2] .. ':' .. ind;
  redis.call('set', key, 1);
  redis.call('pexpire', key, ARGV[1]);
  local remainTime = redis.call('pttl', KEYS[1]);
  redis.call('pexpire', KEYS[1], math.max(remainTime, ARGV[1]));
  return nil;
end;
return redis.call('pttl', KEYS[1]);"#;

/// `RedissonReadLock.unlockInnerAsync`. KEYS: lock, channel, timeout prefix, key prefix
/// `{lock}`. ARGV: unlock message, holder id. 1 released (lock freed), 0 released (others
/// hold), nil not held.
pub const READ_UNLOCK_LUA: &str = r#"local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
  redis.call('publish', KEYS[2], ARGV[1]);
  return nil;
end;
local lockExists = redis.call('hexists', KEYS[1], ARGV[2]);
if (lockExists == 0) then
  return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1);
if (counter == 0) then
  redis.call('hdel', KEYS[1], ARGV[2]);
end;
redis.call('del', KEYS[3] .. ':' .. (counter+1));
if (redis.call('hlen', KEYS[1]) > 1) then
  local maxRemainTime = -3;
  local keys = redis.call('hkeys', KEYS[1]);
  for n, key in ipairs(keys) do
    counter = tonumber(redis.call('hget', KEYS[1], key));
    if type(counter) == 'number' then
      for i=counter, 1, -1 do
        local remainTime = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i);
        maxRemainTime = math.max(remainTime, maxRemainTime);
      end;
    end;
  end;
  if maxRemainTime > 0 then
    redis.call('pexpire', KEYS[1], maxRemainTime);
    return 0;
  end;
  if mode == 'write' then
    return 0;
  end;
end;
redis.call('del', KEYS[1]);
redis.call('publish', KEYS[2], ARGV[1]);
return 1;"#;

/// `RedissonWriteLock.tryLockInnerAsync`. KEYS: lock. ARGV: lease ms, the holder's
/// write-lock name. nil when granted, else the lock's PTTL.
pub const WRITE_LOCK_LUA: &str = r#"local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
  redis.call('hset', KEYS[1], 'mode', 'write');
  redis.call('hset', KEYS[1], ARGV[2], 1);
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return nil;
end;
if (mode == 'write') then
  if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    local currentExpire = redis.call('pttl', KEYS[1]);
    redis.call('pexpire', KEYS[1], currentExpire + ARGV[1]);
    return nil;
  end;
end;
return redis.call('pttl', KEYS[1]);"#;

/// `RedissonWriteLock.unlockInnerAsync`. KEYS: lock, channel. ARGV: unlock message, lease ms,
/// the holder's write-lock name. 1 freed, 0 still held (reentrant), nil not held.
pub const WRITE_UNLOCK_LUA: &str = r#"local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
  redis.call('publish', KEYS[2], ARGV[1]);
  return nil;
end;
if (mode == 'write') then
  local lockExists = redis.call('hexists', KEYS[1], ARGV[3]);
  if (lockExists == 0) then
    return nil;
  else
    local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
    if (counter > 0) then
      redis.call('pexpire', KEYS[1], ARGV[2]);
      return 0;
    else
      redis.call('hdel', KEYS[1], ARGV[3]);
      if (redis.call('hlen', KEYS[1]) == 1) then
        redis.call('del', KEYS[1]);
        redis.call('publish', KEYS[2], ARGV[1]);
      else
        redis.call('hset', KEYS[1], 'mode', 'read');
      end;
      return 1;
    end;
  end;
end;
return nil;"#;

/// `RedissonPermitExpirableSemaphore.tryAcquireAsync` (one permit), plus the `trySetPermits`
/// that initialises the pool. KEYS: pool, timeout zset, channel. ARGV: permits (1), expiry
/// (client ms), permit id, now (client ms), the never-expiring score, pool size. The permit
/// id when granted, else nil or `:<earliest expiry>`.
pub const PERMIT_ACQUIRE_LUA: &str = r#"redis.call('set', KEYS[1], ARGV[6], 'NX');
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[4], 'limit', 0, ARGV[1]);
if #expiredIds > 0 then
  redis.call('zrem', KEYS[2], unpack(expiredIds));
  local value = redis.call('incrby', KEYS[1], #expiredIds);
  if tonumber(value) > 0 then
    redis.call('publish', KEYS[3], value);
  end;
end;
local value = redis.call('get', KEYS[1]);
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
  redis.call('decrby', KEYS[1], ARGV[1]);
  redis.call('zadd', KEYS[2], ARGV[2], ARGV[3]);
  local ttl = redis.call('pttl', KEYS[1]);
  if ttl > 0 then
    redis.call('pexpire', KEYS[2], ttl);
  end;
  return ARGV[3];
end;
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES');
if v[1] ~= nil and v[2] ~= ARGV[5] then
  return ':' .. tostring(v[2]);
end;
return nil;"#;

/// `RedissonPermitExpirableSemaphore.releaseAsync`. KEYS: pool, channel, timeout zset. ARGV:
/// permit id, permits (1), now (client ms). 1 released, 0 not held (or already expired).
pub const PERMIT_RELEASE_LUA: &str = r#"local expire = redis.call('zscore', KEYS[3], ARGV[1]);
local removed = redis.call('zrem', KEYS[3], ARGV[1]);
if tonumber(removed) ~= 1 then
  return 0;
end;
local value = redis.call('incrby', KEYS[1], ARGV[2]);
redis.call('publish', KEYS[2], value);
if tonumber(expire) <= tonumber(ARGV[3]) then
  return 0;
end;
return 1;"#;

/// Redisson's `nonExpirableTimeout` score (permits without a lease).
const NON_EXPIRABLE: &str = "92233720368547758";

/// A Redisson-style client (one holder id, like Redisson's `UUID:threadId`) on one Redis.
pub struct Redisson {
    name: &'static str,
    conn: ConnectionManager,
    cfg: RedisConfig,
    id: String,
    read_lock: Script,
    read_unlock: Script,
    write_lock: Script,
    write_unlock: Script,
    permit_acquire: Script,
    permit_release: Script,
    failed: AtomicU64,
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Redisson {
    /// `addr`: `host:port` or `redis://` URL; `name` labels the backend in reports.
    pub fn new(name: &'static str, addr: &str, cfg: RedisConfig) -> Result<Redisson, LockError> {
        Ok(Redisson {
            name,
            conn: connect(addr, Some(cfg.timeout), cfg.timeout)?,
            cfg,
            id: format!("{}:1", random_id(8)),
            read_lock: Script::new(READ_LOCK_LUA),
            read_unlock: Script::new(READ_UNLOCK_LUA),
            write_lock: Script::new(WRITE_LOCK_LUA),
            write_unlock: Script::new(WRITE_UNLOCK_LUA),
            permit_acquire: Script::new(PERMIT_ACQUIRE_LUA),
            permit_release: Script::new(PERMIT_RELEASE_LUA),
            failed: AtomicU64::new(0),
        })
    }

    fn channel(key: &str) -> String {
        format!("redisson_rwlock:{{{key}}}")
    }

    fn timeout_prefix(&self, key: &str) -> String {
        format!("{{{key}}}:{}:rwlock_timeout", self.id)
    }

    /// One attempt. `Some(handle)` when granted.
    async fn try_once(
        &self,
        key: &str,
        mode: LockMode,
        ms: u64,
    ) -> Result<Option<String>, LockError> {
        let mut c = self.conn.clone();
        let write_name = format!("{}:write", self.id);
        let r = match mode {
            LockMode::Read => self
                .read_lock
                .key(key)
                .key(self.timeout_prefix(key))
                .arg(ms)
                .arg(&self.id)
                .arg(&write_name)
                .invoke_async::<Option<i64>>(&mut c)
                .await
                .map(|pttl| pttl.is_none().then(|| format!("read:{}", self.id))),
            LockMode::Write | LockMode::Exclusive => self
                .write_lock
                .key(key)
                .arg(ms)
                .arg(&write_name)
                .invoke_async::<Option<i64>>(&mut c)
                .await
                .map(|pttl| pttl.is_none().then(|| format!("write:{}", self.id))),
            LockMode::Permit { permits } => {
                let id = random_id(16);
                let now = wall_ms();
                self.permit_acquire
                    .key(key)
                    .key(format!("{{{key}}}:timeout"))
                    .key(format!("redisson_sc:{{{key}}}"))
                    .arg(1)
                    .arg(now + ms)
                    .arg(&id)
                    .arg(now)
                    .arg(NON_EXPIRABLE)
                    .arg(permits)
                    .invoke_async::<Option<String>>(&mut c)
                    .await
                    .map(|r| r.filter(|r| *r == id).map(|_| format!("permit:{id}")))
            }
        };
        r.map_err(|e| map_redis(self.name, e))
    }
}

#[async_trait]
impl DistLock for Redisson {
    fn name(&self) -> &'static str {
        self.name
    }

    fn issues_tokens(&self) -> bool {
        false
    }

    /// The write lock (Redisson's `RLock` differs only in its hash layout).
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.acquire_mode(key, LockMode::Write, ttl, wait).await
    }

    async fn acquire_mode(
        &self,
        key: &str,
        mode: LockMode,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let ms = ttl_ms(ttl)?;
        let start = Instant::now();
        for _ in 0..u32::MAX {
            let sent = Instant::now();
            if let Some(handle) = self.try_once(key, mode, ms).await? {
                return Ok(Some(Grant {
                    key: key.to_owned(),
                    handle,
                    token: None,
                    validity: ttl,
                    acquired_at: sent,
                }));
            }
            self.failed.fetch_add(1, Ordering::Relaxed);
            let pause = self.cfg.retry.next_pause();
            if start.elapsed() + pause > wait {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        Ok(None)
    }

    async fn release(&self, grant: &Grant) -> Result<bool, LockError> {
        let mut c = self.conn.clone();
        let key = grant.key.as_str();
        let (kind, rest) = grant
            .handle
            .split_once(':')
            .ok_or_else(|| LockError::Invalid(format!("not a Redisson grant: {}", grant.handle)))?;
        let r = match kind {
            "read" => self
                .read_unlock
                .key(key)
                .key(Self::channel(key))
                .key(format!("{{{key}}}:{rest}:rwlock_timeout"))
                .key(format!("{{{key}}}"))
                .arg(0)
                .arg(rest)
                .invoke_async::<Option<i64>>(&mut c)
                .await
                .map(|r| r.is_some()),
            "write" => self
                .write_unlock
                .key(key)
                .key(Self::channel(key))
                .arg(0)
                .arg(30_000)
                .arg(format!("{rest}:write"))
                .invoke_async::<Option<i64>>(&mut c)
                .await
                .map(|r| r.is_some()),
            "permit" => self
                .permit_release
                .key(key)
                .key(format!("redisson_sc:{{{key}}}"))
                .key(format!("{{{key}}}:timeout"))
                .arg(rest)
                .arg(1)
                .arg(wall_ms())
                .invoke_async::<i64>(&mut c)
                .await
                .map(|n| n == 1),
            _ => {
                return Err(LockError::Invalid(format!(
                    "not a Redisson grant: {}",
                    grant.handle
                )))
            }
        };
        r.map_err(|e| map_redis(self.name, e))
    }

    async fn extend(&self, _grant: &Grant, _ttl: Duration) -> Result<bool, LockError> {
        Err(LockError::Invalid(
            "the Redisson-style backend does not renew leases".into(),
        ))
    }

    fn failed_attempts(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}
