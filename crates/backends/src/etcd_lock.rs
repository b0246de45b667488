//! etcd's server-side lock service (`v3lockpb.Lock`: `Lock` / `Unlock`) as a lock backend,
//! against a real etcd (3.4/3.5 serve it on the client port) or fenced's gRPC port:
//!
//! * the session is [`EtcdSession`]'s (shared with the client-side recipe [`crate::EtcdLock`]):
//!   one lease of `ceil(ttl)` seconds per client, kept alive every ttl/3, replaced by a fresh
//!   one once the server reports it gone;
//! * acquire = `Lock{name, lease}`, which blocks **server-side** until the lock is ours. "Try
//!   with wait" is that call under a gRPC deadline of `wait` + [`GRACE`] (one Raft round trip
//!   for a free lock: the service has no try-lock). On the deadline the server withdraws our
//!   waiter itself (etcd: the cancelled `Mutex.Lock` deletes its key; fenced: the waiter is
//!   dropped with the call). A grant can still race the deadline — granted on the server, the
//!   answer lost — and a key of ours that nobody knows of would then be held for as long as
//!   our lease is kept alive, so the client also withdraws explicitly: `Unlock` of the key
//!   etcd's recipe would have made (`name/<lease in hex>`), which deletes nothing when the
//!   server already did. Only then is the try reported as "not granted". (A narrower race
//!   remains: a `Lock` whose key-creating write is still in flight when that `Unlock`
//!   arrives, granted at once and answered into a cancelled call. The key then stays until
//!   this client's next `Lock` of that name — etcd's recipe finds its own key and grants
//!   it — or until the session's lease ends);
//! * release = `Unlock{key}` (the key the `Lock` answer named). It does not say whether the
//!   key was still there, so release reports `true` whenever the call succeeds;
//! * extend = one keep-alive of the session's lease.
//!
//! The fencing token is the lock key's **create revision** (etcd's documented ownership
//! token) in both cases, read with one serializable `Range` of the key on the member that
//! answered `Lock`, which has applied the key's creation before it answered
//! ([`TokenFrom::Get`]): `header.revision` is, in etcd and in fenced since its Lock runs on
//! the keyspace (apply rules 13), the store's revision when the wait ended — later than the
//! key's creation whenever the call waited. [`TokenFrom::Header`] is only right for fenced
//! under older rules, whose lock-table grant answered with the key's create revision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tonic::transport::Channel;
use tonic::Code;

use crate::etcd::pb;
use crate::etcd::EtcdSession;
use crate::{DistLock, Grant, LockError};

use fenced_proto::etcd::v3lockpb;
use v3lockpb::lock_client::LockClient;

/// What a `Lock` call's deadline adds to `wait`: time for the round trip (and Raft write) of
/// an uncontended grant.
pub const GRACE: Duration = Duration::from_millis(200);

/// Where the fencing token (the lock key's create revision) comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenFrom {
    /// `LockResponse.header.revision` (equal to the key's create revision only on fenced
    /// under apply rules older than 13).
    Header,
    /// A serializable `Range` of the lock key after the grant (etcd).
    Get,
}

/// One client of etcd's `v3lockpb.Lock` service, with one session lease.
pub struct EtcdLockService {
    session: EtcdSession,
    token_from: TokenFrom,
    failed: AtomicU64,
}

impl EtcdLockService {
    /// A client of a real etcd member at `endpoint` (`host:port`): backend `etcd-lock`, token
    /// read with a `Range` ([`TokenFrom::Get`]).
    pub fn etcd(endpoint: &str) -> Result<EtcdLockService, LockError> {
        Self::connect("etcd-lock", endpoint, TokenFrom::Get)
    }

    /// A client of fenced's etcd lock service at one node's gRPC port: backend
    /// `fenced-etcdlock`, token read with a `Range` as for etcd ([`TokenFrom::Get`]).
    pub fn fenced(endpoint: &str) -> Result<EtcdLockService, LockError> {
        Self::connect("fenced-etcdlock", endpoint, TokenFrom::Get)
    }

    pub fn connect(
        name: &'static str,
        endpoint: &str,
        token_from: TokenFrom,
    ) -> Result<EtcdLockService, LockError> {
        Ok(EtcdLockService {
            session: EtcdSession::connect(name, endpoint)?,
            token_from,
            failed: AtomicU64::new(0),
        })
    }

    /// Revoke the session's lease (any lock it holds goes with it).
    pub async fn close(&self) -> Result<(), LockError> {
        self.session.close().await
    }

    fn locks(&self) -> LockClient<Channel> {
        LockClient::new(self.session.channel.clone())
    }

