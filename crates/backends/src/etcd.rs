//! etcd as a lock backend: a session lease per client plus etcd's own mutex protocol
//! (`client/v3/concurrency/mutex.go`) over Txn, Range, DeleteRange and Watch:
//!
//! * the session ([`EtcdSession`], shared with [`crate::etcd_lock::EtcdLockService`]): one
//!   lease of `ceil(ttl)` seconds per client, granted on first use (again once etcd reports it
//!   gone) and kept alive every ttl/3 on a LeaseKeepAlive stream (like
//!   `concurrency.NewSession`);
//! * acquire: Txn `if create_revision(pfx/lease) == 0 then put(pfx/lease, lease) + get owner
//!   (first created under pfx) else get(pfx/lease) + get owner`; owner's create revision ==
//!   ours → held. Otherwise wait for every key created before ours to be deleted (Watch, no
//!   polling), up to `wait`; on timeout or `wait` zero delete our key again (TryLock);
//! * release: delete our key. Extend: one lease keep-alive.
//!
//! The fencing token is our key's create revision — etcd's documented ownership token.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

use crate::{DistLock, Grant, LockError};

/// etcd's v3 API, generated from the protos vendored in `proto/etcd/` (crate fenced-proto).
pub use fenced_proto::etcd::{etcdserverpb as pb, mvccpb};

use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::watch_client::WatchClient;

const NAME: &str = "etcd";

fn unavailable(e: impl std::fmt::Display) -> LockError {
    LockError::Unavailable {
        backend: NAME,
        message: e.to_string(),
    }
}

fn status_err(s: tonic::Status) -> LockError {
    status_err_of(NAME, s)
}

/// A gRPC status as a [`LockError`] of `backend`: transport-ish codes leave the outcome
/// unknown ([`LockError::Unavailable`]), the others are the server's answer.
pub(crate) fn status_err_of(backend: &'static str, s: tonic::Status) -> LockError {
    use tonic::Code;
    match s.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            LockError::Unavailable {
                backend,
                message: s.message().to_owned(),
            }
        }
        _ => LockError::Backend {
            backend,
            message: format!("{}: {}", s.code(), s.message()),
        },
    }
}

/// The end of the range of keys with prefix `p` (etcd's `GetPrefixRangeEnd`): the client's.
pub use fenced_client::etcd::prefix_end;

struct Session {
    lease: i64,
    /// Cleared by the keep-alive task when etcd says the lease is gone.
    alive: Arc<AtomicBool>,
    keepalive: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// What every etcd-API lock client has: a channel to one member and a session lease of its
/// own, granted on first use and kept alive every ttl/3 on a `LeaseKeepAlive` stream (like
/// `concurrency.NewSession`). A lease etcd reports gone (expired while the client was paused
/// or cut off) is replaced by a fresh one at the next [`EtcdSession::lease`]. Shared by
/// [`EtcdLock`] (the client-side mutex recipe) and [`crate::etcd_lock::EtcdLockService`]
/// (etcd's server-side `v3lockpb.Lock`).
pub(crate) struct EtcdSession {
    pub(crate) name: &'static str,
    pub(crate) channel: Channel,
    session: tokio::sync::Mutex<Option<Session>>,
    pub(crate) timeout: Duration,
}

impl EtcdSession {
    /// `endpoint`: `host:port` (or a URI) of one member; `name`: the backend's name in errors.
    pub(crate) fn connect(name: &'static str, endpoint: &str) -> Result<EtcdSession, LockError> {
        let uri = if endpoint.contains("://") {
            endpoint.to_owned()
        } else {
            format!("http://{endpoint}")
        };
        let channel = Endpoint::from_shared(uri)
            .map_err(|e| LockError::Invalid(format!("{endpoint}: {e}")))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(EtcdSession {
            name,
            channel,
            session: tokio::sync::Mutex::new(None),
            timeout: Duration::from_secs(10),
        })
    }

