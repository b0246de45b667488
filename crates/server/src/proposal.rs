//! One proposal as the node's batchers carry it — to the leader's next entry or in a forwarded
//! batch — and what it costs in a batch.

use std::time::Duration;

use fenced_core::{Command, RequestId, Response};

use crate::error::NodeError;

/// How long a proposal keeps trying (following leader changes) before giving up as unknown.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a wait's deadline, how long to keep listening for the entry that ends it (the
/// leader's tick and its commit) before asking the state machine directly.
pub const WAIT_SLACK: Duration = Duration::from_secs(2);

/// One proposal: the request id (if any) and the command.
pub(crate) type Proposal = (Option<RequestId>, Command);
/// The answer to one proposal.
pub(crate) type Proposed = Result<Response, NodeError>;

/// Every proposal of a batch fails: the node is gone.
pub(crate) fn stopped(n: usize) -> Vec<Proposed> {
    vec![Err(NodeError::Fatal("node stopped".into())); n]
}

/// About how many bytes `cmd` adds to an entry (for the batch bounds; no serialization).
pub(crate) fn size(cmd: &Command) -> usize {
    const BASE: usize = 64;
    fn kv_size(cmd: &fenced_core::kv::KvCommand) -> usize {
        use fenced_core::kv::KvCommand;
        let argv = |a: &Vec<Vec<u8>>| a.iter().map(|x| x.len() + 8).sum::<usize>();
        match cmd {
            KvCommand::Batch(cmds) | KvCommand::Multi { cmds, .. } => cmds.iter().map(argv).sum(),
            KvCommand::Restricted { cmd, .. } => 256 + kv_size(cmd),
        }
    }
    match cmd {
        Command::Kv(kv) => BASE + kv_size(kv),
        Command::AcquireWith(spec) => BASE + spec.names.iter().map(|n| n.len() + 8).sum::<usize>(),
        Command::FencedPut { key, value, .. } => BASE + key.len() + value.len(),
        Command::Limit { key, .. } => {
            BASE + key.len() + 16 * fenced_core::kv::limit::MAX_LOG_POLICIES
        }
        _ => BASE,
    }
}
