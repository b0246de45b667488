//! etcd's lock and election recipe on the keyspace, run on the server (under apply rules
//! [`Semantics::KEYSPACE_LOCKS`](fenced_core::Semantics::KEYSPACE_LOCKS)), as etcd's
//! `v3lock` and `v3election` servers run clientv3's `concurrency.Mutex` and `Election`:
//!
//! * **Enqueue**: one txn puts `name/<lease id in hex>` attached to the lease if the key does
//!   not exist (`create_revision = 0`), else reads it — a lease that already waits or holds
//!   reuses its key. The key's `create_revision` is its place in the queue and, once it
//!   holds, **the fencing token** (a store revision: `FENCE.SET` and `fenced-fence-check`
//!   take it).
//! * **Wait**: the key holds the lock when no live key under `name/` has a lower create
//!   revision (prefix nesting as in etcd: lock `a` also waits for the keys of `a/b`). The
//!   wait is woken by the keyspace's change feed (as a watch is) and reads this node's
//!   applied state: no polling, no herd of RPCs. Reading a follower's state is safe because
//!   the condition is monotone — keys created later have higher create revisions, so once
//!   no lower key is live none ever is again. Whoever deletes the key below (Unlock, Resign,
//!   a KV delete or txn, a lease's end) hands the lock to the next key; grants follow create
//!   revision order, so tokens increase in grant order.
//! * **Withdraw**: a call whose client went away (deadline, cancel, disconnect) before its
//!   key held deletes the key with a txn comparing its `create_revision` — idempotent, no
//!   request id, nothing depending on the dedup window; retried a few times across a leader
//!   change. If this member dies mid-wait (or the withdrawal cannot commit), the key lives on
//!   the client's lease until the lease ends, as in etcd — and meanwhile holds its place, so
//!   the lease's owner should revoke it (every etcd client does when its session closes).

use std::time::Duration;

use fenced_core::etcd::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyRange, PutRequest, RangeRequest,
    RequestOp, ResponseOp, TxnRequest,
};
use fenced_core::{Command, EtcdCommand, EtcdReply, Response, StateMachine};
use fenced_resp::acl::User;
use tokio::task::JoinHandle;
use tonic::Status;

use super::{not_etcd, status_of, EtcdApi};
use crate::error::NodeError;

/// Attempts of an enqueue or withdrawal txn whose outcome is unknown (both are idempotent).
const ATTEMPTS: u32 = 5;
/// The first pause between attempts (doubled each time).
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A call's key in a queue, as the enqueue txn found or made it.
#[derive(Clone, Debug)]
pub(super) struct Enqueued {
    pub(super) key: Vec<u8>,
    /// The key's create revision: its place, and its token once it holds.
    pub(super) create_revision: u64,
    /// The txn's revision (etcd's `Campaign` answers with this header).
    pub(super) revision: u64,
    /// The value the key held when the txn found it (`None`: the txn put it).
    pub(super) found_value: Option<Vec<u8>>,
}

/// How a waiting key stands in this node's state.
enum Turn {
    /// It holds: no live key under the prefix is older (the state's revision).
    Holds(u64),
    /// An older key is live, or the state has not applied the key's txn yet.
    Behind,
    /// The key was deleted (or is another generation now).
    Gone,
}

/// The user a call runs as: name, administrator.
type Caller = (String, bool);

fn caller(user: &User) -> Caller {
    (user.name().to_owned(), user.is_admin())
}

/// The queue's prefix: `name/`.
pub(super) fn queue_prefix(name: &str) -> Vec<u8> {
    format!("{name}/").into_bytes()
}

fn turn(sm: &StateMachine, prefix: &[u8], key: &[u8], create_revision: u64) -> Turn {
    if sm.revision() < create_revision {
        return Turn::Behind;
    }
    let mine = sm
        .etcd_range(&RangeRequest::new(KeyRange::key(key.to_vec())))
        .ok()
        .and_then(|r| r.kvs.into_iter().next());
    if mine.map(|kv| kv.create_revision) != Some(create_revision) {
        return Turn::Gone;
    }
    let mut older = RangeRequest::new(KeyRange::prefix(prefix.to_vec()));
    older.max_create_revision = create_revision.saturating_sub(1);
    older.limit = 1;
    older.keys_only = true;
    match sm.etcd_range(&older) {
        Ok(r) if r.kvs.is_empty() => Turn::Holds(sm.revision()),
        _ => Turn::Behind,
    }
}

