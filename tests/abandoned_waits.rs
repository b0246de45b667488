//! Abandoned waits are withdrawn (issue 38 item 2; `Command::Withdraw`): a waiting acquire
//! whose client went away — a RESP connection closed mid-`WAIT`, a gRPC `Lock.Acquire`
//! whose caller dropped the call — never becomes a holder nobody knows about. On a 3-node
//! cluster of real `fenced` processes (loopback only), each served by a follower and by the
//! leader: y holds L, x waits and leaves, y releases; nobody holds L and a third caller gets
//! it at once.

mod support;

use std::time::{Duration, Instant};

use fenced_proto::v1 as pb;
use fenced_proto::v1::lock_client::LockClient;
use redis::aio::MultiplexedConnection;
use redis::Value;
use support::raw::Raw;
use support::{follower_of, resp_cmd as cmd, resp_connect as connect, TestCluster, LEADER_TIMEOUT};

/// How long the withdrawal may take to be applied after the client left.
const WITHDRAW_WITHIN: Duration = Duration::from_secs(10);

/// `LOCK.INFO name`'s `waiters` (0 when the lock is free and nobody waits).
async fn waiters(con: &mut MultiplexedConnection, name: &str) -> i64 {
    match info_field(con, name, "waiters").await {
        Some(Value::Int(n)) => n,
        _ => 0,
    }
}

/// LOCK.INFO's owner of `name`, if held.
async fn owner(con: &mut MultiplexedConnection, name: &str) -> Option<String> {
    match info_field(con, name, "owner").await {
        Some(Value::BulkString(o)) => Some(String::from_utf8_lossy(&o).into_owned()),
        _ => None,
    }
}

/// Field `wanted` of `LOCK.INFO name`'s flat map (RESP2 array or RESP3 map); `None` when
/// the lock is unknown or the field absent.
async fn info_field(con: &mut MultiplexedConnection, name: &str, wanted: &str) -> Option<Value> {
    let v: Value = cmd(con, &["LOCK.INFO", name]).await;
    let items = match v {
        Value::Nil => return None,
        Value::Array(items) => items
            .chunks(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect::<Vec<_>>(),
        Value::Map(m) => m,
        other => panic!("LOCK.INFO {name}: {other:?}"),
    };
    items.into_iter().find_map(|(k, v)| match k {
        Value::BulkString(k) if k == wanted.as_bytes() => Some(v),
        _ => None,
    })
}

async fn until_waiters(
    con: &mut MultiplexedConnection,
    name: &str,
    n: i64,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if waiters(con, name).await == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// y holds `name`, `leave` makes x wait for it and go away; then y releases. Nobody may hold
/// `name` afterwards and a third caller gets it at once.
async fn after_x_leaves<F>(con: &mut MultiplexedConnection, what: &str, name: &str, leave: F)
where
    F: std::future::Future<Output = ()>,
{
    let y: i64 = cmd(con, &["LOCK.ACQUIRE", name, "y", "60000"]).await;
    assert!(y > 0, "{what}: y holds {name}");
    leave.await;
    // The withdrawal is applied soon after x left; on code without withdrawals x's wait
    // stays queued, and the checks below show what that does.
    let withdrawn = until_waiters(con, name, 0, WITHDRAW_WITHIN).await;
    let released: i64 = cmd(con, &["LOCK.RELEASE", name, "y", &y.to_string()]).await;
    assert_eq!(released, 1, "{what}: y released");
    let holder = owner(con, name).await;
    assert_eq!(
        holder, None,
        "{what}: after y's release {name} went to {holder:?} — the abandoned wait became a \
         holder nobody knows (withdrawn in time: {withdrawn})"
    );
    let w: Value = cmd(con, &["LOCK.ACQUIRE", name, "w", "60000"]).await;
    match w {
        Value::Int(t) => assert!(t > y, "{what}: w's token {t} > y's {y}"),
        other => panic!("{what}: a third caller got {other:?} instead of the lock"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_abandoned_over_resp_or_grpc_never_becomes_a_holder() {
    let c = TestCluster::start("abandoned_waits", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    // Withdrawals need the cluster on rules WITHDRAWALS (refused before, as in a cluster
    // still being upgraded; the wait then runs to its deadline).
    c.wait_for_stamp(leader, u32::from(fenced_core::Semantics::WITHDRAWALS.0))
        .await;
    let f = follower_of(leader);
    let mut con = connect(&c, leader).await;
    for (node, role) in [(f, "follower"), (leader, "leader")] {
        // RESP: x's connection closes mid-WAIT.
        let name = format!("resp-{role}");
        let addr = c.resp_addr(node);
        let probe = &mut connect(&c, leader).await;
        let n = name.clone();
        after_x_leaves(
            &mut con,
            &format!("RESP via the {role}"),
            &name,
            async move {
                let mut x = Raw::connect(&addr);
                x.write(&["LOCK.ACQUIRE", &n, "x", "60000", "WAIT", "30000"]);
                assert!(
                    until_waiters(probe, &n, 1, WITHDRAW_WITHIN).await,
                    "x's wait was queued"
                );
                drop(x);
            },
        )
        .await;

        // gRPC: x's call is dropped by its caller mid-wait.
        let name = format!("grpc-{role}");
        let channel = c.raw_channel(node);
        let probe = &mut connect(&c, leader).await;
        let n = name.clone();
        after_x_leaves(
            &mut con,
            &format!("gRPC via the {role}"),
            &name,
            async move {
                let req = pb::AcquireRequest {
                    request: Some(pb::RequestId {
                        client_id: 4242 + node,
                        seq: 1,
                    }),
                    name: n.clone(),
                    owner: "x".into(),
                    ttl_ms: 60_000,
                    wait_ms: 30_000,
                    ..Default::default()
                };
                let mut client = LockClient::new(channel);
                let call = client.acquire(req);
                tokio::pin!(call);
                let queued = tokio::select! {
                    r = &mut call => panic!("x's acquire answered while y holds: {r:?}"),
                    q = until_waiters(probe, &n, 1, WITHDRAW_WITHIN) => q,
                };
                assert!(queued, "x's wait was queued");
                // Dropping the call resets its HTTP/2 stream.
            },
        )
        .await;
    }
}
