//! Holders per mode (the `rwlock` and `semaphore` workloads): at no time may a writer (or an
//! exclusive holder) share a lock with any other holder, a reader share it with anything but
//! readers, or more than `permits` permit holders hold a semaphore.
//!
//! Judged from the same validity windows as mutual exclusion (`mutex::windows`): a grant
//! acknowledged at `a` certainly holds from `a` until the earlier of its holder's release
//! invoke and `invoke(acquire) + ttl` (extended by acknowledged extends) — the server granted
//! it before `a`, and its lease, which started after the invoke, cannot end before then. So at
//! any instant `t`, every grant whose window contains `t` is held at `t`, together. The most
//! holders of a lock at once are found at some window's start: at each start, the windows of
//! *other* processes still open are held together with it, and a set that breaks the mode's
//! rule there is a real violation whatever the network and the clocks did. Each window whose
//! start breaks a rule counts one anomaly. `info` acquires hold nothing here (they may never
//! have been granted). Windows without a mode are exclusive, so an old `lock` history checks
//! as it does under mutual exclusion.

use std::collections::BTreeMap;

use serde_json::json;

use super::mutex::{windows, Window};
use super::{ms, Op, Verdict, MAX_EXAMPLES};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `exclusive` (or no mode) and `write`: alone.
    Alone,
    Read,
    Permit,
}

fn mode(w: &Window) -> Mode {
    match w.mode.as_deref() {
        Some("read") => Mode::Read,
        Some("permit") => Mode::Permit,
        _ => Mode::Alone,
    }
}

fn describe(w: &Window) -> String {
    format!(
        "process {} ({}, token {:?}, {}–{} ms)",
        w.process,
        w.mode.as_deref().unwrap_or("exclusive"),
        w.token,
        ms(w.start),
        ms(w.end)
    )
}

