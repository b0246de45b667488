//! Rate limiter: over-admission, proven from the history alone (the `limiter` workload).
//!
//! Every `throttle` op asks the limiter for `quantity` units of one key under a GCRA policy in
//! redis-cell's terms, `max_burst B, count N per period P` (the invoke's `value` carries it).
//! With the emission interval `T = P / N`, GCRA admits at most
//!
//! ```text
//!     bound(len) = B + 1 + floor(len / T)       units in any closed interval of length len
//! ```
//!
//! of *its own* time. Proof: GCRA keeps a theoretical arrival time `tat` and admits a request
//! of `q` units at time `s` iff `max(tat, s) + q·T − (B + 1)·T ≤ s`, then sets
//! `tat = max(tat, s) + q·T`. Let admissions `1..k` (units `q_1..q_k`) happen at times
//! `s_1 ≤ … ≤ s_k` inside a window of length `len`. After the first, `tat ≥ s_1 + q_1·T`, and
//! each later admission raises `tat` by at least its `q_i·T`, so before the k-th
//! `tat ≥ s_1 + (q_1 + … + q_{k−1})·T`. Admitting the k-th needs
//! `tat + q_k·T − (B + 1)·T ≤ s_k ≤ s_1 + len`, hence `q_1 + … + q_k ≤ B + 1 + len / T`.
//! A token bucket of capacity `B + 1` refilled at `N / P` (the Lua script's policy in this
//! workload) has the same bound: what it hands out in the window is at most what it held at
//! its start plus what flowed in during it.
//!
//! **Whose time.** fenced decides with *log time*: the leader stamps a command with the last
//! committed log time when it took office plus its monotonic clock's elapsed time since, and
//! `now = max(previous now, stamp)`. So between two applied commands log time advances by at
//! most the real time between their stamps (a failover's gap is not counted; the `max` only
//! holds time back), and a command is stamped after its client sent it and before the client
//! got the answer. The history records CLOCK_MONOTONIC of the same machine. Hence: if every
//! op of a set was invoked at or after `a` and completed at or before `b`, their decisions
//! were taken within a log-time interval of length at most `b − a`, and the policy allows at
//! most `bound(b − a)` units among them. Clients' clocks play no part in this argument (a
//! client that sends its own "now", like the Lua script, is exactly what it does not cover:
//! such a limiter obeys the bound only in the clients' time).
//!
//! **Tolerance.** The checked bound is `bound((b − a)·(1 + RATE_TOLERANCE_PPM·10⁻⁶) +
//! SLACK_NS)`: `SLACK_NS` (2 ms) because fenced keeps log time in whole milliseconds (each
//! end of a window can be off by up to 1 ms) and `RATE_TOLERANCE_PPM` (1000 ppm) for clock
//! rate differences (the leader's monotonic clock and the history's are one clock on this
//! machine; the Lua clients read the wall clock, which NTP may slew by up to 500 ppm).
//!
//! **What counts.** Only `ok` ops with `admitted: true` count, each at its whole
//! invoke–complete interval: an op is in a window only if that interval lies inside it, so
//! every reported excess is a real violation whatever the network did. `info` ops (a
//! timeout: maybe admitted, maybe not) never count towards over-admission; `fail` ops and
//! `ok` denials (GCRA leaves its state alone on a denial) are ignored. Windows slide over every
//! pair (an admitted op's invoke, an admitted op's completion).
//!
//! `anomalies` is the largest excess: units admitted beyond the bound in the worst window —
//! how many admissions the policy could not have let through. (How many admitted ops close
//! some violating window is in the stats as `violating_admissions`; it is no measure of size:
//! once a limiter has forgotten its state, every later admission closes a window that starts
//! before the loss.) The stats add the
//! worst window, the largest count in any window of a few fixed lengths
//! against the bound for that length, and a coarse under-admission figure (information only,
//! never an anomaly): units admitted over the run against what the policy allowed over it,
//! with `info` ops counted as possibly admitted for the upper figure.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{ms, Op, Verdict, MAX_EXAMPLES};
use crate::history::Kind;

