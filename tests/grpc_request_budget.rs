//! Issue 49, "authenticated gRPC/HTTP input has no node-wide cap": on a 3-node cluster with
//! an ACL file, a client that logged in (a valid token on every call) opens [`CONNS`] HTTP/2
//! connections to one node's client port with [`STREAMS`] streams each, every stream an
//! `etcdserverpb.KV/Put` or `fenced.v1.Kv/Get` whose gRPC frame announces a message just
//! under the method's limit, most of which it sends and never finishes (~370 MB in all).
//! With `--grpc-request-buffer-total` at [`TOTAL`], the streams past it are answered
//! `RESOURCE_EXHAUSTED` at once, the node's RSS stays within [`GROWTH`] of what it was, and
//! a small gRPC call (`Lock.Info`) and RESP's `SET`/`GET` are served meanwhile. Before the
//! budget every stream's message was buffered (each call is only bounded by its method's
//! message limit), none was answered, and the RSS grew by hundreds of MB.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use fenced_proto::v1 as pb;
use fenced_proto::v1::auth_client::AuthClient;
use support::{follower_of, Raw, TestCluster, LEADER_TIMEOUT, R};

const ACL_FILE: &str = "\
user default off
user admin on >adminpw allkeys allchannels +@all
";

/// Attacking connections, and streams on each.
const CONNS: usize = 8;
const STREAMS: usize = 32;
/// How long each attacking stream waits for its answer (those under the cap get none).
const ANSWER_WITHIN: Duration = Duration::from_secs(8);
/// The node-wide cap the cluster runs with.
const TOTAL: usize = 32 * 1024 * 1024;
/// How much the node's RSS may grow under the attack: the cap, a frame per stream being
/// refused, and what the allocator keeps of freed buffers.
const GROWTH: u64 = 150 * 1024 * 1024;

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
    token: String,
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
        let token = token.clone();
        calls.push(tokio::spawn(async move {
            let answered = async {
                let mut client = client.ready().await.ok()?;
                let req = http::Request::builder()
                    .method("POST")
                    .uri(uri)
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .header("authorization", format!("Bearer {token}"))
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
async fn authenticated_incomplete_requests_are_capped_node_wide() {
    let c = TestCluster::start_with("grpc_request_budget", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, ACL_FILE).expect("writing the ACL file");
        let args = [
            "--acl-file".to_string(),
            path.display().to_string(),
            "--grpc-request-buffer-total".into(),
            TOTAL.to_string(),
        ];
        (args.to_vec(), None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let addr = c.grpc_addr(node);
    let pid = c.pid(node).expect("the node's pid");
    let token = AuthClient::new(c.raw_channel(node))
        .authenticate(pb::AuthenticateRequest {
            user: "admin".into(),
            password: "adminpw".into(),
        })
        .await
        .expect("login")
        .into_inner()
        .token;
    let small = fenced_client::Client::connect_with(
        c.endpoints_of(&[node]),
        c.client_options().with_credentials("admin", "adminpw"),
    )
    .expect("client");
    small.info("lock:x").await.expect("a small call before");

    let mut good = Raw::login(&c.resp_addr(node), "admin", "adminpw");
    assert_eq!(good.send(&["PING"]), R::Status("PONG".into()));
    let before = rss(pid);
    let started = Instant::now();
    let mut attacks = Vec::new();
    for i in 0..CONNS {
        let (path, announced, sent) = if i % 2 == 0 {
            ("/etcdserverpb.KV/Put", 2_000_000, 1_900_000)
        } else {
            ("/fenced.v1.Kv/Get", 1_000_000, 990_000)
        };
        attacks.push(tokio::spawn(attack(
            addr.clone(),
            token.clone(),
            path,
            announced,
            sent,
            STREAMS,
        )));
    }
    let mut peak = before;
    let mut i = 0;
    let mut small_calls = 0;
    while !attacks.iter().all(|a| a.is_finished()) {
        peak = peak.max(rss(pid));
        let key = format!("k{i}");
        tokio::task::block_in_place(|| {
            assert_eq!(good.send(&["SET", &key, "v"]), R::ok(), "SET under attack");
            assert_eq!(good.send(&["GET", &key]), R::bulk("v"), "GET under attack");
        });
        if started.elapsed() > Duration::from_secs(2) && small_calls < 5 {
            tokio::time::timeout(Duration::from_secs(5), small.info("lock:x"))
                .await
                .expect("a small gRPC call within 5 s under attack")
                .expect("a small gRPC call under attack");
            small_calls += 1;
        }
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
    let mut codes = std::collections::BTreeMap::new();
    for a in &answers {
        *codes.entry(*a).or_insert(0) += 1;
    }
    let refused = answers.iter().filter(|a| **a == Some(8)).count();
    let ok = answers.iter().filter(|a| **a == Some(0)).count();
    eprintln!(
        "authenticated gRPC: RSS {} MB, peak {} MB; {} streams: {codes:?} (None: unanswered, \
         8: RESOURCE_EXHAUSTED) in {:?}; {small_calls} small calls served",
        before >> 20,
        peak >> 20,
        answers.len(),
        started.elapsed()
    );
    assert!(small_calls >= 1, "no small call was made under attack");
    assert!(
        peak.saturating_sub(before) < GROWTH && ok == 0 && refused >= answers.len() / 2,
        "{} authenticated streams with unfinished large messages: RSS {} MB -> peak {} MB \
         (bound: +{} MB); {refused} refused, {ok} OK: {codes:?}",
        answers.len(),
        before >> 20,
        peak >> 20,
        GROWTH >> 20,
    );
    small.info("lock:x").await.expect("a small call after");
    c.assert_alive();
}
