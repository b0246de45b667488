//! An unchanged etcd client library — npm's `etcd3` (microsoft/etcd3 1.1.2, on
//! `@grpc/grpc-js`) — against fenced's etcd API on a real 3-node cluster: KV and Txn, then a
//! watch that must see every key created under its prefix once, in order, while every member
//! in turn (the leader first) is SIGKILLed and restarted. The client's script is
//! `tests/etcd-client/driver.js`.
//!
//! Run: `cargo test -p fenced-server --test etcd_client` (needs Node.js and the library:
//! `apt-get install -y nodejs npm && (cd tests/etcd-client && npm ci)`; scripts/test.sh does
//! both).

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{require, TestCluster, LEADER_TIMEOUT};

/// Bound for each step the script reports.
const STEP: Duration = Duration::from_secs(90);
/// How long writes go on around each kill.
const AROUND_KILL: Duration = Duration::from_millis(1_500);

fn client_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/etcd-client")
}

/// Kills the child on drop.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The next stdout line within `limit`.
fn line(lines: &mpsc::Receiver<String>, limit: Duration, want: &str) -> String {
    lines
        .recv_timeout(limit)
        .unwrap_or_else(|e| panic!("the etcd3 script printed no `{want}` within {limit:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_npm_etcd3_client_runs_kv_txn_and_a_watch_that_resumes_through_sigkills() {
    require("node", &["--version"]);
    let dir = client_dir();
    assert!(
        dir.join("node_modules/etcd3").is_dir(),
        "the etcd3 library is not installed: run `(cd tests/etcd-client && npm ci)` \
         (scripts/test.sh does)"
    );
    let c = TestCluster::start("etcd-client", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let all: Vec<u64> = c.ids().collect();
    let hosts: Vec<String> = c
        .endpoints()
        .iter()
        .map(|e| format!("http://{e}"))
        .collect();

    let mut cmd = Command::new("node");
    cmd.current_dir(&dir)
        .arg("driver.js")
        .arg(hosts.join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    support::die_with_this_test(&mut cmd);
    let mut child = Reaped(cmd.spawn().unwrap_or_else(|e| panic!("spawning node: {e}")));
    let mut stdin = child.0.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let stdout = child.0.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(l).is_err() {
                return;
            }
        }
    });

    assert_eq!(line(&lines, STEP, "kv ok"), "kv ok");
    assert_eq!(line(&lines, STEP, "watching"), "watching");

    // Every member in turn, the leader first, is SIGKILLed while the script writes, then
    // restarted: whichever member the watch stream was on, it was cut at least once.
    let mut order = vec![leader];
    order.extend(all.iter().copied().filter(|i| *i != leader));
    for victim in order {
        tokio::time::sleep(AROUND_KILL).await;
        c.kill(victim);
        tokio::time::sleep(AROUND_KILL).await;
        c.restart(victim);
        c.wait_for_leader(LEADER_TIMEOUT).await;
    }
    tokio::time::sleep(AROUND_KILL).await;
    writeln!(stdin, "stop").unwrap_or_else(|e| panic!("telling the script to stop: {e}"));

    let result = line(&lines, STEP, "the result");
    let v: Value =
        serde_json::from_str(&result).unwrap_or_else(|e| panic!("not JSON ({e}): {result}"));
    let written = v["written"]
        .as_u64()
        .unwrap_or_else(|| panic!("no count: {v}"));
    let seen: Vec<String> = v["seen"]
        .as_array()
        .unwrap_or_else(|| panic!("no values: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap_or("?").to_owned())
        .collect();
    let want: Vec<String> = (0..=written).map(|n| n.to_string()).collect();
    assert!(written >= 5, "too few writes to mean anything: {v}");
    assert_eq!(
        seen, want,
        "the watch must see every key once, in order, across the kills"
    );
    let reconnects = v["reconnects"].as_u64().unwrap_or(0);
    eprintln!("etcd3: {written} keys written and seen, the watch reconnected {reconnects} times");
    assert!(
        reconnects >= 1,
        "the watch stream was never cut, so nothing was resumed: {v}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.0.try_wait() {
            assert!(status.success(), "the script failed: {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the script did not exit");
}
