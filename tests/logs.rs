//! `fenced serve`'s log lines: `--log-format json` writes one JSON object per line, and the
//! default text format writes no colour codes when stderr is not a terminal (here: a file).
//! One single-node `fenced serve` per test, on a loopback address of its own
//! ([`support::free_net`]), with its own data dir; stdout and stderr go to one file.

mod support;

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Bound for the node to start and log that it serves, and for it to stop on SIGTERM.
const TIMEOUT: Duration = Duration::from_secs(20);
/// The line `fenced serve` logs once it serves.
const SERVING: &str = "fenced node serving";

/// One `fenced serve`; dropping it SIGKILLs and reaps the process (and, on a failed test,
/// prints its log) before the temp dir goes.
struct Node {
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Node {
    /// Start a single-node `fenced serve` with `args`, `FENCED_LOG` set to `filter` and
    /// `NO_COLOR` unset, so that only whether stderr is a terminal decides colour.
    fn start(test: &str, args: &[&str], filter: &str) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("node.log");
        let out = File::create(&log).expect("creating the log file");
        let ip = format!("{}.1", support::free_net(test));
        let mut cmd = Command::new(support::bin());
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--grpc-addr")
            .arg(format!("{ip}:{}", support::GRPC_PORT))
            .arg("--resp-addr")
            .arg(format!("{ip}:{}", support::RESP_PORT))
            .args(args)
            .env("FENCED_LOG", filter)
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out);
        support::die_with_this_test(&mut cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", support::bin()));
        Node {
            child: Some(child),
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        let bytes = std::fs::read(&self.log).expect("reading the log file");
        String::from_utf8(bytes).expect("the log is UTF-8")
    }

    /// Wait until the log holds `needle`, for at most [`TIMEOUT`]; panics if the process
    /// exits first or the time runs out.
    fn wait_for_log(&mut self, needle: &str) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if self.log().contains(needle) {
                return;
            }
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!("fenced serve exited ({status}) before logging {needle:?}");
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the log after {TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM the node and wait for it to exit, for at most [`TIMEOUT`].
    fn stop(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("running");
        // SAFETY: plain kill(2) on our own, not yet reaped, child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "fenced serve still running {TIMEOUT:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "----- fenced serve log ({}) -----\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

#[test]
fn json_logs_are_one_object_per_line() {
    // `info` lifts the default `openraft=warn`: FENCED_LOG still decides what is logged.
    let mut node = Node::start("json_logs", &["--log-format", "json"], "info");
    node.wait_for_log(SERVING);
    let status = node.stop();
    assert!(
        status.success(),
        "fenced serve exited with {status} on SIGTERM"
    );

    let log = node.log();
    let mut lines = 0;
    let mut serving = None;
    for line in log.lines() {
        lines += 1;
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        assert!(v.is_object(), "log line is not a JSON object: {line}");
        assert!(v["level"].is_string(), "no \"level\" in {line}");
        assert!(v["timestamp"].is_string(), "no \"timestamp\" in {line}");
        assert!(v["target"].is_string(), "no \"target\" in {line}");
        assert!(v["fields"].is_object(), "no \"fields\" in {line}");
        assert!(
            v["fields"]["message"].is_string(),
            "no \"fields\".\"message\" in {line}"
        );
        if v["fields"]["message"] == SERVING {
            serving = Some(v);
        }
    }
    assert!(!log.contains('\x1b'), "escape codes in JSON logs:\n{log}");
    let serving = serving.expect("the serving line");
    assert_eq!(serving["level"], "INFO");
    assert_eq!(serving["fields"]["id"], 1, "fields of {serving}");
    assert!(
        log.lines()
            .any(|l| l.contains("\"target\":\"openraft") || l.contains("\"target\": \"openraft")),
        "FENCED_LOG=info should let openraft's info lines through:\n{log}"
    );
    assert!(
        log.contains("SIGTERM: shutting down"),
        "no shutdown line in:\n{log}"
    );
    assert!(lines >= 2, "{lines} log lines");
}

#[test]
fn text_logs_to_a_file_have_no_colour() {
    let mut node = Node::start("text_logs", &[], "info,openraft=warn,sled=warn");
    node.wait_for_log(SERVING);
    node.stop();
    let log = node.log();
    assert!(
        !log.contains("\x1b["),
        "ANSI escape codes in a log that is not a terminal:\n{log:?}"
    );
    let serving = log
        .lines()
        .find(|l| l.contains(SERVING))
        .expect("the serving line");
    assert!(serving.contains(" INFO "), "not a text line: {serving}");
    assert!(
        serde_json::from_str::<serde_json::Value>(serving).is_err(),
        "the default format is not JSON: {serving}"
    );
}