    pub(crate) fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.timeout);
        r
    }

    pub(crate) fn unavailable(&self, e: impl std::fmt::Display) -> LockError {
        LockError::Unavailable {
            backend: self.name,
            message: e.to_string(),
        }
    }

    pub(crate) fn status_err(&self, s: tonic::Status) -> LockError {
        status_err_of(self.name, s)
    }

    /// The session's lease id: granted (`ceil(ttl)` seconds) on first use or after the last
    /// one was reported gone.
    pub(crate) async fn lease(&self, ttl: Duration) -> Result<i64, LockError> {
        let mut guard = self.session.lock().await;
        if let Some(s) = guard.as_ref() {
            if s.alive.load(Ordering::Relaxed) {
                return Ok(s.lease);
            }
        }
        let secs = ttl.as_millis().div_ceil(1000).max(1) as i64;
        let g = LeaseClient::new(self.channel.clone())
            .lease_grant(self.req(pb::LeaseGrantRequest { ttl: secs, id: 0 }))
            .await
            .map_err(|s| self.status_err(s))?
            .into_inner();
        if !g.error.is_empty() {
            return Err(LockError::Backend {
                backend: self.name,
                message: g.error,
            });
        }
        let period = Duration::from_millis((g.ttl.max(1) as u64) * 1000 / 3);
        let alive = Arc::new(AtomicBool::new(true));
        let keepalive = tokio::spawn(keep_alive(
            self.channel.clone(),
            g.id,
            period,
            alive.clone(),
        ));
        *guard = Some(Session {
            lease: g.id,
            alive,
            keepalive,
        });
        Ok(g.id)
    }

    /// Forget `lease` (the server said it is gone): the next [`EtcdSession::lease`] grants
    /// another.
    pub(crate) async fn forget(&self, lease: i64) {
        let mut guard = self.session.lock().await;
        if guard.as_ref().is_some_and(|s| s.lease == lease) {
            *guard = None;
        }
    }

    /// Revoke the session's lease (its keys go with it).
    pub(crate) async fn close(&self) -> Result<(), LockError> {
        if let Some(s) = self.session.lock().await.take() {
            s.keepalive.abort();
            LeaseClient::new(self.channel.clone())
                .lease_revoke(self.req(pb::LeaseRevokeRequest { id: s.lease }))
                .await
                .map_err(|s| self.status_err(s))?;
        }
        Ok(())
    }

    /// One keep-alive of the session's lease now: `Ok(false)` if there is none or it is gone.
    pub(crate) async fn keep_alive_once(&self) -> Result<bool, LockError> {
        let Some(lease) = self.session.lock().await.as_ref().map(|s| s.lease) else {
            return Ok(false);
        };
        let (tx, rx) = mpsc::channel(1);
        tx.send(pb::LeaseKeepAliveRequest { id: lease })
            .await
            .map_err(|e| self.unavailable(e))?;
        let mut stream = LeaseClient::new(self.channel.clone())
            .lease_keep_alive(ReceiverStream::new(rx))
            .await
            .map_err(|s| self.status_err(s))?
            .into_inner();
        match stream.next().await {
            Some(Ok(r)) => Ok(r.ttl > 0),
            Some(Err(s)) => Err(self.status_err(s)),
            None => Err(self.unavailable("keep-alive stream ended")),
        }
    }
}

/// One etcd client with one session.
pub struct EtcdLock {
    session: EtcdSession,
    failed: AtomicU64,
}

impl EtcdLock {
    /// `endpoint`: `host:port` of one member (members forward writes to the leader).
    pub fn connect(endpoint: &str) -> Result<EtcdLock, LockError> {
        Ok(EtcdLock {
            session: EtcdSession::connect(NAME, endpoint)?,
            failed: AtomicU64::new(0),
        })
    }

    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        self.session.req(msg)
    }

    /// Revoke the session's lease (its keys go with it).
    pub async fn close(&self) -> Result<(), LockError> {
        self.session.close().await
    }

    fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.session.channel.clone())
    }

    async fn delete(&self, key: &[u8]) -> Result<bool, LockError> {
        let r = self
            .kv()
            .delete_range(self.req(pb::DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            }))
            .await
            .map_err(status_err)?
            .into_inner();
        Ok(r.deleted > 0)
    }

    /// Wait until every key under `pfx` created at or before `max_rev` is gone.
    async fn wait_deletes(&self, pfx: &[u8], max_rev: i64) -> Result<(), LockError> {
        loop {
            let r = self
                .kv()
                .range(self.req(pb::RangeRequest {
                    key: pfx.to_vec(),
                    range_end: prefix_end(pfx),
                    limit: 1,
                    sort_order: pb::range_request::SortOrder::Descend as i32,
                    sort_target: pb::range_request::SortTarget::Create as i32,
                    max_create_revision: max_rev,
                    ..Default::default()
                }))
                .await
                .map_err(status_err)?
                .into_inner();
            let Some(last) = r.kvs.first() else {
                return Ok(());
            };
            let rev = r.header.map(|h| h.revision).unwrap_or(0);
            self.wait_delete(&last.key, rev).await?;
        }
    }

    async fn wait_delete(&self, key: &[u8], rev: i64) -> Result<(), LockError> {
        let (tx, rx) = mpsc::channel(1);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: key.to_vec(),
                    start_revision: rev,
                    ..Default::default()
                },
            )),
        };
        tx.send(create).await.map_err(unavailable)?;
        let mut stream = WatchClient::new(self.session.channel.clone())
            .watch(ReceiverStream::new(rx))
            .await
            .map_err(status_err)?
            .into_inner();
        while let Some(msg) = stream.next().await {
            let msg = msg.map_err(status_err)?;
            if msg.canceled {
                return Err(LockError::Backend {
                    backend: NAME,
                    message: format!("watch canceled: {}", msg.cancel_reason),
                });
            }
            if msg
                .events
                .iter()
                .any(|e| e.r#type == mvccpb::event::EventType::Delete as i32)
            {
                drop(tx);
                return Ok(());
            }
        }
        Err(unavailable("watch stream ended"))
    }
}

