//! The Raft transport end to end: a 3-node cluster on 127.0.0.1, plus the error mapping of
//! the client side against unreachable, silent, broken and stopped peers; and a 3-node cluster
//! over in-process `Links` (a simulator's way: each call goes straight to the target's
//! `RaftService`).
//!
//! In-process (no `fenced` binary). It lives with the server, the crate that puts
//! `fenced-network` and `fenced-storage` together, so that the transport crate does not
//! depend on the storage crate (and sled) even for its tests.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use fenced_core::{Batch, Command, Request, RequestId};
use fenced_network::{raft_server, GrpcLinks, NetworkFactory, PeerGate, SNAPSHOT_CHUNK_SIZE};
use fenced_proto::raft::raft_client::RaftClient;
use fenced_proto::raft::raft_server::{Raft as RaftRpc, RaftServer};
use fenced_proto::raft::{PeerIdentity, RaftReply, RaftRequest};
use fenced_raft_types::identity::{Identity, IdentityStore, MemberState};
use fenced_raft_types::{NodeId, Raft};
use fenced_storage::SharedState;
use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{BasicNode, Config, Vote};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::Router;
use tonic::transport::Server;

const WAIT: Duration = Duration::from_secs(20);

struct Node {
    id: NodeId,
    addr: SocketAddr,
    raft: Raft,
    state: SharedState,
    stop_server: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    _dir: tempfile::TempDir,
}

fn config(chunk: u64) -> anyhow::Result<Arc<Config>> {
    let config = Config {
        cluster_name: "fenced-network-test".into(),
        heartbeat_interval: 50,
        election_timeout_min: 300,
        election_timeout_max: 600,
        snapshot_max_chunk_size: chunk,
        ..Default::default()
    }
    .validate()?;
    fenced_network::check_config(&config)?;
    Ok(Arc::new(config))
}

/// Serves `router` on `listener` until the returned sender fires (or is dropped).
fn serve(
    listener: TcpListener,
    router: Router,
) -> (
    oneshot::Sender<()>,
    JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(router.serve_with_incoming_shutdown(
        TcpListenerStream::new(listener),
        async {
            let _ = rx.await;
        },
    ));
    (tx, handle)
}

/// The identity checks of member `id` of the test cluster, with its identity file in `dir`.
fn gate(dir: &std::path::Path, id: NodeId, addr: &str) -> anyhow::Result<PeerGate> {
    let identity = Identity::new(TEST_CLUSTER, id, MemberState::Ready);
    fenced_raft_types::identity::store(dir, &identity)?;
    Ok(PeerGate::new(
        Arc::new(IdentityStore::new(dir, identity)),
        addr,
    ))
}

const TEST_CLUSTER: u64 = 0x7e57;

async fn start_node(id: NodeId) -> anyhow::Result<Node> {
    start_node_with(id, SNAPSHOT_CHUNK_SIZE).await
}

async fn start_node_with(id: NodeId, chunk: u64) -> anyhow::Result<Node> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let dir = tempfile::tempdir()?;
    let (log, sm) = fenced_storage::open(dir.path(), Arc::new(|_: &[fenced_core::Event]| {}))?;
    let state = sm.shared();
    let gate = gate(dir.path(), id, &addr.to_string())?;
    let raft = Raft::new(
        id,
        config(chunk)?,
        NetworkFactory::new(gate.clone()),
        log,
        sm,
    )
    .await?;
    let (stop, server) = serve(
        listener,
        Server::builder().add_service(raft_server(
            raft.clone(),
            gate,
            fenced_tls::PeerCertCheck::open(),
            None,
        )),
    );
    Ok(Node {
        id,
        addr,
        raft,
        state,
        stop_server: Some(stop),
        server: Some(server),
        _dir: dir,
    })
}

