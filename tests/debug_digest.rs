//! `fenced debug digest`: a stopped member's state rebuilt offline from its data dir. After a
//! 3-node cluster has run (with snapshots and log purges on the way) and stopped, every
//! member has the same digest at a common log index; an index out of range is refused.
//!
//! Run: `cargo test -p fenced-server --test debug_digest`.

#[path = "support/mod.rs"]
mod support;

use std::process::Command;
use std::time::Duration;

use support::{bin, run_bounded, TestCluster, LEADER_TIMEOUT};

const CLI: Duration = Duration::from_secs(60);

/// `fenced debug digest --data-dir DIR [--index N]`: (ok, stdout, stderr).
fn digest(dir: &std::path::Path, index: Option<u64>) -> (bool, String, String) {
    let mut cmd = Command::new(bin());
    cmd.args(["debug", "digest", "--data-dir"]).arg(dir);
    if let Some(i) = index {
        cmd.args(["--index", &i.to_string()]);
    }
    run_bounded(cmd, "", CLI)
}

fn digest_ok(dir: &std::path::Path, index: Option<u64>) -> serde_json::Value {
    let (ok, out, err) = digest(dir, index);
    assert!(ok, "fenced debug digest {index:?} failed: {err}");
    assert_eq!(out.trim().lines().count(), 1, "one JSON line: {out}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_members_agree_at_a_common_index_and_out_of_range_is_refused() {
    let c = TestCluster::start(
        "debug_digest",
        &["--snapshot-logs", "20", "--keep-logs", "5"],
    );
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client();
    for i in 0..60u64 {
        let name = format!("lock-{}", i % 7);
        let mut granted = None;
        for _ in 0..50 {
            match client
                .acquire(
                    &name,
                    "digest-test",
                    Duration::from_secs(60),
                    Duration::ZERO,
                    0,
                )
                .await
            {
                Ok(Some(g)) => {
                    granted = Some(g);
                    break;
                }
                Ok(None) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        let g = granted.unwrap_or_else(|| panic!("acquire {i} never granted"));
        if i % 2 == 0 {
            let _ = client.release(&name, "digest-test", g.token).await;
        }
    }
    let applied = c.wait_all_caught_up(leader, LEADER_TIMEOUT).await;
    for id in c.ids().collect::<Vec<_>>() {
        c.kill(id);
    }

    let ends: Vec<serde_json::Value> = c.ids().map(|id| digest_ok(&c.data_dir(id), None)).collect();
    let last = |v: &serde_json::Value| v["last_index"].as_u64().expect("last_index");
    let snap = |v: &serde_json::Value| v["snapshot_index"].as_u64().unwrap_or(0);
    let common = ends.iter().map(last).min().expect("three nodes");
    assert!(
        common >= applied,
        "every node holds what it applied: {ends:?}"
    );
    assert!(
        ends.iter().any(|v| snap(v) > 0),
        "the run built snapshots (the rebuild starts from one): {ends:?}"
    );
    let at: Vec<serde_json::Value> = c
        .ids()
        .map(|id| digest_ok(&c.data_dir(id), Some(common)))
        .collect();
    for v in &at {
        assert_eq!(v["index"].as_u64(), Some(common), "{v}");
        let d = v["digest"].as_str().expect("digest");
        assert!(
            d.len() == 16 && d.chars().all(|c| c.is_ascii_hexdigit()),
            "{v}"
        );
    }
    assert!(
        at.iter()
            .all(|v| v["digest"] == at[0]["digest"] && v["term"] == at[0]["term"]),
        "members disagree at index {common}: {at:?}"
    );

    // Out of range: past the last durable entry, and below the snapshot.
    let dir = c.data_dir(1);
    let (ok, out, err) = digest(&dir, Some(last(&ends[0]) + 1));
    assert!(!ok, "an index past the log was answered: {out}");
    assert!(err.contains("past the last durable entry"), "{err}");
    let s = snap(&ends[0]);
    if s > 0 {
        let (ok, out, err) = digest(&dir, Some(s - 1));
        assert!(!ok, "an index below the snapshot was answered: {out}");
        assert!(err.contains("below the snapshot"), "{err}");
    }
    // Nothing was written: the node starts from its data dir and serves.
    c.restart(1);
    c.restart(2);
    c.wait_for_leader(LEADER_TIMEOUT).await;
}
