//! etcd's `Watch` on fenced's gRPC port (`crates/server/src/api/etcd/watch.rs`) against a
//! real 3-node cluster: Debian's `etcdctl watch --prefix --rev` kept running while every
//! member in turn (the leader first) is SIGKILLed and restarted — it must print every value
//! once, in order — and, through the generated tonic client, what etcdctl cannot show:
//! several watches on one stream, filters, `prev_kv`, replay from an old revision across
//! many pages, cancel, duplicate ids, progress requests and the compacted cancel.
//!
//! Run: `cargo test -p fenced-server --test etcd_watch` (needs `etcdctl`: `apt-get install -y
//! etcd-client`).

#[path = "support/mod.rs"]
mod support;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::kv_client::KvClient;
use fenced_proto::etcd::etcdserverpb::watch_client::WatchClient;
use fenced_proto::etcd::mvccpb;
use support::{follower_of, require, wait_for, TestCluster, LEADER_TIMEOUT};
use tokio::sync::mpsc;
use tonic::Streaming;

/// Bound for the cluster to accept etcd writes, and for a write after a member died.
const READY: Duration = Duration::from_secs(60);
/// Bound for one expected watch response.
const RESPONSE: Duration = Duration::from_secs(10);

fn put_req(key: &str, value: &str) -> epb::PutRequest {
    epb::PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// Put through the first of `ids` that takes it, retrying until [`READY`]: its revision.
async fn put(c: &TestCluster, ids: &[u64], key: &str, value: &str) -> i64 {
    wait_for("an etcd put to succeed", READY, || {
        let clients: Vec<_> = ids
            .iter()
            .map(|i| KvClient::new(c.raw_channel(*i)))
            .collect();
        let req = put_req(key, value);
        async move {
            let mut last = String::new();
            for mut kv in clients {
                match tokio::time::timeout(Duration::from_secs(3), kv.put(req.clone())).await {
                    Ok(Ok(r)) => return Ok(r.into_inner().header.unwrap_or_default().revision),
                    Ok(Err(e)) => last = e.to_string(),
                    Err(_) => last = "timed out".into(),
                }
            }
            Err(last)
        }
    })
    .await
}

/// One watch stream: requests in, responses out.
struct Stream {
    tx: mpsc::Sender<epb::WatchRequest>,
    rx: Streaming<epb::WatchResponse>,
}

impl Stream {
    async fn open(c: &TestCluster, id: u64) -> Stream {
        let (tx, req_rx) = mpsc::channel(16);
        let rx = WatchClient::new(c.raw_channel(id))
            .watch(tokio_stream::wrappers::ReceiverStream::new(req_rx))
            .await
            .unwrap_or_else(|e| panic!("opening a watch stream: {e}"))
            .into_inner();
        Stream { tx, rx }
    }

    async fn send(&self, r: epb::watch_request::RequestUnion) {
        self.tx
            .send(epb::WatchRequest {
                request_union: Some(r),
            })
            .await
            .unwrap_or_else(|e| panic!("sending a watch request: {e}"));
    }

    async fn create(&self, c: epb::WatchCreateRequest) {
        self.send(epb::watch_request::RequestUnion::CreateRequest(c))
            .await;
    }

    async fn next(&mut self) -> epb::WatchResponse {
        match tokio::time::timeout(RESPONSE, self.rx.message()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("no watch response within {RESPONSE:?}: {other:?}"),
        }
    }

    /// Nothing arrives for a while.
    async fn quiet(&mut self, for_: Duration) {
        if let Ok(r) = tokio::time::timeout(for_, self.rx.message()).await {
            panic!("expected no watch response, got {r:?}");
        }
    }

    /// Responses of watch `id` until `n` events came: the events (other watches'
    /// responses are kept for [`Stream::take`]).
    async fn events(
        &mut self,
        id: i64,
        n: usize,
        other: &mut Vec<epb::WatchResponse>,
    ) -> Vec<mvccpb::Event> {
        let mut got = Vec::new();
        while got.len() < n {
            let r = self.next().await;
            assert!(!r.canceled, "watch cancelled: {r:?}");
            if r.watch_id == id {
                got.extend(r.events);
            } else {
                other.push(r);
            }
        }
        assert_eq!(got.len(), n, "more events than expected: {got:?}");
        got
    }
}

fn prefix(p: &str) -> epb::WatchCreateRequest {
    let mut end = p.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    epb::WatchCreateRequest {
        key: p.as_bytes().to_vec(),
        range_end: end,
        ..Default::default()
    }
}

fn brief(e: &mvccpb::Event) -> (i32, String, String, i64) {
    let kv = e.kv.clone().unwrap_or_default();
    (
        e.r#type,
        String::from_utf8_lossy(&kv.key).into_owned(),
        String::from_utf8_lossy(&kv.value).into_owned(),
        kv.mod_revision,
    )
}

const PUT: i32 = mvccpb::event::EventType::Put as i32;
const DELETE: i32 = mvccpb::event::EventType::Delete as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_deliver_every_change_in_order_filter_replay_cancel_and_report_compaction() {
    let c = TestCluster::start("etcd-watch", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let all: Vec<u64> = c.ids().collect();
    let first = put(&c, &all, "other", "x").await;

    // Two watches on one stream at a follower; writes through the leader.
    let mut s = Stream::open(&c, f).await;
    s.create(prefix("w/")).await;
    let created = s.next().await;
    assert!(created.created && !created.canceled, "{created:?}");
    assert_eq!(created.watch_id, 0, "etcd's first automatic id is 0");
    assert!(created.header.unwrap_or_default().revision >= first);
    s.create(epb::WatchCreateRequest {
        prev_kv: true,
        filters: vec![epb::watch_create_request::FilterType::Noput as i32],
        ..prefix("w/")
    })
    .await;
    let created = s.next().await;
    assert!(created.created);
    assert_eq!(created.watch_id, 1);

    let r1 = put(&c, &[leader], "w/a", "1").await;
    let r2 = put(&c, &[leader], "w/b", "2").await;
    let _ = put(&c, &[leader], "elsewhere", "-").await;
    let r3 = put(&c, &[leader], "w/a", "3").await;
    let mut kv = KvClient::new(c.raw_channel(leader));
    let del = kv
        .delete_range(epb::DeleteRangeRequest {
            key: b"w/a".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    let r4 = del.header.unwrap_or_default().revision;
    let mut others = Vec::new();
    let got = s.events(0, 4, &mut others).await;
    assert_eq!(
        got.iter().map(brief).collect::<Vec<_>>(),
        [
            (PUT, "w/a".into(), "1".into(), r1),
            (PUT, "w/b".into(), "2".into(), r2),
            (PUT, "w/a".into(), "3".into(), r3),
            (DELETE, "w/a".into(), String::new(), r4),
        ],
        "every change of the prefix, in order, nothing else"
    );
    // The NOPUT watch saw only the delete, with the value before it.
    let mut deletes: Vec<mvccpb::Event> = others.into_iter().flat_map(|r| r.events).collect();
    if deletes.is_empty() {
        deletes = s.events(1, 1, &mut Vec::new()).await;
    }
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(brief(&deletes[0]).0, DELETE);
    let prev = deletes[0].prev_kv.clone().unwrap_or_default();
    assert_eq!((prev.value.as_slice(), prev.mod_revision), (&b"3"[..], r3));

    // Replay from an old revision on a new stream at another member: the same changes.
    let mut old = Stream::open(&c, leader).await;
    old.create(epb::WatchCreateRequest {
        start_revision: r1,
        watch_id: 7,
        ..prefix("w/")
    })
    .await;
    let created = old.next().await;
    assert!(created.created && created.watch_id == 7, "{created:?}");
    let replay = old.events(7, 4, &mut Vec::new()).await;
    assert_eq!(
        replay.iter().map(brief).collect::<Vec<_>>(),
        got.iter().map(brief).collect::<Vec<_>>()
    );
    // A duplicate id is refused as etcd refuses it; the stream goes on.
    old.create(epb::WatchCreateRequest {
        watch_id: 7,
        ..prefix("x/")
    })
    .await;
    let dup = old.next().await;
    assert!(dup.created && dup.canceled && dup.watch_id == -1, "{dup:?}");
    assert!(dup.cancel_reason.contains("duplicate watch ID"), "{dup:?}");
    // Progress: everything up to the answer's revision has been seen.
    old.send(epb::watch_request::RequestUnion::ProgressRequest(
        epb::WatchProgressRequest {},
    ))
    .await;
    let progress = old.next().await;
    assert_eq!(progress.watch_id, -1, "{progress:?}");
    assert!(progress.header.unwrap_or_default().revision >= r4);
    // Cancel: acknowledged, and no more events.
    old.send(epb::watch_request::RequestUnion::CancelRequest(
        epb::WatchCancelRequest { watch_id: 7 },
    ))
    .await;
    let cancelled = old.next().await;
    assert!(
        cancelled.canceled && cancelled.watch_id == 7,
        "{cancelled:?}"
    );
    put(&c, &[leader], "w/c", "after cancel").await;
    old.quiet(Duration::from_millis(500)).await;

    // Many pages: 2,500 keys in txns of 125 puts, replayed from before them in order.
    let before = put(&c, &[leader], "p/start", "0").await;
    for t in 0..20 {
        let success = (0..125)
            .map(|i| epb::RequestOp {
                request: Some(epb::request_op::Request::RequestPut(put_req(
                    &format!("p/{:05}", t * 125 + i),
                    "v",
                ))),
            })
            .collect();
        kv.txn(epb::TxnRequest {
            success,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let mut many = Stream::open(&c, f).await;
    many.create(epb::WatchCreateRequest {
        start_revision: before + 1,
        ..prefix("p/")
    })
    .await;
    assert!(many.next().await.created);
    let events = many.events(0, 2_500, &mut Vec::new()).await;
    let keys: Vec<String> = events.iter().map(|e| brief(e).1).collect();
    let want: Vec<String> = (0..2_500).map(|i| format!("p/{i:05}")).collect();
    assert_eq!(
        keys, want,
        "a long replay loses, repeats or reorders nothing"
    );

    // Compaction: a watch from below it is created, then cancelled with the compact
    // revision; one from above it works.
    let now = put(&c, &[leader], "w/d", "4").await;
    kv.compact(epb::CompactionRequest {
        revision: now,
        physical: false,
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let mut late = Stream::open(&c, f).await;
    late.create(epb::WatchCreateRequest {
        start_revision: r1,
        ..prefix("w/")
    })
    .await;
    assert!(late.next().await.created);
    let compacted = late.next().await;
    assert!(compacted.canceled, "{compacted:?}");
    assert_eq!(compacted.compact_revision, now, "{compacted:?}");
    late.create(epb::WatchCreateRequest {
        start_revision: now + 1,
        ..prefix("w/")
    })
    .await;
    let created = late.next().await;
    assert!(created.created && !created.canceled, "{created:?}");
    let r5 = put(&c, &[leader], "w/e", "5").await;
    let got = late.events(created.watch_id, 1, &mut Vec::new()).await;
    assert_eq!(brief(&got[0]), (PUT, "w/e".into(), "5".into(), r5));
    // The first stream, caught up all along, was not cancelled by the compaction.
    let got = s.events(0, 3, &mut Vec::new()).await;
    assert_eq!(
        got.iter().map(|e| brief(e).1).collect::<Vec<_>>(),
        ["w/c", "w/d", "w/e"]
    );
}

/// Kills the child on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_resumes_through_sigkilled_members_with_every_value_once_in_order() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("etcdctl-watch", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let all: Vec<u64> = c.ids().collect();
    let start = put(&c, &all, "v/value", "0").await;

    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", c.endpoints().join(",")))
        .arg("--dial-timeout=3s")
        .args(["watch", "--prefix", "v/", &format!("--rev={start}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    support::die_with_this_test(&mut cmd);
    let mut child = Reaped(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawning etcdctl: {e}")),
    );
    let stdout = child.0.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let (lines_tx, lines) = std_mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            match line {
                Ok(l) => {
                    if lines_tx.send(l).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });

    // Every member in turn, the leader first, is SIGKILLed while values go on being
    // written through the others, then restarted: whichever member etcdctl's stream was on,
    // the stream was cut at least once.
    let mut order = vec![leader];
    order.extend(all.iter().copied().filter(|i| *i != leader));
    let mut value = 0u32;
    for victim in order {
        let survivors: Vec<u64> = all.iter().copied().filter(|i| *i != victim).collect();
        for _ in 0..5 {
            value += 1;
            put(&c, &survivors, "v/value", &value.to_string()).await;
        }
        c.kill(victim);
        for _ in 0..10 {
            value += 1;
            put(&c, &survivors, "v/value", &value.to_string()).await;
        }
        c.restart(victim);
        c.wait_for_leader(LEADER_TIMEOUT).await;
    }
    for _ in 0..5 {
        value += 1;
        put(&c, &all, "v/value", &value.to_string()).await;
    }

    // etcdctl prints "PUT", the key and the value of each event.
    let want: Vec<String> = (0..=value).map(|v| v.to_string()).collect();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while seen.len() < want.len() && Instant::now() < deadline {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => out.push(l),
            Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
        }
        seen = out
            .chunks(3)
            .filter(|e| e.len() == 3)
            .map(|e| {
                assert_eq!(
                    (e[0].as_str(), e[1].as_str()),
                    ("PUT", "v/value"),
                    "{out:?}"
                );
                e[2].clone()
            })
            .collect();
    }
    assert_eq!(
        seen, want,
        "etcdctl watch must print every value once, in order, across the kills"
    );
}
