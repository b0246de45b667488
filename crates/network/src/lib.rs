//! Node-to-node Raft transport of fenced: openraft's [`RaftNetwork`](openraft::RaftNetwork)
//! over tonic gRPC (service `fenced.raft.v1.Raft`).
//!
//! * Client side: [`NetworkFactory`] (give it to [`openraft::Raft::new`]) creates one
//!   [`Network`] per target node. Targets are addressed by [`openraft::BasicNode::addr`]
//!   (`"host:port"` of the node's gRPC listener).
//! * The seam: a [`Links`] hands out the call handles to a peer's Raft and Forward services
//!   (the generated tonic server traits). Production uses [`GrpcLinks`]: channels connected
//!   lazily and shared by all clients that talk to the same node; a simulator routes the
//!   calls to the other nodes' services in its process (see [`links`]).
//! * Server side: [`raft_server`] wraps a [`fenced_raft_types::Raft`] handle into a tonic service
//!   to add to the node's gRPC router next to the client API; [`RaftService`] is the same
//!   service without tonic's server around it.
//!
//! Payloads are openraft's own request, response and error types encoded with bincode (see
//! `codec`), so the schema stays stable while openraft's types evolve.
//!
//! Message size: both ends accept messages up to [`MAX_MESSAGE_SIZE`]. Snapshots travel in
//! chunks of `openraft::Config::snapshot_max_chunk_size` bytes, which must stay below it: use
//! [`SNAPSHOT_CHUNK_SIZE`] and check a configuration with [`check_config`]. An append-entries
//! batch that would exceed the limit is answered with `RPCError::PayloadTooLarge`, so openraft
//! retries with fewer entries.

mod client;
pub mod codec;
pub mod gate;
pub mod links;
mod server;

use std::time::Duration;

pub use client::{Network, NetworkFactory, PeerObserver};
pub use gate::PeerGate;
pub use links::{GrpcLinks, Links};
pub use server::{raft_server, RaftService};

/// Largest gRPC message either end of the Raft transport encodes or decodes (64 MiB).
pub const MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// Room left in a message for everything of an install-snapshot request but its data: vote,
/// snapshot meta (with the membership and node addresses), offset, framing.
pub const SNAPSHOT_CHUNK_OVERHEAD: usize = 1024 * 1024;

/// Recommended `openraft::Config::snapshot_max_chunk_size` (4 MiB): well below
/// [`MAX_MESSAGE_SIZE`] − [`SNAPSHOT_CHUNK_OVERHEAD`].
pub const SNAPSHOT_CHUNK_SIZE: u64 = 4 * 1024 * 1024;

const _: () = assert!(SNAPSHOT_CHUNK_SIZE as usize + SNAPSHOT_CHUNK_OVERHEAD <= MAX_MESSAGE_SIZE);

/// Default timeout for establishing a TCP/HTTP2 connection to a peer.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// Errors of the Raft transport. Inside [`Network`] they are wrapped into openraft's
/// `RPCError` variants; they also describe configuration problems.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The node's address cannot be turned into a gRPC endpoint.
    #[error("invalid address {addr:?} of node {node}: {reason}")]
    InvalidAddress {
        node: fenced_raft_types::NodeId,
        addr: String,
        reason: String,
    },
    /// An openraft value could not be encoded.
    #[error("encoding a raft message: {0}")]
    Encode(#[source] bincode::Error),
    /// A received payload is not a valid bincode encoding of the expected type.
    #[error("decoding a raft message: {0}")]
    Decode(#[source] bincode::Error),
    /// The peer answered with a gRPC error status.
    #[error("peer returned gRPC status {}: {}", .0.code(), .0.message())]
    Status(#[source] tonic::Status),
    /// An encoded request is larger than [`MAX_MESSAGE_SIZE`] and cannot be split.
    #[error("raft message of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// `snapshot_max_chunk_size` does not fit into a message.
    #[error(
        "snapshot_max_chunk_size {chunk} + {overhead} bytes overhead exceeds the transport's \
         message limit of {limit} bytes"
    )]
    ChunkTooLarge {
        chunk: u64,
        overhead: usize,
        limit: usize,
    },
}

/// Checks that `config` fits the transport: a snapshot chunk plus its envelope must fit into
/// [`MAX_MESSAGE_SIZE`].
pub fn check_config(config: &openraft::Config) -> Result<(), TransportError> {
    let fits = usize::try_from(config.snapshot_max_chunk_size)
        .ok()
        .and_then(|c| c.checked_add(SNAPSHOT_CHUNK_OVERHEAD))
        .is_some_and(|total| total <= MAX_MESSAGE_SIZE);
    if fits {
        Ok(())
    } else {
        Err(TransportError::ChunkTooLarge {
            chunk: config.snapshot_max_chunk_size,
            overhead: SNAPSHOT_CHUNK_OVERHEAD,
            limit: MAX_MESSAGE_SIZE,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_and_recommended_configs_fit() {
        check_config(&openraft::Config::default()).expect("default config fits");
        let cfg = openraft::Config {
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_SIZE,
            ..Default::default()
        };
        check_config(&cfg).expect("recommended config fits");
        let too_big = openraft::Config {
            snapshot_max_chunk_size: MAX_MESSAGE_SIZE as u64,
            ..Default::default()
        };
        assert!(check_config(&too_big).is_err());
    }
}
