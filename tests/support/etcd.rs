//! etcd API calls the etcd tests share (the generated tonic clients).

use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::kv_client::KvClient;
use fenced_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use fenced_proto::etcd::mvccpb;
use fenced_proto::etcd::v3lockpb as lpb;
use fenced_proto::etcd::v3lockpb::lock_client::LockClient;
use tonic::transport::Channel;

use super::{wait_for, within, TestCluster};

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

/// Bound for an etcd call that should answer soon ([`etcd_unlock`], [`etcd_get`]).
const ETCD_CALL: Duration = Duration::from_secs(20);

/// etcd's `Lock` RPC on `ch`, unbounded (a Lock may wait long): its answer.
pub async fn etcd_lock(
    ch: Channel,
    name: &str,
    lease: i64,
) -> Result<lpb::LockResponse, tonic::Status> {
    LockClient::new(ch)
        .lock(lpb::LockRequest {
            name: name.as_bytes().to_vec(),
            lease,
        })
        .await
        .map(|r| r.into_inner())
}

/// etcd's `Unlock` RPC of `key` on `ch`, which must succeed.
pub async fn etcd_unlock(ch: Channel, key: &[u8]) {
    within(
        "unlock",
        ETCD_CALL,
        LockClient::new(ch).unlock(lpb::UnlockRequest { key: key.to_vec() }),
    )
    .await
    .expect("unlock");
}

/// The live version of `key`, read through `ch`.
pub async fn etcd_get(ch: Channel, key: &[u8]) -> Option<mvccpb::KeyValue> {
    within(
        "get",
        ETCD_CALL,
        KvClient::new(ch).range(epb::RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        }),
    )
    .await
    .expect("range")
    .into_inner()
    .kvs
    .pop()
}