/// Whether an error leaves a write's outcome unknown (it may have applied): worth another
/// attempt of an idempotent txn.
fn maybe_applied(e: &NodeError) -> bool {
    !matches!(e, NodeError::Rejected(_))
}

async fn propose_txn(
    api: &EtcdApi,
    who: &Caller,
    txn: TxnRequest,
) -> Result<(u64, fenced_core::etcd::TxnResponse), Status> {
    let mut pause = RETRY_PAUSE;
    let mut attempt = 1;
    loop {
        let cmd = Command::Etcd(EtcdCommand::Txn(txn.clone())).as_user(&who.0, who.1);
        match api.node.propose(None, cmd).await {
            Ok(Response::Etcd {
                revision,
                reply: EtcdReply::Txn(t),
                ..
            }) => return Ok((revision, t)),
            Ok(other) => return Err(not_etcd(other)),
            Err(e) if attempt < ATTEMPTS && maybe_applied(&e) => {
                tracing::debug!(error = %e, attempt, "an etcd lock txn's outcome is unknown: again");
            }
            Err(e) => return Err(status_of(e)),
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
        attempt += 1;
    }
}

/// etcd runs `Lock` and `Campaign` through its own client library (`v3lock`, `v3election`),
/// whose errors are not gRPC statuses: they reach the caller as `Unknown` with the error's
/// text ("etcdserver: requested lease not found" for a lease that is gone). The same here,
/// for the errors of the recipe's own keyspace operations.
fn recipe_error(status: Status) -> Status {
    if status.code() == tonic::Code::NotFound {
        Status::unknown(status.message())
    } else {
        status
    }
}

/// Put `key` on `lease` holding `value` unless it exists; either way, its create revision.
async fn enqueue(
    api: EtcdApi,
    who: Caller,
    key: Vec<u8>,
    lease: i64,
    value: Vec<u8>,
) -> Result<Enqueued, Status> {
    let mut put = PutRequest::new(key.clone(), value);
    put.lease = lease;
    let txn = TxnRequest {
        compare: vec![Compare {
            range: KeyRange::key(key.clone()),
            result: CompareResult::Equal,
            target: CompareTarget::CreateRevision(0),
        }],
        success: vec![RequestOp::Put(put)],
        failure: vec![RequestOp::Range(RangeRequest::new(KeyRange::key(
            key.clone(),
        )))],
    };
    let (revision, t) = propose_txn(&api, &who, txn).await?;
    if t.succeeded {
        return Ok(Enqueued {
            key,
            create_revision: revision,
            revision,
            found_value: None,
        });
    }
    match t.responses.into_iter().next() {
        Some(ResponseOp::Range(r)) => match r.kvs.into_iter().next() {
            Some(kv) => Ok(Enqueued {
                key,
                create_revision: kv.create_revision,
                revision,
                found_value: Some(kv.value),
            }),
            // Deleted between the compare and the read cannot happen in one txn.
            None => Err(Status::internal(
                "fenced: the lock key vanished inside its txn",
            )),
        },
        other => Err(Status::internal(format!(
            "fenced: unexpected txn answer {other:?}"
        ))),
    }
}

/// Delete `key` if its create revision is `create_revision` (idempotent): whether it was
/// deleted by this call.
pub(super) async fn delete_generation(
    api: &EtcdApi,
    who: &Caller,
    key: Vec<u8>,
    create_revision: u64,
) -> Result<(u64, bool), Status> {
    let txn = TxnRequest {
        compare: vec![Compare {
            range: KeyRange::key(key.clone()),
            result: CompareResult::Equal,
            target: CompareTarget::CreateRevision(
                i64::try_from(create_revision).unwrap_or(i64::MAX),
            ),
        }],
        success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
            range: KeyRange::key(key),
            prev_kv: false,
        })],
        failure: Vec::new(),
    };
    let (revision, t) = propose_txn(api, who, txn).await?;
    Ok((revision, t.succeeded))
}

