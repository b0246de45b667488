//! Errors of a node, and their one mapping to gRPC status codes.

use fenced_core::CoreError;
use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

/// Metadata key carrying the leader's gRPC address on `UNAVAILABLE` answers.
pub const LEADER_HINT: &str = "x-fenced-leader";
/// Metadata key on the answers of a member whose divergence alarm is raised (`corrupt`).
pub const ALARM_HEADER: &str = "x-fenced-alarm";

/// `Serialize`: a leader answers each proposal of a follower's forwarded batch with a
/// `Result<Response, NodeError>`.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum NodeError {
    /// This node is not the leader. `leader` is the leader's gRPC address when known.
    #[error("not the leader (leader: {})", .leader.as_deref().unwrap_or("unknown"))]
    NotLeader { leader: Option<String> },
    /// The request may or may not have taken effect (a timeout, a lost leader). Retrying with
    /// the same request id is safe.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("rejected: {0}")]
    Rejected(#[from] CoreError),
    /// The Raft node stopped (storage failure or shutdown).
    #[error("node stopped: {0}")]
    Fatal(String),
    /// Too much work waits on this node already (`--max-pending-requests`); nothing was done.
    /// Appended last: forwarded answers carry this enum.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// This member's divergence alarm is raised ([`crate::node::alarm`]): its state differs
    /// from the majority's, so it serves no client reads or writes; nothing was done. Other
    /// members serve. Appended last: forwarded answers carry this enum.
    #[error("corrupt: {0}")]
    Corrupt(String),
}

impl NodeError {
    /// The refusal of the cluster-wide `CORRUPT` alarm ([`crate::node::alarm::CLUSTER_CORRUPT`]),
    /// not of one member's divergence alarm: no member serves.
    pub fn cluster_corrupt(&self) -> bool {
        matches!(self, NodeError::Corrupt(m) if m.starts_with(crate::node::alarm::CLUSTER_CORRUPT))
    }
}

impl From<NodeError> for Status {
    fn from(e: NodeError) -> Status {
        let msg = e.to_string();
        match e {
            NodeError::NotLeader { leader } => {
                let mut s = Status::unavailable(msg);
                if let Some(addr) = leader.and_then(|a| a.parse().ok()) {
                    s.metadata_mut().insert(LEADER_HINT, addr);
                }
                s
            }
            NodeError::Unknown(_) => Status::new(Code::Unavailable, msg),
            NodeError::Invalid(_) => Status::invalid_argument(msg),
            NodeError::Rejected(ref c) => match c {
                CoreError::NoSuchSession(_) => Status::not_found(msg),
                CoreError::NotSessionOwner { .. } => Status::permission_denied(msg),
                CoreError::TooManyWaiters { .. }
                | CoreError::TooManyHolds { .. }
                | CoreError::LimitReached { .. } => Status::resource_exhausted(msg),
                CoreError::LockBoundToSession(_)
                | CoreError::RequestTooOld { .. }
                | CoreError::NotUpgraded { .. }
                | CoreError::LuaBuildDiffers { .. } => Status::failed_precondition(msg),
                _ => Status::invalid_argument(msg),
            },
            NodeError::Fatal(_) => Status::internal(msg),
            NodeError::Overloaded(_) => Status::resource_exhausted(msg),
            // UNAVAILABLE, so that clients try another member; the message starts with
            // "corrupt:" and `x-fenced-alarm: corrupt` says why.
            NodeError::Corrupt(_) => {
                let mut s = Status::unavailable(msg);
                s.metadata_mut().insert(
                    ALARM_HEADER,
                    tonic::metadata::MetadataValue::from_static("corrupt"),
                );
                s
            }
        }
    }
}

/// Errors starting a node.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Storage(#[from] fenced_storage::StoreError),
    #[error(transparent)]
    Identity(#[from] fenced_raft_types::identity::IdentityError),
    #[error("configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("raft: {0}")]
    Raft(String),
    #[error("--force-new-cluster: {0}")]
    Recovery(#[from] crate::backup::BackupError),
}
