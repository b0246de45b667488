//! etcd's `Lease` on fenced's gRPC port (`crates/server/src/api/etcd/lease.rs`): a lease is a
//! fenced session. Against a real 3-node cluster, with Debian's `etcdctl` (3.4) — `lease
//! grant`, `put --lease`, `lease keep-alive`, `lease timetolive --keys`, `lease list`, `lease
//! revoke` — and the generated tonic client: a revoked lease's key is gone and a watcher saw
//! the delete; a session opened over RESP is a lease whose keys `SESSION.CLOSE` deletes; a
//! lease not kept alive lapses and its key is deleted (the watcher sees it); a
//! lease's time left is not reset by a leader SIGKILL; keep-alives of 100 leases on 100
//! streams at once take a few commands (coalesced), not 100; a client-chosen ID and a TTL above
//! etcd's maximum are refused with their reasons. As fenced users, a restricted user may not
//! revoke a lease whose keys it may not delete; while a member runs older apply rules, lease
//! grants and puts naming a lease wait for the upgrade.
//!
//! Run: `cargo test -p fenced-server --test etcd_lease` (needs `etcdctl`: `apt-get install -y
//! etcd-client`).

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::kv_client::KvClient;
use fenced_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use fenced_proto::etcd::etcdserverpb::watch_client::WatchClient;
use fenced_proto::etcd::mvccpb;
use support::{follower_of, grant_lease, require, wait_for, TestCluster, LEADER_TIMEOUT};
use tokio::sync::mpsc;
use tonic::{Code, Streaming};

/// Bound for the cluster to accept lease commands (a leader that heard every member's
/// rules) and for a call after the leader died.
const READY: Duration = support::ETCD_READY;
/// Bound for one expected watch response.
const RESPONSE: Duration = Duration::from_secs(20);

fn etcdctl(endpoints: &[String], args: &[&str]) -> (bool, String, String) {
    support::etcdctl_in(endpoints, args, "")
}

fn etcdctl_ok(endpoints: &[String], args: &[&str]) -> String {
    support::etcdctl_in_ok(endpoints, args, "")
}

/// Grant a lease through etcdctl (retrying until the cluster takes lease commands): its id
/// in hex, as etcdctl prints and takes it.
async fn grant_etcdctl(endpoints: &[String], user: Option<&str>, ttl: u64) -> String {
    let eps = endpoints.to_vec();
    let user = user.map(|u| format!("--user={u}"));
    wait_for("etcdctl lease grant to succeed", READY, || {
        let (eps, user) = (eps.clone(), user.clone());
        async move {
            let ttl = ttl.to_string();
            let (ok, out, err) = tokio::task::spawn_blocking(move || {
                let mut args: Vec<&str> = user.iter().map(String::as_str).collect();
                args.extend(["lease", "grant", &ttl]);
                etcdctl(&eps, &args)
            })
            .await
            .map_err(|e| e.to_string())?;
            // "lease 694d7a0c1f6c5e0a granted with TTL(30s)"
            let id = out
                .split_whitespace()
                .nth(1)
                .filter(|_| ok && out.contains("granted with TTL"));
            id.map(str::to_owned).ok_or(format!("{err}{out}"))
        }
    })
    .await
}

fn hex_id(hex: &str) -> i64 {
    i64::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("lease id {hex}: {e}"))
}

/// Grant a lease through the tonic client on node `id`, retrying until it works.
async fn grant(c: &TestCluster, id: u64, ttl: i64) -> epb::LeaseGrantResponse {
    support::grant_lease(c, id, ttl).await
}

async fn time_to_live(c: &TestCluster, node: u64, id: i64) -> epb::LeaseTimeToLiveResponse {
    wait_for("a lease time-to-live read", READY, || {
        let mut lease = LeaseClient::new(c.raw_channel(node));
        async move {
            lease
                .lease_time_to_live(epb::LeaseTimeToLiveRequest { id, keys: true })
                .await
                .map(|r| r.into_inner())
                .map_err(|e| e.to_string())
        }
    })
    .await
}