/// Log time is whole milliseconds: either end of a window may be off by up to 1 ms.
pub const SLACK_NS: u64 = 2_000_000;
/// Clock rate differences allowed for (parts per million).
pub const RATE_TOLERANCE_PPM: u64 = 1_000;

/// A GCRA policy in redis-cell's terms (`CL.THROTTLE key max_burst count period quantity`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub max_burst: u64,
    pub count: u64,
    pub period_ms: u64,
}

impl Policy {
    /// From a `throttle` invoke's value:
    /// `{"max_burst":B,"count":N,"period_s":P,...}` (or `period_ms`).
    pub fn from_value(v: &Value) -> Option<Policy> {
        let max_burst = v.get("max_burst")?.as_u64()?;
        let count = v.get("count")?.as_u64().filter(|c| *c > 0)?;
        let period_ms = match (v.get("period_ms"), v.get("period_s")) {
            (Some(p), _) => p.as_u64()?,
            (None, Some(p)) => p.as_u64()?.checked_mul(1000)?,
            (None, None) => return None,
        };
        (period_ms > 0).then_some(Policy {
            max_burst,
            count,
            period_ms,
        })
    }

    /// Most units the policy admits in a closed interval of `len_ns` of the limiter's time:
    /// `B + 1 + floor(len / T)` with `T = period / count`.
    pub fn bound(&self, len_ns: u64) -> u64 {
        let emitted =
            u128::from(len_ns) * u128::from(self.count) / (u128::from(self.period_ms) * 1_000_000);
        self.max_burst + 1 + u64::try_from(emitted).unwrap_or(u64::MAX)
    }

    /// [`Policy::bound`] with the tolerance for the limiter's clock (see the module docs).
    pub fn checked_bound(&self, len_ns: u64) -> u64 {
        let stretched = u128::from(len_ns) * u128::from(1_000_000 + RATE_TOLERANCE_PPM) / 1_000_000
            + u128::from(SLACK_NS);
        self.bound(u64::try_from(stretched).unwrap_or(u64::MAX))
    }

    /// The emission interval `T` in ms.
    pub fn emission_ms(&self) -> f64 {
        self.period_ms as f64 / self.count as f64
    }
}

/// Units an op asked for (`quantity` in its invoke value, default 1).
fn quantity(op: &Op) -> u64 {
    op.value_in
        .as_ref()
        .and_then(|v| v.get("quantity"))
        .and_then(Value::as_u64)
        .unwrap_or(1)
}

/// An admitted op: `[inv, end]` is when the limiter may have decided it.
#[derive(Clone, Copy, Debug)]
struct Adm<'a> {
    inv: u64,
    end: u64,
    q: u64,
    op: &'a Op,
}

/// Window lengths (ms) reported in the stats besides the worst window: one emission interval,
/// 1 s, one period, 10 s.
fn report_lengths(p: &Policy) -> Vec<u64> {
    let mut v = vec![(p.period_ms / p.count).max(1), 1_000, p.period_ms, 10_000];
    v.sort_unstable();
    v.dedup();
    v
}

/// The verdict for one key.
struct KeyResult {
    /// The worst window's excess (0: none over the bound).
    excess: u64,
    examples: Vec<String>,
    stats: Value,
}

