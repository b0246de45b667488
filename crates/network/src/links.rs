//! The seam between a node and its peers: [`Links`] hands out, for a target node, a handle on
//! its Raft service and one on its Forward service. Everything around a call — encoding, the
//! identity envelopes and the [`PeerGate`](crate::PeerGate)'s checks, deadlines, error
//! mapping, the forwarder's batching — is the caller's and the callee's code; a link only
//! carries the call.
//!
//! * Production: [`GrpcLinks`], tonic channels (lazy, cached per node and per address, TLS,
//!   connect timeout, `TCP_NODELAY`, HTTP/2 keep-alive on the Raft channels).
//! * A simulator: handles that pass each `tonic::Request` to the target node's
//!   [`RaftService`](crate::RaftService) or forwarding service (`fenced_server`'s
//!   `forward::server::Leader`) in the same process, and may drop, delay, duplicate or reorder
//!   the call or its answer. What it returns decides what the caller sees:
//!   - "the peer is unreachable": `Err(Status::unavailable(..))` (as a refused connection).
//!     A Raft call maps it to openraft's `RPCError::Unreachable` (openraft backs off); a
//!     forwarded call to "outcome unknown" (`NodeError::Unknown`).
//!   - "the call timed out": never answer (a pending future). The caller's own
//!     `tokio::time::timeout` fires — with paused time, in simulated time: a Raft call becomes
//!     `RPCError::Timeout`, a forwarded one "the leader did not answer in time".
//!   - A delivered call: the callee's own answer, `Ok` or `Err`, unchanged (its metadata, such
//!     as a refusal's `x-fenced-refused` or a forwarded answer's log time, included).
//!
//!   The request carries its deadline as `grpc-timeout` metadata (`tonic::Request::set_timeout`
//!   on the caller); a tonic server cancels the handler after it, a simulator may do the same
//!   or let the handler run on. The TLS peer-certificate check (`fenced_tls::PeerCertCheck`,
//!   an interceptor in front of the tonic services) is not part of the handles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_proto::raft::forward_client::ForwardClient;
use fenced_proto::raft::forward_server::Forward;
use fenced_proto::raft::raft_client::RaftClient;
use fenced_proto::raft::raft_server::Raft as RaftRpc;
use fenced_proto::raft::{
    AdminReply, AdminRequest, CampaignReply, CampaignRequest, CheckReply, CheckRequest,
    ProposeBatchReply, ProposeBatchRequest, ProposeReply, ProposeRequest, RaftReply, RaftRequest,
    ReadIndexReply, ReadIndexRequest,
};
use fenced_raft_types::NodeId;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status};

use crate::{TransportError, DEFAULT_CONNECT_TIMEOUT, MAX_MESSAGE_SIZE};

/// How a node reaches its peers: a call handle per target and service.
///
/// One `Links` serves one node (its calls out): a simulator gives each node its own, which
/// knows the caller. Handles are asked for when a client is created (openraft creates one per
/// replication stream, the forwarder one per call) and may be kept for many calls: a handle
/// that must follow a restarted node resolves its target at call time.
pub trait Links: Send + Sync + 'static {
    /// The Raft service (`fenced.raft.v1.Raft`) of member `target` serving at `addr` (its
    /// address in the membership). An error makes every call of the client `Unreachable`.
    fn raft(&self, target: NodeId, addr: &str) -> Result<Arc<dyn RaftRpc>, TransportError>;

    /// The Forward service (`fenced.raft.v1.Forward`) of the node serving at `addr`; `target`
    /// is its member id as the caller's membership knows it, 0 if it does not (the caller
    /// only has the leader's address): route by `addr`.
    fn forward(&self, target: NodeId, addr: &str) -> Result<Arc<dyn Forward>, TransportError>;
}

