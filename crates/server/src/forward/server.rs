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
use crate::error::NodeError;
use crate::node::Node;
use crate::proposal::Proposed;

type Reply<T> = Result<tonic::Response<T>, Status>;

/// The most bytes of a forwarded batch's answers: what the follower decodes
/// ([`fenced_network::MAX_MESSAGE_SIZE`]), less room for the message around them.
const ANSWERS_LIMIT: usize = fenced_network::MAX_MESSAGE_SIZE - 64 * 1024;

/// Encode a forwarded batch's answers, at most `limit` bytes. Answers can be larger than the
/// commands (a `GETDEL` of a large value, a script's reply): if they do not fit, the largest
/// become "outcome unknown" — their commands were applied, but their answers cannot travel
/// back; the caller may ask again with the same request id on the leader — until the rest
/// fits. Before, one large answer made every answer of the batch unknown.
fn encode_answers(mut answers: Vec<Proposed>, limit: usize) -> Result<Vec<u8>, Status> {
    if let Ok(data) = codec::encode(&answers) {
        if data.len() <= limit {
            return Ok(data);
        }
    }
    // Encoded sizes without encoding (never less than the transport's encoding).
    let sizes: Vec<usize> = answers
        .iter()
        .map(|a| bincode::serialized_size(a).map_or(usize::MAX, |n| n as usize))
        .collect();
    let mut total = sizes.iter().fold(64usize, |t, s| t.saturating_add(*s));
    let mut largest: Vec<usize> = (0..answers.len()).collect();
    largest.sort_by_key(|i| std::cmp::Reverse(sizes[*i]));
    for i in largest {
        if total <= limit {
            break;
        }
        let replaced = Err(NodeError::Unknown(format!(
            "applied, but its answer of {} bytes is larger than a forwarded reply may carry; \
             ask again with the same request id on the leader",
            sizes[i]
        )));
        total = total.saturating_sub(sizes[i]).saturating_add(256);
        answers[i] = replaced;
    }
    codec::encode(&answers).map_err(|e| Status::internal(e.to_string()))
}

/// Node-to-node forwarding; with TLS, only for callers with a node certificate.
pub fn forward_server(
    node: Node,
    check: PeerCertCheck,
) -> InterceptedService<ForwardServer<Leader>, PeerCertCheck> {
    InterceptedService::new(
        ForwardServer::new(Leader::new(node))
            .max_decoding_message_size(fenced_network::MAX_MESSAGE_SIZE),
        check,
    )
}

/// Answers followers' forwarded calls on the leader.
pub struct Leader {
    node: Node,
}

impl Leader {
    /// The forwarding service of `node`. [`forward_server`] serves it over gRPC; a simulator
    /// calls it directly (through its `fenced_network::Links`).
    pub fn new(node: Node) -> Leader {
        Leader { node }
    }

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
        let queues = matches!(
            cmd.inner(),
            Command::Acquire { .. } | Command::AcquireWith(_) | Command::EtcdLock { .. }
        );
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
        let data = encode_answers(results, ANSWERS_LIMIT)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_core::kv::{KvResponse, Reply as KvReply};
    use fenced_core::Response;

    fn bulk(bytes: usize) -> Proposed {
        Ok(Response::Kv(KvResponse {
            replies: vec![KvReply::Bulk(vec![b'v'; bytes])],
        }))
    }

    /// One answer too large to travel back makes only that one unknown, not the batch.
    #[test]
    fn an_answer_too_large_to_forward_is_unknown_alone() {
        let answers = vec![bulk(10), bulk(6_000), bulk(20), bulk(3_000)];
        let data = encode_answers(answers, 5_000).expect("encoded");
        assert!(data.len() <= 5_000, "{} bytes", data.len());
        let back: Vec<Proposed> = codec::decode(&data).expect("decoded");
        assert!(
            matches!(&back[1], Err(NodeError::Unknown(m)) if m.contains("larger than a forwarded reply"))
        );
        for i in [0, 2, 3] {
            assert!(back[i].is_ok(), "answer {i}: {:?}", back[i]);
        }
        // What fits goes unchanged.
        let answers = vec![bulk(10), bulk(20)];
        let data = encode_answers(answers.clone(), 5_000).expect("encoded");
        assert_eq!(data, codec::encode(&answers).expect("encoded"));
    }
}
