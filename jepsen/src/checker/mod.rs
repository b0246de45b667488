//! Checkers over a history. Each one turns the events into *operations* (an invoke paired with
//! its completion) and reports a verdict, an anomaly count and the first few offending ops.
//!
//! Every checker is sound in one direction: an anomaly it reports is a real violation of the
//! stated property given only what the clients observed (invoke/complete times and results);
//! `info` ops are treated as "may or may not have happened, at any time after their invoke".

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

use crate::history::{Event, Kind, Process};

pub mod agreement;
pub mod availability;
pub mod counter;
pub mod fencing;
pub mod holders;
pub mod limiter;
pub mod linear;
pub mod mutex;
pub mod watch;

/// An invocation and its completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub process: u64,
    pub f: String,
    pub key: Option<String>,
    /// Completion type: `Ok`, `Fail` or `Info` (an invoke never completed counts as `Info`).
    pub kind: Kind,
    pub invoke: u64,
    /// `None`: never completed (the run ended or the client died first).
    pub complete: Option<u64>,
    /// Value given at invoke (`put`, `cas`, writes).
    pub value_in: Option<Value>,
    /// Value returned (`get`, reads).
    pub value_out: Option<Value>,
    /// Token presented at invoke, or granted on an `acquire` ok.
    pub token: Option<u64>,
    pub ttl_ms: Option<u64>,
    pub error: Option<String>,
    /// `throttle` ops that completed `ok`: admitted by the limiter or not.
    pub admitted: Option<bool>,
    /// `acquire`: the grant asked for (`read`, `write`, `permit`); `None`: exclusive.
    pub mode: Option<String>,
    /// `acquire` of a permit: the semaphore's number of permits.
    pub permits: Option<u32>,
}

impl Op {
    pub fn is_ok(&self) -> bool {
        self.kind == Kind::Ok
    }

    /// Completion time, or "never" for ops whose outcome is unknown.
    pub fn end(&self) -> u64 {
        match self.kind {
            Kind::Info => u64::MAX,
            _ => self.complete.unwrap_or(u64::MAX),
        }
    }
}

/// Pair invokes with completions, per client process. Nemesis events are skipped; a completion
/// without an invoke is ignored. Ops are returned in invoke order.
pub fn pair(history: &[Event]) -> Vec<Op> {
    let mut open: HashMap<u64, Op> = HashMap::new();
    let mut done = Vec::new();
    for e in history {
        let Process::Client(p) = e.process else {
            continue;
        };
        match e.kind {
            Kind::Invoke => {
                let op = Op {
                    process: p,
                    f: e.f.clone(),
                    key: e.key.clone(),
                    kind: Kind::Info,
                    invoke: e.time,
                    complete: None,
                    value_in: e.value.clone(),
                    value_out: None,
                    token: e.token,
                    ttl_ms: e.ttl_ms,
                    error: None,
                    admitted: None,
                    mode: e.mode.clone(),
                    permits: e.permits,
                };
                if let Some(prev) = open.insert(p, op) {
                    // A process with two outstanding ops breaks the contract; keep the first as
                    // unknown rather than lose it.
                    done.push(prev);
                }
            }
            k => {
                if let Some(mut op) = open.remove(&p) {
                    op.kind = k;
                    op.complete = Some(e.time);
                    op.value_out = e.value.clone();
                    if e.token.is_some() {
                        op.token = e.token;
                    }
                    op.error = e.error.clone();
                    op.admitted = e.admitted;
                    done.push(op);
                }
            }
        }
    }
    done.extend(open.into_values());
    done.sort_by_key(|o| (o.invoke, o.process));
    done
}

/// One checker's verdict.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Verdict {
    pub checker: String,
    /// `None`: not applicable to this workload/system, or undecided (search limit hit).
    pub valid: Option<bool>,
    pub anomalies: u64,
    /// Human-readable descriptions of the first anomalies.
    pub examples: Vec<String>,
    /// Checker-specific numbers.
    pub stats: Value,
}

/// How many examples a verdict keeps.
pub const MAX_EXAMPLES: usize = 10;

impl Verdict {
    pub fn new(checker: &str, anomalies: u64, examples: Vec<String>, stats: Value) -> Verdict {
        Verdict {
            checker: checker.to_owned(),
            valid: Some(anomalies == 0),
            anomalies,
            examples,
            stats,
        }
    }

    pub fn not_applicable(checker: &str, why: &str) -> Verdict {
        Verdict {
            checker: checker.to_owned(),
            valid: None,
            anomalies: 0,
            examples: vec![],
            stats: serde_json::json!({ "skipped": why }),
        }
    }
}

pub(crate) fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 10.0).round() / 10.0
}

#[cfg(test)]
pub(crate) mod build {
    //! Hand-made histories for the checkers' tests.
    use super::*;

    pub struct H {
        pub events: Vec<Event>,
    }

    impl H {
        pub fn new() -> H {
            H { events: vec![] }
        }

        pub fn ev(&mut self, p: u64, kind: Kind, f: &str, key: &str, t_ms: u64) -> &mut Event {
            self.events
                .push(Event::new(Process::Client(p), kind, f, t_ms * 1_000_000));
            let e = self.events.last_mut().expect("just pushed");
            e.key = Some(key.to_owned());
            e
        }

        pub fn sorted(&self) -> Vec<Event> {
            let mut v = self.events.clone();
            v.sort_by_key(|e| e.time);
            v
        }
    }

    /// acquire by `p` invoked at `inv`, ok at `ok` with `token` and `ttl` (ms).
    pub fn acquire(h: &mut H, p: u64, key: &str, inv: u64, ok: u64, token: Option<u64>, ttl: u64) {
        h.ev(p, Kind::Invoke, "acquire", key, inv).ttl_ms = Some(ttl);
        h.ev(p, Kind::Ok, "acquire", key, ok).token = token;
    }

    pub fn release(h: &mut H, p: u64, key: &str, inv: u64, ok: u64, token: Option<u64>) {
        h.ev(p, Kind::Invoke, "release", key, inv).token = token;
        h.ev(p, Kind::Ok, "release", key, ok);
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    #[test]
    fn pairs_and_keeps_unfinished_as_info() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 1, 2, Some(5), 1000);
        h.ev(2, Kind::Invoke, "acquire", "L", 3);
        let ops = pair(&h.sorted());
        assert_eq!(ops.len(), 2);
        assert!(ops[0].is_ok());
        assert_eq!(ops[0].token, Some(5));
        assert_eq!(ops[1].kind, Kind::Info);
        assert_eq!(ops[1].end(), u64::MAX);
    }
}
