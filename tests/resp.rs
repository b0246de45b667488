//! The RESP front end with real Redis clients against a 3-node cluster of real `fenced`
//! processes (loopback only, `127.0.{10+k}.x` per test): redis-cli sessions, redis-py's `Lock`
//! in RESP2 and RESP3, redis-rs, unchanged rate-limiter Lua scripts, cross-node pub/sub and
//! BLPOP, expiry without traffic, gRPC/RESP lock sharing, and a leader SIGKILL that a lock
//! taken over RESP survives with its token.
//!
//! redis-cli and python3's `redis` package are installed by `.ci/run`; a test whose external
//! client is missing says so and passes (the Rust-client tests always run).

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use redis::{AsyncCommands, Value};
use support::{
    follower_of, require, resp_cmd as cmd, resp_cmd_err as cmd_err, resp_connect as connect,
    run_bounded, within, TestCluster, LEADER_TIMEOUT,
};

const STEP: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_scripted_session() {
    require("redis-cli", &["--version"]);
    let c = TestCluster::start("resp_cli", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let ip = c.ip(node);
    let script = "PING\nSET greeting hello\nGET greeting\nSET lk owner1 NX PX 60000\n\
                  SET lk owner2 NX PX 60000\nFENCE.TOKEN lk\nINCR counter\nINCRBY counter 41\n\
                  HSET h f1 v1 f2 v2\nHGET h f2\nRPUSH l a b c\nLRANGE l 0 -1\n\
                  ZADD z 1 one 2 two\nZRANGE z 0 -1 WITHSCORES\n\
                  EVAL \"return redis.call('GET', KEYS[1])\" 1 greeting\n\
                  MULTI\nINCR counter\nGET counter\nEXEC\nNOSUCHCMD x\nFENCE.SET data v1 10\n\
                  FENCE.SET data v0 9\nLOCK.ACQUIRE job alice 30000\nTYPE h\nDBSIZE\n";
    let mut cli = Command::new("redis-cli");
    cli.args(["-h", &ip, "-p", "7379"]);
    let (ok, out, err) = run_bounded(cli, script, Duration::from_secs(60));
    assert!(ok, "redis-cli failed: {err}");
    let lines: Vec<&str> = out.lines().collect();
    let expect = [
        "PONG", "OK", "hello", "OK", "", "", "1", "42", "2", "v2", "3", "a", "b", "c", "2", "one",
        "1", "two", "2", "hello", "OK", "QUEUED", "QUEUED", "43", "43",
    ];
    for (i, e) in expect.iter().enumerate() {
        if i == 5 {
            assert!(lines[i].parse::<u64>().is_ok(), "FENCE.TOKEN: {out}");
            continue;
        }
        assert_eq!(lines.get(i).copied(), Some(*e), "line {i} of:\n{out}");
    }
    assert!(
        out.contains("ERR unknown command 'NOSUCHCMD', with args beginning with: 'x'"),
        "{out}"
    );
    assert!(out.contains("STALE token 9 is older than 10"), "{out}");
    assert!(out.contains("hash"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_lock_resp2_and_resp3() {
    require("python3", &["-c", "import redis"]);
    let c = TestCluster::start("resp_py", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/resp/redis_py_lock.py"
    );
    // One protocol against the leader, the other against a follower.
    for (proto, node) in [("2", leader), ("3", follower_of(leader))] {
        let mut py = Command::new("python3");
        py.args([script, &c.ip(node), "7379", proto]);
        let (ok, out, err) = run_bounded(py, "", Duration::from_secs(120));
        assert!(ok, "redis-py lock test, protocol {proto}:\n{out}\n{err}");
        assert!(out.contains("redis-py lock ok"), "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rs_rate_limiters_and_grpc_interop() {
    let c = TestCluster::start("resp_rs", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut con = connect(&c, follower_of(leader)).await;

    // Plain commands through redis-rs.
    let _: () = con.set_ex("k", "v", 60).await.expect("set_ex");
    let v: String = con.get("k").await.expect("get");
    assert_eq!(v, "v");
    let got: Option<String> = cmd(&mut con, &["SET", "lock:a", "me", "NX", "PX", "30000"]).await;
    assert_eq!(got.as_deref(), Some("OK"));
    let got: Option<String> = cmd(&mut con, &["SET", "lock:a", "you", "NX", "PX", "30000"]).await;
    assert_eq!(got, None);

    // Unchanged rate-limiter scripts, through redis-rs's Script (EVALSHA, falls back to EVAL).
    let bucket = redis::Script::new(include_str!("resp/token_bucket.lua"));
    let mut allowed = 0;
    for i in 0..8 {
        let r: Vec<i64> = within(
            "token bucket",
            STEP,
            bucket
                .key("rl.tokens")
                .key("rl.ts")
                .arg(1) // rate: tokens per second
                .arg(5) // capacity
                .arg(1000) // now (s), fixed: no refill within the test
                .arg(1)
                .invoke_async(&mut con),
        )
        .await
        .unwrap_or_else(|e| panic!("token bucket {i}: {e}"));
        allowed += r[0];
    }
    assert_eq!(allowed, 5, "capacity 5 admits exactly 5 of 8");
    let window = redis::Script::new(include_str!("resp/sliding_window.lua"));
    let mut admitted = 0;
    for i in 0..6 {
        let r: i64 = within(
            "sliding window",
            STEP,
            window
                .key("rl.window")
                .arg(10_000 + i) // now (ms)
                .arg(1000) // window (ms)
                .arg(3) // limit
                .arg(format!("req-{i}"))
                .invoke_async(&mut con),
        )
        .await
        .unwrap_or_else(|e| panic!("sliding window {i}: {e}"));
        admitted += r;
    }
    assert_eq!(admitted, 3);
    let r: i64 = within(
        "sliding window later",
        STEP,
        window
            .key("rl.window")
            .arg(20_000)
            .arg(1000)
            .arg(3)
            .arg("req-late")
            .invoke_async(&mut con),
    )
    .await
    .expect("sliding window after the window");
    assert_eq!(r, 1, "old entries slid out");

    // A script error keeps the writes made before it (Redis semantics), on every node.
    let e = cmd_err(
        &mut con,
        &[
            "EVAL",
            "redis.call('SET', KEYS[1], 'before'); error('boom')",
            "1",
            "scripted",
        ],
    )
    .await;
    assert!(e.contains("boom"), "{e}");
    for id in [1, 2, 3] {
        let mut n = connect(&c, id).await;
        let v: String = cmd(&mut n, &["GET", "scripted"]).await;
        assert_eq!(v, "before", "node {id}");
    }
    let e = cmd_err(
        &mut con,
        &["EVALSHA", "0123456789012345678901234567890123456789", "0"],
    )
    .await;
    assert!(e.to_ascii_uppercase().contains("NOSCRIPT"), "{e}");

    // A grant made over gRPC is visible over RESP and vice versa.
    let grpc = c.client();
    let g = grpc
        .acquire(
            "shared",
            "grpc-owner",
            Duration::from_secs(30),
            Duration::ZERO,
            0,
        )
        .await
        .expect("gRPC acquire")
        .expect("granted");
    let info: Vec<Value> = cmd(&mut con, &["LOCK.INFO", "shared"]).await;
    assert_eq!(info.len(), 18, "nine fields: {info:?}");
    assert_eq!(info[3], Value::Int(g.token as i64), "{info:?}");
    let t: Option<i64> = cmd(&mut con, &["LOCK.ACQUIRE", "shared", "resp-owner", "5000"]).await;
    assert_eq!(t, None, "held over gRPC");
    let released: i64 = cmd(
        &mut con,
        &["LOCK.RELEASE", "shared", "grpc-owner", &g.token.to_string()],
    )
    .await;
    assert_eq!(released, 1);
    let t: Option<i64> = cmd(
        &mut con,
        &[
            "LOCK.ACQUIRE",
            "shared",
            "resp-owner",
            "30000",
            "WAIT",
            "1000",
        ],
    )
    .await;
    let t = t.expect("granted over RESP");
    assert!(t as u64 > g.token);
    let seen = grpc.info("shared").await.expect("gRPC info").expect("held");
    assert_eq!((seen.owner.as_str(), seen.token), ("resp-owner", t as u64));
    let renewed: i64 = cmd(
        &mut con,
        &[
            "LOCK.RENEW",
            "shared",
            "resp-owner",
            &t.to_string(),
            "60000",
        ],
    )
    .await;
    assert_eq!(renewed, 1);
    let stale: i64 = cmd(
        &mut con,
        &[
            "LOCK.RENEW",
            "shared",
            "resp-owner",
            &g.token.to_string(),
            "60000",
        ],
    )
    .await;
    assert_eq!(stale, 0, "an old token renews nothing");

    // LOCK.* pipelined: the writes that do not wait are proposed together, answered in order,
    // each its own command (its own token), with a bad argument answered in its place.
    let mut p = redis::pipe();
    p.ignore_errors();
    for args in [
        &["LOCK.ACQUIRE", "p1", "o", "30000"][..],
        &["LOCK.ACQUIRE", "p2", "o", "30000"],
        &["LOCK.ACQUIRE", "p1", "other", "30000"],
        &["LOCK.RELEASE", "p2", "o", "999999999"],
        &["LOCK.ACQUIRE", "p3", "o", "not-a-number"],
        &["LOCK.ACQUIRE", "p3", "o", "30000"],
        &["LOCK.INFO", "p1"],
        &["LOCK.ACQUIRE", "p1", "o", "30000"],
        &["LOCK.RENEW", "p3", "o", "1", "30000"],
    ] {
        let c = p.cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
    }
    let r: Vec<Value> = within("lock pipeline", STEP, p.query_async(&mut con))
        .await
        .expect("lock pipeline");
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?} in {r:?}"),
    };
    let (p1, p2, p3) = (int(&r[0]), int(&r[1]), int(&r[5]));
    assert!(
        p1 < p2 && p2 < p3,
        "tokens follow the pipeline's order: {r:?}"
    );
    assert_eq!(r[2], Value::Nil, "p1 is held by o: {r:?}");
    assert_eq!(int(&r[3]), 0, "wrong token releases nothing: {r:?}");
    assert!(
        matches!(&r[4], Value::ServerError(e) if e.details().is_some_and(|d| d.contains("integer"))),
        "bad argument answered in place: {r:?}"
    );
    assert!(
        matches!(&r[6], Value::Array(a) if a[3] == Value::Int(p1)),
        "{r:?}"
    );
    assert_eq!(int(&r[7]), p1, "reentrant: the same token");
    assert_eq!(int(&r[8]), 0, "token 1 is not p3's grant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_blpop_and_expiry_across_nodes() {
    let c = TestCluster::start("resp_events", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let other = follower_of(leader);

    // A subscriber on one node hears a PUBLISH sent to another.
    let sub_client = redis::Client::open(format!("redis://{}/", c.resp_addr(other))).expect("url");
    let mut pubsub = within("subscriber", STEP, sub_client.get_async_pubsub())
        .await
        .expect("pubsub connection");
    within("subscribe", STEP, pubsub.subscribe("news"))
        .await
        .expect("subscribe");
    within("psubscribe", STEP, pubsub.psubscribe("ne*"))
        .await
        .expect("psubscribe");
    let mut con = connect(&c, leader).await;
    let n: i64 = cmd(&mut con, &["PUBLISH", "news", "hello"]).await;
    assert_eq!(
        n, 0,
        "receivers are counted on the node that took the PUBLISH"
    );
    {
        use futures::StreamExt;
        let mut stream = pubsub.on_message();
        let mut got = Vec::new();
        while got.len() < 2 {
            let m = within("a published message", STEP, stream.next())
                .await
                .expect("message stream ended");
            got.push((
                m.get_channel_name().to_owned(),
                m.get_payload::<String>().expect("payload"),
            ));
        }
        assert!(
            got.iter().all(|(ch, p)| ch == "news" && p == "hello"),
            "{got:?}"
        );
    }

    // BLPOP on one node is woken by an RPUSH on another.
    // No client-side response timeout: the reply comes when the push is applied.
    let blocking_client =
        redis::Client::open(format!("redis://{}/", c.resp_addr(other))).expect("url");
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut blocked = within(
        "blocking connection",
        STEP,
        blocking_client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .expect("blocking connection");
    let waiter = tokio::spawn(async move {
        let r: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("jobs")
            .arg(10)
            .query_async(&mut blocked)
            .await
            .expect("BLPOP");
        r
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _: i64 = cmd(&mut con, &["RPUSH", "jobs", "job-1"]).await;
    let popped = within("BLPOP result", STEP, waiter)
        .await
        .expect("BLPOP task");
    assert_eq!(popped, Some(("jobs".into(), "job-1".into())));
    let mut quick = connect(&c, other).await;
    let start = Instant::now();
    let r: Option<(String, String)> = cmd(&mut quick, &["BRPOP", "empty", "0.3"]).await;
    assert_eq!(r, None);
    assert!(start.elapsed() >= Duration::from_millis(250));

    // Expiry in log time, seen without other traffic on any node.
    let _: String = cmd(&mut con, &["SET", "short", "v", "PX", "200"]).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    for id in [1, 2, 3] {
        let mut n = connect(&c, id).await;
        let v: Option<String> = cmd(&mut n, &["GET", "short"]).await;
        assert_eq!(v, None, "node {id} still sees an expired key");
        let ttl: i64 = cmd(&mut n, &["PTTL", "short"]).await;
        assert_eq!(ttl, -2);
    }

    // MULTI/EXEC with WATCH.
    let _: String = cmd(&mut con, &["SET", "w", "1"]).await;
    let _: String = cmd(&mut con, &["WATCH", "w"]).await;
    let mut other_con = connect(&c, other).await;
    let _: i64 = cmd(&mut other_con, &["INCR", "w"]).await;
    let _: String = cmd(&mut con, &["MULTI"]).await;
    let _: String = cmd(&mut con, &["INCR", "w"]).await;
    let r: Value = cmd(&mut con, &["EXEC"]).await;
    assert_eq!(r, Value::Nil, "EXEC aborted by a watched change");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_locks_survive_leader_sigkill_with_their_tokens() {
    let c = TestCluster::start("resp_failover", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut con = connect(&c, leader).await;
    let token: i64 = cmd(&mut con, &["LOCK.ACQUIRE", "batch", "worker-1", "60000"]).await;
    let ok: String = cmd(
        &mut con,
        &["SET", "redis-lock", "worker-1", "NX", "PX", "60000"],
    )
    .await;
    assert_eq!(ok, "OK");
    let fence: i64 = cmd(&mut con, &["FENCE.TOKEN", "redis-lock"]).await;
    assert!(fence > 0);

    c.kill(leader);
    let new_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(new_leader, leader);
    for id in c.ids().filter(|i| *i != leader) {
        let mut n = connect(&c, id).await;
        let info: Vec<Value> = cmd(&mut n, &["LOCK.INFO", "batch"]).await;
        assert_eq!(
            info.get(1),
            Some(&Value::BulkString(b"worker-1".to_vec())),
            "node {id}: {info:?}"
        );
        assert_eq!(
            info.get(3),
            Some(&Value::Int(token)),
            "node {id}: token changed"
        );
        let again: Option<i64> = cmd(&mut n, &["LOCK.ACQUIRE", "batch", "worker-2", "1000"]).await;
        assert_eq!(again, None, "node {id}: the lock is still held");
        let f: i64 = cmd(&mut n, &["FENCE.TOKEN", "redis-lock"]).await;
        assert_eq!(f, fence, "node {id}: FENCE.TOKEN changed");
        let v: String = cmd(&mut n, &["GET", "redis-lock"]).await;
        assert_eq!(v, "worker-1");
        let nx: Option<String> = cmd(
            &mut n,
            &["SET", "redis-lock", "worker-2", "NX", "PX", "1000"],
        )
        .await;
        assert_eq!(nx, None, "node {id}: SET NX lock still held");
        let ttl: i64 = cmd(&mut n, &["PTTL", "redis-lock"]).await;
        assert!(ttl > 30_000, "node {id}: lease kept, pttl {ttl}");
    }
    // The holder keeps working against the new leader with the same token.
    let mut n = connect(&c, new_leader).await;
    let renewed: i64 = cmd(
        &mut n,
        &[
            "LOCK.RENEW",
            "batch",
            "worker-1",
            &token.to_string(),
            "60000",
        ],
    )
    .await;
    assert_eq!(renewed, 1);
    let stored: String = cmd(&mut n, &["FENCE.SET", "guarded", "x", &fence.to_string()]).await;
    assert_eq!(stored, "OK");
}

/// A write too large for one log entry (an `MSET` of four values just under RESP's 16 MiB
/// bulk limit: ~64 MiB, over the entry cap of 32 MiB), sent to a follower and to the leader
/// while other clients write small keys there. It is refused alone, saying nothing was
/// applied, and every small write beside it is applied — none refused, none unknown. Before,
/// it rode in one forwarded batch with the small writes queued beside it, which the
/// follower could not encode or the leader could not decode (every proposal in it failed),
/// or became an entry no append-entries message could carry (replication stalled).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_too_large_for_an_entry_is_refused_alone() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let c = TestCluster::start("resp_large_write", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);
    let term = c.status_ok(leader).await.term;
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..8u64 {
        let node = if w % 4 == 0 { leader } else { follower };
        let mut con = connect(&c, node).await;
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, Vec::new());
            // Bounded: at most 100,000 writes, and the test stops it within a minute.
            for i in 0..100_000u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let key = format!("small-{w}-{i}");
                let r = within(
                    &key,
                    STEP,
                    redis::cmd("SET")
                        .arg(&key)
                        .arg("v")
                        .query_async::<String>(&mut con),
                )
                .await;
                match r {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(format!("{key}: {e}")),
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Four values just under the 16 MiB bulk limit: one RESP request of just under 64 MiB.
    let value = vec![b'x'; 16 * 1024 * 1024 - 1024];
    for (round, node) in [follower, follower, leader].into_iter().enumerate() {
        let mut con = connect(&c, node).await;
        let mut mset = redis::cmd("MSET");
        for k in 0..4 {
            mset.arg(format!("big-{round}-{k}")).arg(&value[..]);
        }
        let r = within(
            "the large MSET",
            Duration::from_secs(60),
            mset.query_async::<String>(&mut con),
        )
        .await;
        match r {
            Ok(v) => panic!("a write of ~64 MiB was applied ({v}) on node {node}"),
            Err(e) => assert!(
                e.to_string().contains("nothing was applied"),
                "node {node}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    stop.store(true, Ordering::Relaxed);
    // A leader change (two busy cores can starve a heartbeat) leaves writes in flight unknown
    // for reasons of its own: then only the refusals above count.
    let same_leader = c.status_ok(leader).await.term == term;
    let mut total = 0;
    for (w, t) in writers.into_iter().enumerate() {
        let (ok, failed) = within("a small writer to stop", Duration::from_secs(60), t)
            .await
            .expect("writer task");
        if !same_leader {
            eprintln!(
                "the leader changed: not judging writer {w}'s {} failures",
                failed.len()
            );
            continue;
        }
        assert!(
            failed.is_empty(),
            "writer {w}: {} small writes failed beside the large one: {:?}",
            failed.len(),
            &failed[..failed.len().min(5)]
        );
        assert!(ok > 0, "writer {w} wrote nothing");
        total += ok;
    }
    // Nothing of the large writes was applied; everything else is, on every node.
    let mut on_leader = connect(&c, leader).await;
    for round in 0..3 {
        let big: u64 = cmd(&mut on_leader, &["EXISTS", &format!("big-{round}-0")]).await;
        assert_eq!(big, 0, "a part of large write {round} was applied");
    }
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let applied = c.wait_all_caught_up(leader, LEADER_TIMEOUT).await;
    assert!(
        applied > total / 1024,
        "{applied} entries for {total} writes"
    );
}
