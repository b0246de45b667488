//! `v3lockpb.Lock`: etcd's server-side lock, on the etcd keyspace as etcd has it.
//!
//! Under apply rules [`Semantics::KEYSPACE_LOCKS`](fenced_core::Semantics::KEYSPACE_LOCKS) (every member upgraded), `Lock` is etcd's
//! `concurrency.Mutex` run on the server ([`super::queue`]): it puts `name/<lease id in hex>`
//! on the caller's lease (or reuses it), waits until no live key under `name/` has a lower
//! create revision, and answers that key; the lock's **fencing token is the key's
//! `create_revision`** (read it with a `Range` of the key: the answer's `header.revision` is,
//! as in etcd, the revision at which the wait ended). So `Lock`, `etcdctl lock`, `etcdctl
//! elect`, Go's `concurrency` package and npm etcd3's `lock()` on one name are one lock, and
//! a delete of the holder's key by any path hands it to the next key. `Unlock(key)` deletes
//! the key (etcd's Unlock); unlocking what is not held succeeds. A call whose client goes
//! away before its key holds withdraws the key (a delete comparing its create revision).
//! fenced's lock table (`LOCK.*`, the gRPC Lock service) is a separate namespace:
//! `LOCK.ACQUIRE job` and `etcdctl lock job` are two different locks.
//!
//! Under older rules (a rolling upgrade) the old lock-table implementation below serves:
//! [`Command::EtcdLock`] and friends (`fenced_core`'s `machine::etcd_locks`), whose
//! requests apply refuses once entries are stamped with the new rules — a call that meets
//! that refusal (or whose wait the migration withdrew) goes on with the keyspace recipe.
//!
//! * etcd's server keeps a lease alive itself while a `Lock` is open; fenced does not: the
//!   client keeps its lease alive (every etcd client library does, for its session).
//! * Permissions: `LOCK.ACQUIRE` on the name to lock, `LOCK.RELEASE` to unlock.

use std::sync::atomic::{AtomicU64, Ordering};

use fenced_core::etcd::lease_session;
use fenced_core::etcd::{DeleteRangeRequest, KeyRange};
use fenced_core::{
    lock_key, Command, CoreError, EtcdCommand, RequestId, Response, SessionId, Token,
};
use fenced_proto::etcd::v3lockpb as lpb;
use tonic::{Request, Status};

use lpb::lock_server::Lock;

use super::{not_etcd, status_of, EtcdApi, Reply};

use crate::error::NodeError;
use crate::node::Node;
use fenced_resp::acl::User;

/// How long one [`Node::acquire`] of a waiting `Lock` listens before it asks the request's
/// record again (the wait itself has no end but the lease's and the call's).
const WAIT_ROUND_MS: u64 = 60_000;

/// Request ids of this service's `Lock`/`Campaign` calls: a random client id per process,
/// numbered from 1 (etcd clients send none; one is needed to wait and to cancel).
pub struct LockIds {
    client_id: u64,
    seq: AtomicU64,
}

impl LockIds {
    pub fn new() -> LockIds {
        LockIds {
            client_id: rand::random::<u64>().max(1),
            seq: AtomicU64::new(0),
        }
    }

    fn next(&self) -> RequestId {
        RequestId {
            client_id: self.client_id,
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }
}

/// Cancels a `Lock` request ([`Command::EtcdCancel`]) when dropped armed: its call ended
/// without handing the grant to the client.
struct CancelOnDrop {
    node: Node,
    name: String,
    lease: SessionId,
    request: RequestId,
    /// The sequence number of the cancel's own request id.
    cancel_seq: u64,
    /// The user of the `Lock` call (name, administrator), whose cancel it is.
    user: (String, bool),
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let node = self.node.clone();
        let cmd = Command::EtcdCancel {
            name: std::mem::take(&mut self.name),
            lease: self.lease,
            request: self.request,
        }
        .as_user(&self.user.0, self.user.1);
        // Its own request id: the node retries it across a leader change.
        let request = RequestId {
            client_id: self.request.client_id,
            seq: self.cancel_seq,
        };
        tokio::spawn(async move {
            if let Err(e) = node.propose(Some(request), cmd).await {
                tracing::debug!(error = %e, "cancelling an etcd Lock call failed");
            }
        });
    }
}

