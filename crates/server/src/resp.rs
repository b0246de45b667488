//! The RESP front end of a node: `fenced-resp`'s [`Backend`] implemented on [`Node`].
//!
//! * Keyspace writes are `Command::Kv` proposals (forwarded to the leader, retried safely
//!   under the connection's request id).
//! * Reads run after a read-index barrier. Key expiry is decided in the log: the barrier
//!   also brings the leader's log clock, and if a deadline (key expiry, lease) is due on it
//!   but its `Tick` is not applied yet, the read first proposes that `Tick` and waits for it.
//!   So a read never sees a key alive after its expiry because no entry happened to be
//!   applied since, and an expiry a reader observed is in the log — a new leader cannot
//!   un-expire it.
//! * `LOCK.*` use the lock table's own commands (`Acquire`/`Release`/`Renew`) and
//!   `StateMachine::lock_info`, so grants are shared with gRPC.

use std::sync::Arc;

use async_trait::async_trait;
use fenced_core::kv::{KvCommand, KvEvent, KvResponse, Reply};
use fenced_core::{Command, RequestId, Response, StateMachine};
use fenced_resp::{Backend, BackendError, LockOp, LockOpReply, LockView, ReadFn};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::error::{NodeError, StartError};
use crate::node::Node;
use crate::NodeConfig;

/// Bind the RESP listener on `cfg.resp_addr` and serve until `shutdown`.
pub async fn start(
    node: Node,
    cfg: &NodeConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, StartError> {
    let mut config = fenced_resp::Config::new(cfg.resp_addr.clone());
    config.acl = cfg.acl.clone();
    config.max_connections = cfg.max_clients.max(1);
    config.observer = Some(node.metrics().clone());
    if let Some(t) = &cfg.tls {
        config.tls = Some(
            t.resp_acceptor()
                .map_err(|e| StartError::Config(format!("RESP TLS: {e}")))?,
        );
    }
    let listener = fenced_resp::bind(&config).await.map_err(|e| match e {
        fenced_resp::ServeError::Bind { addr, source } => StartError::Bind { addr, source },
    })?;
    tracing::info!(addr = %cfg.resp_addr, "RESP front end listening");
    let cluster: Arc<dyn Backend> = Arc::new(RespBackend { node });
    Ok(tokio::spawn(fenced_resp::serve(
        listener, cluster, config, shutdown,
    )))
}

pub struct RespBackend {
    node: Node,
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

impl RespBackend {
    /// A linearizable view with every due expiry applied (see the module docs).
    async fn fresh<T>(&self, f: impl FnOnce(&StateMachine) -> T) -> Result<T, BackendError> {
        let leader_now = self.node.read_barrier_time().await.map_err(backend_error)?;
        let due = self.node.local(|sm| sm.next_deadline());
        if due.is_some_and(|d| d <= leader_now) {
            self.node
                .propose(None, Command::Tick)
                .await
                .map_err(backend_error)?;
            self.node.read_barrier().await.map_err(backend_error)?;
        }
        Ok(self.node.local(f))
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
        self.fresh(|sm| f(sm, sm.now())).await
    }

    async fn lock_acquire(
        &self,
        rid: RequestId,
        name: String,
        owner: String,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<Option<u64>, BackendError> {
        let cmd = Command::Acquire {
            name,
            owner,
            ttl_ms,
            session: None,
            wait_ms,
        };
        match self.node.acquire(rid, cmd, wait_ms).await {
            Ok(Response::Granted { token, .. }) => Ok(Some(token)),
            Ok(Response::NotGranted) => Ok(None),
            Ok(Response::Pending) => Err(BackendError::Unknown(
                "the wait's outcome could not be learnt in time".into(),
            )),
            Ok(other) => Err(unexpected(other)),
            Err(e) => Err(backend_error(e)),
        }
    }

    async fn lock_batch(
        &self,
        ops: Vec<(RequestId, LockOp)>,
    ) -> Vec<Result<LockOpReply, BackendError>> {
        let proposals = ops
            .into_iter()
            .map(|(rid, op)| {
                let cmd = match op {
                    LockOp::Acquire {
                        name,
                        owner,
                        ttl_ms,
                    } => Command::Acquire {
                        name,
                        owner,
                        ttl_ms,
                        session: None,
                        wait_ms: 0,
                    },
                    LockOp::Release { name, owner, token } => {
                        Command::Release { name, owner, token }
                    }
                    LockOp::Renew {
                        name,
                        owner,
                        token,
                        ttl_ms,
                    } => Command::Renew {
                        name,
                        owner,
                        token,
                        ttl_ms,
                    },
                };
                (Some(rid), cmd)
            })
            .collect();
        self.node
            .propose_all(proposals)
            .await
            .into_iter()
            .map(|r| match r {
                Ok(Response::Granted { token, .. }) => Ok(LockOpReply::Acquired(Some(token))),
                Ok(Response::NotGranted) => Ok(LockOpReply::Acquired(None)),
                Ok(Response::Released { .. } | Response::Renewed { .. }) => {
                    Ok(LockOpReply::Done(true))
                }
                Ok(Response::NotHeld) => Ok(LockOpReply::Done(false)),
                Ok(other) => Err(unexpected(other)),
                Err(e) => Err(backend_error(e)),
            })
            .collect()
    }

    async fn lock_info(&self, name: String) -> Result<Option<LockView>, BackendError> {
        self.fresh(|sm| {
            sm.lock_info(&name).map(|l| LockView {
                owner: l.owner,
                token: l.token,
                holds: l.holds,
                ttl_ms: l.deadline_ms.saturating_sub(sm.now()),
            })
        })
        .await
    }

    fn events(&self) -> broadcast::Receiver<KvEvent> {
        self.node.hub().kv_events()
    }

    fn info(&self) -> Vec<(String, String)> {
        let m = self.node.raft().metrics();
        let m = m.borrow();
        vec![
            ("fenced_node_id".into(), self.node.id().to_string()),
            (
                "fenced_role".into(),
                format!("{:?}", m.state).to_lowercase(),
            ),
            (
                "fenced_leader".into(),
                m.current_leader.map_or("none".into(), |l| l.to_string()),
            ),
            ("fenced_term".into(), m.current_term.to_string()),
            (
                "fenced_applied_index".into(),
                m.last_applied.map_or(0, |l| l.index).to_string(),
            ),
        ]
    }
}
