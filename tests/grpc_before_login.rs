//! Issue 49, "the same thinking for gRPC and HTTP before authentication": on a 3-node
//! cluster with an ACL file (no anonymous user), an attacker that never logs in opens
//! [`CONNS`] HTTP/2 connections to one node's gRPC port with [`STREAMS`] streams each,
//! every stream a call of the client API (`etcdserverpb.KV/Put`, `fenced.v1.Kv/Get`)
//! whose gRPC frame announces a message just under the method's size limit, most of which
//! it sends and never finishes. The node must answer every such stream (a refusal, not a
//! wait for the rest of the body) within [`ANSWER_WITHIN`], its RSS must stay within
//! [`GROWTH`] of what it was, and an authenticated client must be served meanwhile.
//! Before the limits, tonic buffered each stream's message whole before the handler's
//! token check ran: ~1–2 MB per stream, with no bound on the streams of a connection.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use support::{follower_of, Raw, TestCluster, LEADER_TIMEOUT, R};

const ACL_FILE: &str = "\
user default off
user admin on >adminpw allkeys allchannels +@all
";

/// Attacking connections, and streams on each.
const CONNS: usize = 8;
const STREAMS: usize = 32;
/// How soon every attacking stream must have been answered.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);
/// How much the node's RSS may grow under the attack (+45–62 MB measured, with 256 and
/// with 768 streams: transient buffers the allocator keeps; +411 MB before the limits).
const GROWTH: u64 = 100 * 1024 * 1024;
/// The cluster's `--grpc-unauthenticated-calls`.
const CALLS: usize = 64;

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// What one attacking stream got: `Some(code)` for a gRPC status (in the headers or the
/// trailers), `Some(u32::MAX)` for a reset stream or connection, `None` for no answer
/// within [`ANSWER_WITHIN`].
type Answer = Option<u32>;