    fn backend(&self, message: impl Into<String>) -> LockError {
        LockError::Backend {
            backend: self.session.name,
            message: message.into(),
        }
    }

    /// The key's create revision, read on the member that granted it.
    async fn create_revision(&self, key: &[u8]) -> Result<i64, LockError> {
        let r = pb::kv_client::KvClient::new(self.session.channel.clone())
            .range(self.session.req(pb::RangeRequest {
                key: key.to_vec(),
                serializable: true,
                ..Default::default()
            }))
            .await
            .map_err(|s| self.session.status_err(s))?
            .into_inner();
        match r.kvs.first() {
            Some(kv) if kv.create_revision > 0 => Ok(kv.create_revision),
            _ => Err(self.backend(format!(
                "lock key {} gone before its token was read (lease expired?)",
                String::from_utf8_lossy(key)
            ))),
        }
    }

    /// After a `Lock` call ended without an answer: make sure no key of ours stays behind
    /// under `name` (see the module doc). `Ok` once the server has confirmed the delete.
    async fn withdraw(&self, name: &str, lease: i64) -> Result<(), LockError> {
        let key = format!("{name}/{lease:x}").into_bytes();
        match self
            .locks()
            .unlock(self.session.req(v3lockpb::UnlockRequest { key }))
            .await
        {
            Ok(_) => Ok(()),
            // Nothing of ours there to withdraw (a server that refuses an unknown key).
            Err(s) if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) => Ok(()),
            Err(s) => Err(self.session.status_err(s)),
        }
    }
}

/// The service is not served there: say so plainly (fenced before its Lock service landed).
fn unimplemented(name: &'static str, s: &tonic::Status) -> Option<LockError> {
    (s.code() == Code::Unimplemented).then(|| LockError::Backend {
        backend: name,
        message: format!(
            "v3lockpb.Lock is not served here (UNIMPLEMENTED: {})",
            s.message()
        ),
    })
}

/// The call's deadline passed: the server's `DEADLINE_EXCEEDED`, or tonic's own timer on the
/// same deadline (`CANCELLED: Timeout expired`).
fn deadline_passed(s: &tonic::Status) -> bool {
    s.code() == Code::DeadlineExceeded
        || (s.code() == Code::Cancelled && s.message().contains("Timeout expired"))
}

/// etcd's answer for a lease that no longer exists.
fn lease_gone(s: &tonic::Status) -> bool {
    s.code() == Code::NotFound || s.message().contains("lease not found")
}

#[async_trait]
impl DistLock for EtcdLockService {
    fn name(&self) -> &'static str {
        self.session.name
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
        let sent = Instant::now();
        let lease = self.session.lease(ttl).await?;
        let mut req = tonic::Request::new(v3lockpb::LockRequest {
            name: key.as_bytes().to_vec(),
            lease,
        });
        let deadline = wait.saturating_sub(sent.elapsed()) + GRACE;
        req.set_timeout(deadline);
        // Both ends enforce the deadline (tonic times the call out itself).
        let r = match self.locks().lock(req).await {
            Ok(r) => r.into_inner(),
            Err(s) if deadline_passed(&s) => {
                // Not granted in time (or granted as the deadline struck: withdraw).
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.withdraw(key, lease).await?;
                return Ok(None);
            }
            Err(s) => {
                if let Some(e) = unimplemented(self.session.name, &s) {
                    return Err(e);
                }
                if lease_gone(&s) {
                    // Expired while we were paused or cut off: the next try gets a new one.
                    self.session.forget(lease).await;
                }
                return Err(self.session.status_err(s));
            }
        };
        if r.key.is_empty() {
            return Err(self.backend("Lock answered without a key"));
        }
        let token = match self.token_from {
            TokenFrom::Header => r.header.map(|h| h.revision).unwrap_or(0),
            TokenFrom::Get => self.create_revision(&r.key).await?,
        };
        if token <= 0 {
            return Err(self.backend("Lock answered without a revision"));
        }
        Ok(Some(Grant {
            key: key.to_owned(),
            handle: String::from_utf8_lossy(&r.key).into_owned(),
            token: Some(token as u64),
            validity: ttl,
            acquired_at: sent,
        }))
    }

    async fn release(&self, grant: &Grant) -> Result<bool, LockError> {
        self.locks()
            .unlock(self.session.req(v3lockpb::UnlockRequest {
                key: grant.handle.as_bytes().to_vec(),
            }))
            .await
            .map_err(|s| {
                unimplemented(self.session.name, &s).unwrap_or_else(|| self.session.status_err(s))
            })?;
        Ok(true)
    }

    async fn extend(&self, _grant: &Grant, _ttl: Duration) -> Result<bool, LockError> {
        self.session.keep_alive_once().await
    }

    fn failed_attempts(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}
