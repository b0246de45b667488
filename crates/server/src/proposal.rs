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

/// The most bytes ([`size`]) of one entry's commands, and of one forwarded batch's: half the
/// transport's message limit ([`fenced_network::MAX_MESSAGE_SIZE`], 64 MiB), so that an
/// entry always fits into one append-entries message with room to spare, and a forwarded
/// batch always fits the leader's decode limit. Commands that would take an entry or a
/// forwarded batch past it go into the next one; a command larger than this alone is
/// refused before anything is proposed ([`too_large`]). Size is not the only bound on an
/// entry that replicates: openraft gives one append-entries call a heartbeat interval to
/// complete, so an entry of several MiB can still time out on a slow or loaded node.
pub const MAX_ENTRY_BYTES: usize = fenced_network::MAX_MESSAGE_SIZE / 2;

/// The bytes `cmd` adds to an entry (for the batch bounds): its encoded size (bincode's
/// fixed-width lengths, never less than the transport's varints) plus the request around
/// it. Counted without encoding it; a keyspace command's byte strings by their lengths, as
/// bincode's own count walks a `Vec<u8>` byte by byte.
pub(crate) fn size(cmd: &Command) -> usize {
    /// A request's time and id, and the entry's framing, per command.
    const BASE: usize = 64;
    let encoded = match cmd {
        Command::Kv(kv) => TAG.saturating_add(kv_size(kv)),
        other => serialized(other),
    };
    encoded.saturating_add(BASE)
}

/// An enum variant's tag, a collection's length (bincode's fixed-width encoding).
const TAG: usize = 4;
const LEN: usize = 8;

fn serialized<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    bincode::serialized_size(value).map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn kv_size(kv: &fenced_core::kv::KvCommand) -> usize {
    use fenced_core::kv::{Argv, KvCommand};
    let bytes = |b: &[u8]| LEN + b.len();
    let argvs = |cmds: &[Argv]| {
        LEN + cmds
            .iter()
            .map(|argv| LEN + argv.iter().map(|a| bytes(a)).sum::<usize>())
            .sum::<usize>()
    };
    TAG + match kv {
        KvCommand::Batch(cmds) => argvs(cmds),
        KvCommand::Multi { watches, cmds } => {
            LEN + watches.iter().map(|(k, _)| bytes(k) + 8).sum::<usize>() + argvs(cmds)
        }
        KvCommand::Restricted { limits, cmd } => serialized(limits) + kv_size(cmd),
    }
}

/// The error of a command larger than an entry may be ([`MAX_ENTRY_BYTES`]): it was refused
/// before it was proposed, so nothing was applied.
pub(crate) fn too_large(size: usize, cap: usize) -> NodeError {
    NodeError::Invalid(format!(
        "the command takes {size} bytes, more than one log entry may carry ({cap} bytes); \
         nothing was applied"
    ))
}

#[cfg(test)]
mod size_tests {
    use super::*;
    use fenced_core::kv::KvCommand;

    /// What a command carries counts, whichever command: a lock name or owner as much as a
    /// value (`LOCK.ACQUIRE` takes them from RESP bulk strings of up to 16 MiB).
    #[test]
    fn size_covers_every_encoding_of_every_command() {
        let big = "x".repeat(100_000);
        let cmds = [
            Command::Acquire {
                name: big.clone(),
                owner: big.clone(),
                ttl_ms: 1_000,
                session: None,
                wait_ms: 0,
            },
            Command::Release {
                name: big.clone(),
                owner: "o".into(),
                token: 1,
            },
            Command::Kv(KvCommand::Batch(vec![vec![
                b"SET".to_vec(),
                b"k".to_vec(),
                big.clone().into_bytes(),
            ]])),
            Command::Kv(KvCommand::Restricted {
                limits: fenced_core::kv::Restriction {
                    user: "u".into(),
                    keys: Some(vec![b"k*".to_vec()]),
                    channels: None,
                    commands: Some(vec!["SET".into()]),
                },
                cmd: Box::new(KvCommand::Multi {
                    watches: vec![(b"w".to_vec(), 7)],
                    cmds: vec![
                        vec![b"SET".to_vec(), big.clone().into_bytes()],
                        vec![b"DEL".to_vec()],
                    ],
                }),
            }),
        ];
        for cmd in cmds {
            let size = size(&cmd);
            let transport = fenced_network::codec::encode(&cmd).expect("encode").len();
            let log = bincode::serialize(&cmd).expect("encode").len();
            assert_eq!(size, log + 64, "counted as bincode encodes it");
            assert!(
                size >= transport && size >= log && size >= 100_000,
                "size {size} of a command that encodes to {transport} / {log} bytes"
            );
        }
    }
}
