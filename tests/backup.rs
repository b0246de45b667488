//! Backup, restore and recovery (`fenced snapshot save|status|restore`, `fenced serve
//! --force-new-cluster`): a backup taken under load and restored into a new cluster never
//! lets a token be issued twice — every token of the new cluster exceeds every token the old
//! one ever issued, also those granted after the backup — and bad input changes nothing.
//!
//! Run: `cargo test -p fenced-server --test backup`.

#[path = "support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fenced_client::Client;
use support::{bin, resp_cmd, resp_connect, run_bounded, within, TestCluster, LEADER_TIMEOUT};

const TTL: Duration = Duration::from_secs(60);
const CLI: Duration = Duration::from_secs(60);

/// Take and release `name` until `stop`; every token granted goes into `max`.
async fn churn(client: Client, name: String, stop: Arc<AtomicBool>, max: Arc<AtomicU64>) -> u64 {
    let mut grants = 0;
    while !stop.load(Ordering::Relaxed) && grants < 100_000 {
        match client.acquire(&name, "churn", TTL, Duration::ZERO, 0).await {
            Ok(Some(g)) => {
                max.fetch_max(g.token, Ordering::SeqCst);
                grants += 1;
                let _ = client.release(&name, "churn", g.token).await;
            }
            Ok(None) | Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    grants
}

/// Run `fenced ARGS`; returns (ok, stdout, stderr).
fn cli(args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(bin());
    cmd.args(args).env("NO_COLOR", "1");
    run_bounded(cmd, "", CLI)
}

fn cli_ok(args: &[&str]) -> serde_json::Value {
    let (ok, out, err) = cli(args);
    assert!(ok, "fenced {args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("fenced {args:?}: {e}: {out}"))
}

fn cli_refused(args: &[&str], needle: &str) {
    let (ok, out, err) = cli(args);
    assert!(!ok, "fenced {args:?} succeeded: {out}");
    assert!(
        err.contains(needle),
        "fenced {args:?}: expected {needle:?} in {err:?}"
    );
}

/// `fenced snapshot restore FILE --data-dir DIR --id ID --initial-cluster CLUSTER`.
fn restore_args<'a>(file: &'a str, dir: &'a str, id: &'a str, cluster: &'a str) -> [&'a str; 9] {
    [
        "snapshot",
        "restore",
        file,
        "--data-dir",
        dir,
        "--id",
        id,
        "--initial-cluster",
        cluster,
    ]
}

fn is_empty_or_missing(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restored_backup_never_reissues_a_token() {
    let c = TestCluster::start("backup_restore", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client();
    let eps = c.endpoints().join(",");
    let mut con = resp_connect(&c, 1).await;
    let _: () = resp_cmd(&mut con, &["SET", "before", "1"]).await;
    // A lock held across the backup (its holder never releases it).
    let held = client
        .acquire("held", "owner-before", TTL, Duration::ZERO, 0)
        .await
        .expect("acquire")
        .expect("granted");
    let fence: String = resp_cmd(
        &mut con,
        &["FENCE.SET", "fenced-key", "v", &held.token.to_string()],
    )
    .await;
    assert_eq!(fence, "OK");

    let stop = Arc::new(AtomicBool::new(false));
    let max = Arc::new(AtomicU64::new(held.token));
    let load: Vec<_> = (0..4)
        .map(|i| {
            tokio::spawn(churn(
                c.client(),
                format!("churn-{i}"),
                stop.clone(),
                max.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;

    // Saved under load, from a follower: the read barrier makes it include everything
    // acknowledged before the call.
    let file = c.dir().join("backup.snap");
    let file_s = file.to_str().expect("utf-8 path");
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = support::follower_of(leader);
    let saved = cli_ok(&[
        "snapshot",
        "save",
        file_s,
        "--endpoints",
        &c.endpoints_of(&[follower]).join(","),
    ]);
    let backup_revision = saved["revision"].as_u64().expect("revision");
    assert!(backup_revision >= held.token, "{saved}");
    assert!(
        saved["locks"].as_u64() >= Some(1),
        "the held lock is in it: {saved}"
    );
    // The same file again: refused, the file unchanged.
    cli_refused(&["snapshot", "save", file_s, "--endpoints", &eps], "exists");
    assert_eq!(
        cli_ok(&["snapshot", "status", file_s])["sha256"],
        saved["sha256"]
    );

    // Granting goes on after the backup: these tokens are not in it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let _: () = resp_cmd(&mut con, &["SET", "after", "1"]).await;
    stop.store(true, Ordering::Relaxed);
    let mut grants = 0;
    for t in load {
        grants += within("churn to stop", Duration::from_secs(30), t)
            .await
            .expect("churn task");
    }
    assert!(grants > 10, "only {grants} grants under load");
    // Every token the old cluster issued (answered or not) is at most its last revision.
    let old = c.status_ok(c.wait_for_leader(LEADER_TIMEOUT).await).await;
    let highest_ever = max.load(Ordering::SeqCst).max(old.revision);
    assert!(
        highest_ever > backup_revision,
        "no grant after the backup ({highest_ever} vs {backup_revision})"
    );

    // Destroy the cluster, restore every member from the backup.
    for id in c.ids().collect::<Vec<_>>() {
        c.kill(id);
        c.wipe(id);
    }
    let cluster = c.initial_cluster();
    // Bad input first: each refused, nothing created.
    let corrupt = c.dir().join("corrupt.snap");
    let mut bytes = std::fs::read(&file).expect("reading the backup");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&corrupt, &bytes).expect("writing the corrupt copy");
    let dir1 = c.data_dir(1);
    let dir1_s = dir1.to_str().expect("utf-8 path");
    cli_refused(
        &restore_args(corrupt.to_str().expect("utf-8"), dir1_s, "1", &cluster),
        "crc32",
    );
    assert!(is_empty_or_missing(&dir1), "a refused restore left files");
    cli_refused(
        &restore_args(file_s, dir1_s, "9", &cluster),
        "does not list --id 9",
    );
    assert!(is_empty_or_missing(&dir1), "a refused restore left files");

    let mut cluster_ids = Vec::new();
    for id in c.ids().collect::<Vec<_>>() {
        let dir = c.data_dir(id);
        let report = cli_ok(&restore_args(
            file_s,
            dir.to_str().expect("utf-8 path"),
            &id.to_string(),
            &cluster,
        ));
        assert_eq!(
            report["revision_after"].as_u64(),
            Some(backup_revision + 1_000_000_000_000),
            "{report}"
        );
        cluster_ids.push(report["cluster_id"].as_u64().expect("cluster id"));
    }
    assert!(
        cluster_ids.windows(2).all(|w| w[0] == w[1]),
        "members restored from one file disagree on the cluster id: {cluster_ids:?}"
    );
    // A member restored with another --bump-revision would issue other tokens for the same
    // command: it belongs to another cluster.
    let odd = c.dir().join("restored-with-another-bump");
    let mut args = restore_args(file_s, odd.to_str().expect("utf-8 path"), "1", &cluster).to_vec();
    args.extend(["--bump-revision", "5"]);
    let report = cli_ok(&args);
    assert_eq!(report["revision_after"].as_u64(), Some(backup_revision + 5));
    assert_ne!(
        report["cluster_id"].as_u64(),
        Some(cluster_ids[0]),
        "members restored with different bumps share a cluster id: {report}"
    );
    // A second restore into a data dir that now has state: refused, unchanged.
    cli_refused(&restore_args(file_s, dir1_s, "1", &cluster), "not empty");

    for id in c.ids().collect::<Vec<_>>() {
        c.restart(id);
    }
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let status = c.status_ok(leader).await;
    assert_ne!(
        status.cluster_id, old.cluster_id,
        "a restore makes a new cluster"
    );

    // Every new token is above every token ever issued; the lock held at the backup is free.
    let client = c.client();
    for name in ["held", "churn-0", "churn-1", "new-lock"] {
        let g = client
            .acquire(name, "owner-after", TTL, Duration::ZERO, 0)
            .await
            .expect("acquire after the restore")
            .unwrap_or_else(|| panic!("{name} is not free after the restore"));
        assert!(
            g.token > highest_ever,
            "{name}: token {} issued again (the old cluster reached {highest_ever})",
            g.token
        );
    }
    // The keyspace is the backup's: what was written before it, not after; fence marks kept.
    let mut con = resp_connect(&c, leader).await;
    let before: Option<String> = resp_cmd(&mut con, &["GET", "before"]).await;
    let after: Option<String> = resp_cmd(&mut con, &["GET", "after"]).await;
    assert_eq!((before.as_deref(), after.as_deref()), (Some("1"), None));
    let stale = redis::cmd("FENCE.SET")
        .arg("fenced-key")
        .arg("old")
        .arg(held.token - 1)
        .query_async::<String>(&mut con)
        .await;
    assert!(
        stale.is_err_and(|e| e.to_string().contains("STALE")),
        "a token below the backup's fence mark was accepted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_new_cluster_recovers_a_lost_quorum_without_reissuing_tokens() {
    let c = TestCluster::start("backup_force", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let stop = Arc::new(AtomicBool::new(false));
    let max = Arc::new(AtomicU64::new(0));
    let load: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(churn(
                c.client(),
                format!("lock-{i}"),
                stop.clone(),
                max.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut con = resp_connect(&c, leader).await;
    let _: () = resp_cmd(&mut con, &["SET", "k", "v"]).await;
    let survivor = support::follower_of(leader);
    c.wait_all_caught_up(leader, Duration::from_secs(30)).await;
    // The survivor falls behind (paused) while the other two go on granting; then the quorum
    // is lost for good: those two die. The survivor lacks grants clients were given, and only
    // the revision bump keeps their tokens from being issued again.
    c.pause(survivor, true);
    let paused_at = max.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for id in c.ids().filter(|id| *id != survivor).collect::<Vec<_>>() {
        c.kill(id);
    }
    c.pause(survivor, false);
    assert!(
        max.load(Ordering::SeqCst) > paused_at,
        "no grant while the survivor was paused"
    );
    stop.store(true, Ordering::Relaxed);
    for t in load {
        within("churn to stop", Duration::from_secs(60), t)
            .await
            .expect("churn task");
    }
    let highest_seen = max.load(Ordering::SeqCst);
    assert!(highest_seen > 0, "no grant before the quorum was lost");

    c.kill(survivor);
    c.restart_with(survivor, &["--force-new-cluster"]);
    let client = c.client_of(survivor);
    let g = within(
        "the recovered one-node cluster to grant",
        LEADER_TIMEOUT * 2,
        client.acquire("lock-0", "after", TTL, Duration::from_secs(10), 0),
    )
    .await
    .expect("acquire after --force-new-cluster")
    .expect("lock-0 free after the recovery");
    assert!(
        g.token > highest_seen,
        "token {} issued again after --force-new-cluster (clients saw up to {highest_seen})",
        g.token
    );
    let status = c.status_ok(survivor).await;
    assert_eq!(status.members.len(), 1, "{status:?}");
    assert_eq!(status.leader, survivor);
    // The survivor's acknowledged data is there.
    let mut con = resp_connect(&c, survivor).await;
    let v: Option<String> = resp_cmd(&mut con, &["GET", "k"]).await;
    assert_eq!(v.as_deref(), Some("v"));
    // The old data dir is kept beside the new one.
    let aside = std::fs::read_dir(c.dir())
        .expect("listing the temp dir")
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("node-{survivor}.before-force-new-cluster-"))
        });
    assert!(aside, "the old data dir was not kept");

    // A restart that keeps the flag changes nothing.
    c.kill(survivor);
    c.restart_with(survivor, &["--force-new-cluster"]);
    let g2 = within(
        "the restarted one-node cluster to grant",
        LEADER_TIMEOUT * 2,
        c.client_of(survivor)
            .acquire("lock-1", "after", TTL, Duration::from_secs(10), 0),
    )
    .await
    .expect("acquire after a restart")
    .expect("lock-1 free");
    assert!(g2.token > g.token);
    assert_eq!(c.status_ok(survivor).await.cluster_id, status.cluster_id);
}
