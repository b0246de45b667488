//! Mutual exclusion: no two acknowledged grants of one lock may be valid at the same time.
//!
//! A grant acknowledged to process P (acquire `ok` at time `a`) is *valid* from `a` until the
//! earliest of: P invoking `release` of it, and `invoke(acquire) + ttl_ms` (extended by `ok`
//! `extend`s to `invoke(extend) + ttl_ms`). That end is a lower bound on when any correct
//! server may hand the lock to someone else: the lease runs from when the server granted it,
//! which is after the client sent the request. So if another grant is acknowledged (its `ok`
//! returned) before that end, the server must have granted it while P's lease was still
//! running — a violation, whatever the network or the clocks did. A grant whose `ok` arrives
//! after that end (the reply waited in a paused client) has an empty window and holds nothing.

use std::collections::BTreeMap;

use serde_json::json;

use super::{ms, Op, Verdict, MAX_EXAMPLES};

#[derive(Clone, Debug)]
pub struct Window {
    pub process: u64,
    pub key: String,
    pub token: Option<u64>,
    pub start: u64,
    pub end: u64,
    /// The grant's mode as the acquire asked (`None`: exclusive) and, for a permit, the
    /// semaphore's size (see `holders`).
    pub mode: Option<String>,
    pub permits: Option<u32>,
}

/// The validity window of every acknowledged grant, per lock.
pub fn windows(ops: &[Op]) -> BTreeMap<String, Vec<Window>> {
    let mut by_process: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_process.entry(op.process).or_default().push(op);
    }
    let mut out: BTreeMap<String, Vec<Window>> = BTreeMap::new();
    for (p, list) in by_process {
        for (i, op) in list.iter().enumerate() {
            if op.f != "acquire" || !op.is_ok() {
                continue;
            }
            let (Some(key), Some(start)) = (op.key.clone(), op.complete) else {
                continue;
            };
            let ttl_ns = op.ttl_ms.unwrap_or(0).saturating_mul(1_000_000);
            let mut end = op.invoke.saturating_add(ttl_ns);
            for later in &list[i + 1..] {
                if later.key.as_deref() != Some(key.as_str()) {
                    continue;
                }
                match later.f.as_str() {
                    "extend" if later.is_ok() && later.invoke < end => {
                        let t = later.ttl_ms.unwrap_or(0).saturating_mul(1_000_000);
                        end = end.max(later.invoke.saturating_add(t));
                    }
                    "release" => {
                        end = end.min(later.invoke);
                        break;
                    }
                    "acquire" => break,
                    _ => {}
                }
            }
            // A grant acknowledged only after its lease had run out (its reply sat in a
            // paused client's socket) was never valid from the client's point of view.
            if end <= start {
                continue;
            }
            out.entry(key.clone()).or_default().push(Window {
                process: p,
                key,
                token: op.token,
                start,
                end,
                mode: op.mode.clone(),
                permits: op.permits,
            });
        }
    }
    for w in out.values_mut() {
        w.sort_by_key(|w| (w.start, w.process));
    }
    out
}

pub fn check(ops: &[Op]) -> Verdict {
    let all = windows(ops);
    let mut anomalies = 0u64;
    let mut examples = Vec::new();
    let mut grants = 0usize;
    for (key, ws) in &all {
        grants += ws.len();
        // Sweep: the earlier grant whose validity reaches furthest.
        let mut furthest: Option<&Window> = None;
        for w in ws {
            if let Some(f) = furthest {
                if w.start < f.end && f.process != w.process {
                    anomalies += 1;
                    if examples.len() < MAX_EXAMPLES {
                        examples.push(format!(
                            "lock {key}: process {} was granted it (token {:?}) at {} ms while \
                             process {}'s grant (token {:?}, acknowledged at {} ms) was valid \
                             until {} ms",
                            w.process,
                            w.token,
                            ms(w.start),
                            f.process,
                            f.token,
                            ms(f.start),
                            ms(f.end)
                        ));
                    }
                }
            }
            if furthest.is_none_or(|f| w.end > f.end) {
                furthest = Some(w);
            }
        }
    }
    Verdict::new(
        "mutual-exclusion",
        anomalies,
        examples,
        json!({ "grants": grants, "locks": all.len() }),
    )
}

#[cfg(test)]
mod tests {
    use super::super::build::*;
    use super::super::pair;
    use super::*;
    use crate::history::Kind;

    #[test]
    fn counts_only_the_overlap() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 0, 10, Some(1), 1000);
        release(&mut h, 1, "L", 50, 60, Some(1));
        acquire(&mut h, 2, "L", 40, 70, Some(3), 1000);
        // Lease expiry: p3's grant runs out at 100+1000; p4 acknowledged after that.
        acquire(&mut h, 3, "L", 100, 900, Some(5), 1000);
        acquire(&mut h, 4, "L", 200, 1101, Some(7), 1000);
        let v = check(&pair(&h.sorted()));
        // p2 acquired at 70 while p1 released at 50: fine. p3's ok at 900 < p2's end 40+1000.
        assert_eq!(v.anomalies, 1, "{v:?}");
    }

    #[test]
    fn fails_on_overlapping_grants() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 0, 10, None, 1000);
        acquire(&mut h, 2, "L", 20, 30, None, 1000);
        let v = check(&pair(&h.sorted()));
        assert_eq!(v.valid, Some(false));
        assert_eq!(v.anomalies, 1);
        assert!(v.examples[0].contains("process 2"));
    }

    #[test]
    fn expired_lease_and_released_grants_do_not_count() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 0, 10, Some(1), 100);
        acquire(&mut h, 2, "L", 20, 101, Some(2), 100);
        release(&mut h, 2, "L", 150, 160, Some(2));
        acquire(&mut h, 3, "L", 140, 155, Some(3), 100);
        // An unacknowledged (info) acquire never holds anything.
        h.ev(4, Kind::Invoke, "acquire", "L", 156).ttl_ms = Some(100);
        h.ev(4, Kind::Info, "acquire", "L", 157);
        // Other locks are independent.
        acquire(&mut h, 5, "M", 0, 12, Some(4), 1000);
        let v = check(&pair(&h.sorted()));
        assert_eq!(v.valid, Some(true), "{v:?}");
    }

    #[test]
    fn a_grant_acknowledged_after_its_lease_ran_out_holds_nothing() {
        let mut h = H::new();
        // p1's reply arrives at 5000, after invoke + ttl = 3000 (the client was paused).
        acquire(&mut h, 1, "L", 0, 5000, Some(1), 3000);
        acquire(&mut h, 2, "L", 4000, 4990, Some(2), 3000);
        let v = check(&pair(&h.sorted()));
        assert_eq!(v.valid, Some(true), "{v:?}");
    }

    #[test]
    fn extend_prolongs_validity() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 0, 10, Some(1), 100);
        h.ev(1, Kind::Invoke, "extend", "L", 50).ttl_ms = Some(100);
        h.ev(1, Kind::Ok, "extend", "L", 55);
        acquire(&mut h, 2, "L", 60, 120, Some(2), 100);
        let v = check(&pair(&h.sorted()));
        assert_eq!(v.anomalies, 1, "{v:?}");
    }
}
