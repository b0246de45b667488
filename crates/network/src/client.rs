//! Client side: openraft's `RaftNetworkFactory` / `RaftNetwork` over [`Links`] (tonic
//! channels in production).

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use fenced_proto::raft::raft_server::Raft as RaftRpc;
use fenced_proto::raft::RaftRequest;
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::error::{
    Infallible, InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError,
    RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;
use tonic::Code;

use crate::codec::{decode, encode};
use crate::links::{GrpcLinks, Links};
use crate::{PeerGate, TransportError, MAX_MESSAGE_SIZE};

/// Bytes a `RaftRequest` adds around its payload (field tag and length varint), rounded up.
const ENVELOPE: usize = 16;

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

/// Creates [`Network`] clients for openraft; pass it to [`openraft::Raft::new`].
///
/// Each client calls its target through a handle from the factory's [`Links`]: with
/// [`GrpcLinks`] (the default), every client to the same node multiplexes its RPCs over one
/// lazily established HTTP/2 connection.
#[derive(Clone)]
pub struct NetworkFactory {
    id: NodeId,
    gate: PeerGate,
    links: Arc<dyn Links>,
    observer: Observer,
}

impl std::fmt::Debug for NetworkFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkFactory")
            .field("id", &self.id)
            .field("observer", &self.observer)
            .finish_non_exhaustive()
    }
}

/// Receives the transport's timings (the server implements it with Prometheus histograms;
/// this crate knows no metrics library). Called on openraft's replication tasks: keep it
/// cheap and non-blocking.
pub trait PeerObserver: Send + Sync + 'static {
    /// A heartbeat — an `AppendEntries` without entries — to `peer` answered after `took`:
    /// the network round trip plus the peer's handling, which for an empty append does not
    /// wait for its disk. Calls that fail or time out are not reported.
    fn round_trip(&self, peer: NodeId, took: Duration);
    /// `peer` answered an `AppendEntries` carrying entries up to `last` with success: it holds
    /// them durably (for the server's latency breakdown). Empty appends are not reported.
    fn entries_acked(&self, _peer: NodeId, _last: u64) {}
    /// On the follower: an `AppendEntries` carrying entries `first..=last`, received at
    /// `received`, has its answer from the local Raft core (it holds them durably), about to
    /// be sent back. Empty appends are not reported.
    fn append_answered(&self, _first: u64, _last: u64, _received: std::time::Instant) {}
}

/// An optional [`PeerObserver`], shared by a factory's clients.
#[derive(Clone, Default)]
struct Observer(Option<Arc<dyn PeerObserver>>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Observer").field(&self.0.is_some()).finish()
    }
}

impl NetworkFactory {
    /// A factory for the node whose identity `gate` checks, calling peers over plain-text
    /// [`GrpcLinks`] with [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT).
    pub fn new(gate: PeerGate) -> Self {
        Self::with_links(gate, Arc::new(GrpcLinks::new()))
    }

    /// A factory for the node whose identity `gate` checks, calling peers through `links`
    /// (production: [`GrpcLinks`], TLS and connect timeout set there; a simulator: its own).
    pub fn with_links(gate: PeerGate, links: Arc<dyn Links>) -> Self {
        Self {
            id: gate.identity().member_id(),
            gate,
            links,
            observer: Observer::default(),
        }
    }

    /// Report heartbeat round trips to peers to `observer` ([`PeerObserver::round_trip`]).
    /// Affects clients created afterwards.
    pub fn with_observer(mut self, observer: Arc<dyn PeerObserver>) -> Self {
        self.observer = Observer(Some(observer));
        self
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Network;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Network {
        let client = self.links.raft(target, &node.addr);
        if let Err(e) = &client {
            tracing::warn!(id = self.id, target, error = %e, "cannot create raft client");
        }
        Network {
            id: self.id,
            target,
            node: node.clone(),
            gate: self.gate.clone(),
            client,
            observer: self.observer.clone(),
        }
    }
}

/// openraft's connection to one target node; RPCs are bounded by `RPCOption::hard_ttl()`.
///
/// Errors map onto openraft's `RPCError` as follows: the peer cannot be reached (connection
/// refused or timed out, connection lost, invalid address) → `Unreachable` (openraft backs
/// off); the deadline passed → `Timeout`; openraft on the peer returned an error →
/// `RemoteError`; an append-entries batch too large for one message → `PayloadTooLarge`;
/// anything else (malformed reply, other gRPC status) → `Network`.
pub struct Network {
    id: NodeId,
    target: NodeId,
    node: BasicNode,
    gate: PeerGate,
    client: Result<Arc<dyn RaftRpc>, TransportError>,
    observer: Observer,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("id", &self.id)
            .field("target", &self.target)
            .field("addr", &self.node.addr)
            .finish_non_exhaustive()
    }
}

fn network_error<E: Error>(e: &TransportError) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(e))
}