fn check_key(key: &str, policy: Policy, ops: &[&Op]) -> KeyResult {
    let mut adm: Vec<Adm> = ops
        .iter()
        .filter(|o| o.kind == Kind::Ok && o.admitted == Some(true))
        .filter_map(|o| {
            o.complete.map(|end| Adm {
                inv: o.invoke,
                end,
                q: quantity(o),
                op: o,
            })
        })
        .collect();
    // Starts: every distinct invoke time; ends: ops by completion.
    adm.sort_by_key(|a| (a.end, a.inv));
    let mut starts: Vec<u64> = adm.iter().map(|a| a.inv).collect();
    starts.sort_unstable();
    starts.dedup();
    let lengths = report_lengths(&policy);
    // Per fixed length: (largest count, its window start).
    let mut fixed: Vec<(u64, u64)> = vec![(0, 0); lengths.len()];
    // Per admitted op (index into `adm`): the window it closes with the largest excess over
    // the bound, as (excess, start, units, bound) — `None` if every window it closes is
    // within the bound.
    let mut closes: Vec<Option<(u64, u64, u64, u64)>> = vec![None; adm.len()];
    // Worst window: (excess, a, b, count, bound).
    let mut worst: Option<(u64, u64, u64, u64, u64)> = None;
    for &a in &starts {
        let mut sum = 0u64;
        let mut fixed_here = vec![0u64; lengths.len()];
        for (j, x) in adm.iter().enumerate() {
            if x.inv < a {
                continue;
            }
            sum += x.q;
            let len = x.end - a;
            for (k, l) in lengths.iter().enumerate() {
                if len <= l * 1_000_000 {
                    fixed_here[k] = sum;
                }
            }
            let bound = policy.checked_bound(len);
            if sum > bound {
                let excess = sum - bound;
                if closes[j].is_none_or(|(e, ..)| excess > e) {
                    closes[j] = Some((excess, a, sum, bound));
                }
                let better = match worst {
                    None => true,
                    Some((e, wa, wb, ..)) => excess > e || (excess == e && len < wb - wa),
                };
                if better {
                    worst = Some((excess, a, x.end, sum, bound));
                }
            }
        }
        for (k, c) in fixed_here.into_iter().enumerate() {
            if c > fixed[k].0 {
                fixed[k] = (c, a);
            }
        }
    }
    let n_violating = closes.iter().filter(|c| c.is_some()).count() as u64;
    let mut examples = Vec::new();
    let mut worst_json = Value::Null;
    if let Some((excess, a, b, count, bound)) = worst {
        let inside: Vec<&Adm> = adm.iter().filter(|x| x.inv >= a && x.end <= b).collect();
        let list: Vec<String> = inside
            .iter()
            .take(40)
            .map(|x| {
                format!(
                    "p{} [{:.4}, {:.4}]",
                    x.op.process,
                    x.inv as f64 / 1e9,
                    x.end as f64 / 1e9
                )
            })
            .collect();
        examples.push(format!(
            "key {key}: {count} units admitted by ops that ran entirely inside [{:.3} s, {:.3} s] \
             ({} ms), the policy allows at most {bound} there (B + 1 + floor(len / T) = {} + 1 + \
             floor({} / {:.1}), with {} ms slack and {} ppm): {excess} too many; ops (process \
             [invoke s, ok s]): {}{}",
            a as f64 / 1e9,
            b as f64 / 1e9,
            ms(b - a),
            policy.max_burst,
            ms(b - a),
            policy.emission_ms(),
            SLACK_NS / 1_000_000,
            RATE_TOLERANCE_PPM,
            list.join(", "),
            if inside.len() > list.len() {
                format!(", … ({} in all)", inside.len())
            } else {
                String::new()
            }
        ));
        worst_json = json!({
            "from_ms": ms(a), "to_ms": ms(b), "len_ms": ms(b - a),
            "admitted": count, "bound": bound, "excess": excess,
            "ops": inside.iter().take(100).map(|x| json!({
                "process": x.op.process, "invoke_ms": ms(x.inv), "ok_ms": ms(x.end),
                "value": x.op.value_out,
            })).collect::<Vec<_>>(),
        });
    }
    // Further examples: the first violating ops, each with its own worst window.
    for (x, c) in adm.iter().zip(&closes) {
        let Some((_, best_a, best_sum, best_bound)) = *c else {
            continue;
        };
        if examples.len() >= MAX_EXAMPLES {
            break;
        }
        examples.push(format!(
            "key {key}: p{} admitted [{:.3} s, {:.3} s] closes [{:.3} s, {:.3} s] with {best_sum} \
             units admitted, bound {best_bound}",
            x.op.process,
            x.inv as f64 / 1e9,
            x.end as f64 / 1e9,
            best_a as f64 / 1e9,
            x.end as f64 / 1e9,
        ));
    }
    // Coarse under-admission (information): the run's span of throttle ops.
    let first = ops.iter().map(|o| o.invoke).min().unwrap_or(0);
    let last = ops
        .iter()
        .filter_map(|o| o.complete)
        .max()
        .unwrap_or(first)
        .max(first);
    let admitted_units: u64 = adm.iter().map(|x| x.q).sum();
    let info_units: u64 = ops
        .iter()
        .filter(|o| o.kind == Kind::Info)
        .map(|o| quantity(o))
        .sum();
    let denied = ops
        .iter()
        .filter(|o| o.kind == Kind::Ok && o.admitted == Some(false))
        .count();
    let allowed = policy.bound(last - first);
    let span_s = (last - first) as f64 / 1e9;
    let frac = |x: u64| (x as f64 / allowed.max(1) as f64 * 1000.0).round() / 1000.0;
    let fixed_json: Vec<Value> = lengths
        .iter()
        .zip(&fixed)
        .map(|(l, (c, a))| {
            json!({
                "len_ms": l,
                "max_admitted": c,
                "from_ms": ms(*a),
                "bound": policy.checked_bound(l * 1_000_000),
            })
        })
        .collect();
    let stats = json!({
        "key": key,
        "policy": {
            "max_burst": policy.max_burst,
            "count": policy.count,
            "period_ms": policy.period_ms,
            "emission_interval_ms": policy.emission_ms(),
        },
        "requests": ops.len(),
        "admitted": admitted_units,
        "denied": denied,
        "fail": ops.iter().filter(|o| o.kind == Kind::Fail).count(),
        "info_possibly_admitted": info_units,
        "violating_admissions": n_violating,
        "worst_window": worst_json,
        "windows": fixed_json,
        "rate": {
            "span_s": (span_s * 1000.0).round() / 1000.0,
            "admitted_per_s": if span_s > 0.0 {
                ((admitted_units as f64 / span_s) * 100.0).round() / 100.0
            } else { 0.0 },
            "policy_per_s": policy.count as f64 * 1000.0 / policy.period_ms as f64,
            "allowed_over_span": allowed,
            "admitted_fraction_of_allowed": frac(admitted_units),
            "at_most_fraction_with_info": frac(admitted_units + info_units),
        },
    });
    KeyResult {
        excess: worst.map_or(0, |w| w.0),
        examples,
        stats,
    }
}

