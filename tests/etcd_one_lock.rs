//! One lock per name in fenced's etcd API, as etcd has it (issue 38, parts 1 and 2): the
//! `v3lockpb.Lock` and `v3electionpb.Election` RPCs run etcd's recipe on the keyspace, so
//! they exclude `etcdctl lock` / `etcdctl elect` on the same name, against a real 3-node
//! cluster with real etcdctl processes and the generated tonic clients:
//!
//! * `etcdctl lock` holds → a `Lock` RPC waits, and is granted when etcdctl lets go; the
//!   RPC holds → `etcdctl lock` waits until `Unlock`; then two etcdctl workers and two RPC
//!   workers take turns on one name, appending to a shared holder log that must alternate
//!   (start/end), with the lock key's create revision — the token — growing.
//! * `etcdctl elect` leads → `Campaign` waits until etcdctl resigns; `Campaign` leads →
//!   `etcdctl elect` waits until `Resign`.
//! * An operator's `etcdctl del` of the holder's key hands the lock to the next key.
//! * A `Lock` that timed out, followed by 1,000 other lock calls on the same node, never
//!   becomes the holder: when the holder unlocks, a third caller gets the lock at once.
//! * A waiter whose serving member is SIGKILLed keeps its key on its lease until the lease
//!   ends (as in etcd), and the lock goes on once it has.
//!
//! Run: `cargo test -p fenced-server --test etcd_one_lock` (needs etcdctl).

#[path = "support/mod.rs"]
mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use fenced_proto::etcd::v3electionpb as elpb;
use fenced_proto::etcd::v3electionpb::election_client::ElectionClient;
use fenced_proto::etcd::v3lockpb as lpb;
use fenced_proto::etcd::v3lockpb::lock_client::LockClient;
use support::{
    check_one_holder_at_a_time, etcd_get as get, etcd_lock as lock, etcd_unlock as unlock,
    etcdctl_cmd, etcdctl_in_ok, follower_of, grant_lease, log_lines, require, wait_for,
    wait_leases_work, wait_sections, within, Spawned, TestCluster, ETCD_READY, LEADER_TIMEOUT,
};
use tonic::transport::Channel;

/// Bound for one call that should answer soon.
const STEP: Duration = Duration::from_secs(20);

/// A channel to node `id` without a per-call timeout (a Lock may wait long).
fn channel(c: &TestCluster, id: u64) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", c.grpc_addr(id)))
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy()
}

/// A call that must not have answered yet (it waits on the server).
async fn still_waiting<T: std::fmt::Debug>(what: &str, call: &mut tokio::task::JoinHandle<T>) {
    if let Ok(done) = tokio::time::timeout(Duration::from_millis(1_000), &mut *call).await {
        panic!("{what} answered while it should wait: {done:?}");
    }
}

fn append(log: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("holder log");
    writeln!(f, "{line}").expect("append to the holder log");
}

