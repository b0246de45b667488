//! etcd's `Watch` on fenced's gRPC port (`crates/server/src/api/etcd/watch.rs`) against a
//! real 3-node cluster: Debian's `etcdctl watch --prefix --rev` kept running while every
//! member in turn (the leader first) is SIGKILLed and restarted — it must print every value
//! once, in order — and, through the generated tonic client, what etcdctl cannot show:
//! several watches on one stream, filters, `prev_kv`, replay from an old revision across
//! many pages, cancel, duplicate ids, progress requests and the compacted cancel; and a
//! quiet watch that compaction never cancels while `LOCK.*` traffic over RESP takes the
//! revisions (`etcdctl compact` at the current revision, and fenced's auto-compaction), with
//! progress answers that never name a revision above the store's (issue 38, item 3).
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
use support::{
    etcdctl_in_ok, follower_of, require, resp_cmd, resp_connect, wait_for, within, TestCluster,
    LEADER_TIMEOUT,
};
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
    let c = TestCluster::start("etcd-watch", &["--metrics-addr", "{ip}:9190"]);
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
    // The member's metrics count the open watches and the events sent.
    let (code, body) = support::http_get(&c.ip(f), 9190, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("scrape: {e}"));
    assert_eq!(code, 200);
    let sample = |name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in the scrape"))
    };
    assert_eq!(sample("fenced_etcd_watchers"), 2.0);
    assert!(sample("fenced_etcd_watch_events_total") >= 4.0);
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
    // Resuming at the compact revision it was told, as etcd clients do, works (etcd's rule:
    // the puts at that revision are still there).
    late.create(epb::WatchCreateRequest {
        start_revision: compacted.compact_revision,
        ..prefix("w/")
    })
    .await;
    let created = late.next().await;
    assert!(created.created && !created.canceled, "{created:?}");
    let r5 = put(&c, &[leader], "w/e", "5").await;
    let got = late.events(created.watch_id, 2, &mut Vec::new()).await;
    assert_eq!(
        got.iter().map(brief).collect::<Vec<_>>(),
        [
            (PUT, "w/d".into(), "4".into(), now),
            (PUT, "w/e".into(), "5".into(), r5)
        ]
    );
    // The first stream, caught up all along, was not cancelled by the compaction.
    let got = s.events(0, 3, &mut Vec::new()).await;
    assert_eq!(
        got.iter().map(|e| brief(e).1).collect::<Vec<_>>(),
        ["w/c", "w/d", "w/e"]
    );
}