/// Keep `lease` alive every `period` until etcd says it is gone (then clear `alive`); a broken
/// stream is reopened. The first request is queued before the stream is opened: etcd (grpc-go)
/// sends a stream's response headers only with its first answer, and tonic's call returns only
/// once the headers came, so a stream opened empty would wait forever.
async fn keep_alive(channel: Channel, lease: i64, period: Duration, alive: Arc<AtomicBool>) {
    loop {
        let (tx, rx) = mpsc::channel(1);
        if tx
            .send(pb::LeaseKeepAliveRequest { id: lease })
            .await
            .is_err()
        {
            return;
        }
        let stream = LeaseClient::new(channel.clone())
            .lease_keep_alive(ReceiverStream::new(rx))
            .await;
        let Ok(stream) = stream else {
            tokio::time::sleep(period / 4).await;
            continue;
        };
        let mut stream = stream.into_inner();
        loop {
            match stream.next().await {
                Some(Ok(r)) if r.ttl > 0 => {}
                Some(Ok(_)) => {
                    // Lease gone.
                    alive.store(false, Ordering::Relaxed);
                    return;
                }
                _ => break,
            }
            tokio::time::sleep(period).await;
            if tx
                .send(pb::LeaseKeepAliveRequest { id: lease })
                .await
                .is_err()
            {
                break;
            }
        }
    }
}

#[async_trait]
impl DistLock for EtcdLock {
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
        let sent = Instant::now();
        let lease = self.session.lease(ttl).await?;
        let pfx = format!("{key}/").into_bytes();
        let my_key = format!("{key}/{lease:x}").into_bytes();
        use pb::request_op::Request;
        let get_owner = pb::RequestOp {
            request: Some(Request::RequestRange(pb::RangeRequest {
                key: pfx.clone(),
                range_end: prefix_end(&pfx),
                limit: 1,
                sort_order: pb::range_request::SortOrder::Ascend as i32,
                sort_target: pb::range_request::SortTarget::Create as i32,
                ..Default::default()
            })),
        };
        let txn = pb::TxnRequest {
            compare: vec![pb::Compare {
                result: pb::compare::CompareResult::Equal as i32,
                target: pb::compare::CompareTarget::Create as i32,
                key: my_key.clone(),
                target_union: Some(pb::compare::TargetUnion::CreateRevision(0)),
                ..Default::default()
            }],
            success: vec![
                pb::RequestOp {
                    request: Some(Request::RequestPut(pb::PutRequest {
                        key: my_key.clone(),
                        lease,
                        ..Default::default()
                    })),
                },
                get_owner.clone(),
            ],
            failure: vec![
                pb::RequestOp {
                    request: Some(Request::RequestRange(pb::RangeRequest {
                        key: my_key.clone(),
                        ..Default::default()
                    })),
                },
                get_owner,
            ],
        };
        let r = self
            .kv()
            .txn(self.req(txn))
            .await
            .map_err(status_err)?
            .into_inner();
        let range_of = |i: usize| -> Option<&pb::RangeResponse> {
            match r.responses.get(i)?.response.as_ref()? {
                pb::response_op::Response::ResponseRange(rr) => Some(rr),
                _ => None,
            }
        };
        let my_rev = if r.succeeded {
            r.header.as_ref().map(|h| h.revision).unwrap_or(0)
        } else {
            range_of(0)
                .and_then(|rr| rr.kvs.first())
                .map(|kv| kv.create_revision)
                .unwrap_or(0)
        };
        if my_rev <= 0 {
            return Err(LockError::Backend {
                backend: NAME,
                message: "txn answer without our key's revision".into(),
            });
        }
        let owner_rev = range_of(1)
            .and_then(|rr| rr.kvs.first())
            .map(|kv| kv.create_revision);
        let grant = |token: i64| Grant {
            key: key.to_owned(),
            handle: String::from_utf8_lossy(&my_key).into_owned(),
            token: Some(token as u64),
            validity: ttl,
            acquired_at: sent,
        };
        if owner_rev.is_none() || owner_rev == Some(my_rev) {
            return Ok(Some(grant(my_rev)));
        }
        let remaining = wait.saturating_sub(sent.elapsed());
        let waited = if remaining.is_zero() {
            None
        } else {
            tokio::time::timeout(remaining, self.wait_deletes(&pfx, my_rev - 1))
                .await
                .ok()
        };
        match waited {
            Some(Ok(())) => {
                // Make sure our key (and so our session) is still there.
                let g = self
                    .kv()
                    .range(self.req(pb::RangeRequest {
                        key: my_key.clone(),
                        ..Default::default()
                    }))
                    .await
                    .map_err(status_err)?
                    .into_inner();
                if g.kvs.is_empty() {
                    return Err(LockError::Backend {
                        backend: NAME,
                        message: "session expired while waiting".into(),
                    });
                }
                Ok(Some(grant(my_rev)))
            }
            other => {
                // Not granted in time (or the wait failed): withdraw from the queue.
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.delete(&my_key).await?;
                match other {
                    Some(Err(e)) => Err(e),
                    _ => Ok(None),
                }
            }
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool, LockError> {
        self.delete(grant.handle.as_bytes()).await
    }

    async fn extend(&self, _grant: &Grant, _ttl: Duration) -> Result<bool, LockError> {
        self.session.keep_alive_once().await
    }

    fn failed_attempts(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
