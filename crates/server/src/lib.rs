//! A fenced node: the Raft node over sled storage, the leader's log clock, the expiry ticker,
//! forwarding to the leader, and the gRPC client API.

pub mod batch;
pub mod clock;
pub mod config;
pub mod error;
pub mod grpc;
pub mod hub;
pub mod node;
pub mod resp;

pub use config::NodeConfig;
pub use error::{NodeError, StartError};
pub use node::{Node, Running};
