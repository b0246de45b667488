//! `etcdserverpb.Lease`: an etcd lease **is** a fenced session. Its id is the session id
//! (the revision of the command that opened it), its TTL runs in log time like every session
//! (decided by the leader's `Tick`s, never reset by a leader change), and the etcd keys a
//! `Put` attached to it are deleted, as delete events at one revision, by whatever ends it:
//! `LeaseRevoke`, `Session.Close`/`SESSION.CLOSE`, or its expiry. A session opened over
//! fenced's gRPC or RESP is a lease etcd clients see (`LeaseLeases`, `LeaseTimeToLive`) and
//! may attach keys to.
//!
//! * `LeaseGrant` proposes [`Command::OpenLease`] with etcd's TTL rules
//!   ([`core::lease_ttl`]): raised to [`core::MIN_LEASE_TTL_S`], refused above
//!   [`core::MAX_LEASE_TTL_S`]. A client-chosen ID is refused: fenced assigns lease ids.
//! * `LeaseKeepAlive` streams' requests (of every stream on this node) are **coalesced**: a
//!   single task collects what arrives within [`KEEPALIVE_LINGER`] (and while its previous
//!   proposal is in flight) and keeps them all alive in one [`Command::KeepAliveMany`]
//!   ([`KeepAlives`]). A stream's requests are answered concurrently, each when its batch
//!   commits, so a client keeping thousands of leases on one stream is not served one
//!   commit at a time.
//! * `LeaseTimeToLive` and `LeaseLeases` take the read path with the committed time
//!   ([`crate::node::Node::read_timed`]): a lease's time left is judged at a log time the log
//!   holds, so it counts down across a leader change.
//! * Like every etcd write, a grant or revoke is proposed without a request id.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_core::etcd::{self as core, EtcdError};
use fenced_core::{Command, Response, SessionId, SessionLife};
use fenced_proto::etcd::etcdserverpb as epb;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_stream::Stream;
use tonic::{Request, Status, Streaming};

use epb::lease_server::Lease;

use super::{etcd_status, not_etcd, status_of, EtcdApi, Reply};
use crate::node::Node;
use fenced_resp::acl::User;

/// Most sessions one [`Command::KeepAliveMany`] keeps alive (8 bytes each in the entry).
pub const MAX_KEEPALIVE_BATCH: usize = 16_384;

/// Queued keep-alives waiting for the coalescer.
const QUEUE: usize = 65_536;

/// How long the coalescer goes on collecting after the first keep-alive of a batch: a
/// keep-alive is answered up to this much later, and a node proposes at most one
/// [`Command::KeepAliveMany`] per this (plus a commit) however many leases it keeps alive.
/// etcd's clients send a lease's keep-alive every TTL/3, ≥ 666 ms.
pub const KEEPALIVE_LINGER: Duration = Duration::from_millis(50);

/// Keep-alives of one `LeaseKeepAlive` stream in flight at once (etcd's Go client sends every
/// lease of a client on one stream): past it the stream's next request waits.
const STREAM_IN_FLIGHT: usize = 16_384;

type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<epb::LeaseKeepAliveResponse, Status>> + Send>>;

type Answer = oneshot::Sender<Result<Option<SessionLife>, Status>>;

/// Who keeps a lease alive: a user's name and whether it is an administrator (a session
/// belongs to the user who opened it, [`Command::AsUser`]).
type Asker = (String, bool);

/// The keep-alive coalescer of a node: one task, started on first use, that proposes the
/// keep-alives of every `LeaseKeepAlive` stream in [`Command::KeepAliveMany`] commands, one
/// at a time — what arrives while one is in flight goes into the next.
pub struct KeepAlives {
    node: Node,
    tx: Mutex<Option<mpsc::Sender<(Asker, SessionId, Answer)>>>,
}

impl KeepAlives {
    pub fn new(node: Node) -> KeepAlives {
        KeepAlives {
            node,
            tx: Mutex::new(None),
        }
    }

