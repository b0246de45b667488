//! Running this test binary again as a child process, for tests that compare a replica in
//! another process (another address layout and allocation history) with their own.

use std::process::Command;

/// Run test `test` of this binary again with `env` set, and return the rest of the first
/// line of its output that contains `mark`. Panics if the child fails or prints no such line.
pub fn rerun_marked(test: &str, env: &str, mark: &str) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .output()
        .expect("the child test process runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split_once(mark).map(|(_, rest)| rest.trim().to_owned()))
        .expect("the child printed its line")
}
