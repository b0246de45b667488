//! Assembly of a node: open the data dir, start Raft, serve gRPC (Raft transport, forwarding,
//! the client API) and RESP, bootstrap, and run the background tasks (expiry ticker,
//! compactor, the etcd keyspace's upkeep). Everything here wires the layers together; the behaviour lives in
//! [`crate::node`] (propose, read, leader clock), [`crate::api`] (the public gRPC services),
//! [`crate::forward`] (the leader's side of forwarding) and [`crate::resp`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fenced_network::{
    raft_server, GrpcLinks, Links, NetworkFactory, PeerGate, SNAPSHOT_CHUNK_SIZE,
};
use fenced_raft_types::identity::MemberState;
use fenced_raft_types::{NodeId, Raft};
use fenced_storage::datadir;
use openraft::error::RaftError;
use openraft::{BasicNode, Config, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::StartError;
use crate::hub::Hub;
use crate::node::Node;
use crate::NodeConfig;

/// How long a stopping node lets requests in flight finish.
const DRAIN: Duration = Duration::from_secs(5);

/// A started node with its background tasks.
pub struct Running {
    pub node: Node,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stop serving, stop Raft, and wait for the tasks: requests in flight get up to
    /// [`DRAIN`] to finish (a hand-off's waiting requests are answered by the new leader
    /// through this node), then whatever is left (long waits, watch streams) is dropped.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let until = tokio::time::Instant::now() + DRAIN;
        for mut t in self.tasks {
            if tokio::time::timeout_at(until, &mut t).await.is_err() {
                t.abort();
            }
        }
        if let Err(e) = self.node.raft().shutdown().await {
            tracing::warn!("raft shutdown: {e}");
        }
    }

    /// Stop as a crash would (a simulator's crash): the background tasks are aborted at
    /// once and Raft's core stops, with no drain, no hand-off and no shutdown work of ours;
    /// whatever is on disk stays as it is. Requests in flight on other tasks fail as Raft is
    /// gone.
    pub async fn crash(self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Err(e) = self.node.raft().shutdown().await {
            tracing::debug!("raft shutdown after a crash: {e}");
        }
    }
}

/// `--force-new-cluster`: rewrite the data dir as a one-node cluster (once; a restart that
/// keeps the flag changes nothing).
async fn force_new_cluster(cfg: &NodeConfig, env: &fenced_storage::Env) -> Result<(), StartError> {
    if cfg.initial_cluster.len() > 1 {
        tracing::warn!("--force-new-cluster: --initial-cluster is ignored; the new cluster is this member alone");
    }
    match crate::backup::force_new_cluster(
        env,
        &cfg.data_dir,
        cfg.id,
        &cfg.grpc_addr,
        &cfg.initial_cluster_token,
        cfg.bump_revision,
    )
    .await?
    {
        Some((aside, r)) => tracing::warn!(
            old_data_dir = %aside.display(),
            cluster = %fenced_raft_types::identity::fmt_cluster_id(r.cluster_id),
            revision_before = r.revision_before,
            revision_after = r.revision_after,
            locks_dropped = r.locks_dropped,
            sessions_dropped = r.sessions_dropped,
            keys = r.keys,
            etcd_keys = r.etcd_keys,
            etcd_compact_revision = r.etcd_compact_revision,
            "--force-new-cluster: this member is now a new one-node cluster; add members \
             with `fenced member add`, and remove the flag"
        ),
        None => tracing::warn!(
            "--force-new-cluster: the data dir is already of a cluster of this member alone; \
             nothing to do (remove the flag)"
        ),
    }
    Ok(())
}

/// What a node is built from besides its configuration: the production defaults
/// ([`Seams::production`]), or a simulator's (`crates/sim`), which runs several nodes in one
/// process on simulated time, network and disk scheduling.
pub struct Seams {
    /// How the node calls its peers (Raft and forwarding); `None`: gRPC ([`GrpcLinks`],
    /// over TLS if the configuration has it).
    pub links: Option<Arc<dyn Links>>,
    /// How the storage runs its blocking work: on threads of its own (production) or inline
    /// in the calling task (a simulator: nothing may wait on a real thread).
    pub io: fenced_storage::Io,
    /// The file system of the data dir (every file the node reads or writes in it): the real
    /// one (production), or a simulator's disk.
    pub fs: Arc<dyn fenced_fs::Fs>,
    /// Serve the configured addresses (gRPC, RESP, metrics). A simulator calls the node's
    /// services directly instead.
    pub listen: bool,
}

