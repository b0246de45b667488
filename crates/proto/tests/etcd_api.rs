//! The vendored etcd protos keep etcd's names and field numbers: the generated services are
//! named as etcd's (so their gRPC paths are `/etcdserverpb.KV/Range`, …), a client built from
//! them sends etcd's paths, and messages encode with etcd's field numbers.

use std::task::{Context, Poll};

use fenced_proto::etcd::{etcdserverpb, mvccpb, v3electionpb, v3lockpb};
use prost::Message;
use tonic::body::Body;
use tonic::codegen::http;

#[test]
fn service_names_are_etcds() {
    // Each generated server's `NamedService::NAME` is its module's `SERVICE_NAME`.
    let names = [
        etcdserverpb::kv_server::SERVICE_NAME,
        etcdserverpb::watch_server::SERVICE_NAME,
        etcdserverpb::lease_server::SERVICE_NAME,
        etcdserverpb::cluster_server::SERVICE_NAME,
        etcdserverpb::maintenance_server::SERVICE_NAME,
        etcdserverpb::auth_server::SERVICE_NAME,
        v3lockpb::lock_server::SERVICE_NAME,
        v3electionpb::election_server::SERVICE_NAME,
    ];
    assert_eq!(
        names,
        [
            "etcdserverpb.KV",
            "etcdserverpb.Watch",
            "etcdserverpb.Lease",
            "etcdserverpb.Cluster",
            "etcdserverpb.Maintenance",
            "etcdserverpb.Auth",
            "v3lockpb.Lock",
            "v3electionpb.Election",
        ]
    );
}

/// A "channel" that answers every call with an error naming the request's path.
#[derive(Clone)]
struct PathEcho;

impl tonic::codegen::Service<http::Request<Body>> for PathEcho {
    type Response = http::Response<Body>;
    type Error = tonic::codegen::StdError;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let path = req.uri().path().to_owned();
        std::future::ready(Err(Box::new(tonic::Status::internal(path))))
    }
}

#[tokio::test]
async fn clients_call_etcds_paths() {
    let kv = etcdserverpb::kv_client::KvClient::new(PathEcho)
        .range(etcdserverpb::RangeRequest::default())
        .await
        .expect_err("echo");
    assert_eq!(kv.message(), "/etcdserverpb.KV/Range");
    let lock = v3lockpb::lock_client::LockClient::new(PathEcho)
        .lock(v3lockpb::LockRequest::default())
        .await
        .expect_err("echo");
    assert_eq!(lock.message(), "/v3lockpb.Lock/Lock");
    let campaign = v3electionpb::election_client::ElectionClient::new(PathEcho)
        .campaign(v3electionpb::CampaignRequest::default())
        .await
        .expect_err("echo");
    assert_eq!(campaign.message(), "/v3electionpb.Election/Campaign");
}

#[test]
fn messages_use_etcds_field_numbers() {
    // RangeRequest: key = 1, range_end = 2, limit = 3.
    let r = etcdserverpb::RangeRequest {
        key: b"a".to_vec(),
        range_end: b"b".to_vec(),
        limit: 1,
        ..Default::default()
    };
    assert_eq!(r.encode_to_vec(), [0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 1]);
    // mvccpb.KeyValue: key = 1, create_revision = 2, mod_revision = 3, version = 4,
    // value = 5, lease = 6.
    let kv = mvccpb::KeyValue {
        key: b"k".to_vec(),
        create_revision: 2,
        mod_revision: 3,
        version: 4,
        value: b"v".to_vec(),
        lease: 6,
    };
    assert_eq!(
        kv.encode_to_vec(),
        [0x0a, 1, b'k', 0x10, 2, 0x18, 3, 0x20, 4, 0x2a, 1, b'v', 0x30, 6]
    );
    // The cross-package reference decodes: RangeResponse.kvs (field 2) is mvccpb.KeyValue.
    let resp = etcdserverpb::RangeResponse::decode(
        [&[0x12, kv.encoded_len() as u8][..], &kv.encode_to_vec()]
            .concat()
            .as_slice(),
    )
    .expect("decode");
    assert_eq!(resp.kvs, [kv]);
}