/// Withdraws a call's key when dropped armed: the call ended before its key held (or before
/// the client was told it does). If the enqueue txn is still in flight, the withdrawal waits
/// for it to learn the key's create revision.
struct Withdraw {
    api: EtcdApi,
    who: Caller,
    key: Vec<u8>,
    create_revision: Option<u64>,
    pending: Option<JoinHandle<Result<Enqueued, Status>>>,
    armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let api = self.api.clone();
        let who = std::mem::take(&mut self.who);
        let key = std::mem::take(&mut self.key);
        let known = self.create_revision;
        let pending = self.pending.take();
        tokio::spawn(async move {
            let create_revision = match (known, pending) {
                (Some(rev), _) => rev,
                (None, Some(task)) => match task.await {
                    Ok(Ok(e)) => e.create_revision,
                    _ => return,
                },
                (None, None) => return,
            };
            match delete_generation(&api, &who, key, create_revision).await {
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    "withdrawing an abandoned etcd Lock/Campaign key failed: it lives on its \
                     lease until the lease ends"
                ),
            }
        });
    }
}

/// What a caller got: its key, and the revision its answer names.
pub(super) struct Held {
    pub(super) enqueued: Enqueued,
    /// The revision at which the key was seen holding (the txn's if it held at once).
    pub(super) revision: u64,
}

impl EtcdApi {
    /// Queue `lease`'s key under `name/` (holding `value` if it is put) and wait until it
    /// holds. `on_found` runs when the key existed already with another value (Campaign
    /// proclaims it). If the call is dropped before, the key is withdrawn.
    pub(super) async fn queue_and_wait(
        &self,
        user: &User,
        name: &str,
        lease: i64,
        value: Vec<u8>,
        proclaim_found: bool,
    ) -> Result<Held, Status> {
        let key = fenced_core::lock_key(name, lease.unsigned_abs());
        let who = caller(user);
        let task = tokio::spawn(enqueue(
            self.clone(),
            who.clone(),
            key.clone(),
            lease,
            value.clone(),
        ));
        let mut guard = Withdraw {
            api: self.clone(),
            who: who.clone(),
            key: key.clone(),
            create_revision: None,
            pending: Some(task),
            armed: true,
        };
        let joined = match guard.pending.as_mut() {
            Some(task) => task.await,
            None => return Err(Status::internal("fenced: no enqueue task")),
        };
        guard.pending = None;
        let enqueued = match joined {
            Ok(Ok(e)) => e,
            Ok(Err(status)) => {
                guard.armed = false;
                return Err(recipe_error(status));
            }
            Err(e) => {
                guard.armed = false;
                return Err(Status::internal(format!(
                    "fenced: the enqueue task failed: {e}"
                )));
            }
        };
        guard.create_revision = Some(enqueued.create_revision);
        if proclaim_found && enqueued.found_value.as_ref().is_some_and(|v| *v != value) {
            let rev = i64::try_from(enqueued.create_revision).unwrap_or(i64::MAX);
            if self
                .put_leader_value(user, name, lease.unsigned_abs(), lease, rev, value)
                .await?
                .is_none()
            {
                return Err(Status::unknown("election: not leader"));
            }
        }
        let revision = self
            .wait_turn(&queue_prefix(name), &key, enqueued.create_revision, lease)
            .await?;
        guard.armed = false;
        let revision = revision.unwrap_or(enqueued.revision);
        Ok(Held { enqueued, revision })
    }

    /// Wait until `key` (created at `create_revision`) is the oldest live key under `prefix`:
    /// the revision it was seen holding at, `None` if it held at the first look.
    async fn wait_turn(
        &self,
        prefix: &[u8],
        key: &[u8],
        create_revision: u64,
        lease: i64,
    ) -> Result<Option<u64>, Status> {
        let mut changes = self.node.hub().etcd_changes();
        let mut first = true;
        loop {
            match self.node.local(|sm| turn(sm, prefix, key, create_revision)) {
                Turn::Holds(at) => return Ok((!first).then_some(at)),
                Turn::Gone => {
                    let lease_lives = self
                        .node
                        .read_timed(|sm, now| sm.session_info(lease.unsigned_abs(), now).is_some())
                        .await
                        .unwrap_or(false);
                    return Err(if lease_lives {
                        Status::aborted(
                            "fenced: the lock's key was deleted while its call waited \
                             (another call of the same lease was withdrawn, or a client \
                             deleted it)",
                        )
                    } else {
                        super::lease::not_found(lease)
                    });
                }
                Turn::Behind => {}
            }
            first = false;
            if changes.changed().await.is_err() {
                return Err(Status::unavailable("fenced: the node is shutting down"));
            }
        }
    }
}
