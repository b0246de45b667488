//! The leader's half of forwarding (`fenced.raft.v1.Forward`): proposals and read-index
//! rounds that followers pass on.

use fenced_core::{Command, RequestId};
use fenced_network::codec;
use fenced_proto::raft::forward_server::{Forward, ForwardServer};
use fenced_proto::raft::{
    AdminReply, AdminRequest, CampaignReply, CampaignRequest, CheckReply, CheckRequest,
    ProposeBatchReply, ProposeBatchRequest, ProposeReply, ProposeRequest, ReadIndexReply,
    ReadIndexRequest,
};
use fenced_tls::PeerCertCheck;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

use super::LOG_TIME_HEADER;
use crate::node::Node;

type Reply<T> = Result<tonic::Response<T>, Status>;

/// Node-to-node forwarding; with TLS, only for callers with a node certificate.
pub fn forward_server(
    node: Node,
    check: PeerCertCheck,
) -> InterceptedService<ForwardServer<Leader>, PeerCertCheck> {
    InterceptedService::new(
        ForwardServer::new(Leader { node })
            .max_decoding_message_size(fenced_network::MAX_MESSAGE_SIZE),
        check,
    )
}

/// Answers followers' forwarded calls on the leader.
pub struct Leader {
    node: Node,
}

impl Leader {
    /// A forwarded proposal's answer. Its entry is applied here: tell the follower the log
    /// time this node reached ([`LOG_TIME_HEADER`]).
    fn with_log_time<T>(&self, body: T) -> tonic::Response<T> {
        let log_time = self.node.local(|sm| sm.now());
        let mut reply = tonic::Response::new(body);
        reply
            .metadata_mut()
            .insert(LOG_TIME_HEADER, log_time.into());
        reply
    }
}

#[tonic::async_trait]
impl Forward for Leader {
    async fn propose(&self, req: Request<ProposeRequest>) -> Reply<ProposeReply> {
        let req = req.into_inner();
        self.node.admit_peer(req.from.as_ref())?;
        let (rid, cmd): (Option<RequestId>, Command) = codec::decode(&req.data)
            .map_err(|e| Status::invalid_argument(format!("malformed proposal: {e}")))?;
        let queues = matches!(cmd, Command::Acquire { .. } | Command::AcquireWith(_));
        let resp = match rid {
            // A queued acquire waits here, on the leader, which applies the grant first.
            Some(rid) if req.wait_ms > 0 && queues => {
                self.node.acquire_here(rid, cmd, req.wait_ms).await?
            }
            _ => self.node.propose_local(rid, cmd).await?,
        };
        let data = codec::encode(&resp).map_err(|e| Status::internal(e.to_string()))?;
        Ok(self.with_log_time(ProposeReply { data }))
    }

    async fn propose_batch(&self, req: Request<ProposeBatchRequest>) -> Reply<ProposeBatchReply> {
        let req = req.into_inner();
        self.node.admit_peer(req.from.as_ref())?;
        let proposals: Vec<(Option<RequestId>, Command)> = codec::decode(&req.data)
            .map_err(|e| Status::invalid_argument(format!("malformed proposals: {e}")))?;
        // Not the leader: one answer for all, with the hint.
        self.node.check_leader()?;
        let results = self.node.propose_local_all(proposals).await;
        let data = codec::encode(&results).map_err(|e| Status::internal(e.to_string()))?;
        Ok(self.with_log_time(ProposeBatchReply { data }))
    }

    /// A leader handing off asks this voter to campaign ([`Node::campaign`]).
    async fn campaign(&self, req: Request<CampaignRequest>) -> Reply<CampaignReply> {
        let req = req.into_inner();
        self.node.admit_peer(req.from.as_ref())?;
        let from = req.from.as_ref().map_or(0, |f| f.member);
        self.node
            .campaign(from, std::time::Duration::from_millis(req.after_ms))?;
        Ok(tonic::Response::new(CampaignReply {}))
    }

    /// A follower passes on an administrative call ([`crate::admin`]).
    async fn admin(&self, req: Request<AdminRequest>) -> Reply<AdminReply> {
        let req = req.into_inner();
        self.node.admit_peer(req.from.as_ref())?;
        let op: crate::admin::AdminOp = codec::decode(&req.data)
            .map_err(|e| Status::invalid_argument(format!("malformed admin call: {e}")))?;
        let result = self.node.admin_here(op).await;
        let data = codec::encode(&result).map_err(|e| Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(AdminReply { data }))
    }

    /// The leader's check ([`crate::node::alarm`]): this member's apply rules and digests,
    /// and the leader's verdict on them.
    async fn check(&self, req: Request<CheckRequest>) -> Reply<CheckReply> {
        let req = req.into_inner();
        self.node.admit_peer(req.from.as_ref())?;
        let from = req.from.as_ref().map_or(0, |f| f.member);
        Ok(tonic::Response::new(self.node.answer_check(
            from,
            req.term,
            req.corrupt,
        )))
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
