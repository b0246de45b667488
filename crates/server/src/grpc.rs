//! The gRPC front end: `fenced.v1` (Lock, Session, Cluster) for clients and
//! `fenced.raft.v1.Forward` for followers forwarding to the leader.

use std::pin::Pin;
use std::time::Duration;

use fenced_core::kv::{KvCommand, Reply as KvReply};
use fenced_core::{
    AcquireSpec, Command, Event, LockKind, Mode, ReleaseReason, RequestId, Response,
};
use fenced_proto::raft::forward_server::{Forward, ForwardServer};
use fenced_proto::raft::{
    ProposeBatchReply, ProposeBatchRequest, ProposeReply, ProposeRequest, ReadIndexReply,
    ReadIndexRequest,
};
use fenced_proto::v1 as pb;
use fenced_proto::v1::cluster_server::{Cluster, ClusterServer};
use fenced_proto::v1::kv_server::{Kv, KvServer};
use fenced_proto::v1::lock_server::{Lock, LockServer};
use fenced_proto::v1::session_server::{Session, SessionServer};
use fenced_tls::PeerCertCheck;
use openraft::ServerState;
use rand::Rng;
use tokio_stream::Stream;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

use crate::error::NodeError;
use crate::node::Node;

/// Largest client API message (requests are small; this bounds a malicious one).
const MAX_CLIENT_MESSAGE: usize = 1024 * 1024;

type Reply<T> = Result<tonic::Response<T>, Status>;

pub fn lock_server(node: Node) -> LockServer<Api> {
    LockServer::new(Api { node }).max_decoding_message_size(MAX_CLIENT_MESSAGE)
}

pub fn session_server(node: Node) -> SessionServer<Api> {
    SessionServer::new(Api { node }).max_decoding_message_size(MAX_CLIENT_MESSAGE)
}

pub fn kv_server(node: Node) -> KvServer<Api> {
    KvServer::new(Api { node }).max_decoding_message_size(MAX_CLIENT_MESSAGE)
}

pub fn cluster_server(node: Node) -> ClusterServer<Api> {
    ClusterServer::new(Api { node })
}

/// Node-to-node forwarding; with TLS, only for callers with a node certificate.
pub fn forward_server(
    node: Node,
    check: PeerCertCheck,
) -> InterceptedService<ForwardServer<Api>, PeerCertCheck> {
    InterceptedService::new(
        ForwardServer::new(Api { node })
            .max_decoding_message_size(fenced_network::MAX_MESSAGE_SIZE),
        check,
    )
}

pub struct Api {
    node: Node,
}

/// The request id of a call; calls without one get a random one-off id, so that retries
/// inside the cluster are still deduplicated.
fn request_id(id: Option<pb::RequestId>) -> Result<RequestId, Status> {
    match id {
        Some(pb::RequestId { client_id, seq }) if client_id != 0 && seq != 0 => {
            Ok(RequestId { client_id, seq })
        }
        Some(_) => Err(Status::invalid_argument(
            "request id needs a nonzero client_id and seq",
        )),
        None => Ok(RequestId {
            client_id: rand::thread_rng().gen_range(1..u64::MAX),
            seq: 1,
        }),
    }
}

fn unexpected(r: Response) -> Status {
    match r {
        Response::Rejected(e) => NodeError::Rejected(e).into(),
        other => Status::internal(format!("unexpected state machine response {other:?}")),
    }
}

fn opt_session(s: u64) -> Option<u64> {
    (s != 0).then_some(s)
}

impl Api {
    /// A reply to a client call, with the leader's address in `x-fenced-leader` when this node
    /// is a follower, so that clients can go to the leader and skip the forwarding hop.
    fn reply<T>(&self, msg: T) -> tonic::Response<T> {
        let mut r = tonic::Response::new(msg);
        if let Some(addr) = self.node.leader_hint().and_then(|a| a.parse().ok()) {
            r.metadata_mut().insert(crate::error::LEADER_HINT, addr);
        }
        r
    }

    /// Lease left until `deadline_ms`, for the answer to a proposal this node just made.
    fn remaining(&self, deadline_ms: u64) -> u64 {
        deadline_ms.saturating_sub(self.node.log_time())
    }

    fn granted(
        &self,
        token: u64,
        holds: u32,
        deadline_ms: Option<u64>,
        session: Option<u64>,
    ) -> pb::AcquireResponse {
        let deadline = deadline_ms.or_else(|| {
            session.and_then(|s| {
                self.node
                    .local(|sm| sm.session_info(s).map(|i| i.deadline_ms))
            })
        });
        pb::AcquireResponse {
            granted: true,
            token,
            holds,
            deadline_ms: deadline_ms.unwrap_or(0),
            ttl_ms: deadline.map_or(0, |d| self.remaining(d)),
        }
    }
}

