//! What the Raft storage (`fenced-storage`), the transport (`fenced-network`) and the server of
//! fenced share: openraft's type configuration ([`TypeConfig`]), [`NodeId`], the [`Raft`]
//! handle and the snapshot file handle ([`SnapshotFile`], the configuration's
//! `SnapshotData`), and the member's [`identity`] (the `identity` file of a data dir, its
//! incarnation and the peers' pins), which the transport's identity checks read and update;
//! and the node's one source of randomness ([`rng`]: a per-thread generator a simulator can
//! seed, and [`rng::FencedRuntime`], openraft's runtime drawing its election timeouts from it).
//!
//! Nothing here knows how the log, the vote or the state machine are stored (no sled): a crate
//! that needs these types does not need the storage crate for them.

pub mod identity;
pub mod rng;
mod snapshot;

pub use snapshot::SnapshotFile;

openraft::declare_raft_types!(
    /// openraft type configuration of fenced: an entry carries a batch of commands and
    /// answers with one response per command.
    pub TypeConfig:
        D = fenced_core::Batch,
        R = Vec<fenced_core::Response>,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = SnapshotFile,
        AsyncRuntime = rng::FencedRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
