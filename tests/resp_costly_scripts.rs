//! Issue 49, defect 1, on a 3-node cluster of real `fenced` processes: an `EVAL` whose work is
//! Lua's pattern matching (which ran inside one C call, out of the instruction budget's reach,
//! on every replica, for hours) sent by a user allowed only its own keys, to a follower, ends
//! with the budget's `BUSY` error; every node then answers `PING` within a second, and the
//! cluster goes on committing writes that every replica applies.

mod support;

use std::time::{Duration, Instant};

use support::{
    follower_of, resp_cmd as cmd, resp_connect_with, within, TestCluster, LEADER_TIMEOUT,
};

/// `Semantics::BOUNDED`: every script's work bounded.
const BOUNDED: u32 = 7;

const ACL_FILE: &str = "\
user default off
user admin on >adminpw allkeys allchannels +@all
user bob on >bobpw ~lock:b* -@all +@connection +eval +get +set
";

/// The two scripts: exponential backtracking in `string.find`.
const PATTERNS: &[&str] = &[
    "local s=string.rep('a',3000) return tostring(s:find(string.rep('a*',30)..'b'))",
    "local s=string.rep('a',20000) return tostring(s:find(('.-'):rep(6)..'b'))",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_scripts_stop_and_every_node_keeps_answering() {
    let c = TestCluster::start_with("resp_costly_scripts", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, ACL_FILE).expect("writing the ACL file");
        (vec!["--acl-file".into(), path.display().to_string()], None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    // Until the leader has heard which rules every member runs (its first check round), it
    // stamps older ones, under which these scripts still run unbounded (docs/operations.md,
    // "Scripts").
    c.wait_for_stamp(leader, BOUNDED).await;
    let follower = follower_of(leader);
    let mut bob = resp_connect_with(&c, follower, Some(("bob", "bobpw"))).await;
    for (i, script) in PATTERNS.iter().enumerate() {
        let started = Instant::now();
        let mut eval = redis::cmd("EVAL");
        eval.arg(*script).arg(0);
        let reply = within(
            &format!("EVAL of pattern script {i}"),
            Duration::from_secs(60),
            eval.query_async::<String>(&mut bob),
        )
        .await;
        let err = match reply {
            Err(e) => e.to_string(),
            Ok(v) => panic!("pattern script {i} returned {v:?} instead of stopping"),
        };
        assert!(
            err.contains("BUSY") && err.contains("budget"),
            "pattern script {i}: {err}"
        );
        eprintln!(
            "pattern script {i} stopped after {:?}: {err}",
            started.elapsed()
        );
        // Every node answers at once: no replica is still running the script.
        for id in c.ids() {
            let mut con = resp_connect_with(&c, id, Some(("admin", "adminpw"))).await;
            let pong = within(
                &format!("PING node {id} after pattern script {i}"),
                Duration::from_secs(1),
                redis::cmd("PING").query_async::<String>(&mut con),
            )
            .await
            .unwrap_or_else(|e| panic!("PING node {id}: {e}"));
            assert_eq!(pong, "PONG");
        }
    }
    // Writes go on, and reach every replica.
    let _: () = cmd(&mut bob, &["SET", "lock:b1", "after"]).await;
    for id in c.ids() {
        let mut con = resp_connect_with(&c, id, Some(("admin", "adminpw"))).await;
        let got: String = cmd(&mut con, &["GET", "lock:b1"]).await;
        assert_eq!(got, "after", "node {id}");
    }
    c.assert_alive();
}
