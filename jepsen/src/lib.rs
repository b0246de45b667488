//! Jepsen-style fault injection for fenced (over gRPC and over RESP), Redis and Redlock: real processes in network
//! namespaces, nemeses on a seeded schedule, client processes recording histories in the
//! format of `history.rs`, and checkers (mutual exclusion, fencing, stale writes, lost updates,
//! linearizability, availability) that turn a history into a verdict. See docs/jepsen.md.

pub mod checker;
pub mod client;
pub mod env;
pub mod etcd;
pub mod failover;
pub mod history;
pub mod membership;
pub mod nemesis;
pub mod proxy;
pub mod replicas;
pub mod report;
pub mod run;
pub mod system;
pub mod tables;
