//! Rate limiters over gRPC (`fenced.v1.Limiter`, `Client::limiter`) on a 3-node cluster: a
//! token bucket's burst admitted and the next request refused with its `retry_after`, peeks
//! that consume nothing, a reset, the same state as RESP's `LIMIT.*` under the same key, a
//! retried request id that consumes once, state that survives a leader SIGKILL, and bad input
//! refused with nothing consumed.
//!
//! Run: `cargo test -p fenced-server --test limiter`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use fenced_client::{ClientError, Policy};
use fenced_proto::v1 as pb;
use fenced_proto::v1::limiter_client::LimiterClient;
use support::{follower_of, resp_cmd, resp_connect, TestCluster, LEADER_TIMEOUT};
use tonic::Code;

const TEN_S: Duration = Duration::from_secs(10);

fn refused<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str, needle: &str) {
    match r {
        Err(ClientError::Rejected(s)) => {
            assert_eq!(s.code(), Code::InvalidArgument, "{what}: {s:?}");
            assert!(s.message().contains(needle), "{what}: {:?}", s.message());
        }
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limiter_over_grpc_decides_once_and_remembers() {
    let c = TestCluster::start("limiter_grpc", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    // Through a follower first: it forwards.
    let follower = follower_of(leader);
    let client = c.client_of(follower);

    // 5 tokens, 1 back every 10 s: five admitted, the sixth refused for ~10 s.
    let bucket = client.limiter("api:alice", Policy::token_bucket(5, 1, TEN_S));
    for left in (0..5).rev() {
        let d = bucket.try_acquire(1).await.expect("acquire");
        assert!(d.allowed, "{d:?}");
        assert_eq!((d.limit, d.remaining, d.retry_after), (5, left, None));
    }
    let d = bucket.try_acquire(1).await.expect("acquire");
    assert!(!d.allowed, "a sixth unit from a bucket of five: {d:?}");
    let wait = d.retry_after.expect("a retry_after when refused");
    assert!(wait > Duration::from_secs(9) && wait <= TEN_S, "{wait:?}");
    // Peeks consume nothing.
    for _ in 0..3 {
        let p = bucket.peek(1).await.expect("peek");
        assert_eq!((p.allowed, p.remaining), (false, 0), "{p:?}");
    }
    // RESP sees the same limiter under the same key.
    let mut con = resp_connect(&c, leader).await;
    let r: Vec<i64> = resp_cmd(
        &mut con,
        &[
            "LIMIT.TOKENBUCKET",
            "api:alice",
            "5",
            "1",
            "10000",
            "1",
            "PEEK",
        ],
    )
    .await;
    assert_eq!(&r[..2], [0, 0], "RESP's view of the empty bucket: {r:?}");
    // Reset: a fresh bucket.
    bucket.reset().await.expect("reset");
    assert_eq!(bucket.peek(1).await.expect("peek").remaining, 4);

    // Exactly once: the same request id twice (a retry) consumes one unit and answers the
    // first decision again.
    let mut raw = LimiterClient::new(c.raw_channel(leader));
    let req = pb::LimitRequest {
        request: Some(pb::RequestId {
            client_id: 77,
            seq: 1,
        }),
        key: "retried".into(),
        policy: Some(pb::LimitPolicy {
            kind: Some(pb::limit_policy::Kind::Gcra(pb::GcraPolicy {
                max_burst: 9,
                count: 1,
                period_ms: 60_000,
            })),
        }),
        quantity: 3,
    };
    let first = raw.acquire(req.clone()).await.expect("first").into_inner();
    let again = raw.acquire(req.clone()).await.expect("retry").into_inner();
    assert_eq!(first, again, "a retry answers the first decision");
    assert_eq!(first.remaining, 7);
    let retried = client.limiter("retried", Policy::gcra(9, 1, Duration::from_secs(60)));
    // A peek reports what would remain after its own unit: 7 − 1.
    assert_eq!(
        retried.peek(1).await.expect("peek").remaining,
        6,
        "the retry consumed again"
    );

    // Bad input: refused, nothing consumed.
    refused(
        client
            .limiter("bad", Policy::token_bucket(0, 1, TEN_S))
            .try_acquire(1)
            .await,
        "a bucket of 0",
        "capacity",
    );
    refused(
        client
            .limiter("api:bob", Policy::token_bucket(5, 1, TEN_S))
            .try_acquire(6)
            .await,
        "6 units from a bucket of 5",
        "quantity",
    );
    let _: () = resp_cmd(&mut con, &["SET", "plain", "v"]).await;
    refused(
        client
            .limiter("plain", Policy::fixed_window(10, TEN_S))
            .try_acquire(1)
            .await,
        "a limiter on a string key",
        "WRONGTYPE",
    );
    let fresh = client.limiter("api:bob", Policy::token_bucket(5, 1, TEN_S));
    assert_eq!(
        fresh.peek(1).await.expect("peek").remaining,
        4,
        "nothing consumed"
    );

    // The state survives the leader: drain a bucket, kill the leader, still drained.
    let drained = c.client().limiter(
        "drained",
        Policy::token_bucket(3, 1, Duration::from_secs(60)),
    );
    for _ in 0..3 {
        assert!(drained.try_acquire(1).await.expect("acquire").allowed);
    }
    c.kill(leader);
    let d = drained
        .try_acquire(1)
        .await
        .expect("acquire after the kill");
    assert!(!d.allowed, "the limiter forgot after a leader kill: {d:?}");
}
