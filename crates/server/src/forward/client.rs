//! The follower's half of forwarding: proposals batched per leader address
//! ([`FORWARD_LIMITS`]), a waiting acquire in a call of its own, read-index rounds, and the
//! leader's log time from the answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use fenced_core::{Command, RequestId, Response};
use fenced_network::{codec, Links, PeerGate};
use fenced_proto::raft::forward_server::Forward;
use fenced_proto::raft::{
    AdminRequest, CampaignRequest, CheckReply, CheckRequest, CorruptVerdict, PeerIdentity,
    ProposeBatchRequest, ProposeRequest, ReadIndexRequest,
};
use fenced_raft_types::{NodeId, Raft};

use super::LOG_TIME_HEADER;
use crate::batch::{Batcher, Limits};
use crate::error::{NodeError, LEADER_HINT};
use crate::proposal::{self, stopped, Proposal, Proposed, PROPOSE_TIMEOUT, WAIT_SLACK};

/// Forwarding from a follower to the leader: calls in flight at once per leader, and the
/// bounds of one forwarded batch.
const FORWARD_LIMITS: Limits = Limits {
    in_flight: 2,
    max_items: 1024,
    max_bytes: 1024 * 1024,
    // A forwarded batch stays far below the leader's decode limit (64 MiB): a large command
    // goes in a call of its own, one over the cap is refused here, alone.
    cap_bytes: proposal::MAX_ENTRY_BYTES,
    // Set from `--max-pending-requests`.
    max_queued: usize::MAX,
};

/// A node's calls to the leader, through its [`Links`] (production: gRPC channels per
/// address).
pub(crate) struct Forwarder {
    /// Who the members are (the identity sent with a call names the member called).
    raft: Raft,
    /// Identity checks of node-to-node calls, both directions.
    gate: PeerGate,
    /// How calls reach the other nodes' `Forward` services.
    links: Arc<dyn Links>,
    /// Proposals forwarded to the leader, batched per leader address.
    batchers: Mutex<HashMap<String, Batcher<Proposal, Proposed>>>,
    /// The largest log time a leader reported with a forwarded answer ([`LOG_TIME_HEADER`]).
    leader_log_time: AtomicU64,
    /// `--max-pending-requests`: the bound of each batcher's queue.
    max_queued: usize,
    /// Most requests in one forwarded batch (the test hook `forward_max_items`, else
    /// [`FORWARD_LIMITS`]'s).
    max_items: usize,
    me: Weak<Forwarder>,
}

impl Forwarder {
    pub(crate) fn new(
        raft: Raft,
        gate: PeerGate,
        links: Arc<dyn Links>,
        max_queued: usize,
        max_items: Option<usize>,
    ) -> Arc<Forwarder> {
        Arc::new_cyclic(|me| Forwarder {
            raft,
            gate,
            links,
            batchers: Mutex::new(HashMap::new()),
            leader_log_time: AtomicU64::new(0),
            max_queued,
            max_items: max_items.unwrap_or(FORWARD_LIMITS.max_items).max(1),
            me: me.clone(),
        })
    }

    /// The largest log time a leader reported with a forwarded answer (0 before any).
    pub(crate) fn leader_log_time(&self) -> u64 {
        self.leader_log_time.load(Ordering::Relaxed)
    }

    /// Have the leader at `addr` propose `cmd` (and, with `wait_ms`, wait for a queued
    /// acquire's resolution). Without a wait the command joins this node's next forwarded
    /// batch to that leader ([`FORWARD_LIMITS`]).
    pub(crate) async fn forward(
        &self,
        addr: &str,
        rid: Option<RequestId>,
        cmd: &Command,
        wait_ms: u64,
    ) -> Result<Response, NodeError> {
        if wait_ms == 0 {
            let mut out = self.forward_all(addr, vec![(rid, cmd.clone())]).await;
            return out.pop().unwrap_or_else(|| Err(batcher_stopped()));
        }
        self.forward_one(addr, rid, cmd, wait_ms).await
    }

