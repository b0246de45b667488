//! Checker `throttle`: no `CL.THROTTLE` key admits more than GCRA permits.
//!
//! GCRA with `max_burst B`, `count N per period P` (emission interval `T = P/N`) admits at
//! most `B + 1 + floor(len / T)` units in any closed interval of length `len` of the
//! limiter's time (the proof is in `fenced_jepsen::checker::limiter`). The limiter's time is
//! log time: the leader's monotonic clock, in whole milliseconds, stamped after the client
//! sent the command and before it got the reply. So if every admission of a set was invoked
//! at or after `a` and completed at or before `b` (simulated time), the log time between
//! their decisions is at most `(b − a)·(1 + ρ) + 2 ms`: `ρ` the nodes' clock-rate drift bound
//! (the sim's clocks drift at most 100 ppm) and 2 ms for whole-millisecond log time at each
//! end. Over every such window (an admission's invoke to an admission's completion) the
//! admitted units must stay within the bound at that length.
//!
//! Only acknowledged admissions count: a denial changes nothing, an unknown outcome (lost
//! connection, `-TIMEOUT`) may or may not have been admitted, so it counts for nothing.

use std::collections::BTreeMap;

use fenced_jepsen::checker::limiter::Policy;
use fenced_jepsen::checker::Verdict;
use serde_json::json;

/// Log time is whole milliseconds: each end of a window may be off by up to 1 ms.
pub const SLACK_NS: u64 = 2_000_000;

/// How one `CL.THROTTLE` ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Denied,
    /// Maybe admitted (lost connection, `-TIMEOUT`).
    Unknown(String),
    /// Refused before anything was decided (`-TRYAGAIN`, …).
    Failed(String),
}

/// One `CL.THROTTLE key max_burst count period quantity`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Throttle {
    pub client: usize,
    pub key: String,
    pub policy: Policy,
    pub quantity: u64,
    pub invoke_ns: u64,
    pub end_ns: u64,
    pub outcome: Outcome,
}

/// The bound for a window of `len_ns` simulated ns: GCRA's bound over the log time it may
/// span.
fn bound(p: &Policy, len_ns: u64, drift_ppm: u64) -> u64 {
    let stretched =
        u128::from(len_ns) * u128::from(1_000_000 + drift_ppm) / 1_000_000 + u128::from(SLACK_NS);
    p.bound(u64::try_from(stretched).unwrap_or(u64::MAX))
}

/// Over every window from an admission's invoke to an admission's completion, the units of
/// the admissions inside it stay within GCRA's bound (with drift `drift_ppm`). `anomalies`
/// counts the keys with a window over it.
pub fn check(ops: &[Throttle], drift_ppm: u64) -> Verdict {
    let mut keys: BTreeMap<&str, Vec<&Throttle>> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.outcome == Outcome::Allowed) {
        keys.entry(&o.key).or_default().push(o);
    }
    let mut bad = Vec::new();
    let mut worst_ratio = 0.0f64;
    for (key, mut adm) in keys {
        adm.sort_by_key(|o| (o.end_ns, o.invoke_ns));
        let mut starts: Vec<u64> = adm.iter().map(|o| o.invoke_ns).collect();
        starts.sort_unstable();
        starts.dedup();
        // The worst window: (excess, start, end, units, bound).
        let mut worst: Option<(u64, u64, u64, u64, u64)> = None;
        for &a in &starts {
            let mut units = 0;
            for o in adm.iter().filter(|o| o.invoke_ns >= a) {
                units += o.quantity;
                let b = bound(&o.policy, o.end_ns - a, drift_ppm);
                worst_ratio = worst_ratio.max(units as f64 / b as f64);
                if units > b && worst.is_none_or(|w| units - b > w.0) {
                    worst = Some((units - b, a, o.end_ns, units, b));
                }
            }
        }
        if let Some((_, a, b, units, limit)) = worst {
            bad.push(format!(
                "{key}: {units} units admitted between {:.3} ms and {:.3} ms, GCRA {:?} permits {limit} ({drift_ppm} ppm drift, {} ms slack)",
                a as f64 / 1e6,
                b as f64 / 1e6,
                adm[0].policy,
                SLACK_NS / 1_000_000
            ));
        }
    }
    let count = |f: fn(&Outcome) -> bool| ops.iter().filter(|o| f(&o.outcome)).count();
    Verdict::new(
        "throttle",
        bad.len() as u64,
        bad,
        json!({
            "throttles": ops.len(),
            "allowed": count(|o| *o == Outcome::Allowed),
            "denied": count(|o| *o == Outcome::Denied),
            "unknown": count(|o| matches!(o, Outcome::Unknown(_))),
            "worst_fill": (worst_ratio * 1000.0).round() / 1000.0,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy {
        max_burst: 2,
        count: 4,
        period_ms: 1_000,
    };

    fn t(inv_ms: u64, end_ms: u64, q: u64, outcome: Outcome) -> Throttle {
        Throttle {
            client: 0,
            key: "t:0".into(),
            policy: P,
            quantity: q,
            invoke_ns: inv_ms * 1_000_000,
            end_ns: end_ms * 1_000_000,
            outcome,
        }
    }

    #[test]
    fn passes_what_gcra_admits() {
        // A burst of 3 (B + 1), then one per 250 ms; denials and unknowns count for nothing.
        let mut h = vec![
            t(0, 5, 1, Outcome::Allowed),
            t(0, 5, 1, Outcome::Allowed),
            t(0, 5, 1, Outcome::Allowed),
            t(0, 5, 1, Outcome::Denied),
            t(0, 9_000, 5, Outcome::Unknown("connection lost".into())),
        ];
        for i in 1..20 {
            h.push(t(250 * i, 250 * i + 3, 1, Outcome::Allowed));
        }
        let v = check(&h, 100);
        assert_eq!(v.valid, Some(true), "{:?}", v.examples);
        // Two units at once, then nothing for 2 emission intervals, then a burst again.
        let h = [
            t(0, 2, 2, Outcome::Allowed),
            t(1, 3, 1, Outcome::Allowed),
            t(1_000, 1_002, 3, Outcome::Allowed),
        ];
        assert_eq!(check(&h, 100).valid, Some(true));
    }

    #[test]
    fn fails_too_many_admissions() {
        // Four in one burst: one more than B + 1.
        let h = [
            t(0, 5, 1, Outcome::Allowed),
            t(0, 5, 1, Outcome::Allowed),
            t(1, 6, 1, Outcome::Allowed),
            t(2, 7, 1, Outcome::Allowed),
        ];
        let v = check(&h, 100);
        assert_eq!(v.valid, Some(false));
        assert!(v.examples[0].contains("4 units"), "{:?}", v.examples);
        // A steady rate above N per period: 1 per 200 ms for 10 s.
        let h: Vec<Throttle> = (0..51)
            .map(|i| t(200 * i, 200 * i + 1, 1, Outcome::Allowed))
            .collect();
        assert_eq!(check(&h, 100).valid, Some(false));
        // A quantity counts its units.
        let h = [t(0, 1, 2, Outcome::Allowed), t(0, 1, 2, Outcome::Allowed)];
        assert_eq!(check(&h, 100).valid, Some(false));
        // Keys are separate: the same ops split over two keys pass.
        let mut h = vec![t(0, 5, 1, Outcome::Allowed), t(0, 5, 1, Outcome::Allowed)];
        let mut other = h.clone();
        for o in &mut other {
            o.key = "t:1".into();
        }
        h.extend(other);
        assert_eq!(check(&h, 100).valid, Some(true));
    }
}
