//! One rule for outcomes, end to end: a waiting `LOCK.ACQUIRE` through a follower whose leader
//! is lost mid-wait (and no new one can be elected for a while) is answered with a token or "outcome unknown" (`-TIMEOUT`), never
//! `-TRYAGAIN` (which says nothing was applied) — its waiter is queued in the log — and, with
//! the client following docs/resp.md (retry after `-TRYAGAIN` only), the lock is granted once.
//!
//! Run: `cargo test -p fenced-server --test outcome`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use support::{follower_of, wait_for, within, TestCluster, LEADER_TIMEOUT, RESP_STEP};

const TTL: Duration = Duration::from_secs(60);
/// The waiting acquire's wait (log time, which an outage does not count): long enough to
/// outlive the election after the outage.
const WAIT_MS: &str = "15000";

/// `LOCK.ACQUIRE name owner ttl WAIT ms` on `con`: `Ok(token or nil)` or the error text.
async fn acquire_waiting(
    con: &mut redis::aio::MultiplexedConnection,
    name: &str,
    owner: &str,
) -> Result<Option<u64>, String> {
    let ttl = TTL.as_millis().to_string();
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(name).arg(owner).arg(&ttl).arg("WAIT").arg(WAIT_MS);
    within(
        "a waiting LOCK.ACQUIRE",
        Duration::from_secs(60),
        cmd.query_async::<Option<u64>>(con),
    )
    .await
    .map_err(|e| e.to_string())
}

/// A RESP connection to node `id` that waits up to a minute for a reply (a waiting acquire
/// through an outage takes longer than the harness's usual bound).
async fn slow_resp_connect(c: &TestCluster, id: u64) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{}/", c.resp_addr(id))).expect("url");
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    wait_for("a RESP connection", RESP_STEP, || async {
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| e.to_string())
    })
    .await
}

/// `a` takes `l` (gRPC), then `b` asks for it with a waiting `LOCK.ACQUIRE` through
/// `follower`, which forwards the wait to the leader; returns once `b` is queued: `a`'s
/// grant, `b`'s connection and its pending reply.
async fn a_holds_b_waits(
    c: &TestCluster,
    follower: u64,
) -> (
    fenced_client::Grant,
    redis::aio::MultiplexedConnection,
    tokio::task::JoinHandle<Result<Option<u64>, String>>,
) {
    let client = c.client();
    let holder = client
        .acquire("l", "a", TTL, Duration::ZERO, 0)
        .await
        .expect("acquire")
        .expect("granted while free");
    let con = slow_resp_connect(c, follower).await;
    let waiting = {
        let mut con = con.clone();
        tokio::spawn(async move { acquire_waiting(&mut con, "l", "b").await })
    };
    wait_for("b queued", Duration::from_secs(20), || async {
        match client.info("l").await {
            Ok(Some(i)) if i.waiters == 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    (holder, con, waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_whose_leader_is_lost_is_never_refused_nor_granted_twice() {
    let c = TestCluster::start("outcome-wait", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);
    let other = c
        .ids()
        .find(|i| *i != leader && *i != follower)
        .expect("3 nodes");
    // `a` holds `l`; `b` queues behind it through the follower, which forwards the wait to
    // the leader.
    let (holder, mut con, mut waiting) = a_holds_b_waits(&c, follower).await;

    // Mid-wait the leader stops answering (SIGSTOP: the forwarded wait hangs until its own
    // deadline) and the other follower dies: no leader anywhere, and the follower knows it.
    c.pause(leader, true);
    c.kill(other);
    let first = within("the first reply", Duration::from_secs(90), &mut waiting)
        .await
        .expect("task");
    eprintln!("first reply: {first:?}");
    let refused = first
        .as_ref()
        .is_err_and(|e| e.to_ascii_uppercase().contains("TRYAGAIN"));

    // Back to a cluster (the paused leader killed, so its clock does not jump ahead).
    c.kill(leader);
    c.restart(leader);
    c.restart(other);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    // As a RESP client does: -TRYAGAIN means nothing was applied, so ask again (a new request
    // id); "outcome unknown" means look before acting again.
    let retried = refused.then(|| {
        let mut con = con.clone();
        tokio::spawn(async move { acquire_waiting(&mut con, "l", "b").await })
    });

    // `a` lets go: the lock passes to `b`'s queued acquire, once.
    let client = c.client();
    assert!(client
        .release("l", "a", holder.token)
        .await
        .expect("release"));
    let info = wait_for("b holds l", Duration::from_secs(30), || async {
        match client.info("l").await {
            Ok(Some(i)) if i.owner == "b" => Ok(i),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    if let Some(retried) = retried {
        let again = within("the retried acquire", Duration::from_secs(60), retried).await;
        eprintln!("retried reply: {again:?}");
    }
    if let Ok(Some(token)) = first {
        assert_eq!(token, info.token, "b was told another token than it holds");
    }
    let info = client.info("l").await.expect("info").expect("held");
    assert_eq!(info.holds, 1, "l was granted to b twice: {info:?}");
    assert_eq!(info.waiters, 0, "a second waiter of b is queued: {info:?}");
    assert!(
        !refused,
        "a queued acquire was answered -TRYAGAIN (\"nothing was applied\"): {first:?}"
    );
    // One release frees it.
    let released: i64 = support::resp_cmd(
        &mut con,
        &["LOCK.RELEASE", "l", "b", &info.token.to_string()],
    )
    .await;
    assert_eq!(released, 1);
    let after = client.info("l").await.expect("info");
    assert!(after.is_none(), "one LOCK.RELEASE left l held: {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_resumes_its_wait_across_a_leader_kill_and_gets_its_token() {
    let c = TestCluster::start("outcome-resume", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);
    let (holder, mut con, waiting) = a_holds_b_waits(&c, follower).await;

    // The leader the wait was forwarded to dies; the other two elect a new one, and `a` lets
    // go there. The follower's wait resumes on the same request and hears of the grant.
    c.kill(leader);
    let client = c.client();
    // (A retry after an unknown outcome may find it released already: b's grant tells.)
    wait_for("a's release", Duration::from_secs(30), || async {
        client
            .release("l", "a", holder.token)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let got = within("b's reply", Duration::from_secs(60), waiting)
        .await
        .expect("task");
    let token = match got {
        Ok(Some(t)) => t,
        other => panic!("b's queued acquire was not granted: {other:?}"),
    };
    let info = client.info("l").await.expect("info").expect("held");
    assert_eq!(
        (info.owner.as_str(), info.token, info.holds),
        ("b", token, 1)
    );
    let released: i64 =
        support::resp_cmd(&mut con, &["LOCK.RELEASE", "l", "b", &token.to_string()]).await;
    assert_eq!(released, 1);
}
