//! Outside programs: requiring them, and running them with a time limit.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Fail the test unless an outside program works (`bin probe...` succeeds): a missing
/// client must never turn a test into a silent pass. `scripts/test.sh` (the README's test
/// command) installs all of them.
pub fn require(bin: &str, probe: &[&str]) {
    let ok = Command::new(bin)
        .args(probe)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let install = match (bin, probe) {
        ("python3", p) if p.join(" ").contains("pytest") => {
            "apt-get install -y python3-pytest python3-redis (or: python3 -m pip install pytest redis)"
        }
        ("python3", _) => "apt-get install -y python3-redis (or: python3 -m pip install redis)",
        ("redis-cli", _) => "apt-get install -y redis-tools",
        ("redis-server", _) => "apt-get install -y redis-server",
        ("etcdctl", _) => "apt-get install -y etcd-client",
        ("node", _) => "apt-get install -y nodejs npm && (cd tests/etcd-client && npm ci)",
        _ => "see scripts/test.sh",
    };
    assert!(
        ok,
        "`{bin} {}` failed: this test needs it. Install it with `{install}`, or run the \
         tests with scripts/test.sh, which installs what they need",
        probe.join(" ")
    );
}

/// Run a program with a hard time limit; returns (status ok, stdout, stderr).
pub fn run_bounded(mut cmd: Command, stdin: &str, limit: Duration) -> (bool, String, String) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning a client");
    if let Some(mut i) = child.stdin.take() {
        let _ = i.write_all(stdin.as_bytes());
    }
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("client ran longer than {limit:?}");
            }
        }
    }
    let out = child.wait_with_output().expect("client output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Bound of one `etcdctl` run (its own command timeout is shorter).
pub const ETCDCTL_LIMIT: Duration = Duration::from_secs(30);

/// `etcdctl` (API v3) against `endpoints` with `stdin`: (success, stdout, stderr), bounded by
/// [`ETCDCTL_LIMIT`]; the process dies with the test.
pub fn etcdctl_in(endpoints: &[String], args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--dial-timeout=3s")
        .arg("--command-timeout=10s")
        .args(args);
    super::cluster::die_with_this_test(&mut cmd);
    run_bounded(cmd, stdin, ETCDCTL_LIMIT)
}

/// [`etcdctl_in`] that must succeed: its stdout.
pub fn etcdctl_in_ok(endpoints: &[String], args: &[&str], stdin: &str) -> String {
    let (ok, out, err) = etcdctl_in(endpoints, args, stdin);
    assert!(ok, "etcdctl {args:?} failed: {err}{out}");
    out
}
