//! A fenced node, in layers: [`run`] assembles it (data dir, Raft, listeners, background
//! tasks); [`api`] (public gRPC) and [`resp`] (the RESP adapter) translate requests into
//! [`node`] calls; [`node`] proposes and reads through Raft (batching, forwarding, the
//! leader's log clock); [`forward`] answers followers' forwarded calls on the leader.

pub mod api;
pub mod batch;
pub mod clock;
pub mod config;
pub mod error;
pub mod forward;
pub mod hub;
pub mod node;
pub mod resp;
pub mod run;

pub use config::NodeConfig;
pub use error::{NodeError, StartError};
pub use node::Node;
pub use run::{start, Running};
