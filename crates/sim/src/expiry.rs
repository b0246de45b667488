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

use std::collections::BTreeMap;

use fenced_jepsen::checker::{Op, Verdict};
use serde_json::{json, Value};

pub const NAME: &str = "expiry";

/// One completed `read-ttl`: (invoke, complete, value seen, PTTL answered).
type Read = (u64, u64, Option<String>, i64);

/// Check every `read-ttl` of the history against the reads before it.
pub fn check(ops: &[Op]) -> Verdict {
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
    Verdict::new(NAME, anomalies, examples, json!({ "reads": reads }))
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