fn grpc_status(headers: &http::HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// One attacking connection: `streams` streams, each announcing a message of `announced`
/// bytes to `path` and sending `sent` bytes of it, never ending the stream.
async fn attack(
    addr: String,
    path: &'static str,
    announced: u32,
    sent: usize,
    streams: usize,
) -> Vec<Answer> {
    let Ok(tcp) = tokio::net::TcpStream::connect(&addr).await else {
        return vec![Some(u32::MAX); streams];
    };
    let Ok((client, conn)) = h2::client::handshake(tcp).await else {
        return vec![Some(u32::MAX); streams];
    };
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut frame = vec![0u8];
    frame.extend_from_slice(&announced.to_be_bytes());
    frame.resize(5 + sent, b'a');
    let frame = Bytes::from(frame);
    let mut calls = Vec::new();
    for _ in 0..streams {
        let client = client.clone();
        let frame = frame.clone();
        let uri = format!("http://{addr}{path}");
        calls.push(tokio::spawn(async move {
            let answered = async {
                let mut client = client.ready().await.ok()?;
                let req = http::Request::builder()
                    .method("POST")
                    .uri(uri)
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(())
                    .ok()?;
                let (resp, mut body) = client.send_request(req, false).ok()?;
                let _ = body.send_data(frame, false);
                let resp = resp.await.ok()?;
                if let Some(code) = grpc_status(resp.headers()) {
                    return Some(code);
                }
                let mut recv = resp.into_body();
                while recv.data().await.is_some_and(|d| d.is_ok()) {}
                let trailers = recv.trailers().await.ok()??;
                // Keep the send half open (unfinished) until the answer is read.
                drop(body);
                grpc_status(&trailers)
            };
            match tokio::time::timeout(ANSWER_WITHIN, answered).await {
                Ok(Some(code)) => Some(code),
                Ok(None) => Some(u32::MAX),
                Err(_) => None,
            }
        }));
    }
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap_or(None));
    }
    conn.abort();
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_grpc_calls_are_small_and_bounded() {
    let c = TestCluster::start_with("grpc_before_login", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, ACL_FILE).expect("writing the ACL file");
        let args = [
            "--acl-file".to_string(),
            path.display().to_string(),
            "--grpc-unauthenticated-calls".into(),
            CALLS.to_string(),
        ];
        (args.to_vec(), None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let addr = c.grpc_addr(node);
    let pid = c.pid(node).expect("the node's pid");

    let mut good = Raw::login(&c.resp_addr(node), "admin", "adminpw");
    assert_eq!(good.send(&["PING"]), R::Status("PONG".into()));
    let before = rss(pid);
    let started = Instant::now();

    // etcd's Put takes messages up to 2 MiB, fenced's Kv.Get up to 1 MiB.
    let mut attacks = Vec::new();
    for i in 0..CONNS {
        let (path, announced, sent) = if i % 2 == 0 {
            ("/etcdserverpb.KV/Put", 2_000_000, 1_900_000)
        } else {
            ("/fenced.v1.Kv/Get", 1_000_000, 990_000)
        };
        attacks.push(tokio::spawn(attack(
            addr.clone(),
            path,
            announced,
            sent,
            STREAMS,
        )));
    }
    let mut peak = before;
    let mut i = 0;
    while !attacks.iter().all(|a| a.is_finished()) {
        peak = peak.max(rss(pid));
        let key = format!("k{i}");
        tokio::task::block_in_place(|| {
            assert_eq!(good.send(&["SET", &key, "v"]), R::ok(), "SET under attack");
            assert_eq!(good.send(&["GET", &key]), R::bulk("v"), "GET under attack");
        });
        i += 1;
        assert!(
            started.elapsed() < ANSWER_WITHIN + Duration::from_secs(30),
            "the attack did not end"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    peak = peak.max(rss(pid));
    let mut answers = Vec::new();
    for a in attacks {
        answers.extend(a.await.expect("attacking task"));
    }
    let unanswered = answers.iter().filter(|a| a.is_none()).count();
    let ok = answers.iter().filter(|a| **a == Some(0)).count();
    let mut codes = std::collections::BTreeMap::new();
    for a in &answers {
        *codes.entry(*a).or_insert(0) += 1;
    }
    eprintln!("answers (code: count; 4294967295 = reset): {codes:?}");
    eprintln!(
        "unauthenticated gRPC: RSS {} MB, peak {} MB; {} streams, {unanswered} unanswered, \
         {ok} OK, in {:?}",
        before >> 20,
        peak >> 20,
        answers.len(),
        started.elapsed()
    );
    assert!(
        peak.saturating_sub(before) < GROWTH && unanswered == 0 && ok == 0,
        "{} unauthenticated streams with unfinished large messages: RSS {} MB -> peak {} MB \
         (bound: +{} MB); {unanswered} not answered within {ANSWER_WITHIN:?}, {ok} OK; \
         answers: {:?}",
        answers.len(),
        before >> 20,
        peak >> 20,
        GROWTH >> 20,
        &answers[..8]
    );

    // Slow unauthenticated calls: CALLS of them hold the node's permits (a small body,
    // never finished); one more is refused at once, and the slow ones are answered
    // DEADLINE_EXCEEDED 10 s after they started.
    let slow_started = Instant::now();
    let slow = tokio::spawn(attack(
        addr.clone(),
        "/fenced.v1.Auth/Authenticate",
        1000,
        100,
        CALLS,
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let extra = attack(addr.clone(), "/fenced.v1.Auth/Authenticate", 1000, 100, 1).await;
    assert!(
        slow_started.elapsed() < Duration::from_secs(8),
        "the call past --grpc-unauthenticated-calls was not refused at once"
    );
    assert_eq!(
        extra,
        vec![Some(8)],
        "a call past the limit: RESOURCE_EXHAUSTED"
    );
    let slow = slow.await.expect("slow attack");
    let took = slow_started.elapsed();
    assert!(
        slow.iter().all(|a| *a == Some(4)) && took >= Duration::from_secs(9),
        "slow unauthenticated calls: expected DEADLINE_EXCEEDED after 10 s, got {:?} \
         after {took:?}",
        &slow[..4]
    );

    // The attack over, a login and an authenticated call still work on that port.
    let opts = etcd_client::ConnectOptions::new()
        .with_user("admin", "adminpw")
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    let client = tokio::time::timeout(
        Duration::from_secs(10),
        etcd_client::Client::connect([format!("http://{addr}")], Some(opts)),
    )
    .await
    .expect("etcd login within 10 s")
    .expect("etcd login after the attack");
    let mut kv = client.kv_client();
    kv.put("after", "attack", None)
        .await
        .expect("an authenticated etcd Put after the attack");
    c.assert_alive();
}
