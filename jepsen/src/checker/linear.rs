//! Linearizability of a key-value register history: a Wing–Gong search (with Lowe's memo of
//! visited configurations, as Knossos' `wgl` does) against a sequential KV model.
//!
//! Keys are independent (each is its own register), so each key's ops are checked alone.
//! An op may take effect at one instant between its invoke and its completion. `fail` ops
//! certainly had no effect and are dropped; `info` ops may take effect at any instant after
//! their invoke — or never — so they never have to be linearized, and a read with an unknown
//! outcome constrains nothing and is dropped. The search is bounded by a number of visited
//! configurations; past it the verdict is "unknown", never "valid".

use std::collections::{BTreeMap, HashSet};

use serde_json::{json, Value};

use super::{ms, Op, Verdict, MAX_EXAMPLES};
use crate::history::Kind;

/// A register op as the model sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// Read; `None` = absent.
    Get(Option<String>),
    Put(String),
    /// Compare-and-set that succeeded.
    Cas(String, String),
    Del,
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub call: Call,
    pub process: u64,
    pub invoke: u64,
    /// `u64::MAX` for ops whose outcome is unknown.
    pub end: u64,
}

/// The sequential model: one register per key, absent at first.
pub fn step(state: &Option<String>, call: &Call) -> Option<Option<String>> {
    match call {
        Call::Get(v) => (v == state).then(|| state.clone()),
        Call::Put(v) => Some(Some(v.clone())),
        Call::Cas(old, new) => (state.as_deref() == Some(old.as_str())).then(|| Some(new.clone())),
        Call::Del => Some(None),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Turn register ops into model entries, per key.
pub fn entries(ops: &[Op]) -> BTreeMap<String, Vec<Entry>> {
    let mut out: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    for op in ops {
        if op.kind == Kind::Fail || op.kind == Kind::Invoke {
            continue;
        }
        let info = op.kind == Kind::Info;
        let call = match op.f.as_str() {
            "get" if info => continue,
            "get" => Call::Get(op.value_out.as_ref().and_then(text)),
            "put" => match op.value_in.as_ref().and_then(text) {
                Some(v) => Call::Put(v),
                None => continue,
            },
            "cas" => match op.value_in.as_ref() {
                // `[old, new]`, or `[old, new, note]` (the kv workload notes what its etcd
                // Txn compared: the value, or the mod_revision of the read that saw `old`).
                Some(Value::Array(a)) if a.len() == 2 || a.len() == 3 => {
                    match (text(&a[0]), text(&a[1])) {
                        (Some(o), Some(n)) => Call::Cas(o, n),
                        _ => continue,
                    }
                }
                _ => continue,
            },
            "del" => Call::Del,
            _ => continue,
        };
        let Some(key) = op.key.clone() else { continue };
        out.entry(key).or_default().push(Entry {
            call,
            process: op.process,
            invoke: op.invoke,
            end: op.end(),
        });
    }
    for v in out.values_mut() {
        v.sort_by_key(|e| e.invoke);
    }
    out
}

#[derive(Debug, PartialEq)]
pub enum Outcome {
    Linearizable,
    /// No order exists. `stuck`: the ops that could not be placed after the longest prefix.
    NotLinearizable {
        prefix: usize,
        stuck: Vec<usize>,
    },
    /// Search budget exhausted.
    Unknown,
}

/// Wing–Gong with memoisation over (set of linearized ops, model state).
pub fn check_key(h: &[Entry], budget: u64) -> Outcome {
    let n = h.len();
    let words = n.div_ceil(64).max(1);
    let mut seen: HashSet<(Vec<u64>, Option<String>)> = HashSet::new();
    // Depth-first over configurations.
    let mut stack: Vec<(Vec<u64>, Option<String>, usize)> = vec![(vec![0; words], None, 0)];
    let mut visited = 0u64;
    let mut best = (0usize, Vec::new());
    let must: usize = h.iter().filter(|e| e.end != u64::MAX).count();
    while let Some((done, state, count_ok)) = stack.pop() {
        visited += 1;
        if visited > budget {
            return Outcome::Unknown;
        }
        if count_ok == must {
            return Outcome::Linearizable;
        }
        let is_done = |i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        // The earliest completion among pending ops: nothing invoked after it may go first.
        let min_end = (0..n)
            .filter(|&i| !is_done(i))
            .map(|i| h[i].end)
            .min()
            .unwrap_or(u64::MAX);
        let mut placed = 0usize;
        let mut stuck = Vec::new();
        for i in 0..n {
            if is_done(i) {
                continue;
            }
            if h[i].invoke > min_end {
                break; // sorted by invoke
            }
            stuck.push(i);
            let Some(next) = step(&state, &h[i].call) else {
                continue;
            };
            let mut d = done.clone();
            d[i / 64] |= 1 << (i % 64);
            let key = (d, next);
            if seen.contains(&key) {
                continue;
            }
            seen.insert(key.clone());
            placed += 1;
            let c = count_ok + usize::from(h[i].end != u64::MAX);
            stack.push((key.0, key.1, c));
        }
        let depth = done.iter().map(|w| w.count_ones() as usize).sum::<usize>();
        if placed == 0 && depth >= best.0 {
            best = (depth, stuck);
        }
    }
    Outcome::NotLinearizable {
        prefix: best.0,
        stuck: best.1,
    }
}

/// Default number of configurations explored per key.
pub const DEFAULT_BUDGET: u64 = 2_000_000;

pub fn check(ops: &[Op], budget: u64) -> Verdict {
    let keys = entries(ops);
    if keys.is_empty() {
        return Verdict::not_applicable("linearizability", "no register ops");
    }
    let mut bad = 0u64;
    let mut unknown = 0u64;
    let mut examples = Vec::new();
    let mut n_ops = 0;
    for (key, h) in &keys {
        n_ops += h.len();
        match check_key(h, budget) {
            Outcome::Linearizable => {}
            Outcome::Unknown => unknown += 1,
            Outcome::NotLinearizable { prefix, stuck } => {
                bad += 1;
                if examples.len() < MAX_EXAMPLES {
                    let ops: Vec<String> = stuck
                        .iter()
                        .take(6)
                        .map(|&i| {
                            let e = &h[i];
                            let end = if e.end == u64::MAX {
                                "?".to_owned()
                            } else {
                                ms(e.end).to_string()
                            };
                            format!(
                                "p{} {:?} [{} ms, {end} ms]",
                                e.process,
                                e.call,
                                ms(e.invoke)
                            )
                        })
                        .collect();
                    examples.push(format!(
                        "key {key}: after {prefix} of {} ops no op can go next: {}",
                        h.len(),
                        ops.join("; ")
                    ));
                }
            }
        }
    }
    let mut v = Verdict::new(
        "linearizability",
        bad,
        examples,
        json!({ "keys": keys.len(), "ops": n_ops, "keys_unknown": unknown }),
    );
    if bad == 0 && unknown > 0 {
        v.valid = None;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(call: Call, p: u64, invoke: u64, end: Option<u64>) -> Entry {
        Entry {
            call,
            process: p,
            invoke,
            end: end.unwrap_or(u64::MAX),
        }
    }

    fn put(v: &str) -> Call {
        Call::Put(v.into())
    }

    fn get(v: Option<&str>) -> Call {
        Call::Get(v.map(str::to_owned))
    }

    #[test]
    fn concurrent_ops_may_reorder() {
        // put 1 and a read of 1 that started before the put finished.
        let h = vec![
            e(get(None), 0, 0, Some(5)),
            e(put("1"), 1, 1, Some(10)),
            e(get(Some("1")), 2, 2, Some(3)),
            e(Call::Cas("1".into(), "2".into()), 0, 11, Some(12)),
            e(get(Some("2")), 1, 13, Some(14)),
        ];
        assert_eq!(check_key(&h, 10_000), Outcome::Linearizable);
    }

    #[test]
    fn fails_on_stale_read() {
        // put 1 completes, then a later read still sees nothing.
        let h = vec![e(put("1"), 1, 0, Some(1)), e(get(None), 2, 2, Some(3))];
        assert!(matches!(
            check_key(&h, 10_000),
            Outcome::NotLinearizable { .. }
        ));
    }

    #[test]
    fn fails_on_lost_acknowledged_write() {
        // Redis-Raft style: an acknowledged put vanishes after a failover.
        let h = vec![
            e(put("1"), 1, 0, Some(1)),
            e(put("2"), 2, 2, Some(3)),
            e(get(Some("1")), 3, 4, Some(5)),
        ];
        assert!(matches!(
            check_key(&h, 10_000),
            Outcome::NotLinearizable { .. }
        ));
    }

    #[test]
    fn info_ops_may_happen_late_or_never() {
        // An unknown put of 2 may take effect long after its invoke...
        let h = vec![
            e(put("1"), 1, 0, Some(1)),
            e(put("2"), 2, 2, None),
            e(get(Some("1")), 3, 10, Some(11)),
            e(get(Some("2")), 3, 20, Some(21)),
        ];
        assert_eq!(check_key(&h, 10_000), Outcome::Linearizable);
        // ...or never.
        let h = vec![
            e(put("1"), 1, 0, Some(1)),
            e(put("2"), 2, 2, None),
            e(get(Some("1")), 3, 10, Some(11)),
        ];
        assert_eq!(check_key(&h, 10_000), Outcome::Linearizable);
        // But not before its invoke.
        let h = vec![e(get(Some("2")), 3, 0, Some(1)), e(put("2"), 2, 2, None)];
        assert!(matches!(
            check_key(&h, 10_000),
            Outcome::NotLinearizable { .. }
        ));
    }

    #[test]
    fn failed_cas_is_not_a_write_and_budget_gives_unknown() {
        let h = vec![
            e(put("1"), 1, 0, Some(1)),
            e(Call::Cas("2".into(), "3".into()), 2, 2, Some(3)),
        ];
        assert!(matches!(
            check_key(&h, 10_000),
            Outcome::NotLinearizable { .. }
        ));
        // Many concurrent unknown writes and a budget of 1 configuration.
        let h: Vec<Entry> = (0..20)
            .map(|i| e(put(&i.to_string()), i, 0, None))
            .chain([e(get(Some("7")), 99, 1, Some(2))])
            .collect();
        assert_eq!(check_key(&h, 1), Outcome::Unknown);
        assert_eq!(check_key(&h, 100_000), Outcome::Linearizable);
    }

    #[test]
    fn a_cas_with_a_note_is_a_cas() {
        use crate::checker::build::H;
        use crate::checker::pair;
        // kv workload: put 1; cas 1→2 by mod_revision; a read of 1 after it is stale.
        let mut hb = H::new();
        hb.ev(1, Kind::Invoke, "put", "k", 0).value = Some(json!("1"));
        hb.ev(1, Kind::Ok, "put", "k", 1);
        hb.ev(1, Kind::Invoke, "cas", "k", 2).value =
            Some(json!(["1", "2", {"compare": "mod_revision", "mod_revision": 7}]));
        hb.ev(1, Kind::Ok, "cas", "k", 3);
        hb.ev(2, Kind::Invoke, "get", "k", 4);
        hb.ev(2, Kind::Ok, "get", "k", 5).value = Some(json!("1"));
        let ops = pair(&hb.sorted());
        assert_eq!(entries(&ops)["k"].len(), 3);
        assert_eq!(check(&ops, 10_000).anomalies, 1);
    }

    #[test]
    fn check_over_ops_reports_the_bad_key() {
        use crate::checker::build::H;
        use crate::checker::pair;
        let mut hb = H::new();
        hb.ev(1, Kind::Invoke, "put", "a", 0).value = Some(json!("1"));
        hb.ev(1, Kind::Ok, "put", "a", 1);
        hb.ev(2, Kind::Invoke, "get", "a", 2);
        hb.ev(2, Kind::Ok, "get", "a", 3).value = Some(Value::Null);
        hb.ev(3, Kind::Invoke, "get", "b", 2);
        hb.ev(3, Kind::Ok, "get", "b", 3).value = Some(Value::Null);
        let v = check(&pair(&hb.sorted()), 10_000);
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert!(v.examples[0].starts_with("key a"));
    }
}