    /// Have the leader at `addr` propose `proposals`, in order, in this node's next
    /// forwarded batches to it ([`FORWARD_LIMITS`]); one result each.
    pub(crate) async fn forward_all(&self, addr: &str, proposals: Vec<Proposal>) -> Vec<Proposed> {
        let sized = proposals.into_iter().map(|p| {
            let size = proposal::size(&p.1);
            (p, size)
        });
        self.batcher(addr)
            .call_all(sized, |why| {
                Err(crate::node::refused(why, "the forwarding batcher stopped"))
            })
            .await
    }

    /// One read-index round on the leader at `addr`: `(read index, leader log time)`.
    pub(crate) async fn read_index(&self, addr: &str) -> Result<(u64, u64), NodeError> {
        let (client, from) = self.peer(addr)?;
        let mut req = tonic::Request::new(ReadIndexRequest { from: Some(from) });
        req.set_timeout(PROPOSE_TIMEOUT);
        let reply = tokio::time::timeout(PROPOSE_TIMEOUT, client.read_index(req))
            .await
            .map_err(|_| no_answer())?;
        match reply {
            Ok(r) => {
                let r = r.into_inner();
                Ok((r.index, r.time_ms))
            }
            Err(status) => Err(self.refused(&status)),
        }
    }

    /// Ask the voter at `addr` to campaign from `after` on (a leadership hand-off).
    pub(crate) async fn campaign(&self, addr: &str, after: Duration) -> Result<(), NodeError> {
        let (client, from) = self.peer(addr)?;
        let mut req = tonic::Request::new(CampaignRequest {
            from: Some(from),
            after_ms: after.as_millis() as u64,
        });
        req.set_timeout(Duration::from_secs(1));
        match tokio::time::timeout(Duration::from_secs(1), client.campaign(req)).await {
            Err(_) => Err(NodeError::Unknown(format!("{addr} did not answer in time"))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(self.refused(&status)),
        }
    }

    /// The leader's check of the member at `addr` ([`crate::node::alarm`]): its apply rules
    /// and recent digests, telling it the verdict `corrupt` if set.
    pub(crate) async fn check(
        &self,
        addr: &str,
        term: u64,
        corrupt: Option<CorruptVerdict>,
        timeout: Duration,
    ) -> Result<CheckReply, tonic::Status> {
        let (client, from) = self
            .peer(addr)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let mut req = tonic::Request::new(CheckRequest {
            from: Some(from),
            term,
            corrupt,
        });
        req.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.check(req)).await {
            Err(_) => Err(tonic::Status::deadline_exceeded("no answer in time")),
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => {
                self.gate.on_refusal(&status);
                Err(status)
            }
        }
    }