impl Network {
    fn timeout<E: Error>(&self, action: RPCTypes, ttl: Duration) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Timeout(Timeout {
            action,
            id: self.id,
            target: self.target,
            timeout: ttl,
        })
    }

    /// Maps a gRPC status of a failed call onto openraft's error kinds.
    fn status_error<E: Error>(
        &self,
        action: RPCTypes,
        status: tonic::Status,
        ttl: Duration,
        elapsed: Duration,
        entries: usize,
    ) -> RPCError<NodeId, BasicNode, E> {
        let code = status.code();
        let deadline_passed = elapsed >= ttl
            || (matches!(code, Code::Cancelled | Code::DeadlineExceeded)
                && status.message() == tonic::TimeoutExpired(()).to_string());
        let err = TransportError::Status(status);
        match code {
            _ if deadline_passed => self.timeout(action, ttl),
            // The peer refused this node's identity (or this node refused its answer): no
            // vote, no acknowledgement; openraft backs off as from an unreachable node.
            Code::FailedPrecondition => {
                if let TransportError::Status(s) = &err {
                    self.gate.on_refusal(s);
                }
                RPCError::Unreachable(Unreachable::new(&err))
            }
            // Connect failure / refused / connect timeout, keep-alive timeout, or the
            // connection dropped under a pending call (hyper reports that as cancelled).
            Code::Unavailable | Code::Cancelled => RPCError::Unreachable(Unreachable::new(&err)),
            Code::OutOfRange | Code::ResourceExhausted
                if action == RPCTypes::AppendEntries && entries > 1 =>
            {
                RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint((entries / 2) as u64).with_source_error(&err),
                )
            }
            _ => network_error(&err),
        }
    }

    /// One unary call: encode, send with the deadline, decode the reply or the remote error.
    async fn call<Req, Resp, E>(
        &mut self,
        action: RPCTypes,
        req: &Req,
        entries: usize,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let data = encode(req).map_err(|e| network_error(&e))?;
        if data.len() + ENVELOPE > MAX_MESSAGE_SIZE {
            let too_large = TransportError::TooLarge {
                size: data.len(),
                limit: MAX_MESSAGE_SIZE,
            };
            if action == RPCTypes::AppendEntries && entries > 1 {
                // Aim at half the limit so the retry fits even if entry sizes vary.
                let scaled =
                    (entries as u128 * (MAX_MESSAGE_SIZE / 2) as u128 / data.len() as u128) as u64;
                let hint = scaled.clamp(1, (entries - 1) as u64);
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(hint).with_source_error(&too_large),
                ));
            }
            return Err(network_error(&too_large));
        }

        let client = match &self.client {
            Ok(client) => client,
            Err(e) => return Err(RPCError::Unreachable(Unreachable::new(e))),
        };
        let ttl = option.hard_ttl();
        let mut request = tonic::Request::new(RaftRequest {
            data,
            from: Some(self.gate.envelope(self.target)),
        });
        // Sent as `grpc-timeout`: tonic enforces it on this side and the peer stops working on
        // a request nobody waits for any more.
        request.set_timeout(ttl);

        // tokio's clock (simulated time when paused): decides whether a failed call timed
        // out, and times a heartbeat's round trip.
        let start = Instant::now();
        let rpc = async {
            match action {
                RPCTypes::AppendEntries => client.append_entries(request).await,
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::InstallSnapshot => client.install_snapshot(request).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, rpc).await {
            Err(_elapsed) => return Err(self.timeout(action, ttl)),
            Ok(Err(status)) => {
                let err = self.status_error(action, status, ttl, start.elapsed(), entries);
                tracing::debug!(id = self.id, target = self.target, %action, error = %err, "raft rpc failed");
                return Err(err);
            }
            Ok(Ok(reply)) => {
                if action == RPCTypes::AppendEntries && entries == 0 {
                    if let Some(o) = &self.observer.0 {
                        o.round_trip(self.target, start.elapsed());
                    }
                }
                reply.into_inner()
            }
        };
        if let Err(why) = self.gate.accept_reply(self.target, reply.incarnation) {
            tracing::warn!(id = self.id, target = self.target, %action, "{why}");
            let refused = TransportError::Status(tonic::Status::failed_precondition(why));
            return Err(RPCError::Unreachable(Unreachable::new(&refused)));
        }

        if !reply.error.is_empty() {
            let remote: RaftError<NodeId, E> =
                decode(&reply.error).map_err(|e| network_error(&e))?;
            return Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                remote,
            )));
        }
        decode(&reply.data).map_err(|e| network_error(&e))
    }
}

impl RaftNetwork<TypeConfig> for Network {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, Infallible> {
        let entries = rpc.entries.len();
        let last = rpc.entries.last().map(|e| e.log_id.index);
        let reply = self
            .call(RPCTypes::AppendEntries, &rpc, entries, &option)
            .await;
        if let (Ok(AppendEntriesResponse::Success), Some(last), Some(o)) =
            (&reply, last, &self.observer.0)
        {
            o.entries_acked(self.target, last);
        }
        reply
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(RPCTypes::InstallSnapshot, &rpc, 0, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, Infallible> {
        self.call(RPCTypes::Vote, &rpc, 0, &option).await
    }
}
