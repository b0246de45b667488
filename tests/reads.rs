//! Reads that judge time, against 3-node clusters of real `fenced` processes (loopback only):
//! on an idle cluster a lease or key TTL counts down on every node and over both front ends,
//! an expiry (or lease time) a read reported is never undone by a failover, and concurrent
//! reads share the tick that commits the time instead of burning a revision each.
//!
//! Run: `cargo test -p fenced-server --test reads`.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use support::{
    resp_cmd as cmd, resp_connect as connect, wait_for, within, TestCluster, CATCH_UP_TIMEOUT,
    LEADER_TIMEOUT,
};

const CALL: Duration = Duration::from_secs(30);

/// `LOCK.INFO name`'s `ttl_ms`, or `None` if the lock is free.
async fn lock_info_ttl(con: &mut MultiplexedConnection, name: &str) -> Option<i64> {
    let v: Value = cmd(con, &["LOCK.INFO", name]).await;
    let Value::Array(items) = v else {
        return None;
    };
    let at = items
        .iter()
        .position(|i| matches!(i, Value::BulkString(b) if b == b"ttl_ms"))?;
    match items.get(at + 1) {
        Some(Value::Int(n)) => Some(*n),
        other => panic!("LOCK.INFO {name}: ttl_ms is {other:?}"),
    }
}

/// gRPC `Lock.Info` of `name` answered by node `id`: the lease left, `None` if free.
async fn grpc_lock_ttl(c: &TestCluster, id: u64, name: &str) -> Option<u64> {
    within(
        &format!("Lock.Info {name} on node {id}"),
        CALL,
        c.client_of(id).info(name),
    )
    .await
    .unwrap_or_else(|e| panic!("Lock.Info {name} on node {id}: {e}"))
    .map(|i| i.ttl_ms)
}

/// gRPC `Kv.Get` of `key` answered by node `id`: whether it is there.
async fn grpc_found(c: &TestCluster, id: u64, key: &str) -> Result<bool, String> {
    match tokio::time::timeout(CALL, c.client_of(id).get(key)).await {
        Ok(Ok(v)) => Ok(v.is_some()),
        Ok(Err(e)) => Err(format!("Kv.Get {key} on node {id}: {e}")),
        Err(_) => Err(format!("Kv.Get {key} on node {id}: timed out")),
    }
}

/// Bug 2: on an idle cluster (no entry for 2.5 s) the lease left and a key's TTL count down,
/// on every node, over RESP and gRPC. Before, RESP judged at the last applied entry's time
/// and answered the whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_answers_count_down_on_an_idle_cluster() {
    let c = TestCluster::start("reads_idle", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut on_leader = connect(&c, leader).await;
    let _: String = cmd(&mut on_leader, &["SET", "k", "v", "PX", "5000"]).await;
    let token: Option<i64> = cmd(&mut on_leader, &["LOCK.ACQUIRE", "idle", "o", "5000"]).await;
    assert!(token.is_some(), "LOCK.ACQUIRE idle on a free lock");
    c.wait_all_caught_up(leader, CATCH_UP_TIMEOUT).await;
    // Idle: no entry is written meanwhile (nothing is due before 5 s).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Both were stamped before their replies arrived, and every read below starts 2.5 s after
    // that on the leader's monotonic clock: at most 2,500 ms can be left (slack for the
    // millisecond rounding).
    const MAX_LEFT: i64 = 2_600;
    for id in c.ids() {
        let mut con = connect(&c, id).await;
        let pttl: i64 = cmd(&mut con, &["PTTL", "k"]).await;
        assert!(
            (1..=MAX_LEFT).contains(&pttl),
            "PTTL k on node {id} after 2.5 s idle: {pttl} (set with PX 5000)"
        );
        let ttl = lock_info_ttl(&mut con, "idle").await;
        assert!(
            ttl.is_some_and(|t| (1..=MAX_LEFT).contains(&t)),
            "LOCK.INFO idle on node {id} after 2.5 s idle: ttl_ms {ttl:?} (a 5000 ms lease)"
        );
        let grpc = grpc_lock_ttl(&c, id, "idle").await;
        assert!(
            grpc.is_some_and(|t| (1..=MAX_LEFT as u64).contains(&t)),
            "gRPC Lock.Info idle on node {id} after 2.5 s idle: ttl_ms {grpc:?}"
        );
    }
}

