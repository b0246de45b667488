//! The Python package `clients/python` (`import fenced`) against a 3-node cluster of real
//! `fenced` processes: this test starts the cluster and runs the package's pytest suite
//! (`clients/python/tests`) with `PYTHONPATH=clients/python`, so nothing is installed.
//!
//! pytest learns the cluster from the environment: `FENCED_RESP_ADDRS` (`1=ip:port,2=…`) and
//! `FENCED_NODE_PIDS` (`1=pid,2=…`), with which its failover test SIGKILLs the leader it
//! finds through `INFO`. A missing python3, redis-py or pytest fails the test with the
//! install command (`scripts/test.sh` installs them); it never passes by skipping.
//! `FENCED_PYTEST_ARGS` replaces the selection (default `clients/python/tests`), e.g.
//! `FENCED_PYTEST_ARGS="clients/python/tests -k session"`.

mod support;

use std::fs::File;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{die_with_this_test, require, TestCluster, LEADER_TIMEOUT};

/// The whole pytest run; the suite itself aims at well under a minute.
const PYTEST_LIMIT: Duration = Duration::from_secs(180);

fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Run pytest in a process group of its own with stdout/stderr in files (so a run that
/// overstays is killed with everything it started, and its output still shown).
fn run_pytest(c: &TestCluster, args: &[&str], env: &[(&str, String)]) -> (bool, String) {
    let out_path = c.dir().join("pytest.out");
    let out = File::create(&out_path).expect("pytest output file");
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pytest"])
        .args(args)
        .current_dir(repo_root())
        .env("PYTHONPATH", repo_root().join("clients/python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("output handle"))
        .stderr(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    die_with_this_test(&mut cmd);
    let mut child = cmd.spawn().expect("spawning python3 -m pytest");
    let start = Instant::now();
    let status = loop {
        match child.try_wait().expect("waiting for pytest") {
            Some(s) => break Some(s),
            None if start.elapsed() < PYTEST_LIMIT => {
                std::thread::sleep(Duration::from_millis(100))
            }
            None => {
                // SAFETY: kill(2) on the process group of our own child.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
        }
    };
    // Whatever pytest started (a paused holder subprocess) goes with it.
    // SAFETY: as above; ESRCH if the group is already empty.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    match status {
        Some(s) => (s.success(), text),
        None => (
            false,
            format!("pytest ran longer than {PYTEST_LIMIT:?}; output:\n{text}"),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_package_suite() {
    require("python3", &["-c", "import redis"]);
    require("python3", &["-c", "import pytest"]);
    let c = TestCluster::start("python_client", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let addrs: Vec<String> = c
        .ids()
        .map(|id| format!("{id}={}", c.resp_addr(id)))
        .collect();
    let pids: Vec<String> = c
        .ids()
        .map(|id| format!("{id}={}", c.pid(id).expect("node running")))
        .collect();
    // FENCED_PYTEST_ARGS (split on spaces) replaces the test selection, e.g. `-k session`.
    let selection =
        std::env::var("FENCED_PYTEST_ARGS").unwrap_or_else(|_| "clients/python/tests".into());
    let mut args = vec!["-q", "--tb=short", "-p", "no:cacheprovider"];
    args.extend(selection.split_whitespace());
    let (ok, out) = tokio::task::block_in_place(|| {
        run_pytest(
            &c,
            &args,
            &[
                ("FENCED_RESP_ADDRS", addrs.join(",")),
                ("FENCED_NODE_PIDS", pids.join(",")),
            ],
        )
    });
    assert!(ok, "the Python package's pytest suite failed:\n{out}");
    assert!(out.contains(" passed"), "{out}");
    assert!(!out.contains("skipped"), "no test may skip:\n{out}");
    println!("{out}");
}