/// Check every key's `throttle` ops against the policy their invokes carry.
pub fn check(ops: &[Op]) -> Verdict {
    let mut by_key: BTreeMap<String, Vec<&Op>> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.f == "throttle") {
        by_key
            .entry(o.key.clone().unwrap_or_default())
            .or_default()
            .push(o);
    }
    if by_key.is_empty() {
        return Verdict::not_applicable("over-admission", "no throttle ops");
    }
    let mut anomalies = 0;
    let mut examples = vec![];
    let mut keys = serde_json::Map::new();
    for (key, list) in &by_key {
        let Some(policy) = list
            .iter()
            .find_map(|o| o.value_in.as_ref().and_then(Policy::from_value))
        else {
            keys.insert(
                key.clone(),
                json!({ "skipped": "no policy in the invokes" }),
            );
            continue;
        };
        let r = check_key(key, policy, list);
        anomalies += r.excess;
        examples.extend(r.examples);
        keys.insert(key.clone(), r.stats);
    }
    examples.truncate(MAX_EXAMPLES);
    Verdict::new(
        "over-admission",
        anomalies,
        examples,
        json!({ "keys": keys, "slack_ms": SLACK_NS / 1_000_000,
                "rate_tolerance_ppm": RATE_TOLERANCE_PPM }),
    )
}

#[cfg(test)]
mod tests {
    use super::super::build::*;
    use super::super::pair;
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const KEY: &str = "rl";

    fn policy_value(b: u64, n: u64, p_s: u64) -> Value {
        json!({"max_burst": b, "count": n, "period_s": p_s, "quantity": 1})
    }

    /// A throttle by `p` invoked at `inv_us` and completed at `end_us` (microseconds).
    fn throttle(h: &mut H, p: u64, pol: &Value, inv_us: u64, end_us: u64, kind: Kind, adm: bool) {
        h.ev(p, Kind::Invoke, "throttle", KEY, 0).value = Some(pol.clone());
        let i = h.events.len() - 1;
        h.events[i].time = inv_us * 1_000;
        let e = h.ev(p, kind, "throttle", KEY, 0);
        e.time = end_us * 1_000;
        if kind == Kind::Ok {
            e.admitted = Some(adm);
        }
    }

