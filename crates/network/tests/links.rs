//! The transport seam without a network: a [`Links`] that carries each call to a peer object in
//! this process, as a simulator does, and can refuse or swallow it. The caller's side is the
//! production `NetworkFactory`/`Network` (envelopes, deadline, error mapping); the peer checks
//! the caller with a real `PeerGate`, as `RaftService` does, and answers a vote. (A real
//! openraft node behind `RaftService` over in-process links: `fenced-server`'s
//! `tests/raft_transport.rs`, which has the storage.)

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_network::codec::{decode, encode};
use fenced_network::{Links, NetworkFactory, PeerGate, TransportError};
use fenced_proto::raft::forward_server::Forward;
use fenced_proto::raft::raft_server::Raft as RaftRpc;
use fenced_proto::raft::{RaftReply, RaftRequest};
use fenced_raft_types::identity::{Identity, IdentityStore, MemberState};
use fenced_raft_types::NodeId;
use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::{BasicNode, Membership, Vote};
use tonic::{Request, Response, Status};

const CLUSTER: u64 = 0x5eed;

fn addr(id: NodeId) -> String {
    format!("node-{id}:7000")
}

fn membership() -> Membership<NodeId, BasicNode> {
    let voters: BTreeSet<NodeId> = [1, 2].into_iter().collect();
    let nodes: BTreeMap<NodeId, BasicNode> = [1, 2].map(|i| (i, BasicNode::new(addr(i)))).into();
    Membership::new(vec![voters], nodes)
}

/// The gate of member `id` (a fresh incarnation), its identity file in `dir`.
fn gate(dir: &std::path::Path, id: NodeId) -> PeerGate {
    let identity = Identity::new(CLUSTER, id, MemberState::Ready);
    fenced_raft_types::identity::store(dir, &identity).expect("identity file");
    PeerGate::new(Arc::new(IdentityStore::new(dir, identity)), addr(id))
}

/// A peer's Raft service in miniature: the gate's checks, then a vote granted to anyone.
struct Voter {
    gate: PeerGate,
    votes: Mutex<usize>,
}

#[tonic::async_trait]
impl RaftRpc for Voter {
    async fn append_entries(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        Err(Status::unimplemented("votes only"))
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let req = request.into_inner();
        self.gate.admit_raft(req.from.as_ref(), &membership())?;
        let vote: VoteRequest<NodeId> =
            decode(&req.data).map_err(|e| Status::invalid_argument(e.to_string()))?;
        *self.votes.lock().expect("votes") += 1;
        let resp = VoteResponse::new(vote.vote, None, true);
        Ok(Response::new(RaftReply {
            data: encode(&resp).map_err(|e| Status::internal(e.to_string()))?,
            error: Vec::new(),
            incarnation: self.gate.identity().incarnation(),
        }))
    }

    async fn install_snapshot(
        &self,
        _: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        Err(Status::unimplemented("votes only"))
    }
}

/// What the simulated network does with a call to a node.
#[derive(Clone)]
enum Route {
    /// Hand it to the node's service and its answer back.
    Deliver(Arc<dyn RaftRpc>),
    /// The node cannot be reached (as a refused connection).
    Unreachable,
    /// The call is lost: no answer ever.
    Silent,
}

/// One node's links: by target id, through the routes the test sets.
#[derive(Clone, Default)]
struct InProcess {
    routes: Arc<Mutex<HashMap<NodeId, Route>>>,
}

impl InProcess {
    fn set(&self, target: NodeId, route: Route) {
        self.routes.lock().expect("routes").insert(target, route);
    }
}

/// A call handle: looks its route up at call time (so it follows the test's changes).
struct Link {
    routes: Arc<Mutex<HashMap<NodeId, Route>>>,
    target: NodeId,
}

impl Link {
    fn route(&self) -> Route {
        let routes = self.routes.lock().expect("routes");
        routes
            .get(&self.target)
            .cloned()
            .unwrap_or(Route::Unreachable)
    }
}

#[tonic::async_trait]
impl RaftRpc for Link {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        match self.route() {
            Route::Deliver(to) => to.append_entries(request).await,
            Route::Unreachable => Err(Status::unavailable("simulated: peer unreachable")),
            Route::Silent => std::future::pending().await,
        }
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        match self.route() {
            Route::Deliver(to) => to.vote(request).await,
            Route::Unreachable => Err(Status::unavailable("simulated: peer unreachable")),
            Route::Silent => std::future::pending().await,
        }
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        match self.route() {
            Route::Deliver(to) => to.install_snapshot(request).await,
            Route::Unreachable => Err(Status::unavailable("simulated: peer unreachable")),
            Route::Silent => std::future::pending().await,
        }
    }
}