    /// Run an administrative call on the leader at `addr` ([`crate::admin`]).
    pub(crate) async fn admin(
        &self,
        addr: &str,
        op: &crate::admin::AdminOp,
    ) -> Result<crate::admin::AdminDone, NodeError> {
        let (client, from) = self.peer(addr)?;
        let data = codec::encode(op).map_err(|e| NodeError::Invalid(e.to_string()))?;
        let timeout = PROPOSE_TIMEOUT + op.patience() + Duration::from_secs(5);
        let mut req = tonic::Request::new(AdminRequest {
            from: Some(from),
            data,
        });
        req.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.admin(req)).await {
            Err(_) => Err(no_answer()),
            Ok(Ok(r)) => {
                codec::decode::<Result<crate::admin::AdminDone, NodeError>>(&r.into_inner().data)
                    .map_err(|e| NodeError::Unknown(format!("malformed admin answer: {e}")))?
            }
            Ok(Err(status)) => Err(self.refused(&status)),
        }
    }

    /// The `Forward` service of the node at `addr`, and the identity to send with a call to
    /// it.
    fn peer(&self, addr: &str) -> Result<(Arc<dyn Forward>, PeerIdentity), NodeError> {
        let to = self.member_at(addr);
        let service = self
            .links
            .forward(to, addr)
            .map_err(|e| NodeError::Invalid(format!("leader address {addr}: {e}")))?;
        Ok((service, self.gate.envelope(to)))
    }

    /// The batcher of forwarded proposals to the leader at `addr`.
    fn batcher(&self, addr: &str) -> Batcher<Proposal, Proposed> {
        let mut all = self.batchers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = all.get(addr) {
            return b.clone();
        }
        // A leader that moved leaves its batcher behind; forget them all now and then.
        if all.len() > 16 {
            all.clear();
        }
        let me = self.me.clone();
        let to = addr.to_owned();
        let limits = Limits {
            max_queued: self.max_queued,
            max_items: self.max_items,
            ..FORWARD_LIMITS
        };
        let b = Batcher::spawn(limits, move |batch: Vec<Proposal>| {
            let me = me.upgrade();
            let to = to.clone();
            async move {
                match me {
                    Some(me) => me.forward_batch(&to, batch).await,
                    None => stopped(batch.len()),
                }
            }
        });
        all.insert(addr.to_owned(), b.clone());
        b
    }

    /// One forwarding call carrying several proposals; one result each.
    async fn forward_batch(&self, addr: &str, proposals: Vec<Proposal>) -> Vec<Proposed> {
        let n = proposals.len();
        let err = |e: NodeError| vec![Err(e); n];
        let data = match codec::encode(&proposals) {
            Ok(d) => d,
            Err(e) => return err(NodeError::Invalid(format!("encoding: {e}"))),
        };
        let (client, from) = match self.peer(addr) {
            Ok(c) => c,
            Err(e) => return err(e),
        };
        let mut req = tonic::Request::new(ProposeBatchRequest {
            data,
            from: Some(from),
        });
        req.set_timeout(PROPOSE_TIMEOUT);
        let reply = match tokio::time::timeout(PROPOSE_TIMEOUT, client.propose_batch(req)).await {
            Err(_) => return err(no_answer()),
            Ok(Err(status)) => return err(self.refused(&status)),
            Ok(Ok(reply)) => reply,
        };
        self.note_leader_log_time(reply.metadata());
        match codec::decode::<Vec<Proposed>>(&reply.into_inner().data) {
            Ok(out) if out.len() == n => out.into_iter().map(proposal::forwarded).collect(),
            Ok(out) => err(NodeError::Unknown(format!(
                "the leader answered {} of {n} proposals",
                out.len()
            ))),
            Err(e) => err(NodeError::Unknown(format!("bad reply from leader: {e}"))),
        }
    }

    /// One forwarding call for one proposal (a waiting acquire: the leader waits for it).
    async fn forward_one(
        &self,
        addr: &str,
        rid: Option<RequestId>,
        cmd: &Command,
        wait_ms: u64,
    ) -> Result<Response, NodeError> {
        let data =
            codec::encode(&(rid, cmd)).map_err(|e| NodeError::Invalid(format!("encoding: {e}")))?;
        let (client, from) = self.peer(addr)?;
        let mut req = tonic::Request::new(ProposeRequest {
            data,
            wait_ms,
            from: Some(from),
        });
        let waiting = if wait_ms > 0 {
            Duration::from_millis(wait_ms) + WAIT_SLACK
        } else {
            Duration::ZERO
        };
        let deadline = PROPOSE_TIMEOUT + waiting;
        req.set_timeout(deadline);
        let reply = tokio::time::timeout(deadline, client.propose(req))
            .await
            .map_err(|_| no_answer())?;
        match reply {
            Ok(reply) => {
                self.note_leader_log_time(reply.metadata());
                codec::decode(&reply.into_inner().data)
                    .map_err(|e| NodeError::Unknown(format!("bad reply from leader: {e}")))
            }
            Err(status) => Err(self.refused(&status)),
        }
    }

    /// Remember the log time a leader reported with a forwarded answer.
    fn note_leader_log_time(&self, meta: &tonic::metadata::MetadataMap) {
        let log_time = meta
            .get(LOG_TIME_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(t) = log_time {
            self.leader_log_time.fetch_max(t, Ordering::Relaxed);
        }
    }

    /// The member serving at `addr` in the membership this node knows (0 if none).
    fn member_at(&self, addr: &str) -> NodeId {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let found = metrics
            .membership_config
            .membership()
            .nodes()
            .find(|(_, n)| n.addr == addr)
            .map_or(0, |(id, _)| *id);
        found
    }

    /// A forwarding call was refused: retire if the peer said this node is stale; the
    /// status as a node error.
    fn refused(&self, status: &tonic::Status) -> NodeError {
        self.gate.on_refusal(status);
        status_to_error(status)
    }
}

