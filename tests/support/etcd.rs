//! etcd API calls the etcd tests share (the generated tonic clients).

use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::lease_client::LeaseClient;

use super::{wait_for, TestCluster};

/// Bound for the cluster to accept lease commands (a leader that heard every member's
/// rules), and for a call after the leader died.
pub const ETCD_READY: Duration = Duration::from_secs(60);

/// Grant a lease of `ttl` seconds through the tonic client on node `id`, retrying until it
/// works.
pub async fn grant_lease(c: &TestCluster, id: u64, ttl: i64) -> epb::LeaseGrantResponse {
    wait_for("a lease grant to succeed", ETCD_READY, || {
        let mut lease = LeaseClient::new(c.raw_channel(id));
        async move {
            lease
                .lease_grant(epb::LeaseGrantRequest { ttl, id: 0 })
                .await
                .map(|r| r.into_inner())
                .map_err(|e| e.to_string())
        }
    })
    .await
}