/// An `etcdctl lock NAME -- sh -c SCRIPT` process (stdout read by the harness).
fn etcdctl_lock(eps: &[String], name: &str, script: &str) -> Spawned {
    let cmd = etcdctl_cmd(
        eps,
        &["lock", "--ttl", "30", name, "--", "sh", "-c", script],
    );
    Spawned::start(&format!("etcdctl lock {name}"), cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_the_lock_rpc_are_one_lock_in_both_orders_and_take_turns() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("etcd_one_lock", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let eps = c.endpoints();
    wait_leases_work(&eps).await;
    let ch = || channel(&c, node);

    // 1. etcdctl holds: the Lock RPC waits until etcdctl lets go.
    let marker = c.dir().join("etcdctl-done");
    let script = format!(
        "echo \"held $ETCD_LOCK_KEY\"; sleep 3; touch {}",
        marker.display()
    );
    let mut holder = etcdctl_lock(&eps, "one", &script);
    let line = holder.line(STEP, "held");
    let etcdctl_key = line
        .strip_prefix("held ")
        .unwrap_or_else(|| panic!("etcdctl printed {line}"))
        .to_owned();
    let etcdctl_rev = get(ch(), etcdctl_key.as_bytes())
        .await
        .expect("etcdctl's key")
        .create_revision;
    let a = grant_lease(&c, node, 60).await.id;
    let mut wa = tokio::spawn(lock(ch(), "one", a));
    still_waiting("the Lock RPC while etcdctl lock holds", &mut wa).await;
    let la = within("the Lock RPC after etcdctl", STEP, &mut wa)
        .await
        .expect("join")
        .expect("lock a");
    assert!(
        marker.exists(),
        "the Lock RPC was granted while etcdctl's critical section ran"
    );
    holder.wait_exit(STEP);
    let ka = get(ch(), &la.key).await.expect("a's key");
    assert!(
        ka.create_revision > etcdctl_rev,
        "token {} after etcdctl's {etcdctl_rev}",
        ka.create_revision
    );
    assert_eq!(ka.lease, a);

    // 2. The RPC holds: etcdctl lock waits until Unlock.
    let waiter = etcdctl_lock(&eps, "one", "echo held");
    assert_eq!(
        waiter.try_line(Duration::from_millis(1_500)),
        None,
        "etcdctl lock got the lock the Lock RPC holds"
    );
    unlock(ch(), &la.key).await;
    assert_eq!(waiter.line(STEP, "held after Unlock"), "held");
    drop(waiter);

    // 3. Two etcdctl workers and two RPC workers take turns on one name.
    let log = c.dir().join("holders.log");
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for w in 0..2 {
        let (log, stop, eps) = (log.clone(), stop.clone(), eps.clone());
        threads.push(std::thread::spawn(move || {
            let get_rev = format!(
                "ETCDCTL_API=3 etcdctl --endpoints={} get \"$ETCD_LOCK_KEY\" -w fields \
                 | sed -n 's/^\"CreateRevision\" : //p'",
                eps.join(",")
            );
            let script = format!(
                "rev=$({get_rev}); echo \"start ctl{w} $rev\" >> {0}; sleep 0.2; \
                 echo \"end ctl{w}\" >> {0}",
                log.display()
            );
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let mut p = etcdctl_lock(&eps, "one", &script);
                let start = Instant::now();
                while p.child.try_wait().ok().flatten().is_none()
                    && start.elapsed() < Duration::from_secs(60)
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }));
    }
    let mut tasks = Vec::new();
    for w in 0..2 {
        let lease = grant_lease(&c, node, 120).await.id;
        let ch = channel(&c, if w == 0 { node } else { leader });
        let (log, stop) = (log.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let Ok(Ok(l)) =
                    tokio::time::timeout(Duration::from_secs(60), lock(ch.clone(), "one", lease))
                        .await
                else {
                    continue;
                };
                let rev = get(ch.clone(), &l.key)
                    .await
                    .map_or(0, |kv| kv.create_revision);
                append(&log, &format!("start rpc{w} {rev}"));
                tokio::time::sleep(Duration::from_millis(200)).await;
                append(&log, &format!("end rpc{w}"));
                unlock(ch.clone(), &l.key).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    wait_sections(&log, 16, "16 critical sections of four workers").await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = within("an RPC worker to stop", Duration::from_secs(90), t).await;
    }
    for t in threads {
        let _ = t.join();
    }
    let (sections, _) = check_one_holder_at_a_time(&log);
    let lines = log_lines(&log);
    for kind in ["start ctl", "start rpc"] {
        assert!(
            lines.iter().any(|l| l.starts_with(kind)),
            "no `{kind}` section in {lines:#?}"
        );
    }
    assert!(sections >= 16);
}

async fn campaign(ch: Channel, lease: i64, value: &str) -> Result<elpb::LeaderKey, tonic::Status> {
    ElectionClient::new(ch)
        .campaign(elpb::CampaignRequest {
            name: b"el".to_vec(),
            lease,
            value: value.as_bytes().to_vec(),
        })
        .await
        .map(|r| r.into_inner().leader.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_and_campaign_are_one_election_and_a_kv_delete_hands_a_lock_over() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("etcd_one_elect", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let eps = c.endpoints();
    wait_leases_work(&eps).await;
    let ch = || channel(&c, node);

    // etcdctl elect leads: Campaign waits until it resigns (SIGINT closes its session).
    let elect = Spawned::start("etcdctl elect", etcdctl_cmd(&eps, &["elect", "el", "ctl"]));
    let first = elect.line(STEP, "etcdctl elect's leader key");
    assert!(first.starts_with("el/"), "{first}");
    assert_eq!(elect.line(STEP, "the value"), "ctl");
    let a = grant_lease(&c, node, 60).await.id;
    let mut wa = tokio::spawn(campaign(ch(), a, "rpc"));
    still_waiting("Campaign while etcdctl elect leads", &mut wa).await;
    elect.signal(libc::SIGINT);
    let la = within("Campaign after etcdctl resigned", STEP, &mut wa)
        .await
        .expect("join")
        .expect("campaign a");
    drop(elect);
    assert_eq!(la.key, format!("el/{a:x}").into_bytes());
    let ka = get(ch(), &la.key).await.expect("a's leader key");
    assert_eq!(la.rev, ka.create_revision, "leader.rev is the key's token");

    // Campaign leads: etcdctl elect waits until Resign.
    let elect = Spawned::start(
        "etcdctl elect 2",
        etcdctl_cmd(&eps, &["elect", "el", "ctl2"]),
    );
    assert_eq!(
        elect.try_line(Duration::from_millis(1_500)),
        None,
        "etcdctl elect won while Campaign leads"
    );
    within(
        "resign",
        STEP,
        ElectionClient::new(ch()).resign(elpb::ResignRequest {
            leader: Some(la.clone()),
        }),
    )
    .await
    .expect("resign");
    assert!(elect
        .line(STEP, "leader key after Resign")
        .starts_with("el/"));
    drop(elect);

    // A KV delete of the holder's key hands a lock over.
    let h = grant_lease(&c, node, 60).await.id;
    let w = grant_lease(&c, node, 60).await.id;
    let lh = within("lock h", STEP, lock(ch(), "kv", h))
        .await
        .expect("lock h");
    let mut ww = tokio::spawn(lock(ch(), "kv", w));
    still_waiting("w's Lock", &mut ww).await;
    etcdctl_in_ok(
        &eps,
        &["del", std::str::from_utf8(&lh.key).expect("utf-8 key")],
        "",
    );
    let lw = within("w after the delete", STEP, &mut ww)
        .await
        .expect("join")
        .expect("lock w");
    assert_eq!(lw.key, format!("kv/{w:x}").into_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_lock_never_holds_whatever_traffic_follows_and_a_dead_members_waiter_lives_on_its_lease(
) {
    let c = TestCluster::start("etcd_one_abandon", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let ch = || channel(&c, node);
    let y = grant_lease(&c, node, 120).await.id;
    let x = grant_lease(&c, node, 120).await.id;
    let w = grant_lease(&c, node, 120).await.id;
    let ly = within("lock y", ETCD_READY, lock(ch(), "job", y))
        .await
        .expect("lock y");
    // X waits while 1,000 other lock calls run on the same node (500 Lock + 500 Unlock on
    // other names, from the same service), and gives up after them (its deadline).
    let mut req = tonic::Request::new(lpb::LockRequest {
        name: b"job".to_vec(),
        lease: x,
    });
    req.set_timeout(Duration::from_secs(60));
    let (stop_x, gave_up) = tokio::sync::oneshot::channel::<()>();
    let xch = ch();
    let wx = tokio::spawn(async move {
        let mut client = LockClient::new(xch);
        tokio::select! {
            r = client.lock(req) => Some(r),
            _ = gave_up => None,
        }
    });
    let o = grant_lease(&c, node, 120).await.id;
    let started = Instant::now();
    for i in 0..500 {
        let l = within(
            "another lock",
            STEP,
            lock(ch(), &format!("other{}", i % 7), o),
        )
        .await
        .expect("another lock");
        unlock(ch(), &l.key).await;
    }
    eprintln!("1,000 other lock calls took {:?}", started.elapsed());
    let _ = stop_x.send(());
    let r = within("x gives up", STEP, wx).await.expect("join");
    assert!(r.is_none(), "x answered while y held: {r:?}");
    // Its withdrawal commits soon after the call went away.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        get(ch(), format!("job/{x:x}").as_bytes()).await,
        None,
        "the timed-out call's key is still queued"
    );
    unlock(ch(), &ly.key).await;
    let lw = within(
        "a third caller at once",
        Duration::from_secs(5),
        lock(ch(), "job", w),
    )
    .await
    .expect("lock w");
    assert_eq!(lw.key, format!("job/{w:x}").into_bytes());

    // A waiter on a member that dies: its key stays on its lease until the lease ends.
    let short = grant_lease(&c, leader, 4).await.id;
    let mut wdead = tokio::spawn(lock(ch(), "job", short));
    let key = format!("job/{short:x}").into_bytes();
    let lch = channel(&c, leader);
    wait_for("the waiter's key", STEP, || {
        let (lch, key) = (lch.clone(), key.clone());
        async move {
            match get(lch, &key).await {
                Some(_) => Ok(()),
                None => Err("not yet".into()),
            }
        }
    })
    .await;
    c.kill(node);
    let r = within("the dead member's call", STEP, &mut wdead)
        .await
        .expect("join");
    assert!(r.is_err(), "{r:?}");
    assert!(
        get(lch.clone(), &key).await.is_some(),
        "the waiter's key went with its member"
    );
    // The lease (4 s, never kept alive) ends: the key goes; a new caller queues behind w only.
    wait_for("the lease's end to delete the key", STEP, || {
        let (lch, key) = (lch.clone(), key.clone());
        async move {
            match get(lch, &key).await {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            }
        }
    })
    .await;
    unlock(lch.clone(), &lw.key).await;
    let v = grant_lease(&c, leader, 60).await.id;
    let lv = within(
        "v at once",
        Duration::from_secs(5),
        lock(lch.clone(), "job", v),
    )
    .await
    .expect("lock v");
    assert_eq!(lv.key, format!("job/{v:x}").into_bytes());
    drop(LeaseClient::new(lch));
}