fn batcher_stopped() -> NodeError {
    NodeError::Unknown("the forwarding batcher stopped".into())
}

fn no_answer() -> NodeError {
    NodeError::Unknown("the leader did not answer in time".into())
}

/// Turn a status from a peer back into a node error, keeping the leader hint.
pub fn status_to_error(status: &tonic::Status) -> NodeError {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            let hint = status
                .metadata()
                .get(LEADER_HINT)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if status.message().starts_with("not the leader") {
                NodeError::NotLeader { leader: hint }
            } else {
                NodeError::Unknown(status.message().to_owned())
            }
        }
        tonic::Code::InvalidArgument => NodeError::Invalid(status.message().to_owned()),
        _ => NodeError::Unknown(format!("{}: {}", status.code(), status.message())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_network::{NetworkFactory, TransportError};
    use fenced_proto::raft::raft_server::Raft as RaftRpc;
    use fenced_proto::raft::{
        AdminReply, CampaignReply, ProposeBatchReply, ProposeReply, ReadIndexReply,
    };
    use fenced_raft_types::identity::{Identity, IdentityStore, MemberState};
    use tonic::{Request, Response as Reply, Status};

    /// A leader's forwarding service in miniature: answers batches (slowly, so that callers
    /// meanwhile gather in the next batch) with the log time, refuses read rounds as "not
    /// the leader", never answers a campaign.
    #[derive(Default)]
    struct Stub {
        batches: Mutex<Vec<usize>>,
        senders: Mutex<Vec<PeerIdentity>>,
        unreachable: std::sync::atomic::AtomicBool,
    }

    #[tonic::async_trait]
    impl Forward for Stub {
        async fn propose(&self, _: Request<ProposeRequest>) -> Result<Reply<ProposeReply>, Status> {
            Err(Status::unimplemented("batches only"))
        }

        async fn propose_batch(
            &self,
            req: Request<ProposeBatchRequest>,
        ) -> Result<Reply<ProposeBatchReply>, Status> {
            if self.unreachable.load(Ordering::Relaxed) {
                return Err(Status::unavailable("simulated: leader unreachable"));
            }
            let req = req.into_inner();
            let from = req
                .from
                .ok_or_else(|| Status::failed_precondition("no id"))?;
            self.senders.lock().expect("senders").push(from);
            let batch: Vec<Proposal> =
                codec::decode(&req.data).map_err(|e| Status::invalid_argument(e.to_string()))?;
            self.batches.lock().expect("batches").push(batch.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
            let answers: Vec<Proposed> = batch.iter().map(|_| Ok(Response::NotGranted)).collect();
            let data = codec::encode(&answers).map_err(|e| Status::internal(e.to_string()))?;
            let mut reply = Reply::new(ProposeBatchReply { data });
            reply.metadata_mut().insert(LOG_TIME_HEADER, 4242u64.into());
            Ok(reply)
        }

        async fn read_index(
            &self,
            _: Request<ReadIndexRequest>,
        ) -> Result<Reply<ReadIndexReply>, Status> {
            Err(NodeError::NotLeader {
                leader: Some("127.0.0.1:7001".into()),
            }
            .into())
        }

        async fn campaign(
            &self,
            _: Request<CampaignRequest>,
        ) -> Result<Reply<CampaignReply>, Status> {
            std::future::pending().await
        }

        async fn admin(&self, _: Request<AdminRequest>) -> Result<Reply<AdminReply>, Status> {
            Err(Status::unimplemented("batches only"))
        }

        async fn check(&self, _: Request<CheckRequest>) -> Result<Reply<CheckReply>, Status> {
            Err(Status::unimplemented("batches only"))
        }
    }

    /// Links on which every forwarding call reaches the stub.
    struct ToStub(Arc<Stub>);

    impl Links for ToStub {
        fn raft(&self, target: NodeId, addr: &str) -> Result<Arc<dyn RaftRpc>, TransportError> {
            Err(TransportError::InvalidAddress {
                node: target,
                addr: addr.to_owned(),
                reason: "no raft calls here".into(),
            })
        }

        fn forward(&self, _: NodeId, _: &str) -> Result<Arc<dyn Forward>, TransportError> {
            Ok(self.0.clone())
        }
    }

    /// A forwarder of member 1 (its Raft uninitialized, calling nobody) over the stub.
    async fn forwarder(dir: &std::path::Path) -> (Arc<Forwarder>, Arc<Stub>, Raft) {
        let identity = Identity::new(7, 1, MemberState::Ready);
        fenced_raft_types::identity::store(dir, &identity).expect("identity");
        let gate = PeerGate::new(
            Arc::new(IdentityStore::new(dir, identity)),
            "127.0.0.1:7000",
        );
        let (log, sm) =
            fenced_storage::open(dir, Arc::new(|_: &[fenced_core::Event]| {})).expect("storage");
        let config = openraft::Config::default().validate().expect("config");
        let raft = Raft::new(
            1,
            Arc::new(config),
            NetworkFactory::new(gate.clone()),
            log,
            sm,
        )
        .await
        .expect("raft");
        let stub = Arc::new(Stub::default());
        let links = Arc::new(ToStub(stub.clone()));
        (
            Forwarder::new(raft.clone(), gate, links, 1000, None),
            stub,
            raft,
        )
    }

    /// The production forwarder over a `Links` that is a function call: proposals batch,
    /// carry this member's identity, and bring the leader's log time back; the leader's
    /// refusal keeps its hint; an unreachable leader leaves the outcome unknown; a call never
    /// answered ends at the forwarder's own deadline.
    #[tokio::test]
    async fn the_forwarder_over_in_process_links() {
        let dir = tempfile::tempdir().expect("tmp");
        let (fwd, stub, raft) = forwarder(dir.path()).await;
        let cmd = Command::OpenSession { ttl_ms: 1000 };

        let calls = (0..10).map(|_| fwd.forward("127.0.0.1:7001", None, &cmd, 0));
        for answer in futures::future::join_all(calls).await {
            assert!(matches!(answer, Ok(Response::NotGranted)), "{answer:?}");
        }
        let batches = stub.batches.lock().expect("batches").clone();
        assert_eq!(batches.iter().sum::<usize>(), 10);
        assert!(batches.len() < 10, "batched: {batches:?}");
        assert_eq!(fwd.leader_log_time(), 4242);
        let senders = stub.senders.lock().expect("senders").clone();
        assert!(senders.iter().all(|s| s.member == 1 && s.cluster_id == 7));

        let refused = fwd.read_index("127.0.0.1:7001").await;
        assert!(
            matches!(&refused, Err(NodeError::NotLeader { leader: Some(l) }) if l == "127.0.0.1:7001"),
            "{refused:?}"
        );

        stub.unreachable.store(true, Ordering::Relaxed);
        let lost = fwd.forward("127.0.0.1:7001", None, &cmd, 0).await;
        assert!(matches!(lost, Err(NodeError::Unknown(_))), "{lost:?}");

        let started = tokio::time::Instant::now();
        let silent = fwd
            .campaign("127.0.0.1:7001", Duration::from_millis(10))
            .await;
        assert!(
            matches!(&silent, Err(NodeError::Unknown(m)) if m.contains("did not answer")),
            "{silent:?}"
        );
        assert!(started.elapsed() >= Duration::from_secs(1));
        raft.shutdown().await.expect("shutdown");
    }
}
