//! Availability: the fraction of ops that completed `ok`, overall and per nemesis window
//! (an op belongs to the window its invoke falls in; time outside every fault is `quiet`),
//! and the fraction that got a definite answer (`ok` or `fail`, e.g. "lock busy") rather
//! than none (`info`: timeout, unreachable).
//! A measurement, not a safety property: it never counts anomalies.

use std::collections::BTreeMap;

use serde_json::json;

use super::{Op, Verdict};
use crate::history::{Event, Kind};

/// A fault's active interval, from the nemesis' `start-<fault>` to its `stop-<fault>`.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub fault: String,
    pub detail: String,
    pub start: u64,
    pub end: u64,
}

/// Nemesis windows from the history (`info` events with `f` = `start-X` / `stop-X`). A fault
/// never stopped lasts until the end of the history.
pub fn nemesis_windows(history: &[Event]) -> Vec<Window> {
    let last = history.iter().map(|e| e.time).max().unwrap_or(0);
    let mut open: BTreeMap<String, Window> = BTreeMap::new();
    let mut out = Vec::new();
    for e in history.iter().filter(|e| e.process.is_nemesis()) {
        if e.kind != Kind::Info {
            continue;
        }
        if let Some(fault) = e.f.strip_prefix("start-") {
            let detail = match &e.value {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => String::new(),
            };
            if let Some(prev) = open.insert(
                fault.to_owned(),
                Window {
                    fault: fault.to_owned(),
                    detail,
                    start: e.time,
                    end: last,
                },
            ) {
                out.push(Window {
                    end: e.time,
                    ..prev
                });
            }
        } else if let Some(fault) = e.f.strip_prefix("stop-") {
            if let Some(w) = open.remove(fault) {
                out.push(Window { end: e.time, ..w });
            }
        }
    }
    out.extend(open.into_values());
    out.sort_by_key(|w| w.start);
    out
}

#[derive(Default, Clone, Copy)]
struct Tally {
    ok: u64,
    fail: u64,
    info: u64,
}

impl Tally {
    fn add(&mut self, k: Kind) {
        match k {
            Kind::Ok => self.ok += 1,
            Kind::Fail => self.fail += 1,
            _ => self.info += 1,
        }
    }

    fn json(&self) -> serde_json::Value {
        let total = self.ok + self.fail + self.info;
        let frac = if total == 0 {
            serde_json::Value::Null
        } else {
            json!((self.ok as f64 / total as f64 * 1000.0).round() / 1000.0)
        };
        let answered = if total == 0 {
            serde_json::Value::Null
        } else {
            json!(((self.ok + self.fail) as f64 / total as f64 * 1000.0).round() / 1000.0)
        };
        json!({ "ok": self.ok, "fail": self.fail, "info": self.info, "ok_fraction": frac,
                "answered_fraction": answered })
    }
}

/// `fs`: which ops count (e.g. `acquire` only); empty = every client op.
pub fn check(ops: &[Op], windows: &[Window], fs: &[&str]) -> Verdict {
    let mut overall = Tally::default();
    let mut per: BTreeMap<String, Tally> = BTreeMap::new();
    for op in ops
        .iter()
        .filter(|o| fs.is_empty() || fs.contains(&o.f.as_str()))
        .filter(|o| o.f != "final-read")
    {
        overall.add(op.kind);
        let label = windows
            .iter()
            .filter(|w| w.start <= op.invoke && op.invoke < w.end)
            .map(|w| w.fault.clone())
            .collect::<Vec<_>>();
        let label = if label.is_empty() {
            "quiet".to_owned()
        } else {
            label.join("+")
        };
        per.entry(label).or_default().add(op.kind);
    }
    let by_window: serde_json::Map<String, serde_json::Value> =
        per.iter().map(|(k, t)| (k.clone(), t.json())).collect();
    Verdict::new(
        "availability",
        0,
        vec![],
        json!({ "overall": overall.json(), "by_window": by_window, "ops": fs }),
    )
}

#[cfg(test)]
mod tests {
    use super::super::build::*;
    use super::super::pair;
    use super::*;
    use crate::history::Process;

    fn nem(f: &str, t_ms: u64) -> Event {
        Event::new(Process::nemesis(), Kind::Info, f, t_ms * 1_000_000).value(json!("isolate n1"))
    }

    #[test]
    fn splits_by_window() {
        let mut h = H::new();
        h.ev(1, Kind::Invoke, "acquire", "L", 0);
        h.ev(1, Kind::Ok, "acquire", "L", 1);
        h.ev(2, Kind::Invoke, "acquire", "L", 15);
        h.ev(2, Kind::Info, "acquire", "L", 16);
        h.ev(3, Kind::Invoke, "acquire", "L", 17);
        h.ev(3, Kind::Fail, "acquire", "L", 18);
        h.events.push(nem("start-partition", 10));
        h.events.push(nem("stop-partition", 20));
        let hist = h.sorted();
        let w = nemesis_windows(&hist);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].detail, "isolate n1");
        let v = check(&pair(&hist), &w, &[]);
        assert_eq!(v.stats["overall"]["ok"], 1);
        assert_eq!(v.stats["by_window"]["quiet"]["ok_fraction"], 1.0);
        assert_eq!(v.stats["by_window"]["partition"]["ok_fraction"], 0.0);
        assert_eq!(v.stats["by_window"]["partition"]["info"], 1);
    }

    #[test]
    fn an_unavailable_run_shows_zero() {
        // "Proven able to fail": a history where nothing succeeds reads as 0 % available.
        let mut h = H::new();
        h.ev(1, Kind::Invoke, "acquire", "L", 0);
        h.ev(1, Kind::Info, "acquire", "L", 1);
        let v = check(&pair(&h.sorted()), &[], &[]);
        assert_eq!(v.stats["overall"]["ok_fraction"], 0.0);
    }
}
