//! Issue 49: a request id reused for a different command. Before `Semantics::REQUEST_DIGESTS`
//! the dedup record answered the first command's outcome: RESP said `ERR internal:
//! unexpected answer Granted { … }` (or, worse, the other lock's grant), gRPC returned the
//! grant of another lock name. Now both protocols refuse it, naming `REQID`, and a true retry
//! still gets the first outcome.

mod support;

use std::time::Duration;

use fenced_proto::v1 as pb;
use support::{Raw, TestCluster, LEADER_TIMEOUT, R};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_reused_for_another_command_is_refused_on_both_protocols() {
    let c = TestCluster::start("reqid_reuse", &[]);
    // A leader stamping the rules (the first one may hand over while the cluster settles).
    let started = std::time::Instant::now();
    let leader = loop {
        let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
        if c.status_ok(leader).await.semantics >= 12 {
            break leader;
        }
        assert!(
            started.elapsed() < LEADER_TIMEOUT,
            "no leader stamped apply rules 12"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // RESP.
    let mut r = Raw::connect(&c.resp_addr(leader));
    let first = r.send(&["LOCK.ACQUIRE", "a", "o", "5000", "REQID", "77", "1"]);
    assert!(matches!(first, R::Int(_)), "first acquire: {first:?}");
    let reused = r.send(&["LOCK.ACQUIRE", "b", "o", "5000", "REQID", "77", "1"]);
    match &reused {
        R::Err(e) if e.starts_with("ERR ") && e.contains("REQID") => {}
        other => panic!("REQID reused for lock b: expected -ERR naming REQID, got {other:?}"),
    }
    assert_eq!(
        r.send(&["LOCK.ACQUIRE", "a", "o", "5000", "REQID", "77", "1"]),
        first,
        "a true retry gets the first outcome"
    );
    let other = r.send(&["LOCK.ACQUIRE", "b", "someone-else", "5000"]);
    assert!(
        matches!(other, R::Int(_)),
        "lock b was granted to o: {other:?}"
    );

    // gRPC.
    let mut lock = c.raw_lock_client(leader, Duration::from_secs(5));
    let req = |name: &str| pb::AcquireRequest {
        request: Some(pb::RequestId {
            client_id: 78,
            seq: 1,
        }),
        name: name.into(),
        owner: "o".into(),
        ttl_ms: 5_000,
        ..Default::default()
    };
    let granted = lock
        .acquire(req("c"))
        .await
        .expect("acquire c")
        .into_inner();
    assert!(granted.granted);
    let s = lock
        .acquire(req("d"))
        .await
        .expect_err("the same request id for lock d");
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("REQID"), "{s:?}");
    let retry = lock.acquire(req("c")).await.expect("retry").into_inner();
    assert_eq!(
        retry.token, granted.token,
        "a true retry gets the first token"
    );
}
