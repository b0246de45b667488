//! **expiry**: time, as reads tell it, never goes back. For keys written with a TTL
//! (`put-ttl`: `SET key value PX ttl`, every value unique) and read with `read-ttl` (the value
//! and its `PTTL`, judged together), in real-time order — a read invoked after another read
//! completed — for the same written value:
//!
//! * the TTL left never grows (log time stands still while there is no leader, so a lease may
//!   stretch, but a later reader may not be told that more time is left than an earlier one
//!   was: that is a read judged at a time the cluster later undid — a leader's uncommitted
//!   clock — the bug the issue "Replicas never diverge…" fixed);
//! * once a read saw the value gone (expired), no later read sees it again.
//!
//! Writes of other values in between make no difference: values are unique, so the rule is
//! about one value's life. A read that failed or whose outcome is unknown says nothing.
//!
//! With the cluster's leadership as the simulator saw it ([`Quiet`], [`check_with`]), one
//! more rule — time runs while the cluster is quiet:
//!
//! * for two reads of one value in real-time order, if every node was up and saw the same
//!   leader in the same term from [`SETTLED`] before the first read was invoked until the
//!   second completed, the TTL fell by at least the real time between them (less the drift
//!   bound and [`SLACK_MS`]). A TTL that stands still there is a read judged at a time the
//!   cluster had already passed: the state machine's last applied time on an idle cluster
//!   (the "frozen TTL" of reads that do not commit the time).
//!
//! Why that holds for a correct read path: the second read is judged at or after the
//! leader's log clock when its read-index round started, after it was invoked; the first at
//! a committed time, which is at most that leader's clock when the first read completed —
//! once the leader's clock passed every stamp of the terms before (a leader's clock starts
//! from its applied time when it takes office, which may lag the last stamps by the commit
//! notices it missed; [`SETTLED`] of one stable leader covers that). Between the two the
//! leader's clock ran at its node clock's rate, at least `1 − drift` of real time.

use std::collections::BTreeMap;
use std::time::Duration;

use fenced_jepsen::checker::{Op, Verdict};
use serde_json::{json, Value};

pub const NAME: &str = "expiry";

/// How long every node must have seen one leader (same term) before the first read of a
/// pair for the quiet rule to judge it.
pub const SETTLED: Duration = Duration::from_secs(2);
/// Milliseconds of rounding the quiet rule forgives (log time and PTTL are whole ms).
pub const SLACK_MS: f64 = 2.0;

/// A node's view of the leader: `(term, leader)`, `None` while the node is down.
pub type View = Option<(u64, Option<u64>)>;

/// Every node's view of the leader over a run, as the simulator saw it change: `(simulated
/// ns, node, view)` in time order.
#[derive(Clone, Debug, Default)]
pub struct Leadership {
    changes: Vec<(u64, u64, View)>,
}

impl Leadership {
    /// Node `node`'s view became `view` at `ns` (not before the last change recorded).
    pub fn record(&mut self, ns: u64, node: u64, view: View) {
        self.changes.push((ns, node, view));
    }

    /// The `(term, leader)` every one of `nodes` saw throughout `[from, to]`: each up with
    /// that view at `from` and no change of any node's view after `from` up to `to`.
    pub fn stable(&self, nodes: &[u64], from: u64, to: u64) -> Option<(u64, u64)> {
        if self
            .changes
            .iter()
            .any(|(ns, _, _)| *ns > from && *ns <= to)
        {
            return None;
        }
        let mut agreed = None;
        for n in nodes {
            let view = self
                .changes
                .iter()
                .rev()
                .find(|(ns, node, _)| *ns <= from && node == n)
                .and_then(|(_, _, v)| *v);
            let (term, Some(leader)) = view? else {
                return None;
            };
            if agreed.is_some_and(|a| a != (term, leader)) {
                return None;
            }
            agreed = Some((term, leader));
        }
        agreed
    }
}

/// What the quiet rule needs: the run's leadership, its nodes and the clocks' drift bound.
#[derive(Clone, Debug, Default)]
pub struct Quiet {
    pub leadership: Leadership,
    pub nodes: Vec<u64>,
    pub drift_ppm: u64,
}

/// One completed `read-ttl`: (invoke, complete, value seen, PTTL answered).
type Read = (u64, u64, Option<String>, i64);

/// Check every `read-ttl` of the history against the reads before it.
pub fn check(ops: &[Op]) -> Verdict {
    check_with(ops, None)
}