    /// Keep session `id` alive for `asker`: its new deadline and TTL, `None` if it does not
    /// exist (or belongs to another user).
    pub async fn keep_alive(
        &self,
        asker: Asker,
        id: SessionId,
    ) -> Result<Option<SessionLife>, Status> {
        let tx = {
            let mut guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_ref() {
                Some(tx) if !tx.is_closed() => tx.clone(),
                _ => {
                    let (tx, rx) = mpsc::channel(QUEUE);
                    tokio::spawn(coalesce(self.node.clone(), rx));
                    *guard = Some(tx.clone());
                    tx
                }
            }
        };
        let (answer, rx) = oneshot::channel();
        tx.send((asker, id, answer))
            .await
            .map_err(|_| Status::unavailable("the keep-alive coalescer stopped"))?;
        rx.await
            .map_err(|_| Status::unavailable("the keep-alive coalescer stopped"))?
    }
}

/// The coalescer's loop: take the keep-alives that arrive within [`KEEPALIVE_LINGER`] of
/// the first (up to [`MAX_KEEPALIVE_BATCH`] distinct sessions), propose them as one command
/// per user who asked, answer each; again.
async fn coalesce(node: Node, mut rx: mpsc::Receiver<(Asker, SessionId, Answer)>) {
    while let Some((asker, id, answer)) = rx.recv().await {
        let mut waiting: BTreeMap<Asker, BTreeMap<SessionId, Vec<Answer>>> = BTreeMap::new();
        waiting
            .entry(asker)
            .or_default()
            .entry(id)
            .or_default()
            .push(answer);
        let mut count = 1;
        let until = tokio::time::Instant::now() + KEEPALIVE_LINGER;
        while count < MAX_KEEPALIVE_BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some((asker, id, answer))) => {
                    let sessions = waiting.entry(asker).or_default();
                    if !sessions.contains_key(&id) {
                        count += 1;
                    }
                    sessions.entry(id).or_default().push(answer);
                }
                Ok(None) | Err(_) => break,
            }
        }
        // One command per user, proposed together; the next round waits for all of them.
        let mut round = tokio::task::JoinSet::new();
        for ((user, admin), waiting) in waiting {
            round.spawn(keep_alive_many(node.clone(), user, admin, waiting));
        }
        while round.join_next().await.is_some() {}
    }
}

/// Propose the keep-alives of one user's sessions as one command; answer each.
async fn keep_alive_many(
    node: Node,
    user: String,
    admin: bool,
    waiting: BTreeMap<SessionId, Vec<Answer>>,
) {
    let sessions: Vec<SessionId> = waiting.keys().copied().collect();
    let cmd = Command::KeepAliveMany {
        sessions: sessions.clone(),
    };
    let out = node.propose(None, cmd.as_user(&user, admin)).await;
    {
        match out {
            Ok(Response::SessionsAlive { alive }) if alive.len() == sessions.len() => {
                for (life, answers) in alive.into_iter().zip(waiting.into_values()) {
                    for a in answers {
                        let _ = a.send(Ok(life));
                    }
                }
            }
            other => {
                let status = match other {
                    Err(e) => status_of(e),
                    Ok(r) => not_etcd(r),
                };
                for a in waiting.into_values().flatten() {
                    let _ = a.send(Err(status.clone()));
                }
            }
        }
    }
}

/// Seconds as etcd's `int64`.
fn secs(ms: u64) -> i64 {
    i64::try_from(ms / 1000).unwrap_or(i64::MAX)
}

pub(super) fn not_found(id: i64) -> Status {
    etcd_status(&EtcdError::LeaseNotFound { lease: id })
}

/// What `LeaseTimeToLive` reads: (seconds left, granted seconds, keys), or `None`.
type TimeToLive = Option<(i64, i64, Vec<Vec<u8>>)>;

