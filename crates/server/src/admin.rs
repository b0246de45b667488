//! Administrative calls that only the leader can carry out — membership changes and the
//! leadership hand-off — from any node: a follower passes them to the leader over the
//! node-to-node `Forward/Admin` call (the caller's permission was checked where it arrived),
//! so `fenced member …` works through whichever endpoints the operator names.

use std::time::Duration;

use fenced_raft_types::NodeId;
use serde::{Deserialize, Serialize};

use crate::error::NodeError;
use crate::membership::MemberView;
use crate::node::Node;

/// How long `MemberAdd` without `learner` waits for the new member to catch up, at most.
pub const MAX_ADD_WAIT: Duration = Duration::from_secs(300);

/// An administrative call (bincode inside `Forward/Admin`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AdminOp {
    /// Add a learner; unless `learner`, promote it once caught up (waiting up to `wait_ms`).
    MemberAdd {
        id: NodeId,
        addr: String,
        learner: bool,
        wait_ms: u64,
    },
    MemberPromote {
        id: NodeId,
    },
    MemberRemove {
        id: NodeId,
    },
    StepDown,
}

/// What an [`AdminOp`] returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AdminDone {
    Members(Vec<MemberView>),
    HandedOff {
        from: NodeId,
        to: NodeId,
        took_ms: u64,
    },
}

impl AdminOp {
    /// How long the call may take on the leader (beyond the usual timeouts).
    pub fn patience(&self) -> Duration {
        match self {
            AdminOp::MemberAdd {
                learner: false,
                wait_ms,
                ..
            } => Duration::from_millis(*wait_ms).min(MAX_ADD_WAIT),
            _ => Duration::ZERO,
        }
    }
}

impl Node {
    /// Run `op` on the leader: here if this node leads, else forwarded to it once.
    pub async fn admin(&self, op: AdminOp) -> Result<AdminDone, NodeError> {
        match self.admin_here(op.clone()).await {
            Err(NodeError::NotLeader { leader: Some(addr) }) => {
                self.forwarder().admin(&addr, &op).await
            }
            other => other,
        }
    }

    /// Run `op` on this node, which must be the leader.
    pub async fn admin_here(&self, op: AdminOp) -> Result<AdminDone, NodeError> {
        Ok(match op {
            AdminOp::MemberAdd {
                id,
                addr,
                learner,
                wait_ms,
            } => {
                let mut views = self.member_add(id, &addr).await?;
                if !learner {
                    let wait = Duration::from_millis(wait_ms).min(MAX_ADD_WAIT);
                    views = self.member_promote_when_caught_up(id, wait).await?;
                }
                AdminDone::Members(views)
            }
            AdminOp::MemberPromote { id } => AdminDone::Members(self.member_promote(id).await?),
            AdminOp::MemberRemove { id } => AdminDone::Members(self.member_remove(id).await?),
            AdminOp::StepDown => {
                let h = self.step_down().await?;
                AdminDone::HandedOff {
                    from: h.from,
                    to: h.to,
                    took_ms: h.took.as_millis() as u64,
                }
            }
        })
    }
}