    fn run(h: &H) -> Verdict {
        check(&pair(&h.sorted()))
    }

    #[test]
    fn bound_is_b_plus_one_plus_windows_of_t() {
        let p = Policy {
            max_burst: 5,
            count: 20,
            period_ms: 2_000,
        };
        assert_eq!(p.emission_ms(), 100.0);
        assert_eq!(p.bound(0), 6);
        assert_eq!(p.bound(99_999_999), 6);
        assert_eq!(p.bound(100_000_000), 7);
        assert_eq!(p.bound(2_000_000_000), 26);
        // The tolerance: 2 ms slack and 1000 ppm.
        assert_eq!(p.checked_bound(97_800_000), 6);
        assert_eq!(p.checked_bound(97_903_000), 7);
        assert_eq!(p.checked_bound(10_000_000_000), 6 + 100);
        assert_eq!(
            Policy::from_value(&policy_value(5, 20, 2)),
            Some(p),
            "period_s"
        );
        assert_eq!(
            Policy::from_value(&json!({"max_burst":1,"count":0,"period_s":1})),
            None
        );
        assert_eq!(Policy::from_value(&json!({"count":1,"period_s":1})), None);
    }

    #[test]
    fn spaced_admissions_pass() {
        // B = 0, one per second: admissions 1 s apart, with short ops.
        let pol = policy_value(0, 1, 1);
        let mut h = H::new();
        for i in 0..10 {
            throttle(
                &mut h,
                i % 3,
                &pol,
                i * 1_000_000,
                i * 1_000_000 + 5_000,
                Kind::Ok,
                true,
            );
            // Denials in between are ignored.
            throttle(
                &mut h,
                7,
                &pol,
                i * 1_000_000 + 300_000,
                i * 1_000_000 + 310_000,
                Kind::Ok,
                false,
            );
        }
        let v = run(&h);
        assert_eq!(v.valid, Some(true), "{v:?}");
        let s = &v.stats["keys"][KEY];
        assert_eq!(s["admitted"], 10);
        assert_eq!(s["denied"], 10);
        assert_eq!(s["violating_admissions"], 0);
    }

    #[test]
    fn too_many_in_a_window_fails() {
        // B = 1 (2 at once), 1 per second; 5 admissions within 50 ms: 3 too many.
        let pol = policy_value(1, 1, 1);
        let mut h = H::new();
        for i in 0..5 {
            throttle(
                &mut h,
                i,
                &pol,
                1_000_000 + i * 10_000,
                1_001_000 + i * 10_000,
                Kind::Ok,
                true,
            );
        }
        let v = run(&h);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert_eq!(v.anomalies, 3);
        let w = &v.stats["keys"][KEY]["worst_window"];
        assert_eq!(w["admitted"], 5);
        assert_eq!(w["bound"], 2);
        assert_eq!(w["excess"], 3);
        assert!(v.examples[0].contains("3 too many"), "{:?}", v.examples);
    }

    #[test]
    fn info_and_fail_never_count_as_admitted() {
        let pol = policy_value(0, 1, 1);
        let mut h = H::new();
        throttle(&mut h, 0, &pol, 0, 1_000, Kind::Ok, true);
        for p in 1..20 {
            throttle(&mut h, p, &pol, 2_000, 3_000 + p, Kind::Info, false);
            throttle(&mut h, 100 + p, &pol, 2_000, 3_000 + p, Kind::Fail, false);
        }
        // An invoke never completed is info too.
        h.ev(500, Kind::Invoke, "throttle", KEY, 0).value = Some(pol.clone());
        let v = run(&h);
        assert_eq!(v.valid, Some(true), "{v:?}");
        let s = &v.stats["keys"][KEY];
        assert_eq!(s["info_possibly_admitted"], 20);
        assert_eq!(s["fail"], 19);
    }

