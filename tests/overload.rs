//! Overload: past `--max-pending-requests` a request is refused at once with
//! `RESOURCE_EXHAUSTED` (gRPC) or `-BUSY` (RESP) and has no effect; past `--max-clients` a
//! connection is refused. The cluster keeps serving, and nothing refused leaves a trace.
//!
//! Run: `cargo test -p fenced-server --test overload`.

#[path = "support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_client::{Client, ClientError};
use support::{resp_connect, within, TestCluster, LEADER_TIMEOUT};
use tonic::Code;

const TTL: Duration = Duration::from_secs(60);

fn overloaded(e: &ClientError) -> bool {
    matches!(e, ClientError::Rejected(s) if s.code() == Code::ResourceExhausted)
}

/// Retry `f` while the node answers overloaded (bounded).
async fn until_admitted<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if overloaded(&e) && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[derive(Default)]
struct Seen {
    grants: u64,
    refused: u64,
}

/// Take and release this task's own lock as fast as possible. An acquire refused as
/// overloaded did nothing (the next one must find the lock free); a release is retried until
/// admitted. Any other error fails the test.
async fn hammer(client: Client, name: String, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let mut last = 0;
    while !stop.load(Ordering::Relaxed) && seen.grants < 1_000_000 {
        match client
            .acquire(&name, "hammer", TTL, Duration::ZERO, 0)
            .await
        {
            Ok(Some(g)) => {
                assert!(g.token > last, "{name}: token {} after {last}", g.token);
                last = g.token;
                seen.grants += 1;
                let released =
                    until_admitted("release", || client.release(&name, "hammer", g.token)).await;
                assert!(released, "{name}: the grant was gone before its release");
            }
            Ok(None) => panic!("{name} was held: a refused acquire took effect"),
            Err(e) if overloaded(&e) => seen.refused += 1,
            Err(e) => panic!("{name}: {e}"),
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_queue_bound_requests_are_refused_at_once_and_change_nothing() {
    let c = TestCluster::start("overload_queue", &["--max-pending-requests", "2"]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client_of(leader);
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..48)
        .map(|i| tokio::spawn(hammer(client.clone(), format!("lock-{i}"), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut grants, mut refused) = (0, 0);
    for t in tasks {
        let s = within("a load task to stop", Duration::from_secs(60), t)
            .await
            .expect("load task");
        grants += s.grants;
        refused += s.refused;
    }
    println!("gRPC under --max-pending-requests 2: {grants} grants, {refused} refused");
    assert!(refused > 0, "48 clients never filled a queue of 2");
    assert!(grants > 0, "nothing was admitted");
    // Nothing refused left a lock behind.
    for i in 0..48 {
        let name = format!("lock-{i}");
        let info = until_admitted("info", || client.info(&name)).await;
        assert!(info.is_none(), "{name} is held after the load: {info:?}");
    }

    // RESP: the same bound, answered -BUSY; a refused SET changed nothing.
    let mut con = resp_connect(&c, leader).await;
    let mut busy = 0;
    let mut ok = 0;
    let conns: Vec<_> = futures::future::join_all((0..32).map(|_| resp_connect(&c, leader))).await;
    let sets = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut con)| async move {
            let mut out = Vec::new();
            for n in 0..20 {
                let r: redis::RedisResult<()> = redis::cmd("SET")
                    .arg(format!("k{i}"))
                    .arg(n)
                    .query_async(&mut con)
                    .await;
                out.push((n, r));
            }
            (i, out)
        });
    for (i, results) in futures::future::join_all(sets).await {
        let mut last_ok = None;
        for (n, r) in results {
            match r {
                Ok(()) => {
                    ok += 1;
                    last_ok = Some(n)
                }
                Err(e) if e.to_string().starts_with("BUSY") || e.code() == Some("BUSY") => {
                    busy += 1
                }
                Err(e) => panic!("SET k{i} {n}: {e}"),
            }
        }
        let value: Option<i64> = redis::cmd("GET")
            .arg(format!("k{i}"))
            .query_async(&mut con)
            .await
            .expect("GET");
        assert_eq!(
            value, last_ok,
            "k{i} holds the value of its last admitted SET, not of a refused one"
        );
    }
    println!("RESP under --max-pending-requests 2: {ok} SETs, {busy} -BUSY");
    assert!(busy > 0, "32 connections never filled a queue of 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_max_clients_connections_are_refused() {
    let c = TestCluster::start("overload_conns", &["--max-clients", "12"]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    // RESP: Redis's refusal text, then the connection closes.
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..20 {
        let mut s = std::net::TcpStream::connect(c.resp_addr(leader)).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        s.write_all(b"PING\r\n").expect("write");
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        let reply = String::from_utf8_lossy(&buf[..n]).to_string();
        if reply.starts_with("-ERR max number of clients reached") {
            refused += 1;
        } else {
            assert_eq!(reply, "+PONG\r\n");
            open.push(s);
        }
    }
    assert_eq!(
        (open.len(), refused),
        (12, 8),
        "RESP admitted {}",
        open.len()
    );
    drop(open);

    // gRPC: past the limit a connection is closed at once (peers hold some of the 12).
    let mut kept = Vec::new();
    let mut closed = 0;
    for _ in 0..20 {
        let mut s = std::net::TcpStream::connect(c.grpc_addr(leader)).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            _ => kept.push(s),
        }
    }
    assert!(
        closed >= 8,
        "gRPC closed only {closed} of 20 extra connections"
    );
    drop(kept);
    // The cluster still serves, through the leader's gRPC port too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let g = c
        .client_of(leader)
        .acquire("after", "me", TTL, Duration::ZERO, 0)
        .await
        .expect("acquire after the storm");
    assert!(g.is_some());
}