impl Node {
    async fn stop(&mut self) -> anyhow::Result<()> {
        self.raft.shutdown().await.context("raft shutdown")?;
        if let Some(stop) = self.stop_server.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(WAIT, server)
                .await
                .context("server did not stop")???;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_node_cluster_replicates_a_write() -> anyhow::Result<()> {
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(start_node(id).await?);
    }
    let members: BTreeMap<NodeId, BasicNode> = nodes
        .iter()
        .map(|n| (n.id, BasicNode::new(n.addr.to_string())))
        .collect();
    nodes[0].raft.initialize(members).await?;

    let request = Batch::one(Request {
        time_ms: 1,
        client: Some(RequestId {
            client_id: 7,
            seq: 1,
        }),
        cmd: Command::OpenSession { ttl_ms: 1000 },
    });

    // Write through whoever leads; retry (bounded) across an election in progress.
    let deadline = tokio::time::Instant::now() + WAIT;
    let index = loop {
        let metrics = nodes[0]
            .raft
            .wait(Some(WAIT))
            .metrics(|m| m.current_leader.is_some(), "a leader is elected")
            .await?;
        let leader = metrics.current_leader.context("no leader")?;
        let leader = nodes
            .iter()
            .find(|n| n.id == leader)
            .context("leader is not a member")?;
        match leader.raft.client_write(request.clone()).await {
            Ok(resp) => break resp.log_id.index,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("client_write on {} failed, retrying: {e}", leader.id);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => bail!("client_write kept failing: {e}"),
        }
    };

    for node in &nodes {
        let metrics = node
            .raft
            .wait(Some(WAIT))
            .applied_index_at_least(Some(index), "write applied on every node")
            .await
            .with_context(|| format!("node {}", node.id))?;
        assert!(metrics.last_applied.map(|l| l.index) >= Some(index));
        assert_eq!(
            node.state.read(|sm| sm.session_count()),
            1,
            "node {} has the session",
            node.id
        );
    }

    for node in &mut nodes {
        node.stop().await?;
    }
    Ok(())
}

fn vote_request() -> VoteRequest<NodeId> {
    VoteRequest::new(Vote::new(1, 9), None)
}

/// A connection of member 9 to member 1 at `addr`, with member 9's identity dir (keep it).
async fn network_to(
    addr: String,
    connect_timeout: Duration,
) -> (fenced_network::Network, tempfile::TempDir) {
    let gate_dir = tempfile::tempdir().expect("tempdir");
    let gate = gate(gate_dir.path(), 9, "127.0.0.1:9").expect("identity");
    let links = GrpcLinks::new().with_connect_timeout(connect_timeout);
    let mut factory = NetworkFactory::with_links(gate, Arc::new(links));
    (factory.new_client(1, &BasicNode::new(addr)).await, gate_dir)
}

#[tokio::test]
async fn refused_connection_is_unreachable() -> anyhow::Result<()> {
    // A port nobody listens on: bind, note the port, close.
    let addr = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let (mut net, _dir) = network_to(addr.to_string(), Duration::from_secs(1)).await;
    let err = net
        .vote(vote_request(), RPCOption::new(Duration::from_secs(2)))
        .await
        .expect_err("nobody listens");
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn invalid_address_is_unreachable() {
    let (mut net, _dir) = network_to("not a valid host:port".into(), Duration::from_secs(1)).await;
    let err = net
        .vote(vote_request(), RPCOption::new(Duration::from_secs(1)))
        .await
        .expect_err("bad address");
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
}

#[tokio::test]
async fn silent_peer_times_out() -> anyhow::Result<()> {
    // Accepts TCP connections and never says a word.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let accept = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let (mut net, _dir) = network_to(addr.to_string(), Duration::from_secs(5)).await;
    let ttl = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let err = net
        .vote(vote_request(), RPCOption::new(ttl))
        .await
        .expect_err("peer is silent");
    assert!(matches!(err, RPCError::Timeout(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    accept.abort();
    Ok(())
}

/// A peer that answers every call with bytes that are not bincode of anything expected.
#[derive(Clone)]
struct Garbage;

#[tonic::async_trait]
impl RaftRpc for Garbage {
    async fn append_entries(
        &self,
        _: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        Err(tonic::Status::internal("boom"))
    }
    async fn vote(
        &self,
        _: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        Ok(tonic::Response::new(RaftReply {
            data: vec![0xff, 0xff, 0xff],
            error: Vec::new(),
            incarnation: 1,
        }))
    }
    async fn install_snapshot(
        &self,
        _: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        Ok(tonic::Response::new(RaftReply {
            data: Vec::new(),
            error: vec![0xff; 40],
            incarnation: 1,
        }))
    }
}

#[tokio::test]
async fn malformed_reply_is_a_network_error() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, server) = serve(
        listener,
        Server::builder().add_service(RaftServer::new(Garbage)),
    );
    let (mut net, _dir) = network_to(addr.to_string(), Duration::from_secs(1)).await;
    let err = net
        .vote(vote_request(), RPCOption::new(Duration::from_secs(2)))
        .await
        .expect_err("garbage reply");
    assert!(matches!(err, RPCError::Network(_)), "{err:?}");
    let append = AppendEntriesRequest {
        vote: Vote::new(1, 9),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let err = net
        .append_entries(append, RPCOption::new(Duration::from_secs(2)))
        .await
        .expect_err("internal status");
    assert!(matches!(err, RPCError::Network(_)), "{err:?}");
    let _ = stop.send(());
    server.await??;
    Ok(())
}

#[tokio::test]
async fn malformed_request_is_invalid_argument_and_stopped_node_is_remote_error(
) -> anyhow::Result<()> {
    let mut node = start_node(1).await?;

    // Garbage straight to the server, from a caller of the cluster.
    let mut client = RaftClient::connect(format!("http://{}", node.addr)).await?;
    let caller = PeerIdentity {
        cluster_id: TEST_CLUSTER,
        member: 8,
        incarnation: 5,
        addr: "127.0.0.1:8".into(),
        to: 1,
        to_incarnation: 0,
        known: Default::default(),
    };
    let garbage = |from: PeerIdentity| RaftRequest {
        data: vec![0xff; 7],
        from: Some(from),
    };
    let status = client
        .vote(garbage(caller.clone()))
        .await
        .expect_err("garbage request");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // Identity checks come first: no identity, another cluster, another member id, and
    // member 8 again under a new incarnation (its data dir was replaced) are refused.
    let refused = [
        RaftRequest {
            data: vec![0xff; 7],
            from: None,
        },
        garbage(PeerIdentity {
            cluster_id: TEST_CLUSTER + 1,
            ..caller.clone()
        }),
        garbage(PeerIdentity {
            to: 2,
            ..caller.clone()
        }),
        garbage(PeerIdentity {
            incarnation: 6,
            ..caller.clone()
        }),
    ];
    for req in refused {
        let status = client.vote(req).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    }
    let status = client
        .vote(garbage(PeerIdentity {
            incarnation: 6,
            ..caller.clone()
        }))
        .await
        .expect_err("refused");
    assert!(
        status
            .metadata()
            .get(fenced_network::gate::REFUSED_HEADER)
            .is_some(),
        "a stale incarnation is told so: {status:?}"
    );

    // A well-formed vote is answered (the node is uninitialized but still votes).
    let (mut net, _dir) = network_to(node.addr.to_string(), Duration::from_secs(1)).await;
    net.vote(vote_request(), RPCOption::new(Duration::from_secs(2)))
        .await?;

    // Raft stopped, gRPC server still up: openraft's Fatal error comes back as RemoteError.
    node.raft.shutdown().await?;
    let err = net
        .vote(vote_request(), RPCOption::new(Duration::from_secs(2)))
        .await
        .expect_err("raft is stopped");
    assert!(matches!(err, RPCError::RemoteError(_)), "{err:?}");

    if let Some(stop) = node.stop_server.take() {
        let _ = stop.send(());
    }
    if let Some(server) = node.server.take() {
        server.await??;
    }
    Ok(())
}

fn open_session(seq: u64) -> Batch {
    Batch::one(Request {
        time_ms: seq,
        client: Some(RequestId { client_id: 7, seq }),
        cmd: Command::OpenSession { ttl_ms: 60_000 },
    })
}

/// A learner that joins after the log was snapshotted and purged can only catch up through
/// install_snapshot; tiny chunks force many install-snapshot RPCs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn late_learner_catches_up_through_chunked_snapshot() -> anyhow::Result<()> {
    let mut leader = start_node_with(1, 64).await?;
    leader
        .raft
        .initialize(BTreeMap::from([(
            1,
            BasicNode::new(leader.addr.to_string()),
        )]))
        .await?;
    leader
        .raft
        .wait(Some(WAIT))
        .current_leader(1, "single node leads")
        .await?;

    let mut last = 0;
    for seq in 1..=20 {
        last = leader
            .raft
            .client_write(open_session(seq))
            .await?
            .log_id
            .index;
    }
    leader.raft.trigger().snapshot().await?;
    leader
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.map(|s| s.index) >= Some(last),
            "snapshot covers the writes",
        )
        .await?;
    leader.raft.trigger().purge_log(last).await?;
    leader
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.purged.map(|p| p.index) >= Some(last),
            "log purged up to the snapshot",
        )
        .await?;

    let mut learner = start_node_with(2, 64).await?;
    leader
        .raft
        .add_learner(2, BasicNode::new(learner.addr.to_string()), true)
        .await?;
    learner
        .raft
        .wait(Some(WAIT))
        .applied_index_at_least(Some(last), "learner caught up")
        .await?;
    let metrics = learner.raft.metrics().borrow().clone();
    assert!(
        metrics.snapshot.map(|s| s.index) >= Some(last),
        "learner installed the snapshot: {metrics:?}"
    );
    assert_eq!(learner.state.read(|sm| sm.session_count()), 20);

    learner.stop().await?;
    leader.stop().await?;
    Ok(())
}

/// Every node's Raft service in this process, and the nodes cut off from the rest: the
/// simulated network of [`InProcess`] links.
#[derive(Clone, Default)]
struct Wires {
    services: Arc<std::sync::Mutex<BTreeMap<NodeId, Arc<dyn RaftRpc>>>>,
    cut: Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>,
}

impl Wires {
    /// The service a call from `from` to `to` reaches now, if any.
    fn route(&self, from: NodeId, to: NodeId) -> Option<Arc<dyn RaftRpc>> {
        let cut = self.cut.lock().expect("cut");
        if cut.contains(&from) || cut.contains(&to) {
            return None;
        }
        self.services.lock().expect("services").get(&to).cloned()
    }