#[tonic::async_trait]
impl Lock for Api {
    async fn acquire(&self, req: Request<pb::AcquireRequest>) -> Reply<pb::AcquireResponse> {
        let r = req.into_inner();
        let rid = request_id(r.request)?;
        let session = opt_session(r.session);
        let mode = match pb::LockMode::try_from(r.mode) {
            Ok(pb::LockMode::Exclusive) => Mode::Exclusive,
            Ok(pb::LockMode::Read) => Mode::Read,
            Ok(pb::LockMode::Write) => Mode::Write,
            Ok(pb::LockMode::Permit) => Mode::Permit { permits: r.permits },
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown lock mode {}",
                    r.mode
                )))
            }
        };
        let cmd = if mode == Mode::Exclusive && r.names.is_empty() && r.lock_delay_ms == 0 {
            Command::Acquire {
                name: r.name,
                owner: r.owner,
                ttl_ms: r.ttl_ms,
                session,
                wait_ms: r.wait_ms,
            }
        } else {
            Command::AcquireWith(Box::new(AcquireSpec {
                names: if r.names.is_empty() {
                    vec![r.name]
                } else {
                    r.names
                },
                owner: r.owner,
                mode,
                ttl_ms: r.ttl_ms,
                session,
                wait_ms: r.wait_ms,
                lock_delay_ms: r.lock_delay_ms,
            }))
        };
        let not_granted = pb::AcquireResponse::default();
        let resolved = self.node.acquire(rid, cmd, r.wait_ms).await?;
        let out = match resolved {
            Response::Granted {
                token,
                holds,
                deadline_ms,
            } => self.granted(token, holds, deadline_ms, session),
            Response::NotGranted => not_granted,
            Response::Pending => return Err(Status::unavailable(
                "outcome unknown: the wait did not resolve in time; retry with the same request id",
            )),
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(out))
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Reply<pb::ReleaseResponse> {
        let r = req.into_inner();
        let rid = request_id(r.request)?;
        let cmd = if r.names.is_empty() {
            Command::Release {
                name: r.name,
                owner: r.owner,
                token: r.token,
            }
        } else {
            Command::ReleaseAll {
                names: r.names,
                owner: r.owner,
                token: r.token,
            }
        };
        let out = match self.node.propose(Some(rid), cmd).await? {
            Response::Released { holds } => pb::ReleaseResponse {
                released: true,
                holds,
            },
            Response::NotHeld => pb::ReleaseResponse::default(),
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(out))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Reply<pb::RenewResponse> {
        let r = req.into_inner();
        let rid = request_id(r.request)?;
        let cmd = Command::Renew {
            name: r.name,
            owner: r.owner,
            token: r.token,
            ttl_ms: r.ttl_ms,
        };
        let out = match self.node.propose(Some(rid), cmd).await? {
            Response::Renewed { deadline_ms } => pb::RenewResponse {
                renewed: true,
                deadline_ms,
            },
            Response::NotHeld => pb::RenewResponse::default(),
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(out))
    }

    async fn info(&self, req: Request<pb::InfoRequest>) -> Reply<pb::InfoResponse> {
        let name = req.into_inner().name;
        let read_time = self.node.read_barrier_time().await?;
        let (info, waiters, applied) = self
            .node
            .local(|sm| (sm.lock_info(&name), sm.waiter_count(&name), sm.now()));
        // Count the lease left from the leader's log clock at the read: the last applied
        // entry can be up to a lease old on an idle cluster, which would overstate it.
        let now = applied.max(read_time);
        let Some(i) = info else {
            return Ok(self.reply(pb::InfoResponse {
                waiters: waiters as u32,
                ..Default::default()
            }));
        };
        let (kind, permits) = match i.kind {
            LockKind::Exclusive => ("exclusive", 0),
            LockKind::ReadWrite => ("read-write", 0),
            LockKind::Semaphore { permits } => ("semaphore", permits),
        };
        let holders = i
            .holders
            .iter()
            .map(|h| pb::Holder {
                owner: h.owner.clone(),
                token: h.token,
                holds: h.holds,
                ttl_ms: h.deadline_ms.saturating_sub(now),
                session: h.session.unwrap_or(0),
                mode: proto_mode(h.mode) as i32,
            })
            .collect();
        Ok(self.reply(pb::InfoResponse {
            held: true,
            owner: i.owner,
            token: i.token,
            holds: i.holds,
            ttl_ms: i.deadline_ms.saturating_sub(now),
            session: i.session.unwrap_or(0),
            waiters: i.waiters as u32,
            kind: kind.into(),
            permits,
            holders,
        }))
    }

    async fn force_unlock(
        &self,
        req: Request<pb::ForceUnlockRequest>,
    ) -> Reply<pb::ForceUnlockResponse> {
        let r = req.into_inner();
        let rid = request_id(r.request)?;
        let released = match self
            .node
            .propose(Some(rid), Command::ForceUnlock { name: r.name })
            .await?
        {
            Response::Released { .. } => true,
            Response::NotHeld => false,
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(pb::ForceUnlockResponse { released }))
    }
}

