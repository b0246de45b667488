//! [`Metrics`] as the hooks the front ends and lower crates report through:
//! [`fenced_resp::CommandObserver`], [`fenced_storage::StorageObserver`] and
//! [`fenced_network::PeerObserver`].

use std::time::Duration;

use super::{Metrics, Peer, Reason};

impl Metrics {
    /// A gRPC call without a valid token refused for `reason` ([`crate::pre_auth`]).
    pub fn grpc_unauthenticated_refused(&self, reason: &'static str) {
        self.grpc_unauthenticated_refused
            .get_or_create(&Reason {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A metrics-port connection closed for `--metrics-max-connections`
    /// ([`super::http::Capped`]).
    pub fn metrics_connection_refused(&self) {
        self.metrics_connections_refused.inc();
    }

    /// A call refused for `--grpc-request-buffer-total` ([`crate::request_budget`]).
    pub fn grpc_request_buffer_refused(&self) {
        self.grpc_request_buffer_refused.inc();
    }
}

impl fenced_resp::CommandObserver for Metrics {
    fn command(&self, command: &'static str, ok: bool, took: Duration) {
        self.resp.record(command, ok, took.as_secs_f64());
    }

    fn input_refused(&self, reason: &'static str) {
        self.resp_input_closed
            .get_or_create(&Reason {
                reason: reason.to_string(),
            })
            .inc();
    }
}

impl fenced_storage::StorageObserver for Metrics {
    fn wal_fsync(&self, took: Duration) {
        self.wal_fsync.observe(took.as_secs_f64());
    }

    fn wal_append(&self, took: Duration) {
        self.wal_append.observe(took.as_secs_f64());
    }

    fn snapshot_built(&self, bytes: u64, took: Duration) {
        self.snapshots.inc();
        self.snapshot_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.snapshot_seconds.observe(took.as_secs_f64());
    }

    fn log_written(&self, first: u64, last: u64) {
        self.stages.written(first, last);
    }

    fn log_synced(&self, last: u64) {
        self.stages.synced(last);
    }

    fn log_recorded(&self, last: u64) {
        self.stages.recorded(last);
    }

    fn applying(&self, index: u64) {
        self.apply.applying(index);
        self.stages.applying(index);
    }

    fn applied(&self, index: u64) {
        self.apply.applied(index);
        self.stages.applied(index);
    }
}

impl fenced_network::PeerObserver for Metrics {
    fn round_trip(&self, peer: fenced_raft_types::NodeId, took: Duration) {
        self.peer_rtt
            .get_or_create(&Peer { peer })
            .observe(took.as_secs_f64());
    }

    fn entries_acked(&self, peer: fenced_raft_types::NodeId, last: u64) {
        self.stages.acked(peer, last);
    }

    fn append_answered(&self, first: u64, last: u64, received: std::time::Instant) {
        self.stages.follower_answered(first, last, received);
    }
}