    #[test]
    fn admissions_are_placed_anywhere_in_their_interval() {
        // B = 0, one per second. X ran [0, 1.5 s], Y [1.0 s, 1.01 s]: X may have been
        // admitted at 0 and Y at 1.0 s — valid, although their completions are 490 ms apart.
        let pol = policy_value(0, 1, 1);
        let mut h = H::new();
        throttle(&mut h, 0, &pol, 0, 1_500_000, Kind::Ok, true);
        throttle(&mut h, 1, &pol, 1_000_000, 1_010_000, Kind::Ok, true);
        assert_eq!(run(&h).valid, Some(true));
        // But two short ops 100 ms apart inside X's interval are a violation whatever X did.
        throttle(&mut h, 2, &pol, 100_000, 110_000, Kind::Ok, true);
        throttle(&mut h, 3, &pol, 200_000, 210_000, Kind::Ok, true);
        let v = run(&h);
        assert_eq!(v.valid, Some(false), "{v:?}");
        // The worst window holds the two short ops and Y: 3 in 910 ms, where 1 fits.
        let w = &v.stats["keys"][KEY]["worst_window"];
        assert_eq!(w["from_ms"], 100.0);
        assert_eq!(w["to_ms"], 1010.0);
        assert_eq!(w["excess"], 2);
    }

    #[test]
    fn bursts_at_the_window_edge() {
        // B = 0, one per second: two admissions exactly one period apart are allowed; 1 ms
        // (log time truncation) and 0.1 % are tolerated; 10 ms too early is a violation.
        let pol = policy_value(0, 1, 1);
        for (gap_us, valid) in [
            (1_000_000, true),
            (999_000, true),
            (998_500, true),
            (990_000, false),
        ] {
            let mut h = H::new();
            throttle(&mut h, 0, &pol, 5_000_000, 5_000_000, Kind::Ok, true);
            throttle(
                &mut h,
                1,
                &pol,
                5_000_000 + gap_us,
                5_000_000 + gap_us,
                Kind::Ok,
                true,
            );
            assert_eq!(run(&h).valid, Some(valid), "gap {gap_us} µs");
        }
        // A full burst of B + 1 at the very end of one period and again right at the start
        // of the next passes only as far as the refill allows: B = 2, 1 per second.
        let pol = policy_value(2, 1, 1);
        let mut h = H::new();
        for i in 0..3 {
            throttle(&mut h, i, &pol, 999_000 + i, 999_100 + i, Kind::Ok, true);
        }
        throttle(&mut h, 9, &pol, 2_000_000, 2_000_100, Kind::Ok, true);
        assert_eq!(run(&h).valid, Some(true));
        throttle(&mut h, 10, &pol, 2_000_200, 2_000_300, Kind::Ok, true);
        let v = run(&h);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert_eq!(v.anomalies, 1);
    }

    #[test]
    fn quantities_count_as_units() {
        let pol = json!({"max_burst": 3, "count": 1, "period_s": 10, "quantity": 2});
        let mut h = H::new();
        throttle(&mut h, 0, &pol, 0, 10, Kind::Ok, true);
        throttle(&mut h, 1, &pol, 20, 30, Kind::Ok, true);
        assert_eq!(run(&h).valid, Some(true), "4 units = B + 1");
        throttle(&mut h, 2, &pol, 40, 50, Kind::Ok, true);
        assert_eq!(run(&h).valid, Some(false), "6 units");
    }

    #[test]
    fn keys_are_checked_separately_and_no_policy_is_skipped() {
        let pol = policy_value(0, 1, 1);
        let mut h = H::new();
        throttle(&mut h, 0, &pol, 0, 10, Kind::Ok, true);
        h.ev(1, Kind::Invoke, "throttle", "other", 0).value = Some(pol.clone());
        h.ev(1, Kind::Ok, "throttle", "other", 0).admitted = Some(true);
        assert_eq!(run(&h).valid, Some(true), "one admission per key");
        h.ev(2, Kind::Invoke, "throttle", "bare", 0);
        h.ev(2, Kind::Ok, "throttle", "bare", 0).admitted = Some(true);
        let v = run(&h);
        assert_eq!(v.valid, Some(true));
        assert!(v.stats["keys"]["bare"]["skipped"].is_string());
        assert_eq!(check(&[]).valid, None);
    }