/// The store's revision now, by a linearizable read through node `id` (reads take none).
async fn store_revision(c: &TestCluster, id: u64) -> i64 {
    KvClient::new(c.raw_channel(id))
        .range(epb::RangeRequest {
            key: b"w/".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("range: {e}"))
        .into_inner()
        .header
        .unwrap_or_default()
        .revision
}

/// `cycles` LOCK.ACQUIRE / LOCK.RELEASE over RESP on node `id`: revisions that are no etcd
/// write.
async fn lock_traffic(c: &TestCluster, id: u64, cycles: usize) {
    let mut con = resp_connect(c, id).await;
    for i in 0..cycles {
        let name = format!("busy-{}", i % 7);
        let token: i64 = resp_cmd(&mut con, &["LOCK.ACQUIRE", &name, "me", "10000"]).await;
        let released: i64 =
            resp_cmd(&mut con, &["LOCK.RELEASE", &name, "me", &token.to_string()]).await;
        assert_eq!(released, 1, "{name} released");
    }
}

/// A quiet watch (caught up, nothing written to its range since) is never cancelled by a
/// compaction at a revision that lock commands took — etcd never compacts a synced watcher —
/// neither by `etcdctl compact $(current revision)` nor by fenced's auto-compaction on a
/// cluster busy with `LOCK.*`; an unsynced watch from below the compact revision still is.
/// And a progress request on a stream whose only watch starts in the future names at most the
/// store's revision (etcd 3.5.1 answers its current revision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_watches_survive_compaction_while_lock_traffic_takes_the_revisions() {
    require("etcdctl", &["version"]);
    // Revision mode, the last 20 revisions: lock traffic alone keeps compacting.
    let c = TestCluster::start(
        "etcd-watch-quiet",
        &[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "20",
        ],
    );
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let all: Vec<u64> = c.ids().collect();
    // A superseded version, so that auto-compaction has something to compact.
    put(&c, &all, "w/a", "1").await;
    let last_write = put(&c, &[leader], "w/a", "2").await;

    // Two quiet watches, on a follower and on the leader.
    let mut quiet = Vec::new();
    for id in [f, leader] {
        let mut s = Stream::open(&c, id).await;
        // From after the last write (a follower's own current revision may lag behind it).
        s.create(epb::WatchCreateRequest {
            start_revision: last_write + 1,
            ..prefix("w/")
        })
        .await;
        let created = s.next().await;
        assert!(created.created && !created.canceled, "{created:?}");
        quiet.push(s);
    }

    // 1. etcdctl compact at the current revision, taken by lock commands.
    lock_traffic(&c, leader, 30).await;
    let now = store_revision(&c, leader).await;
    assert!(now > last_write + 30, "lock commands took revisions: {now}");
    let out = etcdctl_in_ok(&c.endpoints(), &["compact", &now.to_string()], "");
    assert!(out.contains(&now.to_string()), "{out}");
    for s in &mut quiet {
        s.quiet(Duration::from_millis(500)).await;
    }

    // 2. Auto-compaction while LOCK.* keeps the cluster busy: wait until it compacted past
    //    the second write of x/a (a read below it is refused), well past the watches'
    //    positions.
    //    A superseded version outside the watched range, for it to compact (the explicit
    //    compaction left none, and auto-compaction waits for one).
    put(&c, &[leader], "x/a", "1").await;
    let x2 = put(&c, &[leader], "x/a", "2").await;
    let mut kv = KvClient::new(c.raw_channel(leader));
    let mut rounds = 0;
    loop {
        lock_traffic(&c, leader, 20).await;
        let r = kv
            .range(epb::RangeRequest {
                key: b"w/a".to_vec(),
                revision: x2 - 1,
                ..Default::default()
            })
            .await;
        if matches!(&r, Err(e) if e.message().contains("compacted")) {
            break;
        }
        rounds += 1;
        assert!(rounds < 50, "auto-compaction never passed {x2}: {r:?}");
    }
    for s in &mut quiet {
        s.quiet(Duration::from_millis(500)).await;
    }
    // Still watching: the next write arrives, once, on both.
    let r = put(&c, &[leader], "w/b", "3").await;
    for s in &mut quiet {
        let got = s.events(0, 1, &mut Vec::new()).await;
        assert_eq!(
            got.iter().map(brief).collect::<Vec<_>>(),
            [(PUT, "w/b".into(), "3".into(), r)]
        );
    }
    // An unsynced watch from below the compact revision is cancelled, as in etcd.
    let mut late = Stream::open(&c, f).await;
    late.create(epb::WatchCreateRequest {
        start_revision: last_write,
        ..prefix("w/")
    })
    .await;
    assert!(late.next().await.created);
    let compacted = late.next().await;
    assert!(
        compacted.canceled && compacted.compact_revision > now,
        "{compacted:?}"
    );

    // 3. Progress with a watch starting in the future.
    let mut future = Stream::open(&c, f).await;
    let before = store_revision(&c, f).await;
    future
        .create(epb::WatchCreateRequest {
            start_revision: before + 1_000,
            ..prefix("w/")
        })
        .await;
    assert!(future.next().await.created);
    future
        .send(epb::watch_request::RequestUnion::ProgressRequest(
            epb::WatchProgressRequest {},
        ))
        .await;
    let progress = within("a progress answer", RESPONSE, future.next()).await;
    let after = store_revision(&c, f).await;
    let named = progress.header.unwrap_or_default().revision;
    assert_eq!(progress.watch_id, -1, "{progress:?}");
    assert!(
        named >= before && named <= after,
        "a progress answer names {named}; the store was at {before}..={after}"
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_require_leader_watch_ends_when_its_member_loses_the_majority() {
    let c = TestCluster::start("etcd-watch-leader", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let all: Vec<u64> = c.ids().collect();
    put(&c, &all, "ready", "1").await;
    let open = |require: bool| {
        let channel = c.raw_channel(f);
        async move {
            let (tx, req_rx) = mpsc::channel(4);
            tx.send(epb::WatchRequest {
                request_union: Some(epb::watch_request::RequestUnion::CreateRequest(prefix(
                    "w/",
                ))),
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(req_rx));
            if require {
                req.metadata_mut().insert(
                    "hasleader",
                    tonic::metadata::MetadataValue::from_static("true"),
                );
            }
            let mut rx = WatchClient::new(channel)
                .watch(req)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .into_inner();
            let created = rx.message().await.unwrap_or_else(|e| panic!("{e}"));
            assert!(created.is_some_and(|r| r.created));
            (tx, rx)
        }
    };
    let (_keep_a, mut required) = open(true).await;
    let (_keep_b, mut plain) = open(false).await;
    // The other two members die: `f` is alone, with no leader.
    for id in all.iter().copied().filter(|i| *i != f) {
        c.kill(id);
    }
    let ended = tokio::time::timeout(Duration::from_secs(20), required.message())
        .await
        .unwrap_or_else(|_| panic!("the require-leader watch went on without a leader"));
    let status = ended.expect_err("the require-leader watch must end with an error");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("no leader"), "{status:?}");
    // A watch that did not ask stays open (it would catch up once the member does).
    if let Ok(r) = tokio::time::timeout(Duration::from_secs(1), plain.message()).await {
        panic!("the plain watch ended or got something: {r:?}");
    }
}

/// Issue 49: one stream holds at most 10,000 watches and 64 MiB of watched keys; a create past
/// either is answered created-and-cancelled with etcd's style of reason, and the stream and
/// its other watches go on (a cancel makes room again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_watch_limits_refuses_the_create_and_goes_on() {
    const WATCHES: usize = 10_000;
    let c = TestCluster::start("etcd-watch-limit", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let all: Vec<u64> = c.ids().collect();
    put(&c, &all, "warm", "x").await;

    let mut s = Stream::open(&c, leader).await;
    let started = Instant::now();
    for i in 0..WATCHES {
        s.create(prefix(&format!("n{i}/"))).await;
        let r = s.next().await;
        assert!(r.created && !r.canceled, "watch {i} of {WATCHES}: {r:?}");
    }
    s.create(prefix("over/")).await;
    let over = s.next().await;
    assert!(
        over.created && over.canceled && over.cancel_reason.contains("too many watches"),
        "watch {} of one stream must be refused: {over:?}",
        WATCHES + 1
    );
    // A cancel makes room; the stream still serves its watches.
    s.send(epb::watch_request::RequestUnion::CancelRequest(
        epb::WatchCancelRequest { watch_id: 5 },
    ))
    .await;
    let cancelled = s.next().await;
    assert!(
        cancelled.canceled && cancelled.watch_id == 5,
        "{cancelled:?}"
    );
    s.create(prefix("again/")).await;
    let again = s.next().await;
    assert!(again.created && !again.canceled, "{again:?}");
    put(&c, &all, "n7/k", "v").await;
    let mut other = Vec::new();
    let got = s.events(7, 1, &mut other).await;
    assert_eq!(brief(&got[0]).1, "n7/k");
    println!(
        "{WATCHES} watches created on one stream in {:?}",
        started.elapsed()
    );

    // Bytes: a small watch and 63 of a 1 MiB key fit in the 64 MiB; one more is refused.
    let mut b = Stream::open(&c, leader).await;
    b.create(prefix("small/")).await;
    assert!(!b.next().await.canceled);
    for i in 0..63u8 {
        let mut key = vec![b'k'; 1 << 20];
        key[0] = i;
        b.create(epb::WatchCreateRequest {
            key,
            ..Default::default()
        })
        .await;
        let r = b.next().await;
        assert!(
            r.created && !r.canceled,
            "big watch {i}: {:?}",
            r.cancel_reason
        );
    }
    b.create(epb::WatchCreateRequest {
        key: vec![b'z'; 1 << 20],
        ..Default::default()
    })
    .await;
    let full = b.next().await;
    assert!(
        full.canceled && full.cancel_reason.contains("too many watches"),
        "a watch past 64 MiB of watched keys must be refused: {:?}",
        full.cancel_reason
    );
    put(&c, &all, "small/k", "v").await;
    let got = b.events(0, 1, &mut other).await;
    assert_eq!(brief(&got[0]).1, "small/k");
}

/// A client that closes its side of the stream after its create request (what etcd's JSON
/// gateway does when the HTTP body ends, `curl -d '{"create_request": …}'`) goes on
/// receiving its watch's events, as on etcd, whose watch server ends a stream only when
/// the client goes away, not when it stops sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_goes_on_after_its_client_closes_its_send_side() {
    let c = TestCluster::start("etcd-watch-half-closed", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let all: Vec<u64> = c.ids().collect();
    put(&c, &all, "warm", "x").await;
    let mut s = Stream::open(&c, leader).await;
    s.create(prefix("half/")).await;
    let created = s.next().await;
    assert!(created.created && !created.canceled, "{created:?}");
    // Close the send side: the request stream ends.
    drop(s.tx);
    let mut rx = s.rx;
    put(&c, &all, "half/k", "v").await;
    match tokio::time::timeout(RESPONSE, rx.message()).await {
        Ok(Ok(Some(r))) => {
            assert_eq!(r.events.len(), 1, "{r:?}");
            assert_eq!(brief(&r.events[0]).1, "half/k");
        }
        other => panic!("the watch must go on after the client closed its side: {other:?}"),
    }
}
