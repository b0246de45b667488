//! npm `etcd3`'s client-side recipes — `client.lock(name)` (a try-lock: a create-only key
//! under a fresh lease) and `client.election(name)` (campaign, observe, proclaim, resign) —
//! unchanged against a 3-node fenced cluster through a SIGKILL of the fenced leader and a
//! partition that cuts the fenced leader off from the other members. The script is
//! `tests/etcd-client/recipes.js`.
//!
//! These recipes build their lock from keys in the keyspace: a different lock from fenced's
//! own server-side lock table. Don't use both on one name.
//!
//! Run: `cargo test -p fenced-server --test etcd3_recipes` (needs Node.js and the library:
//! `apt-get install -y nodejs npm && (cd tests/etcd-client && npm ci)`, etcdctl, and for the
//! partition root and iptables; scripts/test.sh installs them).

#[path = "support/mod.rs"]
mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{
    check_one_holder_at_a_time, ends, require, wait_leases_work, wait_sections, Spawned,
    TestCluster, LEADER_TIMEOUT,
};

fn client_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/etcd-client")
}

/// `node recipes.js ARGS…` with a piped stdin.
fn script(what: &str, args: &[&str]) -> (Spawned, std::process::ChildStdin) {
    require("node", &["--version"]);
    let dir = client_dir();
    assert!(
        dir.join("node_modules/etcd3").is_dir(),
        "the etcd3 library is not installed: run `(cd tests/etcd-client && npm ci)` \
         (scripts/test.sh does)"
    );
    let mut cmd = Command::new("node");
    cmd.current_dir(&dir)
        .arg("recipes.js")
        .args(args)
        .stdin(Stdio::piped());
    support::die_with_this_test(&mut cmd);
    let mut s = Spawned::start(what, cmd);
    let stdin = s.child.stdin.take().expect("the script's stdin");
    (s, stdin)
}

