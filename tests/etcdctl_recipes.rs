//! etcdctl's client-side recipes — `etcdctl lock` and `etcdctl elect`, built by the client
//! from a lease, keys, Txn and Watch — unchanged against a 3-node fenced cluster through a
//! SIGKILL of the fenced leader and a partition that cuts the fenced leader off from the
//! other members (clients still reach every node).
//!
//! These recipes build their lock from keys in the keyspace — the same lock as etcd's `Lock`
//! and `Election` RPCs on that name (tests/etcd_one_lock.rs), a different one from fenced's
//! own lock table (`LOCK.*`), which is a separate namespace.
//!
//! Run: `cargo test -p fenced-server --test etcdctl_recipes` (needs etcdctl and, for the
//! partition, root and iptables: scripts/test.sh installs them).

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{
    check_one_holder_at_a_time, ends, etcdctl_cmd, require, wait_sections, Spawned, TestCluster,
    LEADER_TIMEOUT,
};

/// Bound of one worker's `etcdctl lock -- cmd` run (a partition lasts a few seconds).
const RUN_LIMIT: Duration = Duration::from_secs(45);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_keeps_one_holder_through_a_leader_sigkill_and_a_partition() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("ectl-lock-faults", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let eps = c.endpoints();
    support::wait_leases_work(&eps).await;
    let log = c.dir().join("holders.log");
    let stop = Arc::new(AtomicBool::new(false));
    // The endpoints each new `etcdctl lock` run is given, and how many runs each worker
    // started: before the partition every new run goes to the majority side only (a client
    // whose node ends up on the minority side waits there until the heal, with etcd too).
    let shared_eps = Arc::new(Mutex::new(eps.clone()));
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..3).map(|_| AtomicU32::new(0)).collect());

    // Three contenders, each running `etcdctl lock` rounds until told to stop: the
    // critical section appends a start line (with the lock key's revision etcdctl hands it
    // in ETCD_LOCK_REV), sleeps, and appends an end line.
    let mut workers = Vec::new();
    for w in 0..3 {
        let (shared_eps, runs) = (shared_eps.clone(), runs.clone());
        let (log, stop) = (log.clone(), stop.clone());
        workers.push(std::thread::spawn(move || {
            let script = format!(
                "echo \"start {w} $ETCD_LOCK_REV\" >> {0}; sleep 0.2; echo \"end {w}\" >> {0}",
                log.display()
            );
            let (mut ok, mut failed) = (0u32, 0u32);
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let eps = shared_eps.lock().expect("endpoints").clone();
                runs[w].fetch_add(1, Ordering::SeqCst);
                // A 30 s session (etcdctl's default is 10 s): etcd 3.4's recipe does not check,
                // after waiting, that its key is still there, so a lease that lapses while a
                // client waits through the faults yields a holder without a key — two holders
                // by the recipe's own fault, which a longer lease keeps out of this test.
                let mut cmd = etcdctl_cmd(
                    &eps,
                    &["lock", "--ttl", "30", "recipe", "--", "sh", "-c", &script],
                );
                let err = log.with_file_name(format!("worker-{w}.stderr"));
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&err)
                    .expect("worker stderr file");
                cmd.stderr(file);
                let mut p = Spawned::start(&format!("etcdctl lock (worker {w})"), cmd);
                let start = Instant::now();
                while p.child.try_wait().ok().flatten().is_none() && start.elapsed() < RUN_LIMIT {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if p.child.try_wait().ok().flatten().is_none() {
                    let text = std::fs::read_to_string(&err).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(15).collect();
                    panic!(
                        "worker {w}: etcdctl lock ran longer than {RUN_LIMIT:?}; its stderr \
                         (newest first):\n{}",
                        tail.join("\n")
                    );
                }
                if p.wait_exit(RUN_LIMIT).success() {
                    ok += 1;
                } else {
                    // An attempt that failed during a fault; the recipe is retried.
                    failed += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            (ok, failed)
        }));
    }

    wait_sections(&log, 3, "three critical sections before any fault").await;

    // SIGKILL the fenced leader while the contenders go on; restart it.
    let before = ends(&log);
    c.kill(leader);
    wait_sections(
        &log,
        before + 3,
        "three critical sections after the leader's SIGKILL",
    )
    .await;
    c.restart(leader);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;

    // Cut the (new) fenced leader off from the other two members.
    *shared_eps.lock().expect("endpoints") = c
        .ids()
        .filter(|i| *i != leader)
        .map(|i| c.grpc_addr(i))
        .collect();
    let started: Vec<u32> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    support::wait_for(
        "every worker to start a run on the majority side",
        Duration::from_secs(60),
        || async {
            if runs
                .iter()
                .zip(&started)
                .all(|(r, s)| r.load(Ordering::SeqCst) >= s + 2)
            {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await;
    let before = ends(&log);
    let cut = c.partition(&[leader]);
    wait_sections(
        &log,
        before + 3,
        "three critical sections with the leader cut off",
    )
    .await;
    cut.heal();
    let before = ends(&log);
    wait_sections(&log, before + 3, "three critical sections after the heal").await;

    stop.store(true, Ordering::Relaxed);
    let mut total_failed = 0;
    for w in workers {
        let (ok, failed) = w.join().expect("a worker panicked");
        assert!(
            ok >= 1,
            "a contender never got the lock ({failed} failed runs)"
        );
        total_failed += failed;
    }

    // Never two holders at once; the lock key's revision grows from holder to holder.
    let (sections, last_rev) = check_one_holder_at_a_time(&log);
    eprintln!(
        "etcdctl lock: {sections} critical sections, one holder at a time, last revision \
         {last_rev}; {total_failed} runs failed during faults and were retried"
    );
    assert!(sections >= 12, "too few critical sections: {sections}");
}

/// `etcdctl lock NAME` (no command) prints the lock key once it holds the lock.
fn lock_holder(eps: &[String], what: &str, ttl: &str) -> Spawned {
    Spawned::start(what, etcdctl_cmd(eps, &["lock", "--ttl", ttl, "handover"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_hands_over_when_the_holder_dies_and_elect_follows_leaders() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("ectl-handover", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let eps = c.endpoints();
    support::wait_leases_work(&eps).await;
    let step = Duration::from_secs(30);

    // --- lock: a holder, a waiter; the fenced leader is SIGKILLed; the holder's etcdctl is
    // SIGKILLed (its lease is not revoked: it expires) and the waiter takes over.
    let h = lock_holder(&eps, "etcdctl lock (holder)", "5");
    let hkey = h.line(step, "the holder's lock key");
    assert!(hkey.starts_with("handover/"), "lock key {hkey}");
    let w = lock_holder(&eps, "etcdctl lock (waiter)", "5");
    assert_eq!(
        w.try_line(Duration::from_secs(1)),
        None,
        "the waiter got the lock while the holder holds it"
    );
    c.kill(leader);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    c.restart(follower_not(leader, &c));
    // The holder's session survives the leader change: the waiter still waits.
    assert_eq!(
        w.try_line(Duration::from_secs(2)),
        None,
        "the waiter got the lock after the fenced leader's SIGKILL while the holder lives"
    );
    drop(h); // SIGKILL: no revoke; the lease (TTL 5 s) expires
    let t = Instant::now();
    let wkey = w.line(step, "the waiter's lock key after the holder died");
    assert!(
        wkey.starts_with("handover/") && wkey != hkey,
        "{wkey} vs {hkey}"
    );
    eprintln!(
        "etcdctl lock: the waiter held {:?} after the holder's SIGKILL",
        t.elapsed()
    );
    drop(w);

    // --- elect: alpha is elected, then the fenced leader is SIGKILLed (alpha stays leader);
    // a listener and two more candidates start; each resignation (SIGINT: etcdctl closes
    // its session, revoking its lease) hands the leadership to the next candidate in order,
    // the last one while the fenced leader is cut off from the other members. The listener
    // and the later candidates talk to the majority side: a client whose only node is on the
    // minority side of a partition can do nothing (with etcd as with fenced), and one whose
    // resignation cannot reach a majority leaves its lease to expire (60 s for etcdctl).
    let a = Spawned::start(
        "elect alpha",
        etcdctl_cmd(&eps, &["elect", "ring", "alpha"]),
    );
    let akey = a.line(step, "alpha's leader key");
    assert!(akey.starts_with("ring/"), "{akey}");
    assert_eq!(a.line(step, "alpha's value"), "alpha");
    c.kill(leader);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    c.restart(follower_not(leader, &c));
    let majority: Vec<String> = c
        .ids()
        .filter(|i| *i != leader)
        .map(|i| c.grpc_addr(i))
        .collect();
    let listen = Spawned::start(
        "etcdctl elect -l",
        etcdctl_cmd(&majority, &["elect", "-l", "ring"]),
    );
    let b = Spawned::start(
        "elect beta",
        etcdctl_cmd(&majority, &["elect", "ring", "beta"]),
    );
    std::thread::sleep(Duration::from_millis(500));
    let g = Spawned::start(
        "elect gamma",
        etcdctl_cmd(&majority, &["elect", "ring", "gamma"]),
    );
    assert_eq!(
        b.try_line(Duration::from_secs(1)),
        None,
        "beta elected while alpha leads"
    );
    assert_eq!(g.try_line(Duration::from_millis(200)), None, "two leaders");

    a.signal(libc::SIGINT);
    assert!(b.line(step, "beta's leader key").starts_with("ring/"));
    assert_eq!(b.line(step, "beta's value"), "beta");
    assert_eq!(g.try_line(Duration::from_millis(500)), None, "two leaders");

    let cut = c.partition(&[leader]);
    c.wait_for_leader_other_than(leader, LEADER_TIMEOUT).await;
    b.signal(libc::SIGINT);
    assert!(g.line(step, "gamma's leader key").starts_with("ring/"));
    assert_eq!(g.line(step, "gamma's value"), "gamma");
    cut.heal();
    g.signal(libc::SIGINT);

    // The listener printed key/value pairs; its values, repeats merged (a resumed observe
    // may print the current leader again), are the leaders in order.
    let mut seen: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.last().map(String::as_str) != Some("gamma") && Instant::now() < deadline {
        let Some(_key) = listen.try_line(Duration::from_secs(1)) else {
            continue;
        };
        let v = listen.line(step, "a leader's value");
        if seen.last() != Some(&v) {
            seen.push(v);
        }
    }
    assert_eq!(seen, ["alpha", "beta", "gamma"], "the listener's leaders");
}

/// A node that is neither `leader` nor running (the one the test killed), to restart.
fn follower_not(leader: u64, c: &TestCluster) -> u64 {
    c.ids()
        .find(|i| *i != leader && !c.is_running(*i))
        .expect("a stopped node")
}