/// [`check`], and with `quiet` the quiet rule too (module docs).
pub fn check_with(ops: &[Op], quiet: Option<&Quiet>) -> Verdict {
    let mut by_key: BTreeMap<&str, Vec<Read>> = BTreeMap::new();
    for op in ops.iter().filter(|o| o.f == "read-ttl" && o.is_ok()) {
        let (Some(key), Some(c), Some(Value::Array(v))) =
            (op.key.as_deref(), op.complete, op.value_out.as_ref())
        else {
            continue;
        };
        let value = v.first().and_then(Value::as_str).map(str::to_owned);
        let pttl = v.get(1).and_then(Value::as_i64).unwrap_or(-2);
        by_key
            .entry(key)
            .or_default()
            .push((op.invoke, c, value, pttl));
    }
    let mut anomalies = 0u64;
    let mut examples = Vec::new();
    let mut reads = 0usize;
    let mut quiet_pairs = 0u64;
    for (key, list) in &by_key {
        reads += list.len();
        // A TTL never grows: for two reads of one value in real-time order.
        for (inv, _, value, pttl) in list {
            let Some(v) = value else { continue };
            for (_, pc, pvalue, ppttl) in list {
                if *pc >= *inv || pvalue.as_ref() != Some(v) || *ppttl < 0 || *pttl <= *ppttl {
                    continue;
                }
                anomalies += 1;
                if examples.len() < 10 {
                    examples.push(format!(
                        "key {key}: value {v:?} had {ppttl} ms left at a read done at {} ms, \
                         then {pttl} ms at a read invoked at {} ms",
                        pc / 1_000_000,
                        inv / 1_000_000
                    ));
                }
            }
        }
        // Time runs while the cluster is quiet: the TTL falls with real time.
        if let Some(q) = quiet {
            let settled = SETTLED.as_nanos() as u64;
            let rate = 1.0 - q.drift_ppm as f64 / 1e6;
            for (inv, c, value, pttl) in list {
                let Some(v) = value else { continue };
                for (pinv, pc, pvalue, ppttl) in list {
                    if *pc >= *inv || pvalue.as_ref() != Some(v) || *ppttl < 0 || *pttl < 0 {
                        continue;
                    }
                    let Some((term, leader)) = pinv
                        .checked_sub(settled)
                        .and_then(|from| q.leadership.stable(&q.nodes, from, *c))
                    else {
                        continue;
                    };
                    quiet_pairs += 1;
                    let passed_ms = (inv - pc) as f64 / 1e6 * rate;
                    let fell = (ppttl - pttl) as f64;
                    if fell + SLACK_MS >= passed_ms {
                        continue;
                    }
                    anomalies += 1;
                    if examples.len() < 10 {
                        examples.push(format!(
                            "key {key}: value {v:?} had {ppttl} ms left at a read done at {} ms, \
                             and {pttl} ms at a read invoked at {} ms: it fell {} ms in {} ms \
                             while n{leader} led term {term} throughout and every node saw it",
                            pc / 1_000_000,
                            inv / 1_000_000,
                            ppttl - pttl,
                            (inv - pc) / 1_000_000
                        ));
                    }
                }
            }
        }
        // Once gone, gone: a value seen absent after it was seen present is never seen again.
        for (i, (_, c_gone, value, _)) in list.iter().enumerate() {
            if value.is_some() {
                continue;
            }
            // The values seen present before this read saw the key empty.
            let gone: Vec<&String> = list
                .iter()
                .take(i)
                .filter(|(_, pc, _, _)| pc < &list[i].0)
                .filter_map(|(_, _, v, _)| v.as_ref())
                .collect();
            for (inv, _, v, _) in list.iter().skip(i + 1) {
                if *inv <= *c_gone {
                    continue;
                }
                if let Some(v) = v.as_ref().filter(|v| gone.contains(v)) {
                    anomalies += 1;
                    if examples.len() < 10 {
                        examples.push(format!(
                            "key {key}: value {v:?} was gone at a read done at {} ms, and back \
                             at a read invoked at {} ms",
                            c_gone / 1_000_000,
                            inv / 1_000_000
                        ));
                    }
                }
            }
        }
    }
    Verdict::new(
        NAME,
        anomalies,
        examples,
        json!({ "reads": reads, "quiet_pairs": quiet_pairs }),
    )
}

#[cfg(test)]
mod tests {
    use fenced_jepsen::checker::pair;
    use fenced_jepsen::history::{Event, Kind, Process};
    use serde_json::json;

    use super::*;

    fn read(h: &mut Vec<Event>, p: u64, inv_ms: u64, ok_ms: u64, value: Option<&str>, pttl: i64) {
        let ns = |ms: u64| ms * 1_000_000;
        h.push(Event::new(Process::Client(p), Kind::Invoke, "read-ttl", ns(inv_ms)).key("e"));
        h.push(
            Event::new(Process::Client(p), Kind::Ok, "read-ttl", ns(ok_ms))
                .key("e")
                .value(json!([value, pttl])),
        );
    }