/// A lock name from etcd's bytes: UTF-8 (fenced's lock names are strings).
pub(super) fn lock_name(name: &[u8]) -> Result<String, Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("etcdserver: lock name is empty"));
    }
    String::from_utf8(name.to_vec())
        .map_err(|_| Status::invalid_argument("fenced: lock and election names must be UTF-8"))
}

/// The session a `Lock`/`Campaign` names as its lease (0 is refused).
pub(super) fn lock_lease(lease: i64) -> Result<SessionId, Status> {
    lease_session(lease).ok_or_else(|| {
        Status::invalid_argument(
            "fenced: a lock needs a lease (LeaseGrant, then Lock with its id): without one \
             it would outlive its client",
        )
    })
}

/// The lock name and lease of a key `Lock` or `Campaign` returned (`name/<lease hex>`).
pub(super) fn parse_key(key: &[u8]) -> Result<(String, SessionId), Status> {
    let bad = || {
        Status::invalid_argument(
            "fenced: not a key that Lock or Campaign returned (name/<lease id in hex>)",
        )
    };
    let key = std::str::from_utf8(key).map_err(|_| bad())?;
    let (name, hex) = key.rsplit_once('/').ok_or_else(bad)?;
    let lease = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
    if name.is_empty() || lock_key(name, lease) != key.as_bytes() {
        return Err(bad());
    }
    Ok((name.to_owned(), lease))
}

impl EtcdApi {
    /// Take etcd lock `name` for `lease` in the lock table (rules older than
    /// [`Semantics::KEYSPACE_LOCKS`](fenced_core::Semantics::KEYSPACE_LOCKS)), its key holding `value`: the grant's token, once
    /// granted; `None` if the entry's rules retired the lock-table lock meanwhile (go on
    /// with the keyspace). Waits as long as needed; if the call is dropped first, the
    /// request is cancelled.
    pub(super) async fn take_lock(
        &self,
        user: &User,
        name: &str,
        lease: SessionId,
        value: Vec<u8>,
    ) -> Result<Option<Token>, Status> {
        let request = self.lock_ids.next();
        let cmd = Command::EtcdLock {
            name: name.to_owned(),
            lease,
            value,
        }
        .as_user(user.name(), user.is_admin());
        let mut cancel = CancelOnDrop {
            node: self.node.clone(),
            name: name.to_owned(),
            lease,
            request,
            cancel_seq: self.lock_ids.next().seq,
            user: (user.name().to_owned(), user.is_admin()),
            armed: true,
        };
        loop {
            let answer = self
                .node
                .acquire(request, cmd.clone(), WAIT_ROUND_MS, false)
                .await;
            match answer {
                Ok(Response::Granted { token, .. }) => {
                    cancel.armed = false;
                    return Ok(Some(token));
                }
                Ok(Response::Rejected(CoreError::Retired { .. })) => {
                    cancel.armed = false;
                    return Ok(None);
                }
                // The migration to keyspace locks withdrew the wait.
                Ok(Response::NotGranted) if self.node.stamp_semantics().keyspace_locks() => {
                    cancel.armed = false;
                    return Ok(None);
                }
                // Queued (or its resolution not learnt yet): listen again, same request id.
                Ok(Response::Pending) => continue,
                Ok(Response::NotGranted) => {
                    cancel.armed = false;
                    let lease_lives = self
                        .node
                        .read_timed(|sm, now| sm.session_info(lease, now).is_some())
                        .await
                        .unwrap_or(false);
                    return Err(if lease_lives {
                        Status::aborted(
                            "fenced: a newer Lock call with the same lease took this call's \
                             place in the queue",
                        )
                    } else {
                        super::lease::not_found(lease as i64)
                    });
                }
                Ok(Response::Rejected(fenced_core::CoreError::NoSuchSession(_))) => {
                    cancel.armed = false;
                    return Err(super::lease::not_found(lease as i64));
                }
                Ok(Response::Rejected(e)) => {
                    cancel.armed = false;
                    return Err(status_of(NodeError::Rejected(e)));
                }
                Ok(other) => return Err(not_etcd(other)),
                Err(e) => return Err(status_of(e)),
            }
        }
    }

