//! Follower → leader forwarding (`fenced.raft.v1.Forward`), both halves: the follower's
//! ([`client`]: batching per leader, the calls, the leader's log time from the answers) and the
//! leader's ([`server`]). Payloads are encoded with the transport's codec
//! (`fenced_network::codec`), like the Raft messages.

pub mod client;
pub mod server;

/// Response metadata of a forwarded proposal: the leader's state machine log time (ms) after
/// it applied the entry. Lets the follower that forwarded it count leases from a log time no
/// older than that entry, although it may not have applied the entry itself yet.
pub const LOG_TIME_HEADER: &str = "x-fenced-log-time";