    #[test]
    fn ttls_that_fall_and_a_value_that_expires_once_pass() {
        let mut h = Vec::new();
        read(&mut h, 1, 0, 1, Some("a"), 5000);
        read(&mut h, 2, 2, 3, Some("a"), 4000);
        // Overlapping reads may disagree either way.
        read(&mut h, 3, 10, 20, Some("a"), 3000);
        read(&mut h, 4, 11, 21, Some("a"), 3500);
        read(&mut h, 1, 30, 31, None, -2);
        // A new value, later: its own life.
        read(&mut h, 2, 40, 41, Some("b"), 9000);
        let v = check(&pair(&h));
        assert_eq!(v.anomalies, 0, "{v:?}");
    }

    #[test]
    fn a_ttl_that_grows_fails() {
        let mut h = Vec::new();
        read(&mut h, 1, 0, 1, Some("a"), 4000);
        read(&mut h, 2, 5, 6, Some("a"), 4500);
        let v = check(&pair(&h));
        assert_eq!(v.anomalies, 1, "{v:?}");
    }

    /// Three nodes that saw n1 lead term 2 from 0 ms on; node 3 down from `down_ms` if any.
    fn quiet(down_ms: Option<u64>) -> Quiet {
        let mut leadership = Leadership::default();
        for n in 1..=3 {
            leadership.record(0, n, Some((2, Some(1))));
        }
        if let Some(ms) = down_ms {
            leadership.record(ms * 1_000_000, 3, None);
        }
        Quiet {
            leadership,
            nodes: vec![1, 2, 3],
            drift_ppm: 100,
        }
    }

    #[test]
    fn a_ttl_that_stands_still_while_one_leader_leads_fails() {
        let mut h = Vec::new();
        read(&mut h, 1, 3_000, 3_001, Some("a"), 2_000);
        // 500 ms later, still 2000 ms left (a frozen TTL); then 1 ms less.
        read(&mut h, 2, 3_501, 3_502, Some("a"), 2_000);
        read(&mut h, 3, 4_001, 4_002, Some("a"), 1_999);
        let v = check_with(&pair(&h), Some(&quiet(None)));
        assert_eq!(v.anomalies, 3, "{v:?}");
        assert!(v.examples[0].contains("n1 led term 2"), "{v:?}");
        // Without the leadership, the rules before see nothing wrong: equal is not growing.
        assert_eq!(check(&pair(&h)).anomalies, 0);
    }

    #[test]
    fn a_ttl_falling_with_real_time_or_a_leader_change_passes_the_quiet_rule() {
        let mut h = Vec::new();
        read(&mut h, 1, 3_000, 3_001, Some("a"), 2_000);
        // Fell by the real time passed, less the drift bound and the slack.
        read(&mut h, 2, 3_501, 3_502, Some("a"), 1_501);
        let v = check_with(&pair(&h), Some(&quiet(None)));
        assert_eq!(v.anomalies, 0, "{v:?}");
        // A frozen TTL while a node was down, or too soon after the leader took office
        // (time may stand still then), is not judged.
        let mut h = Vec::new();
        read(&mut h, 1, 3_000, 3_001, Some("a"), 2_000);
        read(&mut h, 2, 3_501, 3_502, Some("a"), 2_000);
        assert_eq!(
            check_with(&pair(&h), Some(&quiet(Some(3_200)))).anomalies,
            0
        );
        let mut h = Vec::new();
        read(&mut h, 1, 1_000, 1_001, Some("a"), 2_000);
        read(&mut h, 2, 1_501, 1_502, Some("a"), 2_000);
        assert_eq!(check_with(&pair(&h), Some(&quiet(None))).anomalies, 0);
    }

    #[test]
    fn stable_needs_every_node_up_on_one_leader_and_term() {
        let mut l = Leadership::default();
        l.record(0, 1, Some((2, Some(1))));
        l.record(0, 2, Some((2, Some(1))));
        l.record(0, 3, Some((2, None)));
        l.record(10, 3, Some((2, Some(1))));
        l.record(50, 2, Some((3, None)));
        let nodes = [1, 2, 3];
        assert_eq!(l.stable(&nodes, 5, 8), None, "n3 had no leader yet");
        assert_eq!(l.stable(&nodes, 10, 49), Some((2, 1)));
        assert_eq!(l.stable(&nodes, 10, 50), None, "n2 moved to term 3");
        assert_eq!(l.stable(&nodes, 60, 70), None);
    }

    #[test]
    fn a_value_back_after_it_was_seen_gone_fails() {
        let mut h = Vec::new();
        read(&mut h, 1, 0, 1, Some("a"), 100);
        read(&mut h, 2, 200, 201, None, -2);
        read(&mut h, 3, 300, 301, Some("a"), 0);
        let v = check(&pair(&h));
        assert_eq!(v.anomalies, 1, "{v:?}");
    }
}