    /// End `lease`'s grant of `name` (only grant `token`, if given) or withdraw its wait, in
    /// the lock table: `false` if the entry's rules retired it (go on with the keyspace).
    pub(super) async fn release_lock(
        &self,
        user: &User,
        name: String,
        lease: SessionId,
        token: Option<Token>,
    ) -> Result<bool, Status> {
        // With a request id, so the node may retry it across a leader change (applying it
        // twice ends nothing more: only the lease's grant, or only grant `token`).
        let request = self.lock_ids.next();
        match self
            .node
            .propose(
                Some(request),
                Command::EtcdUnlock { name, lease, token }.as_user(user.name(), user.is_admin()),
            )
            .await
            .map_err(status_of)?
        {
            Response::Released { .. } | Response::NotHeld => Ok(true),
            Response::Rejected(CoreError::Retired { .. }) => Ok(false),
            other => Err(not_etcd(other)),
        }
    }
}

#[tonic::async_trait]
impl Lock for EtcdApi {
    async fn lock(&self, req: Request<lpb::LockRequest>) -> Reply<lpb::LockResponse> {
        let name = lock_name(&req.get_ref().name)?;
        let user = self
            .users
            .permit(&req, "LOCK.ACQUIRE", &[name.as_bytes()])?;
        let lease_id = req.get_ref().lease;
        let lease = lock_lease(lease_id)?;
        if !self.node.stamp_semantics().keyspace_locks() {
            if let Some(token) = self.take_lock(&user, &name, lease, Vec::new()).await? {
                return Ok(tonic::Response::new(lpb::LockResponse {
                    header: self.header(token),
                    key: lock_key(&name, lease),
                }));
            }
        }
        let held = self
            .queue_and_wait(&user, &name, lease_id, Vec::new(), false)
            .await?;
        Ok(tonic::Response::new(lpb::LockResponse {
            header: self.header(held.revision),
            key: held.enqueued.key,
        }))
    }

    async fn unlock(&self, req: Request<lpb::UnlockRequest>) -> Reply<lpb::UnlockResponse> {
        let (name, lease) = parse_key(&req.get_ref().key)?;
        let user = self
            .users
            .permit(&req, "LOCK.RELEASE", &[name.as_bytes()])?;
        if !self.node.stamp_semantics().keyspace_locks()
            && self.release_lock(&user, name, lease, None).await?
        {
            return Ok(tonic::Response::new(lpb::UnlockResponse {
                header: self.header_now(),
            }));
        }
        // etcd's Unlock: a delete of the key.
        let (revision, _) = self
            .write_as(
                &user,
                EtcdCommand::DeleteRange(DeleteRangeRequest {
                    range: KeyRange::key(req.into_inner().key),
                    prev_kv: false,
                }),
            )
            .await?;
        Ok(tonic::Response::new(lpb::UnlockResponse {
            header: self.header(revision),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_back_to_their_name_and_lease() {
        assert_eq!(
            parse_key(b"jobs/a/694d7a1b").expect("key"),
            ("jobs/a".to_owned(), 0x694d7a1b)
        );
        for bad in [
            &b"nolease"[..],
            b"/1f",
            b"x/",
            b"x/zz",
            b"x/01f",
            b"x/1F",
            b"\xff/1",
        ] {
            assert!(parse_key(bad).is_err(), "{bad:?}");
        }
        assert!(lock_lease(0).is_err());
        assert!(lock_name(b"").is_err());
    }
}