    fn cut(&self, id: NodeId, off: bool) {
        let mut cut = self.cut.lock().expect("cut");
        if off {
            cut.insert(id);
        } else {
            cut.remove(&id);
        }
    }
}

/// Node `me`'s links: each call goes straight to the target's `RaftService`, no tonic server
/// between; a cut-off node is unreachable (`UNAVAILABLE`).
struct InProcess {
    me: NodeId,
    wires: Wires,
}

struct Wire {
    from: NodeId,
    to: NodeId,
    wires: Wires,
}

impl Wire {
    fn service(&self) -> Result<Arc<dyn RaftRpc>, tonic::Status> {
        self.wires
            .route(self.from, self.to)
            .ok_or_else(|| tonic::Status::unavailable("simulated: cut off"))
    }
}

#[tonic::async_trait]
impl RaftRpc for Wire {
    async fn append_entries(
        &self,
        req: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        self.service()?.append_entries(req).await
    }
    async fn vote(
        &self,
        req: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        self.service()?.vote(req).await
    }
    async fn install_snapshot(
        &self,
        req: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        self.service()?.install_snapshot(req).await
    }
}

impl fenced_network::Links for InProcess {
    fn raft(
        &self,
        target: NodeId,
        _addr: &str,
    ) -> Result<Arc<dyn RaftRpc>, fenced_network::TransportError> {
        Ok(Arc::new(Wire {
            from: self.me,
            to: target,
            wires: self.wires.clone(),
        }))
    }