/// Bug 3: an expiry a read on the leader reported is committed before the answer, so the next
/// leader cannot bring the value back. A few rounds: `SET k v PX 2000`, poll `Kv.Get` on the
/// leader until it says absent, SIGKILL the leader at once, and ask the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_seen_on_the_leader_survives_its_death() {
    let c = TestCluster::start("reads_expiry_failover", &[]);
    for round in 0..4 {
        let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
        c.wait_all_caught_up(leader, CATCH_UP_TIMEOUT).await;
        let key = format!("k{round}");
        let mut con = connect(&c, leader).await;
        let _: String = cmd(&mut con, &["SET", &key, "v", "PX", "2000"]).await;
        let set_at = Instant::now();
        assert!(
            grpc_found(&c, leader, &key)
                .await
                .expect("Kv.Get right after SET"),
            "round {round}: {key} absent right after SET"
        );
        // Poll from just before the expiry, so the first "absent" comes as early as the
        // leader will say it.
        tokio::time::sleep(Duration::from_millis(1_900).saturating_sub(set_at.elapsed())).await;
        wait_for(
            &format!("round {round}: Kv.Get {key} on the leader to say absent"),
            Duration::from_secs(20),
            || async {
                match grpc_found(&c, leader, &key).await? {
                    false => Ok(()),
                    true => Err("still there".into()),
                }
            },
        )
        .await;
        c.kill(leader);
        let new_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
        let found = wait_for(
            &format!("round {round}: Kv.Get {key} on the new leader {new_leader}"),
            Duration::from_secs(30),
            || grpc_found(&c, new_leader, &key),
        )
        .await;
        assert!(
            !found,
            "round {round}: the leader {leader} said {key} had expired; after it died the new \
             leader {new_leader} returns it again"
        );
        c.restart(leader);
    }
}

/// Bug 3, the lease's face: lease time a read reported as gone stays gone after a failover.
/// Before, `Lock.Info` on the leader judged at its clock (nothing committed at that time), and
/// the next leader's clock continued from the last committed entry: the lease grew back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_time_seen_on_the_leader_is_not_given_back_by_the_next() {
    let c = TestCluster::start("reads_lease_failover", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut con = connect(&c, leader).await;
    let token: Option<i64> = cmd(&mut con, &["LOCK.ACQUIRE", "l", "o", "20000"]).await;
    assert!(token.is_some(), "LOCK.ACQUIRE l");
    c.wait_all_caught_up(leader, CATCH_UP_TIMEOUT).await;
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let seen = grpc_lock_ttl(&c, leader, "l")
        .await
        .expect("l is held on the leader");
    assert!(seen <= 17_100, "Lock.Info on the leader after 3 s: {seen}");
    let seen_at = Instant::now();
    c.kill(leader);
    let new_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let now = wait_for(
        &format!("Lock.Info l on the new leader {new_leader}"),
        Duration::from_secs(30),
        || async {
            match tokio::time::timeout(CALL, c.client_of(new_leader).info("l")).await {
                Ok(Ok(Some(i))) => Ok(i.ttl_ms),
                Ok(Ok(None)) => panic!("l is free on the new leader {new_leader}"),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("timed out".into()),
            }
        },
    )
    .await;
    assert!(
        now <= seen,
        "the leader said {seen} ms were left; {} ms later the new leader says {now}",
        seen_at.elapsed().as_millis()
    );
}