/// What is wrong with `w` starting while `others` (other processes' windows containing its
/// start) are held, if anything.
fn violation(w: &Window, others: &[&Window]) -> Option<String> {
    if others.is_empty() {
        return None;
    }
    let list = || {
        others
            .iter()
            .map(|o| describe(o))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match mode(w) {
        Mode::Alone => Some(format!(
            "{} was granted it while {} other holder(s) held it: {}",
            describe(w),
            others.len(),
            list()
        )),
        Mode::Read => others
            .iter()
            .any(|o| mode(o) != Mode::Read)
            .then(|| format!("reader {} overlapped {}", describe(w), list())),
        Mode::Permit => {
            if others.iter().any(|o| mode(o) != Mode::Permit) {
                return Some(format!(
                    "permit {} overlapped a holder of another mode: {}",
                    describe(w),
                    list()
                ));
            }
            // The smallest size any of them was asked with (they agree in a sane run).
            let permits = others
                .iter()
                .filter_map(|o| o.permits)
                .chain(w.permits)
                .min()
                .unwrap_or(1);
            let holders = others.len() + 1;
            (holders > permits as usize).then(|| {
                format!(
                    "{holders} permits of a {permits}-permit semaphore held at {} ms: {} and {}",
                    ms(w.start),
                    describe(w),
                    list()
                )
            })
        }
    }
}

pub fn check(ops: &[Op]) -> Verdict {
    let all = windows(ops);
    let mut anomalies = 0u64;
    let mut examples = Vec::new();
    let mut by_mode: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut most_readers = 0usize;
    let mut most_permits = 0usize;
    for (key, ws) in &all {
        // Windows containing the current start (ws is sorted by start).
        let mut open: Vec<&Window> = Vec::new();
        for w in ws {
            open.retain(|o| o.end > w.start);
            let others: Vec<&Window> = open
                .iter()
                .copied()
                .filter(|o| o.process != w.process)
                .collect();
            *by_mode
                .entry(match mode(w) {
                    Mode::Alone if w.mode.as_deref() == Some("write") => "write",
                    Mode::Alone => "exclusive",
                    Mode::Read => "read",
                    Mode::Permit => "permit",
                })
                .or_default() += 1;
            let same = 1 + others.iter().filter(|o| mode(o) == mode(w)).count();
            match mode(w) {
                Mode::Read => most_readers = most_readers.max(same),
                Mode::Permit => most_permits = most_permits.max(same),
                Mode::Alone => {}
            }
            if let Some(why) = violation(w, &others) {
                anomalies += 1;
                if examples.len() < MAX_EXAMPLES {
                    examples.push(format!("lock {key}: {why}"));
                }
            }
            open.push(w);
        }
    }
    Verdict::new(
        "mode-exclusion",
        anomalies,
        examples,
        json!({
            "grants": by_mode,
            "locks": all.len(),
            "most_readers_at_once": most_readers,
            "most_permits_at_once": most_permits,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::super::build::*;
    use super::super::{fencing, pair};
    use super::*;
    use crate::history::Kind;

    /// An acquire of `mode` (`permits` for a permit) by `p`, invoked at `inv`, ok at `ok`.
    #[allow(clippy::too_many_arguments)]
    fn grant(
        h: &mut H,
        p: u64,
        mode: &str,
        permits: Option<u32>,
        inv: u64,
        ok: u64,
        token: u64,
        ttl: u64,
    ) {
        let e = h.ev(p, Kind::Invoke, "acquire", "L", inv);
        e.ttl_ms = Some(ttl);
        e.mode = Some(mode.to_owned());
        e.permits = permits;
        h.ev(p, Kind::Ok, "acquire", "L", ok).token = Some(token);
    }

    fn verdicts(h: &H) -> (Verdict, Verdict) {
        let ops = pair(&h.sorted());
        (check(&ops), fencing::check(&ops, true))
    }

    #[test]
    fn many_readers_may_overlap() {
        let mut h = H::new();
        for p in 0..5 {
            grant(&mut h, p, "read", None, p * 10, p * 10 + 5, 10 + p, 1000);
        }
        for p in 0..5 {
            release(&mut h, p, "L", 500 + p, 505 + p, Some(10 + p));
        }
        // A writer after every reader released.
        grant(&mut h, 9, "write", None, 600, 610, 30, 1000);
        let (v, f) = verdicts(&h);
        assert_eq!(v.valid, Some(true), "{v:?}");
        assert_eq!(v.stats["most_readers_at_once"], 5);
        assert_eq!(f.valid, Some(true), "{f:?}");
    }

    #[test]
    fn two_writers_overlapping_fail() {
        let mut h = H::new();
        grant(&mut h, 1, "write", None, 0, 10, 5, 1000);
        grant(&mut h, 2, "write", None, 20, 30, 7, 1000);
        let (v, _) = verdicts(&h);
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert!(v.examples[0].contains("process 2 (write"), "{v:?}");
    }

    #[test]
    fn a_reader_overlapping_a_writer_fails_either_way_round() {
        let mut h = H::new();
        grant(&mut h, 1, "write", None, 0, 10, 5, 1000);
        grant(&mut h, 2, "read", None, 20, 30, 7, 1000);
        let (v, _) = verdicts(&h);
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert!(v.examples[0].contains("reader process 2"), "{v:?}");
        let mut h = H::new();
        grant(&mut h, 1, "read", None, 0, 10, 5, 1000);
        grant(&mut h, 2, "read", None, 0, 12, 5, 1000);
        grant(&mut h, 3, "write", None, 20, 30, 7, 1000);
        let (v, _) = verdicts(&h);
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert!(v.examples[0].contains("2 other holder(s)"), "{v:?}");
    }

    #[test]
    fn a_writer_after_readers_released_or_expired_passes() {
        let mut h = H::new();
        grant(&mut h, 1, "read", None, 0, 10, 5, 100);
        release(&mut h, 1, "L", 50, 55, Some(5));
        // p2's lease ends at 20 + 100: the writer acknowledged at 121 overlaps nothing.
        grant(&mut h, 2, "read", None, 20, 30, 6, 100);
        grant(&mut h, 3, "write", None, 60, 121, 9, 100);
        // An info read holds nothing.
        let e = h.ev(4, Kind::Invoke, "acquire", "L", 130);
        e.ttl_ms = Some(100);
        e.mode = Some("read".into());
        h.ev(4, Kind::Info, "acquire", "L", 131);
        let (v, f) = verdicts(&h);
        assert_eq!(v.valid, Some(true), "{v:?}");
        assert_eq!(f.valid, Some(true), "{f:?}");
    }

    #[test]
    fn exactly_permits_holders_pass_and_one_more_fails() {
        let mut h = H::new();
        for p in 0..3 {
            grant(&mut h, p, "permit", Some(3), p, 10 + p, 20 + p, 1000);
        }
        let (v, f) = verdicts(&h);
        assert_eq!(v.valid, Some(true), "{v:?}");
        assert_eq!(v.stats["most_permits_at_once"], 3);
        assert_eq!(f.valid, Some(true), "{f:?}");
        // One releases, another takes its place: still 3.
        release(&mut h, 0, "L", 100, 105, Some(20));
        grant(&mut h, 3, "permit", Some(3), 101, 110, 30, 1000);
        let (v, _) = verdicts(&h);
        assert_eq!(v.valid, Some(true), "{v:?}");
        // A fifth while three hold: 4 of 3.
        grant(&mut h, 4, "permit", Some(3), 200, 210, 40, 1000);
        let (v, _) = verdicts(&h);
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert!(v.examples[0].contains("4 permits of a 3-permit"), "{v:?}");
        assert_eq!(v.stats["most_permits_at_once"], 4);
    }

    #[test]
    fn a_token_that_went_backwards_fails_and_a_shared_token_only_for_writers() {
        let mut h = H::new();
        grant(&mut h, 1, "read", None, 0, 10, 9, 1000);
        // Invoked after p1's grant was acknowledged, yet a smaller token.
        grant(&mut h, 2, "read", None, 20, 30, 8, 1000);
        let (v, f) = verdicts(&h);
        assert_eq!(v.valid, Some(true), "readers may overlap: {v:?}");
        assert_eq!(f.anomalies, 1, "{f:?}");
        assert!(f.examples[0].contains("token 8"), "{f:?}");
        // Readers (or permits) admitted together by one command share its revision.
        let mut h = H::new();
        grant(&mut h, 1, "read", None, 0, 50, 9, 1000);
        grant(&mut h, 2, "read", None, 5, 51, 9, 1000);
        grant(&mut h, 3, "permit", Some(3), 0, 50, 4, 1000);
        let ops = pair(&h.sorted());
        let f = fencing::check(&ops, true);
        assert_eq!(f.valid, Some(true), "{f:?}");
        // A writer's token is its own.
        let mut h = H::new();
        grant(&mut h, 1, "read", None, 0, 50, 9, 1000);
        grant(&mut h, 2, "write", None, 5, 51, 9, 1000);
        let (_, f) = verdicts(&h);
        assert_eq!(f.anomalies, 1, "{f:?}");
    }

    #[test]
    fn an_old_exclusive_history_checks_as_mutual_exclusion() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 0, 10, Some(1), 1000);
        acquire(&mut h, 2, "L", 20, 30, Some(2), 1000);
        let ops = pair(&h.sorted());
        assert_eq!(check(&ops).anomalies, 1);
        assert_eq!(super::super::mutex::check(&ops).anomalies, 1);
    }
}
