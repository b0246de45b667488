//! The leader's upkeep of the etcd keyspace: it proposes its `--quota-backend-bytes` when the
//! replicated quota differs, and the compactions of `--auto-compaction-mode` /
//! `--auto-compaction-retention`, as it proposes expiry ticks — so every replica judges writes
//! by one quota and removes the same history.
//!
//! * **Quota.** The quota is replicated state (`fenced_core::etcd::Quota`), set by a logged
//!   `EtcdCommand::Quota`: apply never reads a node's flag, so every replica refuses exactly
//!   the same writes. A leader whose flag differs from the replicated quota proposes its own
//!   (refused by [`Node::admit`] until every member runs [`Semantics::QUOTA`]; asked again
//!   every second). Members should carry the same flag; if they do not, the quota is the
//!   current leader's.
//! * **Auto-compaction.** Every node feeds its committed states to a
//!   [`fenced_core::etcd::AutoCompactor`] (followers too, so a new leader has samples of the
//!   past); the leader proposes `Compact` at the revision it names, at most once a second.
//!   Periodic retention is judged in log time, from committed states only.
//!
//! [`Semantics::QUOTA`]: fenced_core::Semantics::QUOTA

use std::time::Duration;

use fenced_core::etcd::{effective_quota, AutoCompaction, AutoCompactor};
use fenced_core::{Command, EtcdCommand, Response};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Node;

/// How often the upkeep looks at the committed state.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(100);
/// Least time between two proposals of the same kind by this leader.
const RETRY: Duration = Duration::from_secs(1);

impl Node {
    /// Run until shutdown: on every node, sample the committed state for auto-compaction;
    /// while this node leads, propose its quota and the compactions due (module docs).
    pub(crate) async fn etcd_upkeep(
        self,
        quota_bytes: u64,
        auto: Option<AutoCompaction>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let want = effective_quota(quota_bytes);
        let mut compactor = auto.map(AutoCompactor::new);
        let mut next_quota = Instant::now();
        let mut next_compact = Instant::now();
        loop {
            let leading = self.leader_term().is_ok();
            let (quota, due) = self.inner.state.read(|sm| {
                let due = compactor.as_mut().and_then(|c| {
                    if leading {
                        c.due(sm)
                    } else {
                        c.observe(sm.now(), sm.revision());
                        None
                    }
                });
                (sm.etcd_quota().limit(), due)
            });
            if leading && quota != want && Instant::now() >= next_quota {
                next_quota = Instant::now() + RETRY;
                let cmd = EtcdCommand::Quota { bytes: quota_bytes };
                match self.propose_local(None, Command::Etcd(cmd)).await {
                    Ok(Response::Etcd { revision, .. }) => tracing::info!(
                        revision,
                        quota_bytes = want,
                        "etcd space quota set (--quota-backend-bytes)"
                    ),
                    Ok(other) => tracing::debug!("etcd quota: {other:?}"),
                    Err(e) => tracing::debug!("etcd quota: {e}"),
                }
            }
            if let Some(at) = due.filter(|_| leading && Instant::now() >= next_compact) {
                next_compact = Instant::now() + RETRY;
                let cmd = EtcdCommand::Compact { revision: at };
                match self.propose_local(None, Command::Etcd(cmd)).await {
                    Ok(Response::Etcd { .. }) => {
                        tracing::info!(compact_revision = at, "etcd history auto-compacted")
                    }
                    Ok(other) => tracing::debug!("etcd auto-compaction at {at}: {other:?}"),
                    Err(e) => tracing::debug!("etcd auto-compaction at {at}: {e}"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(UPKEEP_INTERVAL) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }
}