/// Many concurrent time-judging reads on an idle cluster share the tick that commits the time:
/// the revision rises by far fewer than the reads, and every answer counts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_share_one_tick() {
    let c = TestCluster::start("reads_single_flight", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut con = connect(&c, leader).await;
    let _: String = cmd(&mut con, &["SET", "k", "v", "PX", "60000"]).await;
    c.wait_all_caught_up(leader, CATCH_UP_TIMEOUT).await;
    let mut cons = Vec::new();
    for id in c.ids() {
        cons.push(connect(&c, id).await);
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let before = c.status_ok(leader).await.revision;
    const READS: usize = 200;
    let reads = futures::future::join_all((0..READS).map(|i| {
        let mut con = cons[i % cons.len()].clone();
        async move {
            let mut c = redis::cmd("PTTL");
            c.arg("k");
            within("PTTL k", CALL, c.query_async::<i64>(&mut con))
                .await
                .unwrap_or_else(|e| panic!("PTTL k: {e}"))
        }
    }))
    .await;
    c.wait_all_caught_up(leader, CATCH_UP_TIMEOUT).await;
    let after = c.status_ok(leader).await.revision;
    let max = reads.iter().copied().max().unwrap_or(0);
    eprintln!(
        "{READS} concurrent PTTLs: revision {before} -> {after}, answers {}..={max}",
        reads.iter().copied().min().unwrap_or(0)
    );
    assert!(
        max <= 59_000,
        "PTTL after 1 s idle answered up to {max} (set with PX 60000)"
    );
    assert!(
        after - before <= 20,
        "{READS} concurrent PTTLs raised the revision from {before} to {after}"
    );
}

/// A read whose answer does not depend on the time between the last committed log time and
/// the leader's clock needs no tick: on an idle cluster, sequential GETs of a key without a
/// deadline and of one far from it leave the revision alone — while a GET of a key whose
/// deadline passed in between still answers nil on every node (that one commits the time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_whose_answer_time_cannot_change_commit_no_tick() {
    let c = TestCluster::start("reads_time_free", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut con = connect(&c, leader).await;
    let _: String = cmd(&mut con, &["SET", "plain", "v"]).await;
    let _: String = cmd(&mut con, &["SET", "far", "v", "PX", "600000"]).await;
    let _: String = cmd(&mut con, &["SET", "soon", "v", "PX", "1500"]).await;
    c.wait_all_caught_up(leader, CATCH_UP_TIMEOUT).await;
    let mut cons = Vec::new();
    for id in c.ids() {
        cons.push(connect(&c, id).await);
    }
    // Idle: the leader's clock runs ahead of the last committed log time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = c.status_ok(leader).await.revision;
    const READS: usize = 30;
    for i in 0..READS {
        let con = &mut cons[i % 3];
        for key in ["plain", "far"] {
            let v: Option<String> = cmd(con, &["GET", key]).await;
            assert_eq!(v.as_deref(), Some("v"), "GET {key}");
        }
    }
    let after = c.status_ok(leader).await.revision;
    assert!(
        after - before <= 2,
        "{} GETs whose answer cannot change with time raised the revision {before} -> {after}",
        2 * READS
    );
    // Past the deadline of `soon` (the leader's ticker may or may not have expired it yet):
    // every node says it is gone.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for (i, con) in cons.iter_mut().enumerate() {
        let v: Option<String> = cmd(con, &["GET", "soon"]).await;
        assert_eq!(v, None, "GET soon on connection {i} after its deadline");
    }
}

/// Not a check: the cost of a time-judging read, on an idle cluster (each read commits a tick)
/// and on a busy one (writers keep entries coming), on the leader and on a follower.
/// `cargo test -p fenced-server --test reads read_cost -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn read_cost() {
    let c = TestCluster::start("reads_cost", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = support::follower_of(leader);
    let mut con = connect(&c, leader).await;
    let _: String = cmd(&mut con, &["SET", "k", "v", "PX", "600000"]).await;
    c.wait_all_caught_up(leader, CATCH_UP_TIMEOUT).await;
    const N: usize = 300;
    async fn run(con: &mut MultiplexedConnection) -> (f64, f64) {
        let mut lat = Vec::with_capacity(N);
        for _ in 0..N {
            let t = Instant::now();
            let _: i64 = cmd(con, &["PTTL", "k"]).await;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        (lat.iter().sum::<f64>() / N as f64, lat[N / 2])
    }
    for (what, id) in [("leader", leader), ("follower", follower)] {
        let mut con = connect(&c, id).await;
        // Idle.
        let before = c.status_ok(leader).await.revision;
        let (mean, p50) = run(&mut con).await;
        let after = c.status_ok(leader).await.revision;
        eprintln!(
            "idle, PTTL on the {what}: mean {mean:.0} µs, p50 {p50:.0} µs; revision +{} for {N} reads",
            after - before
        );
        // Busy: 4 writers on the leader.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut writers = Vec::new();
        for w in 0..4 {
            let mut wc = connect(&c, leader).await;
            let (stop, done) = (stop.clone(), done.clone());
            writers.push(tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _: String = cmd(&mut wc, &["SET", &format!("w{w}"), "x"]).await;
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = c.status_ok(leader).await.revision;
        let w0 = done.load(std::sync::atomic::Ordering::Relaxed);
        let (mean, p50) = run(&mut con).await;
        let w1 = done.load(std::sync::atomic::Ordering::Relaxed);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            w.await.expect("writer");
        }
        // Every acknowledged SET is applied on the leader; those in flight at either end
        // blur the count by at most the writers' number.
        let after = c.status_ok(leader).await.revision;
        let writes = done.load(std::sync::atomic::Ordering::Relaxed) - w0;
        eprintln!(
            "busy (4 writers, {} SETs meanwhile), PTTL on the {what}: mean {mean:.0} µs, \
             p50 {p50:.0} µs; revision +{} for {writes} SETs in all: ~{} ticks for {N} reads",
            w1 - w0,
            after - before,
            (after - before).saturating_sub(writes)
        );
    }
}
