//! Issue 49, item 2: a poisoned log can be recovered. A 3-node cluster whose members
//! advertise the apply rules of before `Semantics::BOUNDED` (the test-only flag
//! `--unsafe-test-advertise-semantics 6`, accepted only with `FENCED_UNSAFE_TEST_HOOKS=1`)
//! commits an `EVAL` of a backtracking pattern, whose apply under those rules does not end on
//! any replica: a poisoned entry. Every node then answers `/health` unhealthy, naming the
//! stuck index and for how long, logs it every few seconds, and exits on SIGTERM within its
//! grace period; `fenced debug quarantine` on every stopped data dir turns the entry into a
//! no-op, and the restarted cluster serves again with the data written before it, takes
//! writes, and every replica holds the same state.
//!
//! Run: `cargo test -p fenced-server --test poison_recovery`.

#[path = "support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{bin, resp_connect, resp_try, run_bounded, wait_for, TestCluster, LEADER_TIMEOUT};

const METRICS_PORT: u16 = 9193;
/// `Semantics::ELECTIONS`: the newest rules before scripts' work was bounded.
const UNBOUNDED: u32 = 6;
/// The script: exponential backtracking in `string.find`, unbounded under rules 6.
const POISON: &str =
    "local s=string.rep('a',3000) return tostring(s:find(string.rep('a*',30)..'b'))";
/// The node's grace period after SIGTERM is 10 s; this leaves room for a loaded machine.
const EXITS_WITHIN: Duration = Duration::from_secs(25);
const STEP: Duration = Duration::from_secs(60);
const CLI: Duration = Duration::from_secs(60);

fn enable_test_hooks() {
    std::env::set_var("FENCED_UNSAFE_TEST_HOOKS", "1");
}

fn start(test: &str) -> TestCluster {
    enable_test_hooks();
    let metrics = format!("{{ip}}:{METRICS_PORT}");
    TestCluster::start(
        test,
        &[
            "--unsafe-test-advertise-semantics",
            &UNBOUNDED.to_string(),
            "--metrics-addr",
            &metrics,
        ],
    )
}

/// `GET path` on node `id`'s metrics listener, bounded (a node may not answer at all).
async fn http_get(c: &TestCluster, id: u64, path: &str) -> Result<(u16, String), String> {
    match tokio::time::timeout(
        Duration::from_secs(3),
        support::http_get(&c.ip(id), METRICS_PORT, path),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(format!("node {id}: no answer to GET {path} within 3 s")),
    }
}

/// Write `before` = 1, then commit the poisoned `EVAL` through the leader (its client waits
/// in a task of its own, for good). Returns the leader.
async fn plant_poison(c: &TestCluster) -> u64 {
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    wait_for("the leader stamping rules 6", LEADER_TIMEOUT, || async {
        let s = c.status_ok(leader).await;
        if s.semantics == UNBOUNDED {
            Ok(())
        } else {
            Err(format!("stamps {}", s.semantics))
        }
    })
    .await;
    assert_eq!(
        resp_try(c, leader, &["SET", "before", "1"]).await,
        Ok(Some("OK".into()))
    );
    c.wait_all_caught_up(leader, STEP).await;
    let mut con = resp_connect(c, leader).await;
    tokio::spawn(async move {
        let mut eval = redis::cmd("EVAL");
        eval.arg(POISON).arg(0);
        let _ = eval.query_async::<redis::Value>(&mut con).await;
    });
    leader
}

/// SIGTERM every node; each must exit within [`EXITS_WITHIN`].
async fn terminate_all(c: &TestCluster) {
    for id in c.ids() {
        let started = Instant::now();
        let status = c.terminate(id, EXITS_WITHIN).await;
        eprintln!(
            "node {id} exited {:?} after SIGTERM: {status}",
            started.elapsed()
        );
    }
}

fn cli(args: &[&str], dir: &std::path::Path) -> (bool, String, String) {
    let mut cmd = Command::new(bin());
    cmd.args(args).arg("--data-dir").arg(dir);
    run_bounded(cmd, "", CLI)
}

