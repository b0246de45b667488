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
        ("etcd", _) => "apt-get install -y etcd-server",
        ("iptables", _) => "apt-get install -y iptables",
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
    run_bounded(etcdctl_cmd(endpoints, args), stdin, ETCDCTL_LIMIT)
}

/// [`etcdctl_in`] that must succeed: its stdout.
pub fn etcdctl_in_ok(endpoints: &[String], args: &[&str], stdin: &str) -> String {
    let (ok, out, err) = etcdctl_in(endpoints, args, stdin);
    assert!(ok, "etcdctl {args:?} failed: {err}{out}");
    out
}

/// Wait (bounded) until `etcdctl lease grant` works through `endpoints`: a new cluster takes
/// etcd leases (and so the lock and election recipes) once its leader has heard that every
/// member applies the etcd rules.
pub async fn wait_leases_work(endpoints: &[String]) {
    let eps = endpoints.to_vec();
    super::wait::wait_for(
        "an etcd lease grant to succeed",
        Duration::from_secs(30),
        || {
            let eps = eps.clone();
            async move {
                let (ok, out, err) = tokio::task::spawn_blocking(move || {
                    etcdctl_in(&eps, &["lease", "grant", "5"], "")
                })
                .await
                .map_err(|e| e.to_string())?;
                if ok {
                    Ok(())
                } else {
                    Err(format!("{err}{out}"))
                }
            }
        },
    )
    .await
}

/// An `etcdctl` (API v3) command against `endpoints`, not yet started; it dies with the test.
pub fn etcdctl_cmd(endpoints: &[String], args: &[&str]) -> Command {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--dial-timeout=3s")
        .arg("--command-timeout=10s")
        .args(args);
    super::cluster::die_with_this_test(&mut cmd);
    cmd
}

/// A long-running client process whose stdout is read line by line on a thread of its own.
/// Dropping it SIGKILLs and reaps the process (a failing test leaves nothing behind).
pub struct Spawned {
    pub what: String,
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Spawned {
    /// Start `cmd` (stdout read here; stdin and stderr as `cmd` sets them, else inherited).
    pub fn start(what: &str, mut cmd: Command) -> Spawned {
        use std::io::BufRead;
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("{what}: no stdout"));
        let (tx, lines) = std::sync::mpsc::channel();
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
        Spawned {
            what: what.to_owned(),
            child,
            lines,
        }
    }

    /// The next stdout line within `limit`, or `None` (timeout or end of output).
    pub fn try_line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }

    /// The next stdout line within `limit`; panics saying what was expected.
    pub fn line(&self, limit: Duration, want: &str) -> String {
        self.try_line(limit)
            .unwrap_or_else(|| panic!("{} printed no {want} within {limit:?}", self.what))
    }

    /// Send `sig` (e.g. `libc::SIGINT`) to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid (not reaped before drop).
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Wait (bounded) for the process to exit; its status.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            assert!(
                start.elapsed() < limit,
                "{} did not exit within {limit:?}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
