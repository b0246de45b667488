//! The run's history, in the fault-injection harness's format (`jepsen/src/history.rs`, the
//! contract of docs/jepsen.md), so the same checkers judge a simulated run and a real one.
//! Times are simulated nanoseconds since the run started.

use std::cell::RefCell;
use std::rc::Rc;

use fenced_jepsen::history::{Event, Kind, Process};

use crate::trace::Trace;

/// Every client's events, in the order they happened.
#[derive(Clone)]
pub struct History {
    events: Rc<RefCell<Vec<Event>>>,
    trace: Trace,
}

/// One invocation waiting for its completion.
pub struct Pending {
    event: Event,
}

impl History {
    pub fn new(trace: Trace) -> History {
        History {
            events: Rc::default(),
            trace,
        }
    }

    /// Record an invocation by `process` (`f` on `key`), with `fill` adding its value, token,
    /// ttl.
    pub fn invoke(
        &self,
        process: u64,
        f: &str,
        key: &str,
        fill: impl FnOnce(Event) -> Event,
    ) -> Pending {
        let e = fill(
            Event::new(
                Process::Client(process),
                Kind::Invoke,
                f,
                self.trace.now_ns(),
            )
            .key(key),
        );
        self.trace.line(&format!("p{process}"), describe(&e));
        self.events.borrow_mut().push(e.clone());
        Pending { event: e }
    }

    /// Complete `p` with `kind`, `fill` adding what the answer carried.
    pub fn complete(&self, p: Pending, kind: Kind, fill: impl FnOnce(Event) -> Event) {
        let mut e = p.event;
        e.kind = kind;
        e.time = self.trace.now_ns();
        e.value = match e.f.as_str() {
            // A read's value is what it returned (set by `fill`); the others keep their input.
            "get" | "read-counter" | "read-ttl" => None,
            _ => e.value,
        };
        e.token = match e.f.as_str() {
            "acquire" => None,
            _ => e.token,
        };
        e.error = None;
        let e = fill(e);
        let who = match &e.process {
            Process::Client(p) => format!("p{p}"),
            _ => "nemesis".to_owned(),
        };
        self.trace.line(&who, describe(&e));
        self.events.borrow_mut().push(e);
    }

    /// Simulated nanoseconds since the run started.
    pub fn now_ns(&self) -> u64 {
        self.trace.now_ns()
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.borrow().clone()
    }
}

fn describe(e: &Event) -> String {
    let mut s = format!("{:?} {} {}", e.kind, e.f, e.key.as_deref().unwrap_or(""));
    if let Some(v) = &e.value {
        s.push_str(&format!(" value={v}"));
    }
    if let Some(t) = e.token {
        s.push_str(&format!(" token={t}"));
    }
    if let Some(t) = e.ttl_ms {
        s.push_str(&format!(" ttl_ms={t}"));
    }
    if let Some(err) = &e.error {
        s.push_str(&format!(" error={err:?}"));
    }
    s
}