impl Seams {
    /// What `fenced serve` runs with.
    pub fn production() -> Seams {
        Seams {
            links: None,
            io: fenced_storage::Io::Threads,
            fs: fenced_fs::os(),
            listen: true,
        }
    }
}

/// Open the data dir (under the bootstrap and identity rules of
/// [`fenced_storage::datadir`]), start Raft and the gRPC server (Raft transport, forwarding
/// and client API on one port) and the RESP listener, bootstrap a new cluster, start the
/// expiry ticker and the compactor.
pub async fn start(cfg: NodeConfig) -> Result<Running, StartError> {
    start_with(cfg, Seams::production()).await
}

/// [`start`] with `seams` in place of the production ones.
pub async fn start_with(cfg: NodeConfig, seams: Seams) -> Result<Running, StartError> {
    let env = fenced_storage::Env::new(seams.fs.clone(), seams.io);
    if cfg.force_new_cluster {
        force_new_cluster(&cfg, &env).await?;
    }
    let members = cfg.members()?;
    let plan = datadir::Plan {
        member_id: cfg.id,
        cluster_id: datadir::cluster_id(&cfg.initial_cluster_token, &members),
        may_bootstrap: cfg.may_bootstrap()? && cfg.join.is_none(),
        join: cfg.join,
    };
    let hub = Hub::new();
    let sink_hub = hub.clone();
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let sink_metrics = metrics.clone();
    let opened = datadir::open_with(
        &cfg.data_dir,
        &plan,
        Arc::new(move |events: &[fenced_core::Event]| {
            sink_metrics.observe_events(events);
            sink_hub.deliver(events)
        }),
        env,
    )?;
    let identity = opened.identity.clone();
    let gate = PeerGate::new(identity.clone(), cfg.grpc_addr.clone());
    let (log_store, mut sm_store) = (opened.log, opened.state_machine);
    sm_store.digest_every(cfg.digest_interval);
    if let Some(index) = cfg.test_hooks.diverge_at {
        tracing::warn!(
            index,
            "TEST HOOK: this member's state will diverge at index {index}"
        );
        sm_store.diverge_at_for_tests(index);
    }
    let advertise = match cfg.test_hooks.advertise_semantics {
        Some(s) => {
            tracing::warn!(s, "TEST HOOK: advertising apply rules {s}");
            fenced_core::Semantics(s)
        }
        None => fenced_core::Semantics::NEWEST,
    };
    let alarms = crate::node::Alarms::open(
        seams.fs.clone(),
        cfg.data_dir.clone(),
        advertise,
        sm_store.digests(),
    );
    if let Some(fingerprint) = cfg.test_hooks.advertise_lua_build {
        tracing::warn!(
            fingerprint = format!("{fingerprint:016x}"),
            "TEST HOOK: advertising another Lua build"
        );
        alarms.advertise_lua_build(fingerprint);
    }
    log_store.observe(metrics.clone());
    metrics.read_log(log_store.committed());
    let state = sm_store.shared();
    let gauge = fenced_storage::CompactionGauge::new(&log_store, &sm_store);

    // This member's address is fixed by the membership; serving at another one would
    // make peers refuse it (an address change needs a membership change).
    let membership = match log_store.last_membership()? {
        Some(m) => m,
        None => state.membership().membership().clone(),
    };
    if let Some(n) = membership.get_node(&cfg.id) {
        if n.addr != cfg.grpc_addr {
            return Err(StartError::Config(format!(
                "member {} is at {} in the cluster's membership, but --grpc-addr is {}",
                cfg.id, n.addr, cfg.grpc_addr
            )));
        }
    }

    let raft_config = Config {
        cluster_name: "fenced".into(),
        heartbeat_interval: cfg.heartbeat_ms,
        election_timeout_min: cfg.election_timeout.min_ms,
        election_timeout_max: cfg.election_timeout.max_ms,
        // `compactor` decides when (it weighs the log against the snapshot's size).
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: cfg.keep_logs,
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_SIZE,
        max_payload_entries: cfg.raft_max_payload_entries,
        ..Default::default()
    }
    .validate()
    .map_err(|e| StartError::Config(e.to_string()))?;
    // How this node reaches its peers (Raft and forwarding): gRPC, over TLS if configured.
    let links: Arc<dyn Links> = match seams.links {
        Some(links) => links,
        None => Arc::new(match &cfg.tls {
            Some(t) => GrpcLinks::new().with_tls(t.peer_client()),
            None => GrpcLinks::new(),
        }),
    };
    let network =
        NetworkFactory::with_links(gate.clone(), links.clone()).with_observer(metrics.clone());
    let raft = Raft::new(cfg.id, Arc::new(raft_config), network, log_store, sm_store)
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;

    let listener =
        match seams.listen {
            true => Some(TcpListener::bind(&cfg.grpc_addr).await.map_err(|source| {
                StartError::Bind {
                    addr: cfg.grpc_addr.clone(),
                    source,
                }
            })?),
            false => None,
        };

    let node = Node::new(
        &cfg,
        raft.clone(),
        state,
        hub,
        gate.clone(),
        metrics,
        alarms,
        links,
    );
    node.apply_alarm_to_raft();

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    if let Some(listener) = listener {
        tasks.extend(listen(&cfg, &node, &raft, &gate, listener, &shutdown_rx).await?);
    }

    if opened.bootstrap {
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        tracing::info!(?nodes, "bootstrapping a new cluster");
        match raft.initialize(nodes).await {
            Ok(()) => {}
            // Already initialized: a restart before this member heard from every voter
            // (it stays `Bootstrapping` until then).
            Err(RaftError::APIError(e)) => tracing::info!("not initializing: {e}"),
            Err(e) => return Err(StartError::Raft(e.to_string())),
        }
        // Alone, this member has heard from every voter; in a cluster it votes once it
        // has heard from all of them (`PeerGate::bootstrapped`).
        if members.keys().all(|id| *id == cfg.id) {
            identity.set_state(MemberState::Ready)?;
        }
    }

    if seams.listen {
        tasks.push(crate::resp::start(node.clone(), &cfg, shutdown_rx.clone()).await?);
    }
    tasks.push(tokio::spawn(compactor(
        raft.clone(),
        gauge,
        cfg.snapshot_logs,
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(node.clone().checker(shutdown_rx.clone())));
    tasks.push(tokio::spawn(node.clone().etcd_upkeep(
        cfg.quota_backend_bytes,
        cfg.auto_compaction,
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(node.clone().ticker(shutdown_rx)));
    Ok(Running {
        node,
        shutdown: shutdown_tx,
        tasks,
    })
}

/// Serve the node's gRPC port (Raft transport, forwarding, the client API, health) on
/// `listener`, and metrics on `--metrics-addr`: the tasks doing it.
async fn listen(
    cfg: &NodeConfig,
    node: &Node,
    raft: &Raft,
    gate: &PeerGate,
    listener: TcpListener,
    shutdown_rx: &watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let mut tasks = Vec::new();
    // The standard gRPC health service: SERVING while a leader is known.
    let (health, health_service) = tonic_health::server::health_reporter();
    tasks.push(tokio::spawn(crate::metrics::watch_leader(
        node.clone(),
        health,
        shutdown_rx.clone(),
    )));
    // Served by the watchdog thread (crate::metrics::spawn_watchdog), beside the log line
    // of a stuck apply: not on this runtime, which a hung apply can stop.
    let metrics_listener = match &cfg.metrics_addr {
        Some(addr) => {
            let bind_error = |source| StartError::Bind {
                addr: addr.clone(),
                source,
            };
            let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
            listener.set_nonblocking(true).map_err(bind_error)?;
            tracing::info!(%addr, "metrics, /health and /ready listening");
            Some(listener)
        }
        None => None,
    };
    crate::metrics::spawn_watchdog(
        node.clone(),
        metrics_listener,
        cfg.metrics_max_connections,
        shutdown_rx.clone(),
    )
    .map_err(|e| StartError::Config(format!("starting the watchdog thread: {e}")))?;
    let port = crate::client_port::ClientPort::new(listener, cfg)?;
    let check = match &cfg.tls {
        Some(t) => t
            .peer_check()
            .map_err(|e| StartError::Config(format!("TLS: {e}")))?,
        None => fenced_tls::PeerCertCheck::open(),
    };
    let tls = cfg.tls.is_some();
    let users = Arc::new(crate::users::Users::new(
        cfg.acl.clone(),
        cfg.auth_token_ttl,
    ));
    // Counts and times the client API's calls (fenced.v1 and etcd's; node-to-node calls
    // pass). Then the limits on calls without a valid token, before their bodies are read.
    let layers = crate::client_port::Layers {
        metrics: node.metrics().grpc_layer(),
        pre_auth: crate::pre_auth::PreAuthLayer::new(
            users.clone(),
            cfg.grpc_unauthenticated_calls,
            cfg.grpc_request_buffer_total,
            node.metrics().clone(),
        ),
    };
    let mut grpc = tonic::service::Routes::builder();
    grpc.add_service(raft_server(
        raft.clone(),
        gate.clone(),
        check.clone(),
        Some(node.metrics().clone()),
    ))
    .add_service(crate::forward::server::forward_server(node.clone(), check))
    .add_service(crate::api::lock_server(node.clone(), users.clone()))
    .add_service(crate::api::session_server(node.clone(), users.clone()))
    .add_service(crate::api::kv_server(node.clone(), users.clone()))
    .add_service(crate::api::limiter_server(node.clone(), users.clone()))
    .add_service(crate::api::cluster_server(node.clone(), users.clone()))
    .add_service(crate::api::auth_server(node.clone(), users.clone()))
    // etcd's v3 API (service names `etcdserverpb.*`): `etcdctl` and etcd clients.
    .add_service(crate::api::etcd::kv_server(
        node.clone(),
        users.clone(),
        tls,
    ))
    .add_service(crate::api::etcd::maintenance_server(
        node.clone(),
        users.clone(),
        tls,
    ))
    .add_service(crate::api::etcd::cluster_server(
        node.clone(),
        users.clone(),
        tls,
    ))
    .add_service(crate::api::etcd::watch_server(
        node.clone(),
        users.clone(),
        tls,
    ))
    .add_service(crate::api::etcd::lease_server(
        node.clone(),
        users.clone(),
        tls,
    ))
    .add_service(crate::api::etcd::lock_server(
        node.clone(),
        users.clone(),
        tls,
    ))
    .add_service(crate::api::etcd::election_server(
        node.clone(),
        users.clone(),
        tls,
    ))
    .add_service(crate::api::etcd::auth_server(node.clone(), users, tls))
    .add_service(health_service);
    let grpc = grpc.routes();
    // etcd's JSON gateway calls the same gRPC services.
    let http = crate::gateway::router(grpc.clone(), node.metrics().grpc_layer(), node.clone());
    let routes = crate::client_port::routes(grpc, http);
    let mut rx = shutdown_rx.clone();
    let stop = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tasks.push(port.serve(layers, routes, stop));

    Ok(tasks)
}

/// How often [`compactor`] looks at the log.
const COMPACT_EVERY: Duration = Duration::from_millis(200);

/// Build a snapshot (after which openraft purges the log before it, keeping `keep_logs`
/// entries) once at least `min_entries` entries were applied since the last one **and** the
/// log on disk is at least as large as that snapshot. The second rule makes the cost of
/// snapshots proportional to the log they let us drop: writing a 130 MB state (a million
/// held locks) every 5,000 entries took ~15 % of this machine's CPU from the requests, while
/// a small state still compacts every `min_entries`. The data dir stays within about twice
/// the state's size plus one log segment.
async fn compactor(
    raft: Raft,
    gauge: fenced_storage::CompactionGauge,
    min_entries: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(COMPACT_EVERY) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let (applied, snapshot) = {
            let m = raft.metrics();
            let m = m.borrow();
            (
                m.last_applied.map_or(0, |l| l.index),
                m.snapshot.map_or(0, |l| l.index),
            )
        };
        // A lock and a stat: cheap enough for a worker thread five times a second.
        let (log, snap) = (gauge.log_bytes(), gauge.snapshot_bytes());
        if !snapshot_due(applied.saturating_sub(snapshot), min_entries, log, snap) {
            continue;
        }
        tracing::debug!(applied, snapshot, log, snap, "triggering a snapshot");
        if let Err(e) = raft.trigger().snapshot().await {
            tracing::debug!("snapshot trigger: {e}");
            return;
        }
    }
}

/// [`compactor`]'s rule: enough entries since the last snapshot, and a log at least as large.
fn snapshot_due(entries_since: u64, min_entries: u64, log_bytes: u64, snapshot_bytes: u64) -> bool {
    entries_since >= min_entries.max(1) && log_bytes >= snapshot_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_wait_for_entries_and_for_a_log_as_large_as_the_last_snapshot() {
        // A small state: the entry count decides.
        assert!(!snapshot_due(4_999, 5_000, 10 << 20, 300 << 10));
        assert!(snapshot_due(5_000, 5_000, 10 << 20, 300 << 10));
        // A 130 MB state: not before the log has grown as large.
        assert!(!snapshot_due(20_000, 5_000, 100 << 20, 130 << 20));
        assert!(snapshot_due(20_000, 5_000, 130 << 20, 130 << 20));
        // No snapshot yet: the count alone.
        assert!(snapshot_due(5_000, 5_000, 0, 0));
        // 0 entries configured still needs one new entry.
        assert!(!snapshot_due(0, 0, 1, 0));
        assert!(snapshot_due(1, 0, 1, 0));
    }
}
