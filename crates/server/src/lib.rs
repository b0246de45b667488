//! A fenced node, in layers: [`run`] assembles it (data dir, Raft, listeners, background
//! tasks); [`api`] (public gRPC) and [`resp`] (the RESP adapter) translate requests into
//! [`node`] calls; [`node`] proposes and reads through Raft (batching, the leader's log
//! clock), passing what a follower cannot do to the leader through [`forward`] (both halves:
//! the follower's calls and the leader's answers). [`users`] says who calls the gRPC API and
//! what they may do (the ACL users of RESP, on every port).

pub mod admin;
pub mod api;
pub mod backup;
pub mod batch;
pub mod client_port;
pub mod clock;
pub mod config;
pub mod config_file;
pub mod conn_limit;
pub mod error;
pub mod forward;
pub mod gateway;
pub mod hub;
pub mod membership;
pub mod metrics;
pub mod node;
pub mod pre_auth;
pub mod procinfo;
pub mod proposal;
pub mod request_budget;
pub mod resp;
pub mod run;
pub mod users;

pub use config::NodeConfig;
pub use error::{NodeError, StartError};
pub use node::Node;
pub use run::{start, Running};
