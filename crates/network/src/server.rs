//! Server side: `fenced.raft.v1.Raft` in front of the local openraft node.

use std::error::Error;
use std::sync::Arc;

use fenced_proto::raft::raft_server::{Raft as RaftRpc, RaftServer};
use fenced_proto::raft::{RaftReply, RaftRequest};
use fenced_raft_types::Raft;
use fenced_tls::PeerCertCheck;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::codec::{decode, encode};
use crate::{PeerGate, PeerObserver, MAX_MESSAGE_SIZE};

/// Serves openraft's append-entries, vote and install-snapshot RPCs for the local node.
///
/// A caller that fails the identity checks ([`PeerGate::admit`]) is refused with
/// `FAILED_PRECONDITION`; a request whose payload does not decode is rejected with
/// `INVALID_ARGUMENT`; an error
/// returned by openraft (e.g. the node is shutting down) is sent back bincode-encoded in
/// [`RaftReply::error`] and surfaces on the caller as `RPCError::RemoteError`.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    gate: PeerGate,
    observer: Option<Arc<dyn PeerObserver>>,
}

impl RaftService {
    pub fn new(raft: Raft, gate: PeerGate) -> Self {
        Self {
            raft,
            gate,
            observer: None,
        }
    }

    /// Report answered appends to `observer` ([`PeerObserver::append_answered`]).
    pub fn with_observer(mut self, observer: Option<Arc<dyn PeerObserver>>) -> Self {
        self.observer = observer;
        self
    }

    /// Check the caller's identity ([`PeerGate::admit_raft`]; for entries from a leader,
    /// [`PeerGate::admit_raft_entries`]) and decode its payload.
    fn admit<T: DeserializeOwned>(
        &self,
        request: Request<RaftRequest>,
        what: &str,
        entries: bool,
    ) -> Result<T, Status> {
        let req = request.into_inner();
        {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            if entries {
                self.gate
                    .admit_raft_entries(req.from.as_ref(), membership)?;
            } else {
                let settled = *metrics.membership_config.log_id() <= metrics.last_applied;
                self.gate
                    .admit_raft_vote(req.from.as_ref(), membership, settled)?;
            }
        }
        decode(&req.data)
            .map_err(|e| Status::invalid_argument(format!("malformed {what} request: {e}")))
    }

    fn reply<T: Serialize, E: Error + Serialize>(
        &self,
        result: Result<T, E>,
    ) -> Result<Response<RaftReply>, Status> {
        let incarnation = self.gate.identity().incarnation();
        let reply = match result {
            Ok(resp) => RaftReply {
                data: encode(&resp).map_err(|e| Status::internal(e.to_string()))?,
                error: Vec::new(),
                incarnation,
            },
            Err(err) => RaftReply {
                data: Vec::new(),
                error: encode(&err).map_err(|e| Status::internal(e.to_string()))?,
                incarnation,
            },
        };
        Ok(Response::new(reply))
    }
}

/// The tonic service to add to the node's gRPC router, with the transport's message-size
/// limits ([`MAX_MESSAGE_SIZE`]) applied, behind `check` (with TLS, only callers holding a
/// node certificate get through). Answered appends go to `observer`, if any (the latency
/// breakdown's follower side).
pub fn raft_server(
    raft: Raft,
    gate: PeerGate,
    check: PeerCertCheck,
    observer: Option<Arc<dyn PeerObserver>>,
) -> InterceptedService<RaftServer<RaftService>, PeerCertCheck> {
    InterceptedService::new(
        RaftServer::new(RaftService::new(raft, gate).with_observer(observer))
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
        check,
    )
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let received = std::time::Instant::now();
        let req: openraft::raft::AppendEntriesRequest<fenced_raft_types::TypeConfig> =
            self.admit(request, "append-entries", true)?;
        let range = req
            .entries
            .first()
            .zip(req.entries.last())
            .map(|(f, l)| (f.log_id.index, l.log_id.index));
        let answer = self.raft.append_entries(req).await;
        if let (Some((first, last)), Some(o), Ok(_)) = (range, &self.observer, &answer) {
            o.append_answered(first, last, received);
        }
        self.reply(answer)
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let req = self.admit(request, "vote", false)?;
        self.reply(self.raft.vote(req).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let req = self.admit(request, "install-snapshot", true)?;
        self.reply(self.raft.install_snapshot(req).await)
    }
}