/// The production [`Links`]: gRPC over tonic channels, connected lazily and shared by every
/// handle (and every clone of the `GrpcLinks`) to the same node. tonic reconnects a channel
/// after a failure. Raft channels are keyed by member id (a changed address replaces the
/// channel), forwarding channels by address; the two services use separate connections, so a
/// large snapshot does not hold up forwarded proposals.
#[derive(Clone, Debug)]
pub struct GrpcLinks {
    connect_timeout: Duration,
    tls: Option<ClientTlsConfig>,
    raft: Arc<Mutex<HashMap<NodeId, (String, Channel)>>>,
    forward: Arc<Mutex<HashMap<String, Channel>>>,
}

impl Default for GrpcLinks {
    fn default() -> Self {
        Self::new()
    }
}

impl GrpcLinks {
    /// Plain-text links with [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn new() -> GrpcLinks {
        GrpcLinks {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: None,
            raft: Arc::default(),
            forward: Arc::default(),
        }
    }

    /// Sets the timeout for establishing a connection to a peer. Affects channels created
    /// afterwards.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Call peers over TLS with this configuration (the node's identity and the cluster CA,
    /// see `fenced_tls::ServerTls::peer_client`). Affects channels created afterwards.
    pub fn with_tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    fn endpoint(&self, target: NodeId, addr: &str) -> Result<Endpoint, TransportError> {
        Ok(fenced_tls::endpoint(addr, self.tls.as_ref())
            .map_err(|reason| TransportError::InvalidAddress {
                node: target,
                addr: addr.to_owned(),
                reason,
            })?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true))
    }

    /// The cached Raft channel to `target` at `addr`, or a new lazily connecting one.
    fn raft_channel(&self, target: NodeId, addr: &str) -> Result<Channel, TransportError> {
        let mut channels = self.raft.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cached_addr, channel)) = channels.get(&target) {
            if cached_addr == addr {
                return Ok(channel.clone());
            }
        }
        let channel = self
            .endpoint(target, addr)?
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .connect_lazy();
        channels.insert(target, (addr.to_owned(), channel.clone()));
        Ok(channel)
    }

    /// The cached forwarding channel to `addr`, or a new lazily connecting one.
    fn forward_channel(&self, target: NodeId, addr: &str) -> Result<Channel, TransportError> {
        let mut channels = self.forward.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let channel = self.endpoint(target, addr)?.connect_lazy();
        channels.insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }
}

impl Links for GrpcLinks {
    fn raft(&self, target: NodeId, addr: &str) -> Result<Arc<dyn RaftRpc>, TransportError> {
        let client = RaftClient::new(self.raft_channel(target, addr)?)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        Ok(Arc::new(GrpcRaft(client)))
    }

    fn forward(&self, target: NodeId, addr: &str) -> Result<Arc<dyn Forward>, TransportError> {
        let client = ForwardClient::new(self.forward_channel(target, addr)?)
            .max_decoding_message_size(MAX_MESSAGE_SIZE);
        Ok(Arc::new(GrpcForward(client)))
    }
}

/// A Raft handle over a tonic client (each call on a clone of it: tonic's clients take
/// `&mut self`; a clone shares the channel).
struct GrpcRaft(RaftClient<Channel>);

#[tonic::async_trait]
impl RaftRpc for GrpcRaft {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.0.clone().append_entries(request).await
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.0.clone().vote(request).await
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.0.clone().install_snapshot(request).await
    }
}

/// A Forward handle over a tonic client.
struct GrpcForward(ForwardClient<Channel>);

#[tonic::async_trait]
impl Forward for GrpcForward {
    async fn propose(
        &self,
        request: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        self.0.clone().propose(request).await
    }

    async fn propose_batch(
        &self,
        request: Request<ProposeBatchRequest>,
    ) -> Result<Response<ProposeBatchReply>, Status> {
        self.0.clone().propose_batch(request).await
    }

    async fn read_index(
        &self,
        request: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexReply>, Status> {
        self.0.clone().read_index(request).await
    }

    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignReply>, Status> {
        self.0.clone().campaign(request).await
    }

    async fn admin(&self, request: Request<AdminRequest>) -> Result<Response<AdminReply>, Status> {
        self.0.clone().admin(request).await
    }

    async fn check(&self, request: Request<CheckRequest>) -> Result<Response<CheckReply>, Status> {
        self.0.clone().check(request).await
    }
}