    fn forward(
        &self,
        target: NodeId,
        addr: &str,
    ) -> Result<Arc<dyn fenced_proto::raft::forward_server::Forward>, fenced_network::TransportError>
    {
        Err(fenced_network::TransportError::InvalidAddress {
            node: target,
            addr: addr.to_owned(),
            reason: "no forwarding here".into(),
        })
    }
}

/// A node of an in-process cluster: openraft over `InProcess` links, its `RaftService`
/// registered in `wires` (no listener).
async fn start_wired(
    id: NodeId,
    wires: &Wires,
) -> anyhow::Result<(Raft, SharedState, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let (log, sm) = fenced_storage::open(dir.path(), Arc::new(|_: &[fenced_core::Event]| {}))?;
    let state = sm.shared();
    let gate = gate(dir.path(), id, &format!("sim-{id}"))?;
    let links = InProcess {
        me: id,
        wires: wires.clone(),
    };
    let network = NetworkFactory::with_links(gate.clone(), Arc::new(links));
    let raft = Raft::new(id, config(SNAPSHOT_CHUNK_SIZE)?, network, log, sm).await?;
    wires.services.lock().expect("services").insert(
        id,
        Arc::new(fenced_network::RaftService::new(raft.clone(), gate)),
    );
    Ok((raft, state, dir))
}

/// Write through whoever leads among `nodes` (retrying across an election); the log index.
async fn write_through_leader(
    nodes: &[(NodeId, Raft)],
    request: Batch,
) -> anyhow::Result<(NodeId, u64)> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let leader = nodes[0]
            .1
            .wait(Some(WAIT))
            .metrics(
                |m| {
                    m.current_leader
                        .is_some_and(|l| nodes.iter().any(|(id, _)| *id == l))
                },
                "a leader among these nodes",
            )
            .await?
            .current_leader
            .context("no leader")?;
        let raft = &nodes
            .iter()
            .find(|(id, _)| *id == leader)
            .context("leader")?
            .1;
        match raft.client_write(request.clone()).await {
            Ok(resp) => return Ok((leader, resp.log_id.index)),
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("client_write on {leader} failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => bail!("client_write kept failing: {e}"),
        }
    }
}

