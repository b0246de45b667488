//! gRPC schemas of fenced, generated from `proto/` at build time.
//!
//! * [`v1`] — package `fenced.v1`: the client API (`Lock`, `Session`, `Cluster`).
//! * [`raft`] — package `fenced.raft.v1`: node-to-node services: the `Raft` transport
//!   (bincode-encoded openraft request/response types) and `Forward` (follower → leader).
//!
//! Both clients and servers are generated.

/// Client API, package `fenced.v1`.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    rustdoc::all
)]
pub mod v1 {
    tonic::include_proto!("fenced.v1");
}

/// Node-to-node Raft transport, package `fenced.raft.v1`.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    rustdoc::all
)]
pub mod raft {
    tonic::include_proto!("fenced.raft.v1");
}
