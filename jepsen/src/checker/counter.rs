//! Lost updates: the counter read at the end must account for every acknowledged increment.
//!
//! Each increment (`fenced-write` or `write`) writes `read + 1` under the lock. With mutual
//! exclusion (or fencing that stops every superseded holder) increments are serial, so the
//! final value equals the acknowledged increments plus some of the unknown (`info`) ones.
//! Final < acknowledged means acknowledged increments were overwritten: lost updates.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{Op, Verdict, MAX_EXAMPLES};
use crate::history::Kind;

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Null => Some(0),
        _ => None,
    }
}

pub fn check(ops: &[Op]) -> Verdict {
    let incs: Vec<&Op> = ops
        .iter()
        .filter(|o| matches!(o.f.as_str(), "fenced-write" | "write"))
        .collect();
    let acked = incs.iter().filter(|o| o.kind == Kind::Ok).count() as i64;
    let unknown = incs.iter().filter(|o| o.kind == Kind::Info).count() as i64;
    let Some(final_read) = ops.iter().rev().find(|o| o.f == "final-read" && o.is_ok()) else {
        return Verdict::not_applicable("lost-updates", "no final read of the counter");
    };
    let Some(fin) = final_read.value_out.as_ref().and_then(as_int) else {
        return Verdict::not_applicable("lost-updates", "final read is not a number");
    };
    let mut examples = Vec::new();
    // Two acknowledged increments writing the same value: one overwrote the other.
    let mut by_value: BTreeMap<i64, Vec<&Op>> = BTreeMap::new();
    for op in incs.iter().filter(|o| o.kind == Kind::Ok) {
        if let Some(v) = op.value_in.as_ref().and_then(as_int) {
            by_value.entry(v).or_default().push(op);
        }
    }
    let duplicates: usize = by_value.values().map(|v| v.len().saturating_sub(1)).sum();
    for (v, list) in by_value.iter().filter(|(_, l)| l.len() > 1) {
        if examples.len() >= MAX_EXAMPLES {
            break;
        }
        let who: Vec<String> = list
            .iter()
            .map(|o| format!("process {} (token {:?})", o.process, o.token))
            .collect();
        examples.push(format!(
            "value {v} was written and acknowledged {} times: {}",
            list.len(),
            who.join(", ")
        ));
    }
    let lost = (acked - fin).max(0);
    let phantom = (fin - acked - unknown).max(0);
    if lost > 0 {
        examples.insert(
            0,
            format!("final counter {fin} < {acked} acknowledged increments: {lost} lost"),
        );
    }
    if phantom > 0 {
        examples.insert(
            0,
            format!("final counter {fin} > {acked} acknowledged + {unknown} unknown increments"),
        );
    }
    examples.truncate(MAX_EXAMPLES);
    Verdict::new(
        "lost-updates",
        (lost + phantom) as u64,
        examples,
        json!({
            "final": fin,
            "acknowledged": acked,
            "unknown": unknown,
            "duplicate_values": duplicates,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::super::build::*;
    use super::super::pair;
    use super::*;
    use serde_json::json;

    fn inc(h: &mut H, p: u64, at: u64, value: i64, kind: Kind) {
        h.ev(p, Kind::Invoke, "write", "counter", at).value = Some(json!(value));
        h.ev(p, kind, "write", "counter", at + 1);
    }

    fn final_read(h: &mut H, at: u64, value: Value) {
        h.ev(99, Kind::Invoke, "final-read", "counter", at);
        h.ev(99, Kind::Ok, "final-read", "counter", at + 1).value = Some(value);
    }

    #[test]
    fn all_increments_accounted_passes() {
        let mut h = H::new();
        inc(&mut h, 1, 0, 1, Kind::Ok);
        inc(&mut h, 2, 10, 2, Kind::Ok);
        inc(&mut h, 3, 20, 3, Kind::Info);
        inc(&mut h, 4, 30, 3, Kind::Fail);
        final_read(&mut h, 100, json!("3"));
        let v = check(&pair(&h.sorted()));
        assert_eq!(v.valid, Some(true), "{v:?}");
    }

    #[test]
    fn fails_on_lost_update() {
        let mut h = H::new();
        inc(&mut h, 1, 0, 1, Kind::Ok);
        inc(&mut h, 2, 10, 2, Kind::Ok);
        // A paused client wakes and writes 2 again from its old read of 1.
        inc(&mut h, 3, 20, 2, Kind::Ok);
        final_read(&mut h, 100, json!(2));
        let v = check(&pair(&h.sorted()));
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert_eq!(v.stats["duplicate_values"], 1);
    }

    #[test]
    fn fails_on_phantom_increments_and_skips_without_final_read() {
        let mut h = H::new();
        inc(&mut h, 1, 0, 1, Kind::Ok);
        assert_eq!(check(&pair(&h.sorted())).valid, None);
        final_read(&mut h, 100, json!(5));
        assert_eq!(check(&pair(&h.sorted())).anomalies, 4);
    }
}
