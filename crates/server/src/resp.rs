//! The RESP front end of a node: `fenced-resp`'s [`Backend`] implemented on [`Node`].
//!
//! * Keyspace writes are `Command::Kv` proposals (forwarded to the leader, retried safely
//!   under the connection's request id).
//! * Reads take the node's read path with the time committed first ([`Node::read_clone_timed`],
//!   `node/read.rs`): after a read-index barrier, the log time reaches the leader's clock at
//!   the check (a shared `Tick` if no other entry brought it) and the read is judged at the
//!   state machine's own time — `PTTL`, `LOCK.INFO`'s `ttl_ms` and expiry count down on an
//!   idle cluster, and an expiry a reader observed is in the log (a new leader cannot
//!   un-expire it). Keyspace reads run on an O(1) clone of the state, since `KEYS`/`SCAN`
//!   may walk all of it.
//! * The lock family (`LOCK.*`, `SESSION.*`) proposes the lock table's own commands, which
//!   the front end builds (`fenced_resp`'s `conn/lock.rs`), so grants are shared with gRPC;
//!   its lock-loss channels read the hub's ended grants.

use std::sync::Arc;

use async_trait::async_trait;
use fenced_core::kv::{KvCommand, KvEvent, KvResponse, Reply};
use fenced_core::{Command, Event, RequestId, Response};
use fenced_raft_types::identity::fmt_cluster_id;
use fenced_resp::{Backend, BackendError, MemberInfo, NodeInfo, ReadFn};
use openraft::ServerState;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::error::{NodeError, StartError};
use crate::node::Node;
use crate::{procinfo, NodeConfig};