async fn put(c: &TestCluster, node: u64, key: &str, lease: i64) -> i64 {
    let r = KvClient::new(c.raw_channel(node))
        .put(epb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("put {key} with lease {lease}: {e}"))
        .into_inner();
    r.header.unwrap_or_default().revision
}

async fn get(c: &TestCluster, node: u64, key: &str) -> Option<mvccpb::KeyValue> {
    KvClient::new(c.raw_channel(node))
        .range(epb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"))
        .into_inner()
        .kvs
        .pop()
}

/// The store revision now (a linearizable read's header).
async fn get_revision(c: &TestCluster, node: u64) -> i64 {
    KvClient::new(c.raw_channel(node))
        .range(epb::RangeRequest {
            key: b"none".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("range: {e}"))
        .into_inner()
        .header
        .unwrap_or_default()
        .revision
}

/// A watch of one prefix from a revision on.
struct Watch {
    _tx: mpsc::Sender<epb::WatchRequest>,
    rx: Streaming<epb::WatchResponse>,
}

impl Watch {
    async fn open(c: &TestCluster, node: u64, prefix: &str, start: i64) -> Watch {
        let (tx, req_rx) = mpsc::channel(4);
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let create = epb::WatchCreateRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: end,
            start_revision: start,
            ..Default::default()
        };
        tx.send(epb::WatchRequest {
            request_union: Some(epb::watch_request::RequestUnion::CreateRequest(create)),
        })
        .await
        .unwrap_or_else(|e| panic!("watch request: {e}"));
        let rx = WatchClient::new(c.raw_channel(node))
            .watch(tokio_stream::wrappers::ReceiverStream::new(req_rx))
            .await
            .unwrap_or_else(|e| panic!("opening a watch: {e}"))
            .into_inner();
        Watch { _tx: tx, rx }
    }

    /// The next `n` events (skipping the created response).
    async fn events(&mut self, n: usize) -> Vec<mvccpb::Event> {
        let mut got = Vec::new();
        while got.len() < n {
            match tokio::time::timeout(RESPONSE, self.rx.message()).await {
                Ok(Ok(Some(r))) => {
                    assert!(!r.canceled, "watch cancelled: {r:?}");
                    got.extend(r.events);
                }
                other => panic!("no watch event within {RESPONSE:?} (have {got:?}): {other:?}"),
            }
        }
        got
    }
}

fn kind(e: &mvccpb::Event) -> (i32, String, i64) {
    let kv = e.kv.clone().unwrap_or_default();
    (
        e.r#type,
        String::from_utf8_lossy(&kv.key).into_owned(),
        kv.mod_revision,
    )
}

const PUT: i32 = mvccpb::event::EventType::Put as i32;
const DELETE: i32 = mvccpb::event::EventType::Delete as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leases_are_fenced_sessions() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("etcd_lease", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let all = c.endpoints();

    // etcdctl: grant, put --lease, keep-alive, timetolive --keys, list, revoke.
    let hex = grant_etcdctl(&all, None, 30).await;
    let id = hex_id(&hex);
    let mut watch = Watch::open(&c, f, "ctl/", 1).await;
    let lease_arg = format!("--lease={hex}");
    assert_eq!(
        etcdctl_ok(&all, &["put", "ctl/k", "v", &lease_arg]).trim(),
        "OK"
    );
    let kv = get(&c, f, "ctl/k").await.expect("ctl/k is there");
    assert_eq!(kv.lease, id, "range shows the key's lease");
    let ttl = etcdctl_ok(&all, &["lease", "timetolive", &hex, "--keys"]);
    assert!(
        ttl.contains("granted with TTL(30s)") && ttl.contains("attached keys([ctl/k])"),
        "{ttl}"
    );
    // A few renewals through `lease keep-alive` (it runs until stopped).
    let mut ka = Command::new("etcdctl");
    ka.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", all.join(",")))
        .args(["lease", "keep-alive", &hex])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    support::die_with_this_test(&mut ka);
    let mut child = ka.spawn().expect("starting etcdctl lease keep-alive");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std_mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let started = Instant::now();
    let mut renewals = 0;
    while renewals < 2 && started.elapsed() < Duration::from_secs(40) {
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
            assert!(line.contains(&hex), "{line}");
            if line.contains("keepalived with TTL(30)") {
                renewals += 1;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        renewals >= 2,
        "etcdctl lease keep-alive renewed {renewals} times"
    );
    let list = etcdctl_ok(&all, &["lease", "list"]);
    assert!(list.lines().any(|l| l.trim() == hex), "{list}");
    assert_eq!(
        etcdctl_ok(&all, &["lease", "revoke", &hex]).trim(),
        format!("lease {hex} revoked")
    );
    assert_eq!(
        get(&c, f, "ctl/k").await,
        None,
        "a revoked lease's key is deleted"
    );
    let events = watch.events(2).await;
    assert_eq!(kind(&events[0]).0, PUT);
    let put_kv = events[0].kv.clone().unwrap_or_default();
    assert_eq!(put_kv.lease, id, "the watch shows the key's lease");
    assert_eq!(kind(&events[1]).0, DELETE);
    assert_eq!(kind(&events[1]).1, "ctl/k");
    let ttl = etcdctl_ok(&all, &["lease", "timetolive", &hex]);
    assert!(ttl.contains("already expired"), "{ttl}");
    let (ok, _, err) = etcdctl(&all, &["lease", "revoke", &hex]);
    assert!(!ok && err.contains("requested lease not found"), "{err}");

    // A negative ID is refused, saying why (chosen ids: the test below); so is a TTL above
    // etcd's maximum.
    let mut lease = LeaseClient::new(c.raw_channel(leader));
    let e = lease
        .lease_grant(epb::LeaseGrantRequest { ttl: 10, id: -42 })
        .await
        .expect_err("a negative id is refused");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("lease ids are positive"), "{e:?}");
    let e = lease
        .lease_grant(epb::LeaseGrantRequest {
            ttl: 9_000_000_001,
            id: 0,
        })
        .await
        .expect_err("too long");
    assert_eq!(
        (e.code(), e.message()),
        (Code::OutOfRange, "etcdserver: too large lease TTL")
    );
    // A lease is a session: at most one day, as sessions (issue 49; etcd allows 285 years).
    for ttl in [24 * 3600 + 1, 68 * 365 * 24 * 3600] {
        let e = lease
            .lease_grant(epb::LeaseGrantRequest { ttl, id: 0 })
            .await
            .expect_err("longer than a day");
        assert_eq!(e.code(), Code::OutOfRange, "{ttl}: {e:?}");
    }
    assert_eq!(grant(&c, leader, 24 * 3600).await.ttl, 24 * 3600);
    // A TTL below etcd's minimum is raised to it.
    assert_eq!(grant(&c, leader, 1).await.ttl, 2);
    // An unknown lease: TimeToLive -1, a put refused as etcd does.
    assert_eq!(time_to_live(&c, f, 1_000_000_007).await.ttl, -1);
    let e = KvClient::new(c.raw_channel(f))
        .put(epb::PutRequest {
            key: b"x".to_vec(),
            lease: 1_000_000_007,
            ..Default::default()
        })
        .await
        .expect_err("unknown lease");
    assert_eq!(
        (e.code(), e.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );

    // A lease not kept alive lapses: its keys are deleted, and the watcher sees it.
    let short = grant(&c, f, 3).await;
    let rev = put(&c, f, "lapse/k", short.id).await;
    let mut watch = Watch::open(&c, leader, "lapse/", rev).await;
    let events = watch.events(2).await;
    assert_eq!(kind(&events[0]), (PUT, "lapse/k".into(), rev));
    assert_eq!(kind(&events[1]).0, DELETE, "{events:?}");
    assert!(kind(&events[1]).2 > rev);
    assert_eq!(get(&c, leader, "lapse/k").await, None);
    assert_eq!(time_to_live(&c, leader, short.id).await.ttl, -1);

    // Keep-alive stream through a follower (coalesced on its node, forwarded).
    let kept = grant(&c, f, 30).await;
    let (tx, req_rx) = mpsc::channel(4);
    let mut answers = LeaseClient::new(c.raw_channel(f))
        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(req_rx))
        .await
        .expect("keep-alive stream")
        .into_inner();
    for _ in 0..3 {
        tx.send(epb::LeaseKeepAliveRequest { id: kept.id })
            .await
            .expect("send");
        let r = tokio::time::timeout(RESPONSE, answers.message())
            .await
            .expect("a keep-alive answer in time")
            .expect("stream ok")
            .expect("an answer");
        assert_eq!((r.id, r.ttl), (kept.id, 30));
    }
    tx.send(epb::LeaseKeepAliveRequest { id: 1_000_000_007 })
        .await
        .expect("send");
    let r = tokio::time::timeout(RESPONSE, answers.message())
        .await
        .expect("answer in time")
        .expect("stream ok")
        .expect("an answer");
    assert_eq!(r.ttl, 0, "a lease not found answers TTL 0");
    drop(tx);
    let leases = LeaseClient::new(c.raw_channel(leader))
        .lease_leases(epb::LeaseLeasesRequest {})
        .await
        .expect("leases")
        .into_inner();
    assert!(leases.leases.iter().any(|l| l.id == kept.id), "{leases:?}");

    // Coalescing: keep-alives of many leases on many streams at once become a few
    // KeepAliveMany commands (each command takes a revision), not one each.
    const MANY: usize = 100;
    let mut ids = Vec::new();
    for _ in 0..MANY {
        ids.push(grant(&c, f, 60).await.id);
    }
    let mut streams = Vec::new();
    for _ in 0..MANY {
        let (tx, req_rx) = mpsc::channel(1);
        let rx = LeaseClient::new(c.raw_channel(f))
            .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(req_rx))
            .await
            .expect("keep-alive stream")
            .into_inner();
        streams.push((tx, rx));
    }
    let before = get_revision(&c, f).await;
    let sends = streams
        .iter()
        .zip(&ids)
        .map(|((tx, _), id)| tx.send(epb::LeaseKeepAliveRequest { id: *id }));
    for r in futures::future::join_all(sends).await {
        r.expect("send");
    }
    let answers = streams.iter_mut().map(|(_, rx)| async move {
        tokio::time::timeout(RESPONSE, rx.message())
            .await
            .expect("a keep-alive answer in time")
            .expect("stream ok")
            .expect("an answer")
    });
    let answers = futures::future::join_all(answers).await;
    assert!(answers.iter().all(|a| a.ttl == 60), "{answers:?}");
    let after = get_revision(&c, f).await;
    eprintln!(
        "{MANY} keep-alives on {MANY} streams: {} revisions",
        after - before
    );
    assert!(
        after - before <= (MANY / 4) as i64,
        "{MANY} keep-alives took {} revisions: not coalesced",
        after - before
    );
    drop(streams);

    // The same leases on one stream (as etcd's Go client keeps every lease of a client):
    // answered together, a few commands again — not one commit after another, which let
    // leases lapse while their client was keeping them alive.
    let (tx, req_rx) = mpsc::channel(MANY);
    let mut one = LeaseClient::new(c.raw_channel(f))
        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(req_rx))
        .await
        .expect("keep-alive stream")
        .into_inner();
    let before = get_revision(&c, f).await;
    for id in &ids {
        tx.send(epb::LeaseKeepAliveRequest { id: *id })
            .await
            .expect("send");
    }
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < MANY {
        let a = tokio::time::timeout(RESPONSE, one.message())
            .await
            .expect("a keep-alive answer in time")
            .expect("stream ok")
            .expect("an answer");
        assert_eq!(a.ttl, 60, "{a:?}");
        answered.insert(a.id);
    }
    let after = get_revision(&c, f).await;
    eprintln!(
        "{MANY} keep-alives on one stream: {} revisions",
        after - before
    );
    assert!(
        after - before <= (MANY / 4) as i64,
        "{MANY} keep-alives on one stream took {} revisions: answered one at a time",
        after - before
    );
    drop(tx);

    // A session opened over RESP is a lease: keys attached to it go with SESSION.CLOSE.
    let mut con = support::resp_connect(&c, f).await;
    let s: i64 = support::resp_cmd(&mut con, &["SESSION.OPEN", "60000"]).await;
    let rev = put(&c, leader, "resp/k", s).await;
    let ttl = time_to_live(&c, leader, s).await;
    assert_eq!(
        (ttl.granted_ttl, ttl.keys.clone()),
        (60, vec![b"resp/k".to_vec()])
    );
    let mut watch = Watch::open(&c, f, "resp/", rev).await;
    let closed: i64 = support::resp_cmd(&mut con, &["SESSION.CLOSE", &s.to_string()]).await;
    assert_eq!(closed, 1);
    let events = watch.events(2).await;
    assert_eq!(kind(&events[1]).0, DELETE, "{events:?}");
    assert_eq!(get(&c, f, "resp/k").await, None);

    // TimeToLive across a leader SIGKILL: never reset to the full TTL.
    let long = grant(&c, leader, 60).await;
    put(&c, leader, "kill/k", long.id).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before = time_to_live(&c, f, long.id).await;
    assert!(before.ttl <= 56 && before.granted_ttl == 60, "{before:?}");
    c.kill(leader);
    let after = time_to_live(&c, f, long.id).await;
    assert!(
        after.ttl <= before.ttl && after.ttl > 0,
        "time left after the leader died: {after:?} (before {before:?})"
    );
    assert_eq!(after.keys, vec![b"kill/k".to_vec()]);
    c.restart(leader);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let again = time_to_live(&c, leader, long.id).await;
    assert!(again.ttl <= after.ttl, "{again:?} after {after:?}");
}

