//! Rate limiters over RESP on a 3-node cluster of real `fenced` processes: `CL.THROTTLE`
//! through a follower with redis-cell's README reply, a burst admitted and the next request
//! limited with the right `retry_after`, peeks that consume nothing, a pipeline decided in
//! order in one entry, and limiter state that survives a leader SIGKILL (the limiter does not
//! forget). Exactly-once on a retried request id is a core test
//! (`crates/core/tests/limiter.rs`), as the RESP client cannot choose request ids.

mod support;

use redis::Value;
use support::{
    follower_of, resp_cmd as cmd, resp_connect as connect, within, TestCluster, LEADER_TIMEOUT,
};

const STEP: std::time::Duration = std::time::Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cl_throttle_through_a_follower_survives_a_leader_kill() {
    let c = TestCluster::start("resp_limiter", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut con = connect(&c, follower_of(leader)).await;

    // redis-cell's README example.
    let r: Vec<i64> = cmd(&mut con, &["CL.THROTTLE", "user123", "15", "30", "60", "1"]).await;
    assert_eq!(r, [0, 16, 15, -1, 2]);

    // Burst 4 (limit 5), 1 per minute: five admitted, the sixth limited for a minute.
    for left in (0..5).rev() {
        let r: Vec<i64> = cmd(&mut con, &["CL.THROTTLE", "burst", "4", "1", "60"]).await;
        assert_eq!(&r[..4], [0, 5, left, -1], "{r:?}");
    }
    let r: Vec<i64> = cmd(&mut con, &["CL.THROTTLE", "burst", "4", "1", "60"]).await;
    assert_eq!(&r[..4], [1, 5, 0, 60], "{r:?}");
    assert!((299..=300).contains(&r[4]), "reset_after {r:?}");
    // Quantity 0 peeks: nothing consumed.
    for _ in 0..3 {
        let p: Vec<i64> = cmd(&mut con, &["CL.THROTTLE", "user123", "15", "30", "60", "0"]).await;
        assert_eq!(&p[..3], [0, 16, 15], "{p:?}");
    }
    let t: String = cmd(&mut con, &["TYPE", "burst"]).await;
    assert_eq!(t, "ratelimit");

    // LIMIT.* peeks consume nothing; a pipeline is decided in order.
    for _ in 0..3 {
        let p: Vec<i64> = cmd(
            &mut con,
            &["LIMIT.TOKENBUCKET", "tb", "3", "1", "60000", "PEEK"],
        )
        .await;
        assert_eq!(&p[..3], [1, 2, -1], "{p:?}");
    }
    let mut pipe = redis::pipe();
    for _ in 0..4 {
        pipe.cmd("LIMIT.TOKENBUCKET")
            .arg("tb")
            .arg(3)
            .arg(1)
            .arg(60_000);
    }
    let r: Vec<Vec<i64>> = within("pipeline", STEP, pipe.query_async(&mut con))
        .await
        .expect("pipeline");
    let allowed: Vec<i64> = r.iter().map(|d| d[0]).collect();
    let remaining: Vec<i64> = r.iter().map(|d| d[1]).collect();
    assert_eq!(allowed, [1, 1, 1, 0], "{r:?}");
    assert_eq!(remaining, [2, 1, 0, 0], "{r:?}");
    assert!((59_000..=60_000).contains(&r[3][2]), "retry_after_ms {r:?}");
    let e = within(
        "bad input",
        STEP,
        redis::cmd("CL.THROTTLE")
            .arg("burst")
            .arg("4")
            .arg("0")
            .arg("60")
            .query_async::<Value>(&mut con),
    )
    .await
    .expect_err("count 0");
    assert!(e.to_string().contains("count must be in 1..="), "{e}");

    // SIGKILL the leader: the survivors still limit.
    c.kill(leader);
    let new_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(new_leader, leader);
    for id in c.ids().filter(|i| *i != leader) {
        let mut n = connect(&c, id).await;
        let r: Vec<i64> = cmd(&mut n, &["CL.THROTTLE", "burst", "4", "1", "60", "0"]).await;
        assert_eq!(
            &r[..3],
            [0, 5, 0],
            "node {id}: the burst is still spent: {r:?}"
        );
        let p: Vec<i64> = cmd(
            &mut n,
            &["LIMIT.TOKENBUCKET", "tb", "3", "1", "60000", "PEEK"],
        )
        .await;
        assert_eq!(
            &p[..2],
            [0, 0],
            "node {id}: the bucket is still empty: {p:?}"
        );
    }
    let mut n = connect(&c, new_leader).await;
    let r: Vec<i64> = cmd(&mut n, &["CL.THROTTLE", "burst", "4", "1", "60"]).await;
    assert_eq!(&r[..3], [1, 5, 0], "still limited after failover: {r:?}");
    assert!((1..=60).contains(&r[3]), "{r:?}");
}