/// Bind the RESP listener on `cfg.resp_addr` and serve until `shutdown`.
pub async fn start(
    node: Node,
    cfg: &NodeConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, StartError> {
    let config = config(&node, cfg)?;
    let listener = fenced_resp::bind(&config).await.map_err(|e| match e {
        fenced_resp::ServeError::Bind { addr, source } => StartError::Bind { addr, source },
    })?;
    tracing::info!(addr = %cfg.resp_addr, "RESP front end listening");
    let files = (
        cfg.config_file
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        cfg.data_dir.display().to_string(),
    );
    Ok(tokio::spawn(fenced_resp::serve(
        listener,
        Arc::new(RespBackend { node, files }),
        config,
        shutdown,
    )))
}

/// The node's RESP settings from its configuration: users, connection limit, TLS, and the
/// node's metrics as the command observer.
pub fn config(node: &Node, cfg: &NodeConfig) -> Result<fenced_resp::Config, StartError> {
    let mut config = fenced_resp::Config::new(cfg.resp_addr.clone());
    config.acl = cfg.acl.clone();
    config.max_connections = cfg.max_clients.max(1);
    config.max_query_buffer_total = cfg.resp_query_buffer_total;
    config.observer = Some(node.metrics().clone());
    if let Some(t) = &cfg.tls {
        config.tls = Some(
            t.resp_acceptor()
                .map_err(|e| StartError::Config(format!("RESP TLS: {e}")))?,
        );
    }
    Ok(config)
}

/// The node as the RESP front end's [`Backend`] (what [`start`] serves; a simulator runs
/// connections on it through [`fenced_resp::Front`]).
pub fn backend(node: Node) -> Arc<dyn Backend> {
    Arc::new(RespBackend {
        node,
        files: Default::default(),
    })
}

pub struct RespBackend {
    node: Node,
    /// `INFO`'s `config_file` and `fenced_data_dir`.
    files: (String, String),
}

fn backend_error(e: NodeError) -> BackendError {
    match e {
        NodeError::NotLeader { .. } => BackendError::Unavailable(e.to_string()),
        NodeError::Unknown(m) => BackendError::Unknown(m),
        NodeError::Fatal(m) => BackendError::Unavailable(m),
        NodeError::Invalid(m) => BackendError::Rejected(m),
        NodeError::Rejected(c) => BackendError::Rejected(c.to_string()),
        NodeError::Overloaded(m) => BackendError::Busy(m),
        NodeError::Corrupt(m) => BackendError::Corrupt(m),
    }
}

fn unexpected(r: Response) -> BackendError {
    match r {
        Response::Rejected(e) => BackendError::Rejected(e.to_string()),
        other => BackendError::Rejected(format!("unexpected response {other:?}")),
    }
}

#[async_trait]
impl Backend for RespBackend {
    async fn write(&self, rid: RequestId, cmd: KvCommand) -> Result<KvResponse, BackendError> {
        match self.node.propose(Some(rid), Command::Kv(cmd)).await {
            Ok(Response::Kv(r)) => Ok(r),
            Ok(other) => Err(unexpected(other)),
            Err(e) => Err(backend_error(e)),
        }
    }

    async fn read(&self, f: ReadFn) -> Result<Vec<Reply>, BackendError> {
        self.node
            .read_clone_timed(|sm, now| f(sm, now))
            .await
            .map_err(backend_error)
    }

    async fn lock_wait(
        &self,
        rid: RequestId,
        cmd: Command,
        wait_ms: u64,
        own_id: bool,
    ) -> Result<Response, BackendError> {
        self.node
            .acquire(rid, cmd, wait_ms, own_id)
            .await
            .map_err(backend_error)
    }

    async fn lock_batch(
        &self,
        cmds: Vec<(RequestId, Command)>,
    ) -> Vec<Result<Response, BackendError>> {
        let proposals = cmds.into_iter().map(|(rid, c)| (Some(rid), c)).collect();
        self.node
            .propose_all(proposals)
            .await
            .into_iter()
            .map(|r| r.map_err(backend_error))
            .collect()
    }

    fn lock_events(&self) -> broadcast::Receiver<Event> {
        self.node.hub().watch_released()
    }

    async fn session_gone(&self, id: u64) -> bool {
        // Gone on the applied state already: gone for good (session ids are never reused).
        if self
            .node
            .local(|sm| sm.revision() >= id && sm.session_info(id, sm.now()).is_none())
        {
            return true;
        }
        self.node
            .read_timed(|sm, now| sm.revision() >= id && sm.session_info(id, now).is_none())
            .await
            .unwrap_or(false)
    }

    fn log_time(&self) -> u64 {
        self.node.log_time()
    }

    fn events(&self) -> broadcast::Receiver<KvEvent> {
        self.node.hub().kv_events()
    }

    fn client_id(&self) -> u64 {
        fenced_raft_types::rng::nonzero_u64()
    }

    fn info(&self) -> NodeInfo {
        let m = self.node.raft().metrics().borrow().clone();
        let raft_role = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        // The local applied state at its own log time: INFO answers without a quorum.
        let (keys, expires) = self.node.local(|sm| {
            let now = sm.now();
            (sm.kv().len(now) as u64, sm.kv().expires(now) as u64)
        });
        let (rss_bytes, peak_rss_bytes) = procinfo::rss();
        let (cpu_sys, cpu_user) = procinfo::cpu();
        NodeInfo {
            node_id: self.node.id(),
            cluster_id: fmt_cluster_id(self.node.gate().identity().cluster_id()),
            raft_role: raft_role.into(),
            leader_id: m.current_leader.unwrap_or(0),
            term: m.current_term,
            applied_index: m.last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            members: crate::membership::members(&m)
                .into_iter()
                .map(|v| MemberInfo {
                    id: v.id,
                    addr: v.addr,
                    voter: v.voter,
                })
                .collect(),
            keys,
            expires,
            config_file: self.files.0.clone(),
            data_dir: self.files.1.clone(),
            rss_bytes,
            peak_rss_bytes,
            total_system_memory: procinfo::total_memory(),
            mem_allocator: "mimalloc".into(),
            cpu_sys,
            cpu_user,
            os: procinfo::os(),
        }
    }
}