    /// GCRA as redis-cell specifies it, in integer ns.
    struct Gcra {
        tat: u64,
        t: u64,
        tau: u64,
    }

    impl Gcra {
        fn new(b: u64, n: u64, p_ms: u64) -> Gcra {
            let t = p_ms * 1_000_000 / n;
            Gcra {
                tat: 0,
                t,
                tau: t * (b + 1),
            }
        }

        fn allow(&mut self, now: u64) -> bool {
            let new_tat = self.tat.max(now) + self.t;
            if new_tat.saturating_sub(self.tau) <= now {
                self.tat = new_tat;
                true
            } else {
                false
            }
        }
    }

    /// Clients hammer a GCRA limiter that decides at a random point of each op's interval:
    /// always valid, and the bound is reached (it is tight, not a loose upper limit). A
    /// limiter that forgets its state once (a restart with empty data) is caught.
    #[test]
    fn simulated_gcra_passes_reaches_the_bound_and_a_forgetful_one_fails() {
        for forget in [false, true] {
            let mut rng = StdRng::seed_from_u64(7);
            let pol = policy_value(5, 20, 2);
            let mut g = Gcra::new(5, 20, 2_000);
            let mut h = H::new();
            let mut t = 1_000_000u64; // µs
            for i in 0..2_000u64 {
                t += rng.gen_range(1..3_000);
                let decide = t + rng.gen_range(0..500);
                let end = decide + rng.gen_range(0..500);
                if forget && i == 1_000 {
                    g = Gcra::new(5, 20, 2_000);
                }
                let adm = g.allow(decide * 1_000);
                throttle(&mut h, i % 5, &pol, t, end, Kind::Ok, adm);
            }
            let v = run(&h);
            let s = &v.stats["keys"][KEY];
            if forget {
                assert_eq!(v.valid, Some(false), "{}", s["worst_window"]);
                // Forgetting a drained limiter hands out a whole fresh burst (B + 1 = 6) that
                // the policy did not allow; a window around the reset shows (almost) all of it.
                assert!((5..=6).contains(&v.anomalies), "{v:?}");
            } else {
                assert_eq!(v.valid, Some(true), "{}", s["worst_window"]);
                // Hammered far above the rate: some one-period window reaches B + 1 + N.
                let w = s["windows"]
                    .as_array()
                    .and_then(|a| a.iter().find(|w| w["len_ms"] == 2_000))
                    .expect("2 s window");
                assert!(w["max_admitted"].as_u64() >= Some(25), "{w}");
                assert!(s["rate"]["admitted_fraction_of_allowed"].as_f64() > Some(0.9));
            }
        }
    }

    /// The token-bucket Lua script with "now" from each client's own clock: one client whose
    /// clock is 5 s ahead refills the bucket on every call that follows one of the others.
    #[test]
    fn simulated_token_bucket_with_a_skewed_client_fails() {
        struct Bucket {
            tokens: f64,
            last: f64,
        }
        let (rate, cap) = (0.01f64, 6.0f64); // per ms; B + 1
        let pol = policy_value(5, 20, 2);
        for skew_ms in [0.0f64, 5_000.0] {
            let mut b = Bucket {
                tokens: cap,
                last: 0.0,
            };
            let mut rng = StdRng::seed_from_u64(3);
            let mut h = H::new();
            let mut t = 1_000_000u64;
            for i in 0..3_000u64 {
                t += rng.gen_range(1..3_000);
                let p = i % 5;
                let now = t as f64 / 1_000.0 + if p == 0 { skew_ms } else { 0.0 };
                let delta = (now - b.last).max(0.0);
                let filled = cap.min(b.tokens + delta * rate);
                let adm = filled >= 1.0;
                b.tokens = if adm { filled - 1.0 } else { filled };
                b.last = now;
                throttle(&mut h, p, &pol, t, t + 200, Kind::Ok, adm);
            }
            let v = run(&h);
            assert_eq!(v.valid, Some(skew_ms == 0.0), "skew {skew_ms}: {v:?}");
        }
    }
}