const USERS: &str = "\
user default off
user app on >apppw ~app/* -@all +get +set +del +@fencing
user admin on >adminpw +@all ~*
user locker on >lockpw ~lock/* -@all +@fencing
";

/// Lease calls as fenced users (a restricted user may not revoke a lease whose keys it may
/// not delete), and the apply-rules gate: while a member runs rules older than 5, a grant and
/// a put naming a lease are refused "cluster not upgraded", a plain put is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_permissions_and_the_apply_rules_gate() {
    require("etcdctl", &["version"]);
    // The test-only flag that makes a member advertise older apply rules.
    std::env::set_var("FENCED_UNSAFE_TEST_HOOKS", "1");
    let c = TestCluster::start_with("etcd_lease-auth", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, USERS).expect("writing the ACL file");
        (vec!["--acl-file".into(), path.display().to_string()], None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let all = c.endpoints();
    let as_app = |args: &[&str]| {
        let mut a = vec!["--user=app:apppw"];
        a.extend_from_slice(args);
        etcdctl(&all, &a)
    };
    let as_admin = |args: &[&str]| {
        let mut a = vec!["--user=admin:adminpw"];
        a.extend_from_slice(args);
        etcdctl_ok(&all, &a)
    };
    let hex = grant_etcdctl(&all, Some("app:apppw"), 60).await;
    let lease_arg = format!("--lease={hex}");
    assert!(as_app(&["put", "app/k", "v", &lease_arg]).0);
    // Another user attaches a key outside app's patterns to app's lease.
    assert_eq!(as_admin(&["put", "other", "v", &lease_arg]).trim(), "OK");
    let (ok, _, err) = as_app(&["lease", "revoke", &hex]);
    assert!(
        !ok && err.contains("no permissions") && err.contains("other"),
        "{err}"
    );
    assert_eq!(
        as_admin(&["lease", "revoke", &hex]).trim(),
        format!("lease {hex} revoked")
    );
    assert_eq!(
        as_admin(&["get", "", "--from-key", "--keys-only"]).trim(),
        ""
    );
    // A lock-only user (no DEL) grants and revokes a lease without keys.
    let locker = grant_etcdctl(&all, Some("locker:lockpw"), 60).await;
    let (ok, out, err) = etcdctl(&all, &["--user=locker:lockpw", "lease", "revoke", &locker]);
    assert!(ok && out.contains("revoked"), "{err}{out}");

    // A member on rules 4: leases wait, plain etcd writes do not.
    let live = grant_etcdctl(&all, Some("admin:adminpw"), 60).await;
    c.kill(f);
    c.restart_with(f, &["--unsafe-test-advertise-semantics", "4"]);
    wait_for("the leader back on rules 4", READY, || async {
        let s = c.status(leader).await?;
        if s.semantics == 4 {
            Ok(())
        } else {
            Err(format!("stamps {}", s.semantics))
        }
    })
    .await;
    let via_leader = c.endpoints_of(&[leader]);
    let admin = |args: &[&str]| {
        let mut a = vec!["--user=admin:adminpw"];
        a.extend_from_slice(args);
        etcdctl(&via_leader, &a)
    };
    let (ok, _, err) = admin(&["lease", "grant", "10"]);
    assert!(!ok && err.contains("cluster not upgraded"), "{err}");
    let (ok, _, err) = admin(&["put", "k", "v", &format!("--lease={live}")]);
    assert!(!ok && err.contains("cluster not upgraded"), "{err}");
    let (ok, out, err) = admin(&["put", "k", "v"]);
    assert!(ok && out.trim() == "OK", "{err}{out}");
    c.kill(f);
    c.restart(f);
    grant_etcdctl(&via_leader, Some("admin:adminpw"), 10).await;
}

/// A lease id the client chose (issue 38, item 5): granted when free — keys attach to it —,
/// refused with etcd's `lease already exists` (FAILED_PRECONDITION) while it lives, free again
/// once revoked; an id fenced assigns later never is a chosen one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_chosen_lease_id_is_granted_once_and_never_assigned_again() {
    let c = TestCluster::start("etcd-lease-chosen", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let first = grant_lease(&c, f, 60).await;
    let mut lease = LeaseClient::new(c.raw_channel(f));
    // Two ids just ahead of the revisions, so that the next grants' revisions reach them.
    let chosen = [first.id + 3, first.id + 4];
    for id in chosen {
        let r = lease
            .lease_grant(epb::LeaseGrantRequest { ttl: 60, id })
            .await
            .unwrap_or_else(|e| panic!("a free chosen id {id} is granted: {e:?}"))
            .into_inner();
        assert_eq!(r.id, id);
        assert_eq!(r.ttl, 60);
        let rev = r.header.unwrap_or_default().revision;
        assert!(
            rev < id,
            "the header is a revision ({rev}), not the chosen id {id}"
        );
    }
    let e = lease
        .lease_grant(epb::LeaseGrantRequest {
            ttl: 60,
            id: chosen[0],
        })
        .await
        .expect_err("a taken id");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(e.message(), "etcdserver: lease already exists");
    // Keys attach to a chosen lease.
    KvClient::new(c.raw_channel(f))
        .put(epb::PutRequest {
            key: b"chosen/k".to_vec(),
            value: b"v".to_vec(),
            lease: chosen[1],
            ..Default::default()
        })
        .await
        .expect("a put with the chosen lease");
    // Assigned ids skip the chosen ones, however the revisions go.
    let mut seen = std::collections::BTreeSet::from(chosen);
    seen.insert(first.id);
    for _ in 0..6 {
        let r = grant_lease(&c, f, 60).await;
        assert!(
            seen.insert(r.id),
            "lease id {} handed out twice: {seen:?}",
            r.id
        );
    }
    // Revoked, a chosen id is free again (as in etcd).
    lease
        .lease_revoke(epb::LeaseRevokeRequest { id: chosen[0] })
        .await
        .expect("revoke");
    let r = lease
        .lease_grant(epb::LeaseGrantRequest {
            ttl: 60,
            id: chosen[0],
        })
        .await
        .expect("granted again after its revoke")
        .into_inner();
    assert_eq!(r.id, chosen[0]);
}
