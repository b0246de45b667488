//! The shared log of a lock recipe's holders (tests/etcdctl_recipes.rs, tests/etcd3_recipes.rs):
//! each holder appends `start WORKER REVISION` when it gets the lock and `end WORKER` before
//! it lets go. One holder at a time means these lines strictly alternate.

use std::path::Path;
use std::time::Duration;

pub fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Critical sections finished so far.
pub fn ends(path: &Path) -> usize {
    log_lines(path)
        .iter()
        .filter(|l| l.starts_with("end "))
        .count()
}

/// Wait (bounded, 60 s) until the holders have finished `n` critical sections in all.
pub async fn wait_sections(path: &Path, n: usize, what: &str) {
    super::wait::wait_for(what, Duration::from_secs(60), || async {
        let done = ends(path);
        if done >= n {
            Ok(())
        } else {
            Err(format!("{done} of {n} critical sections done"))
        }
    })
    .await
}

/// Panic unless the log shows one holder at a time: start and end lines strictly
/// alternate, each end by the worker that started, and the lock key's revision grows from
/// holder to holder. Returns (critical sections, last revision).
pub fn check_one_holder_at_a_time(path: &Path) -> (usize, u64) {
    let lines = log_lines(path);
    let mut holder: Option<&str> = None;
    let mut last_rev = 0u64;
    let mut sections = 0;
    for l in &lines {
        let f: Vec<&str> = l.split(' ').collect();
        match (f.as_slice(), holder) {
            (["start", w, rev], None) => {
                let rev: u64 = rev
                    .parse()
                    .unwrap_or_else(|_| panic!("no revision in `{l}`:\n{lines:#?}"));
                assert!(
                    rev > last_rev,
                    "lock revision {rev} after {last_rev}:\n{lines:#?}"
                );
                last_rev = rev;
                holder = Some(w);
            }
            (["end", w], Some(h)) if *w == h => {
                holder = None;
                sections += 1;
            }
            _ => panic!("two holders at once, or a torn line, at `{l}`:\n{lines:#?}"),
        }
    }
    (sections, last_rev)
}