/// Real openraft nodes and `RaftService`s, the production `NetworkFactory` (envelopes, gate,
/// error mapping), and links that are function calls: a cluster elects, replicates, and
/// elects again when its leader is cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_in_process_links_replicates_and_fails_over() -> anyhow::Result<()> {
    let wires = Wires::default();
    let mut nodes = Vec::new();
    let mut states = BTreeMap::new();
    let mut dirs = Vec::new();
    for id in 1..=3 {
        let (raft, state, dir) = start_wired(id, &wires).await?;
        nodes.push((id, raft));
        states.insert(id, state);
        dirs.push(dir);
    }
    let members: BTreeMap<NodeId, BasicNode> = (1..=3)
        .map(|id| (id, BasicNode::new(format!("sim-{id}"))))
        .collect();
    nodes[0].1.initialize(members).await?;

    let (leader, index) = write_through_leader(&nodes, open_session(1)).await?;
    for (id, raft) in &nodes {
        raft.wait(Some(WAIT))
            .applied_index_at_least(Some(index), "first write applied")
            .await
            .with_context(|| format!("node {id}"))?;
        assert_eq!(states[id].read(|sm| sm.session_count()), 1, "node {id}");
    }

    // The leader is cut off: its calls and the calls to it fail as unreachable; the two
    // others elect one of them and commit without it.
    wires.cut(leader, true);
    let rest: Vec<(NodeId, Raft)> = nodes
        .iter()
        .filter(|(id, _)| *id != leader)
        .cloned()
        .collect();
    let (new_leader, index) = write_through_leader(&rest, open_session(2)).await?;
    assert_ne!(new_leader, leader);
    for (id, raft) in &rest {
        raft.wait(Some(WAIT))
            .applied_index_at_least(Some(index), "second write applied")
            .await
            .with_context(|| format!("node {id}"))?;
        assert_eq!(states[id].read(|sm| sm.session_count()), 2, "node {id}");
    }

    // Healed, the old leader catches up.
    wires.cut(leader, false);
    let old = &nodes.iter().find(|(id, _)| *id == leader).context("old")?.1;
    old.wait(Some(WAIT))
        .applied_index_at_least(Some(index), "the old leader caught up")
        .await?;
    assert_eq!(states[&leader].read(|sm| sm.session_count()), 2);

    for (_, raft) in &nodes {
        raft.shutdown().await?;
    }
    Ok(())
}