fn hosts(c: &TestCluster) -> String {
    c.endpoints()
        .iter()
        .map(|e| format!("http://{e}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd3_lock_keeps_one_holder_through_a_leader_sigkill_and_a_partition() {
    let c = TestCluster::start("etcd3-lock", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    wait_leases_work(&c.endpoints()).await;
    let log = c.dir().join("holders.log");
    let hosts = hosts(&c);
    let mut workers = Vec::new();
    for w in 0..3 {
        let (s, stdin) = script(
            &format!("etcd3 lock worker {w}"),
            &["lock", &hosts, &w.to_string(), &log.display().to_string()],
        );
        assert_eq!(s.line(Duration::from_secs(30), "ready"), "ready");
        workers.push((s, stdin));
    }

    wait_sections(&log, 3, "three critical sections before any fault").await;
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

    let before = ends(&log);
    let cut = c.partition(&[leader]);
    c.wait_for_leader_other_than(leader, LEADER_TIMEOUT).await;
    wait_sections(
        &log,
        before + 3,
        "three critical sections with the leader cut off",
    )
    .await;
    cut.heal();
    let before = ends(&log);
    wait_sections(&log, before + 3, "three critical sections after the heal").await;

    let mut held_by_all = 0;
    for (w, (s, mut stdin)) in workers.into_iter().enumerate() {
        writeln!(stdin, "stop").expect("telling a worker to stop");
        let counts = s.line(Duration::from_secs(30), "the worker's counts");
        let v: serde_json::Value = serde_json::from_str(&counts)
            .unwrap_or_else(|e| panic!("worker {w}: not JSON ({e}): {counts}"));
        eprintln!("etcd3 lock worker {w}: {v}");
        held_by_all += v["held"].as_u64().unwrap_or(0);
    }
    let (sections, last_rev) = check_one_holder_at_a_time(&log);
    eprintln!(
        "etcd3 lock: {sections} critical sections, one holder at a time, last revision {last_rev}"
    );
    assert!(sections >= 12, "too few critical sections: {sections}");
    assert_eq!(
        held_by_all as usize, sections,
        "the workers' counts and the log disagree"
    );
}

/// Reads the election script's lines: `observed V` values go to `observed` (repeats
/// merged), the rest are returned one by one.
struct ElectLines {
    s: Spawned,
    observed: Vec<String>,
}

impl ElectLines {
    /// The next line that is not an observation, within `limit` (`None` on timeout).
    fn next(&mut self, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self.s.try_line(left)?;
            match l.strip_prefix("observed ") {
                Some(v) => {
                    if self.observed.last().map(String::as_str) != Some(v) {
                        self.observed.push(v.to_owned());
                    }
                }
                None => return Some(l),
            }
        }
    }

    fn expect(&mut self, want: &str, limit: Duration) {
        match self.next(limit) {
            Some(l) if l == want => {}
            other => panic!("the election script: wanted `{want}`, got {other:?}"),
        }
    }

    /// No line but observations for `d`.
    fn quiet(&mut self, d: Duration, why: &str) {
        if let Some(l) = self.next(d) {
            panic!("{why}: the election script printed `{l}`");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd3_election_hands_over_in_order_through_a_leader_sigkill_and_a_partition() {
    let c = TestCluster::start("etcd3-elect", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    wait_leases_work(&c.endpoints()).await;
    let step = Duration::from_secs(30);
    let (s, mut stdin) = script("etcd3 election", &["elect", &hosts(&c)]);
    let mut e = ElectLines {
        s,
        observed: Vec::new(),
    };
    e.expect("elected alpha", step);
    e.expect("ready", step);

    // The fenced leader's SIGKILL changes nothing for the election.
    c.kill(leader);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    c.restart(
        c.ids()
            .find(|i| !c.is_running(*i))
            .expect("the killed node"),
    );
    e.quiet(
        Duration::from_secs(2),
        "nothing may change after the SIGKILL",
    );

    // alpha resigns: beta, the next candidate, is elected (gamma waits).
    writeln!(stdin, "resign alpha").expect("stdin");
    e.expect("done resign alpha", step);
    e.expect("elected beta", step);
    e.quiet(Duration::from_millis(500), "two leaders");

    // With the fenced leader cut off, beta's lease is revoked (as when its owner dies):
    // gamma is elected — at once if its watch is on the majority side, at the heal if it was
    // on the node cut off (a watch there sees nothing new until then, with etcd too). The
    // partition stays shorter than the candidates' lease TTL (15 s): a candidate whose
    // keep-alives go to the node cut off is not renewed meanwhile (they need the majority),
    // so a longer partition would rightly cost gamma its lease.
    let cut = c.partition(&[leader]);
    c.wait_for_leader_other_than(leader, LEADER_TIMEOUT).await;
    writeln!(stdin, "revoke beta").expect("stdin");
    e.expect("done revoke beta", step);
    let during = e.next(Duration::from_secs(5));
    cut.heal();
    match during {
        Some(l) => assert_eq!(l, "elected gamma"),
        None => {
            eprintln!("etcd3 election: gamma was elected only after the heal");
            e.expect("elected gamma", step);
        }
    }

    // The observer reports gamma (at the heal at the latest, if its watch was on the node
    // cut off) before gamma proclaims a new value: it reports the leader's current value, so
    // a change made while it lags behind may be folded into the next.
    let deadline = Instant::now() + step;
    while e.observed.last().map(String::as_str) != Some("gamma") && Instant::now() < deadline {
        e.quiet(Duration::from_millis(200), "waiting for the observer");
    }
    writeln!(stdin, "proclaim gamma omega").expect("stdin");
    e.expect("done proclaim gamma", step);
    let deadline = Instant::now() + step;
    while e.observed.last().map(String::as_str) != Some("omega") && Instant::now() < deadline {
        e.next(Duration::from_millis(200));
    }
    writeln!(stdin, "stop").expect("stdin");
    assert_eq!(
        e.observed,
        ["alpha", "beta", "gamma", "omega"],
        "the observer's leaders, in order"
    );
    let status = e.s.wait_exit(step);
    assert!(status.success(), "the election script failed: {status}");
}