impl Links for InProcess {
    fn raft(&self, target: NodeId, _addr: &str) -> Result<Arc<dyn RaftRpc>, TransportError> {
        Ok(Arc::new(Link {
            routes: self.routes.clone(),
            target,
        }))
    }

    fn forward(&self, target: NodeId, addr: &str) -> Result<Arc<dyn Forward>, TransportError> {
        Err(TransportError::InvalidAddress {
            node: target,
            addr: addr.to_owned(),
            reason: "no forwarding in this test".into(),
        })
    }
}

/// Member 1's client to member 2, over `links`.
async fn client(gate: PeerGate, links: &InProcess) -> fenced_network::Network {
    let mut factory = NetworkFactory::with_links(gate, Arc::new(links.clone()));
    factory.new_client(2, &BasicNode::new(addr(2))).await
}

fn vote() -> VoteRequest<NodeId> {
    VoteRequest::new(Vote::new(3, 1), None)
}

#[tokio::test]
async fn a_call_carries_the_envelope_both_gates_check() {
    let (d1, d2) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let (g1, g2) = (gate(d1.path(), 1), gate(d2.path(), 2));
    let voter = Arc::new(Voter {
        gate: g2.clone(),
        votes: Mutex::new(0),
    });
    let links = InProcess::default();
    links.set(2, Route::Deliver(voter.clone()));

    let mut net = client(g1.clone(), &links).await;
    let resp = net
        .vote(vote(), RPCOption::new(Duration::from_secs(1)))
        .await
        .expect("vote granted");
    assert!(resp.vote_granted);
    assert_eq!(*voter.votes.lock().expect("votes"), 1);
    // The callee pinned the caller from its envelope, the caller the callee from its reply.
    assert_eq!(g2.identity().pinned(1), Some(g1.identity().incarnation()));
    assert_eq!(g1.identity().pinned(2), Some(g2.identity().incarnation()));
    assert!(g1.heard_within(2, Duration::from_secs(1)));

    // Member 1's data dir is replaced (a new incarnation): member 2 refuses it, and says
    // so in the refusal's metadata, which the link carries back; the caller retires.
    let d1b = tempfile::tempdir().expect("tmp");
    let wiped = gate(d1b.path(), 1);
    let mut net = client(wiped.clone(), &links).await;
    let err = net
        .vote(vote(), RPCOption::new(Duration::from_secs(1)))
        .await
        .expect_err("a stale incarnation is refused");
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
    assert!(wiped.identity().retired_reason().is_some());
    assert_eq!(*voter.votes.lock().expect("votes"), 1, "no vote counted");
}

#[tokio::test]
async fn an_unavailable_link_is_unreachable() {
    let d1 = tempfile::tempdir().expect("tmp");
    let links = InProcess::default();
    links.set(2, Route::Unreachable);
    let mut net = client(gate(d1.path(), 1), &links).await;
    let err = net
        .vote(vote(), RPCOption::new(Duration::from_secs(1)))
        .await
        .expect_err("unreachable");
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
}

/// A lost call is never answered: the caller's deadline ends it, on tokio's clock (here
/// paused: the 30 s pass at once).
#[tokio::test(start_paused = true)]
async fn a_silent_link_times_out_in_tokio_time() {
    let (d1, d2) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let links = InProcess::default();
    links.set(2, Route::Silent);
    let mut net = client(gate(d1.path(), 1), &links).await;
    let ttl = Duration::from_secs(30);
    let (wall, started) = (std::time::Instant::now(), tokio::time::Instant::now());
    let err = net
        .vote(vote(), RPCOption::new(ttl))
        .await
        .expect_err("no answer");
    assert!(matches!(err, RPCError::Timeout(_)), "{err:?}");
    assert!(started.elapsed() >= ttl);
    assert!(
        wall.elapsed() < Duration::from_secs(10),
        "{:?}",
        wall.elapsed()
    );

    // The same client once the route heals: the handle looks its route up per call.
    links.set(
        2,
        Route::Deliver(Arc::new(Voter {
            gate: gate(d2.path(), 2),
            votes: Mutex::new(0),
        })),
    );
    net.vote(vote(), RPCOption::new(ttl))
        .await
        .expect("delivered now");
}