fn json(out: &str) -> serde_json::Value {
    assert_eq!(out.trim().lines().count(), 1, "one JSON line: {out}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `/health`'s body if node `id` reports a stuck apply.
async fn stuck_on(c: &TestCluster, id: u64) -> Result<String, String> {
    let (code, body) = http_get(c, id, "/health").await?;
    if code == 503 && body.contains("apply stuck") {
        Ok(body)
    } else {
        Err(format!("node {id}: {code}: {body}"))
    }
}

/// The index `/health`'s "log entry N has been applying" names.
fn stuck_index(body: &str) -> Option<u64> {
    let rest = body.split("log entry ").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stuck_in_apply_exits_on_sigterm() {
    let c = start("poison_sigterm");
    plant_poison(&c).await;
    // Long enough for every replica to be inside the entry's apply.
    tokio::time::sleep(Duration::from_secs(6)).await;
    terminate_all(&c).await;
    // The leader applies the entry once committed; a follower may not have learnt that yet
    // when the leader's runtime stopped (it then shuts down cleanly).
    let logs: Vec<String> = c.ids().map(|id| c.log_tail(id, 100)).collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("SIGTERM") && l.contains("did not finish within 10 s")),
        "a stuck node logs why it exits: {logs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_entry_is_reported_and_quarantined_and_the_cluster_serves_again() {
    let c = start("poison_recovery");
    plant_poison(&c).await;

    // The nodes applying the entry say they are stuck, and on which entry (all name the
    // same one): the leader at least, and every follower that learnt the entry committed
    // before the leader stopped answering (one that did not only lacks a leader).
    wait_for(
        "a node's /health to report the stuck apply",
        STEP,
        || async {
            for id in c.ids() {
                if let Ok(body) = stuck_on(&c, id).await {
                    return Ok(body);
                }
            }
            Err("none yet".to_string())
        },
    )
    .await;
    // Time for the others to get there too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut stuck = Vec::new();
    for id in c.ids() {
        let Ok(body) = stuck_on(&c, id).await else {
            continue;
        };
        eprintln!("node {id} /health: {}", body.trim());
        let index = stuck_index(&body).unwrap_or_else(|| panic!("no index in {body:?}"));
        assert!(body.contains(" s "), "and for how long: {body}");
        let (code, ready) = http_get(&c, id, "/ready").await.expect("/ready answers");
        assert_eq!(code, 503, "{ready}");
        assert!(ready.contains("apply stuck"), "{ready}");
        // ... and logs it.
        wait_for(&format!("node {id}'s log line"), STEP, || async {
            let log = c.log_tail(id, 200);
            if log.contains(&format!("apply stuck: log entry {index} has been applying")) {
                Ok(())
            } else {
                Err(log)
            }
        })
        .await;
        stuck.push(index);
    }
    let index = stuck[0];
    assert!(stuck.iter().all(|i| *i == index), "{stuck:?}");

    // SIGTERM stops them (past the grace period, the hung apply is left behind).
    terminate_all(&c).await;

    // Quarantine it on every stopped data dir: a member whose log does not hold it yet
    // quarantines it all the same, for when it arrives.
    let mut holders = 0;
    for id in c.ids() {
        let dir = c.data_dir(id);
        let (ok, out, err) = cli(
            &["debug", "quarantine", "--index", &index.to_string()],
            &dir,
        );
        assert!(ok, "fenced debug quarantine on node {id}: {err}");
        let v = json(&out);
        eprintln!("node {id}: {v}");
        assert_eq!(v["index"].as_u64(), Some(index), "{v}");
        assert_eq!(v["quarantined"], serde_json::json!([index]), "{v}");
        if v["entry"].is_null() {
            continue;
        }
        holders += 1;
        assert_eq!(
            v["entry"]["semantics"].as_u64(),
            Some(u64::from(UNBOUNDED)),
            "{v}"
        );
        assert!(
            v["entry"]["commands"]
                .as_array()
                .is_some_and(|a| a.iter().any(|k| k == "kv")),
            "the entry holds the EVAL: {v}"
        );
    }
    assert!(holders >= 2, "a committed entry is on a majority");
    // Refused: entry 1 is the first leader's blank entry (or membership), not a batch.
    let (ok, _, err) = cli(&["debug", "quarantine", "--index", "1"], &c.data_dir(1));
    assert!(!ok && !err.is_empty(), "index 1 refused: {err}");

    // The same flags (rules 6 still advertised): the quarantine, not a newer binary, is
    // what gets the replicas past the entry, which is stamped with rules 6 forever.
    for id in c.ids() {
        c.restart(id);
    }
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    for id in c.ids() {
        wait_for(&format!("node {id} healthy"), STEP, || async {
            match http_get(&c, id, "/health").await? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code}: {body}")),
            }
        })
        .await;
        wait_for(
            &format!("node {id} to apply the entry as quarantined"),
            STEP,
            || async {
                let log = c.log_tail(id, 400);
                if log.contains(&format!("log entry {index} quarantined by the operator")) {
                    Ok(())
                } else {
                    Err(log)
                }
            },
        )
        .await;
    }
    assert_eq!(
        resp_try(&c, leader, &["GET", "before"]).await,
        Ok(Some("1".into()))
    );
    assert_eq!(
        resp_try(&c, leader, &["SET", "after", "2"]).await,
        Ok(Some("OK".into()))
    );
    let applied = c.wait_all_caught_up(leader, STEP).await;
    assert!(applied > index);
    for id in c.ids() {
        assert_eq!(
            resp_try(&c, id, &["GET", "after"]).await,
            Ok(Some("2".into()))
        );
    }

    // Every replica holds the same state: digests of the stopped data dirs at one index.
    terminate_all(&c).await;
    let ends: Vec<serde_json::Value> = c
        .ids()
        .map(|id| {
            let (ok, out, err) = cli(&["debug", "digest"], &c.data_dir(id));
            assert!(ok, "fenced debug digest on node {id}: {err}");
            json(&out)
        })
        .collect();
    let common = ends
        .iter()
        .filter_map(|v| v["last_index"].as_u64())
        .min()
        .expect("three nodes");
    assert!(common >= applied, "{ends:?}");
    let at: Vec<serde_json::Value> = c
        .ids()
        .map(|id| {
            let (ok, out, err) = cli(
                &["debug", "digest", "--index", &common.to_string()],
                &c.data_dir(id),
            );
            assert!(
                ok,
                "fenced debug digest --index {common} on node {id}: {err}"
            );
            json(&out)
        })
        .collect();
    assert!(
        at.iter().all(|v| v["digest"] == at[0]["digest"]),
        "members disagree at index {common}: {at:?}"
    );
}
