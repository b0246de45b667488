//! Raft storage of fenced: log, vote and state machine in one sled `Db`.

use std::io::Cursor;

openraft::declare_raft_types!(
    /// openraft type configuration of fenced.
    pub TypeConfig:
        D = fenced_core::Request,
        R = fenced_core::Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
