//! The replica-agreement check at the end of a fenced run (see
//! [`checker::agreement`](crate::checker::agreement)): with every node stopped, run
//! `fenced debug digest` on each member's data dir — first at its own end, to learn what it
//! can rebuild, then at one common index — and compare.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::checker::agreement::{self, NodeDigest};
use crate::checker::Verdict;

/// How long one `fenced debug digest` may take (it reads a snapshot and a log).
const DIGEST_TIMEOUT: Duration = Duration::from_secs(120);

/// `fenced debug digest --data-dir DIR [--index N]`, bounded in time.
fn digest(fenced: &Path, node: &str, dir: &Path, index: Option<u64>) -> Result<NodeDigest, String> {
    let mut cmd = Command::new(fenced);
    cmd.args(["debug", "digest", "--data-dir"]).arg(dir);
    if let Some(i) = index {
        cmd.args(["--index", &i.to_string()]);
    }
    let out_file = dir.with_extension("digest.out");
    let err_file = dir.with_extension("digest.err");
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(file(&out_file)?)
        .stderr(file(&err_file)?)
        .spawn()
        .map_err(|e| format!("{node}: cannot run {}: {e}", fenced.display()))?;
    let give_up = Instant::now() + DIGEST_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < give_up => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{node}: fenced debug digest timed out"));
            }
        }
    };
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    let _ = std::fs::remove_file(&err_file);
    if !status.success() {
        return Err(format!("{node}: {}", stderr.trim()));
    }
    let mut d: NodeDigest = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("{node}: unreadable digest line ({e}): {stdout}"))?;
    d.node = node.to_owned();
    Ok(d)
}

fn all_at(
    fenced: &Path,
    nodes: &[(String, PathBuf)],
    index: Option<u64>,
) -> Result<Vec<NodeDigest>, String> {
    nodes
        .iter()
        .map(|(n, dir)| digest(fenced, n, dir, index))
        .collect()
}

/// Compare the members `nodes` (name, data dir) of a stopped cluster. `skipped` names nodes
/// left out (retired, removed), for the record.
pub fn check(fenced: &Path, nodes: &[(String, PathBuf)], skipped: &[String]) -> Verdict {
    let base = json!({ "skipped": skipped });
    let ends = match all_at(fenced, nodes, None) {
        Ok(e) => e,
        Err(why) => return agreement::unchecked(&why, base),
    };
    let mut v = match agreement::common_index(&ends) {
        Err(why) => agreement::unchecked(&why, json!({ "ends": ends })),
        Ok(index) => match all_at(fenced, nodes, Some(index)) {
            Err(why) => agreement::unchecked(&why, json!({ "ends": ends })),
            Ok(at) if agreement::same_log(&at) => {
                agreement::check(&at, "largest index every node can rebuild")
            }
            // The logs differ at that index: an uncommitted tail. Compare where every node
            // knew its log committed.
            Ok(_) => match agreement::committed_index(&ends)
                .and_then(|i| all_at(fenced, nodes, Some(i)))
            {
                Err(why) => agreement::unchecked(
                    &format!("the logs differ at the last common index; {why}"),
                    json!({ "ends": ends }),
                ),
                Ok(at) => agreement::check(
                    &at,
                    "largest index every node knew committed (the logs differ past it)",
                ),
            },
        },
    };
    v.stats["skipped"] = json!(skipped);
    v
}