fn proto_mode(m: Mode) -> pb::LockMode {
    match m {
        Mode::Exclusive => pb::LockMode::Exclusive,
        Mode::Read => pb::LockMode::Read,
        Mode::Write => pb::LockMode::Write,
        Mode::Permit { .. } => pb::LockMode::Permit,
    }
}

fn reason_name(r: ReleaseReason) -> &'static str {
    match r {
        ReleaseReason::Released => "released",
        ReleaseReason::Expired => "expired",
        ReleaseReason::SessionExpired => "session_expired",
        ReleaseReason::SessionClosed => "session_closed",
        ReleaseReason::ForceUnlocked => "force_unlocked",
    }
}

/// How often a lock-loss watch checks that its session still exists (it may end without an
/// event reaching this node, e.g. when the node catches up by snapshot).
const WATCH_CHECK: Duration = Duration::from_millis(500);

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Session for Api {
    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Reply<Self::WatchStream> {
        let session = req.into_inner().session;
        let node = self.node.clone();
        let mut released = node.hub().watch_released();
        // The session must exist now (linearizable), or the watch ends at once.
        let exists = node.read(|sm| sm.session_info(session).is_some()).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let gone = pb::SessionEvent {
                reason: "session_gone".into(),
                ..Default::default()
            };
            if !exists {
                let _ = tx.send(Ok(gone)).await;
                return;
            }
            let mut check = tokio::time::interval(WATCH_CHECK);
            loop {
                let event = tokio::select! {
                    e = released.recv() => e,
                    _ = check.tick() => {
                        if node.local(|sm| sm.session_info(session).is_none()) {
                            let _ = tx.send(Ok(gone)).await;
                            return;
                        }
                        continue;
                    }
                    () = tx.closed() => return,
                };
                let msg = match event {
                    Ok(Event::LockReleased {
                        name,
                        owner,
                        session: Some(s),
                        token,
                        reason,
                    }) if s == session => pb::SessionEvent {
                        name,
                        token,
                        owner,
                        reason: reason_name(reason).into(),
                    },
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => pb::SessionEvent {
                        reason: "lagged".into(),
                        ..Default::default()
                    },
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
        });
        let stream: WatchStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(tonic::Response::new(stream))
    }

    async fn open(&self, req: Request<pb::OpenSessionRequest>) -> Reply<pb::OpenSessionResponse> {
        let r = req.into_inner();
        let rid = request_id(r.request)?;
        match self
            .node
            .propose(Some(rid), Command::OpenSession { ttl_ms: r.ttl_ms })
            .await?
        {
            Response::SessionOpened { session, .. } => Ok(self.reply(pb::OpenSessionResponse {
                session,
                ttl_ms: r.ttl_ms,
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn keep_alive(&self, req: Request<pb::KeepAliveRequest>) -> Reply<pb::KeepAliveResponse> {
        let r = req.into_inner();
        let rid = request_id(r.request)?;
        match self
            .node
            .propose(Some(rid), Command::KeepAlive { session: r.session })
            .await?
        {
            Response::SessionAlive { deadline_ms } => Ok(self.reply(pb::KeepAliveResponse {
                alive: true,
                ttl_ms: self.remaining(deadline_ms),
            })),
            Response::NoSuchSession => Ok(self.reply(pb::KeepAliveResponse::default())),
            other => Err(unexpected(other)),
        }
    }

    async fn close(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        let r = req.into_inner();
        let rid = request_id(r.request)?;
        let closed = match self
            .node
            .propose(Some(rid), Command::CloseSession { session: r.session })
            .await?
        {
            Response::SessionClosed => true,
            Response::NoSuchSession => false,
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(pb::CloseSessionResponse { closed }))
    }
}

#[tonic::async_trait]
impl Kv for Api {
    async fn fenced_put(&self, req: Request<pb::FencedPutRequest>) -> Reply<pb::FencedPutResponse> {
        let r = req.into_inner();
        let rid = request_id(r.request)?;
        let argv = vec![
            b"FENCE.SET".to_vec(),
            r.key.clone().into_bytes(),
            r.value,
            r.token.to_string().into_bytes(),
        ];
        let replies = match self
            .node
            .propose(Some(rid), Command::Kv(KvCommand::Batch(vec![argv])))
            .await?
        {
            Response::Kv(k) => k.replies,
            other => return Err(unexpected(other)),
        };
        let (accepted, highest) = match replies.first() {
            Some(KvReply::Status(_)) => (true, r.token),
            // "STALE token N is older than M": M is the mark the entry was checked against.
            Some(KvReply::Error(e)) if e.starts_with("STALE") => {
                let highest = e.rsplit(' ').next().and_then(|m| m.parse().ok());
                (false, highest.unwrap_or(r.token))
            }
            Some(KvReply::Error(e)) => return Err(Status::invalid_argument(e.clone())),
            other => return Err(Status::internal(format!("unexpected reply {other:?}"))),
        };
        Ok(self.reply(pb::FencedPutResponse { accepted, highest }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Reply<pb::GetResponse> {
        let key = req.into_inner().key.into_bytes();
        // Expiry is judged at the leader's log time of the read, not at the last applied
        // entry's (which may be old on an idle cluster).
        let leader_now = self.node.read_barrier_time().await?;
        let (value, fence) = self.node.local(|sm| {
            let argv = [b"GET".to_vec(), key.clone()];
            let now = leader_now.max(sm.now());
            (sm.kv().read(now, &argv), sm.kv().fence(&key))
        });
        let out = match value {
            Some(KvReply::Bulk(v)) => pb::GetResponse {
                found: true,
                value: v,
                fence,
            },
            Some(KvReply::Error(e)) => return Err(Status::failed_precondition(e)),
            _ => pb::GetResponse {
                fence,
                ..Default::default()
            },
        };
        Ok(self.reply(out))
    }
}

#[tonic::async_trait]
impl Cluster for Api {
    async fn status(&self, _req: Request<pb::StatusRequest>) -> Reply<pb::StatusResponse> {
        let m = self.node.raft().metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let members: Vec<pb::Member> = membership
            .nodes()
            .map(|(id, n)| pb::Member {
                id: *id,
                addr: n.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let leader_addr = m
            .current_leader
            .and_then(|l| membership.get_node(&l).map(|n| n.addr.clone()))
            .unwrap_or_default();
        let state = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        Ok(tonic::Response::new(pb::StatusResponse {
            leader: m.current_leader.unwrap_or(0),
            term: m.current_term,
            commit_index: m.last_applied.map_or(0, |l| l.index),
            members,
            id: self.node.id(),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            leader_addr,
            state: state.into(),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            revision: self.node.local(|sm| sm.revision()),
        }))
    }
}

impl Api {
    /// A forwarded proposal's answer. Its entry is applied here: tell the follower the log
    /// time this node reached ([`crate::node::LOG_TIME_HEADER`]).
    fn with_log_time<T>(&self, body: T) -> tonic::Response<T> {
        let log_time = self.node.local(|sm| sm.now());
        let mut reply = tonic::Response::new(body);
        reply
            .metadata_mut()
            .insert(crate::node::LOG_TIME_HEADER, log_time.into());
        reply
    }
}

#[tonic::async_trait]
impl Forward for Api {
    async fn propose(&self, req: Request<ProposeRequest>) -> Reply<ProposeReply> {
        let req = req.into_inner();
        self.node.admit_peer(req.from.as_ref())?;
        let (rid, cmd): (Option<RequestId>, Command) = bincode::deserialize(&req.data)
            .map_err(|e| Status::invalid_argument(format!("malformed proposal: {e}")))?;
        let queues = matches!(cmd, Command::Acquire { .. } | Command::AcquireWith(_));
        let resp = match rid {
            // A queued acquire waits here, on the leader, which applies the grant first.
            Some(rid) if req.wait_ms > 0 && queues => {
                self.node.acquire_here(rid, cmd, req.wait_ms).await?
            }
            _ => self.node.propose_local(rid, cmd).await?,
        };
        let data = bincode::serialize(&resp).map_err(|e| Status::internal(e.to_string()))?;
        Ok(self.with_log_time(ProposeReply { data }))
    }

    async fn propose_batch(&self, req: Request<ProposeBatchRequest>) -> Reply<ProposeBatchReply> {
        let req = req.into_inner();
        self.node.admit_peer(req.from.as_ref())?;
        let proposals: Vec<(Option<RequestId>, Command)> = bincode::deserialize(&req.data)
            .map_err(|e| Status::invalid_argument(format!("malformed proposals: {e}")))?;
        // Not the leader: one answer for all, with the hint.
        self.node.check_leader()?;
        let results = self.node.propose_local_all(proposals).await;
        let data = bincode::serialize(&results).map_err(|e| Status::internal(e.to_string()))?;
        Ok(self.with_log_time(ProposeBatchReply { data }))
    }

    /// A follower's read-index round. It shares this leader's next round (one that starts
    /// after the call arrived) with the leader's own reads.
    async fn read_index(&self, req: Request<ReadIndexRequest>) -> Reply<ReadIndexReply> {
        self.node.admit_peer(req.get_ref().from.as_ref())?;
        self.node.check_leader()?;
        let (index, time_ms) = self.node.shared_read_round().await?;
        Ok(tonic::Response::new(ReadIndexReply { index, time_ms }))
    }
}