#[tonic::async_trait]
impl Lease for EtcdApi {
    async fn lease_grant(
        &self,
        req: Request<epb::LeaseGrantRequest>,
    ) -> Reply<epb::LeaseGrantResponse> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let r = req.into_inner();
        // A chosen id is a session id: positive (etcd's ids are too, in practice: clientv3
        // and etcdctl read them as hex of an int64).
        if r.id < 0 {
            return Err(etcd_status(&EtcdError::LeaseIdChosen { lease: r.id }));
        }
        let ttl = core::lease_ttl(r.ttl).map_err(|e| etcd_status(&e))?;
        let ttl_ms = u64::try_from(ttl).unwrap_or(1).saturating_mul(1000);
        let cmd = match u64::try_from(r.id) {
            Ok(id) if id != 0 => Command::GrantLease { id, ttl_ms },
            _ => Command::OpenLease { ttl_ms },
        };
        match self
            .node
            .propose(None, cmd.as_user(user.name(), user.is_admin()))
            .await
            .map_err(status_of)?
        {
            Response::SessionOpened { session, .. } => {
                // The lease id is not always the revision that granted it any more (a chosen
                // one, or an assigned one past a chosen one): the header names this node's
                // revision, which the grant has reached.
                let revision = self.node.local(|sm| sm.revision());
                Ok(tonic::Response::new(epb::LeaseGrantResponse {
                    header: self.header(revision),
                    id: lease_id(session),
                    ttl,
                    error: String::new(),
                }))
            }
            other => Err(not_etcd(other)),
        }
    }

    async fn lease_revoke(
        &self,
        req: Request<epb::LeaseRevokeRequest>,
    ) -> Reply<epb::LeaseRevokeResponse> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let id = req.into_inner().id;
        let session = core::lease_session(id).ok_or_else(|| not_found(id))?;
        if !user.all_keys() {
            // Its locks and keys as of a linearizable read (as `Session.Close` does; etcd
            // asks for write permission on every attached key).
            let (locks, keys) = self
                .node
                .read_timed(|sm, now| {
                    (
                        sm.session_info(session, now)
                            .map(|i| i.locks)
                            .unwrap_or_default(),
                        sm.lease_keys(session),
                    )
                })
                .await
                .map_err(status_of)?;
            let names: Vec<&[u8]> = locks.iter().map(|l| l.as_bytes()).collect();
            user.permit("LOCK.RELEASE", &names)
                .map_err(crate::users::denied)?;
            if !keys.is_empty() {
                let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                user.permit("DEL", &keys).map_err(crate::users::denied)?;
            }
        }
        match self
            .node
            .propose(
                None,
                Command::CloseSession { session }.as_user(user.name(), user.is_admin()),
            )
            .await
            .map_err(status_of)?
        {
            Response::SessionClosed => Ok(tonic::Response::new(epb::LeaseRevokeResponse {
                header: self.header_now(),
            })),
            Response::NoSuchSession => Err(not_found(id)),
            other => Err(not_etcd(other)),
        }
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<epb::LeaseKeepAliveRequest>>,
    ) -> Reply<Self::LeaseKeepAliveStream> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let asker: Asker = (user.name().to_owned(), user.is_admin());
        self.node.serving().map_err(status_of)?;
        // clientv3's lessor opens its stream with `hasleader: true` (WithRequireLeader): on a
        // member without a leader it ends, and the client keeps its leases alive elsewhere.
        let mut require_leader = super::watch::RequireLeader::of(self, &req)?;
        let mut input = req.into_inner();
        let (tx, rx) = mpsc::channel(256);
        let api = self.clone();
        // Each request is answered by a task of its own, so that many leases on one stream
        // are kept alive together (one coalesced command), not one commit after another.
        let in_flight = Arc::new(Semaphore::new(STREAM_IN_FLIGHT));
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = input.message() => m,
                    () = tx.closed() => return,
                    () = super::watch::RequireLeader::lost(&mut require_leader) => {
                        let _ = tx.send(Err(super::watch::no_leader())).await;
                        return;
                    }
                };
                let id = match msg {
                    Ok(Some(m)) => m.id,
                    Ok(None) | Err(_) => return,
                };
                let permit = tokio::select! {
                    p = in_flight.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                    () = tx.closed() => return,
                };
                let (api, tx, asker) = (api.clone(), tx.clone(), asker.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let life = match core::lease_session(id) {
                        Some(s) => api.keep_alives.keep_alive(asker, s).await,
                        None => Ok(None),
                    };
                    // An error ends the stream: the client reconnects (to another member).
                    let answer = life.map(|life| epb::LeaseKeepAliveResponse {
                        header: api.header_now(),
                        id,
                        // etcd's: the granted TTL after a renewal, 0 for a lease not found.
                        ttl: life.map_or(0, |l| secs(l.ttl_ms)),
                    });
                    let _ = tx.send(answer).await;
                });
            }
        });
        let out: KeepAliveStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(tonic::Response::new(out))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<epb::LeaseTimeToLiveRequest>,
    ) -> Reply<epb::LeaseTimeToLiveResponse> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let r = req.into_inner();
        let (id, with_keys) = (r.id, r.keys);
        let session = core::lease_session(id);
        // Judged at a committed log time: the same answer on every node, and never more
        // time left than the leader would grant (module docs of `node::read`).
        let (revision, found): (u64, TimeToLive) = self
            .node
            .read_timed(|sm, now| {
                let found = session.and_then(|s| {
                    // Another user's lease is not found for this one (stricter than etcd).
                    if owned_by_another(sm, s, &user) {
                        return None;
                    }
                    let info = sm.session_info(s, now)?;
                    let left = info.deadline_ms.checked_sub(now).filter(|l| *l > 0)?;
                    let keys = if with_keys {
                        sm.lease_keys(s)
                    } else {
                        Vec::new()
                    };
                    // etcd truncates the seconds left (`int64(Remaining().Seconds())`).
                    Some((secs(left), secs(info.ttl_ms), keys))
                });
                (sm.revision(), found)
            })
            .await
            .map_err(status_of)?;
        let (ttl, granted_ttl, keys) = found.unwrap_or((-1, 0, Vec::new()));
        Ok(tonic::Response::new(epb::LeaseTimeToLiveResponse {
            header: self.header(revision),
            id,
            ttl,
            granted_ttl,
            keys,
        }))
    }

    async fn lease_leases(
        &self,
        req: Request<epb::LeaseLeasesRequest>,
    ) -> Reply<epb::LeaseLeasesResponse> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let (revision, ids) = self
            .node
            .read_timed(|sm, now| {
                let ids: Vec<SessionId> = sm
                    .session_ids()
                    .into_iter()
                    .filter(|s| !owned_by_another(sm, *s, &user))
                    .filter(|s| sm.session_info(*s, now).is_some())
                    .collect();
                (sm.revision(), ids)
            })
            .await
            .map_err(status_of)?;
        Ok(tonic::Response::new(epb::LeaseLeasesResponse {
            header: self.header(revision),
            leases: ids
                .into_iter()
                .map(|s| epb::LeaseStatus { id: lease_id(s) })
                .collect(),
        }))
    }
}

/// Session `s` was opened by a user other than `user`, who is no administrator.
fn owned_by_another(sm: &fenced_core::StateMachine, s: SessionId, user: &User) -> bool {
    !user.is_admin() && sm.session_owner(s).is_some_and(|o| o != user.name())
}

/// A session id as etcd's lease id.
fn lease_id(s: SessionId) -> i64 {
    i64::try_from(s).unwrap_or(i64::MAX)
}

/// Shared by every clone of the etcd services' handler on a node.
pub(super) type SharedKeepAlives = Arc<KeepAlives>;
