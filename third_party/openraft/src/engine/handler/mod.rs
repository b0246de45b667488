pub(crate) mod establish_handler;
pub(crate) mod following_handler;
pub(crate) mod leader_handler;
pub(crate) mod log_handler;
pub(crate) mod replication_handler;
pub(crate) mod server_state_handler;
pub(crate) mod snapshot_handler;
pub(crate) mod vote_handler;
