//! The leader's log clock (design.md §3).
//!
//! Log time is stamped by the leader as *the log time when it took office + its monotonic
//! clock's elapsed time since then*, never its wall clock. A wall-clock jump on any node can
//! then neither shorten nor lengthen a lease, and the time an election takes is not counted
//! (leases stretch by the failover time: the safe direction). The very first leader of a new
//! cluster anchors log time to Unix time, so log time reads as Unix milliseconds.

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug)]
struct Office {
    term: u64,
    base_ms: u64,
    since: Instant,
}

#[derive(Debug, Default)]
pub struct LeaderClock {
    inner: Mutex<(Option<Office>, u64)>,
}

impl LeaderClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// The log time for an entry proposed now by the leader of `term`. `applied_now` is the
    /// state machine's log time, read only when the term changes (taking office).
    /// Never smaller than a time this node stamped before.
    pub fn stamp(&self, term: u64, applied_now: impl FnOnce() -> u64) -> u64 {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (office, last) = &mut *guard;
        let t = Self::read(office, term, applied_now);
        *last = (*last).max(t);
        *last
    }

    /// The log time now, without recording it.
    pub fn peek(&self, term: u64, applied_now: impl FnOnce() -> u64) -> u64 {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (office, last) = &mut *guard;
        Self::read(office, term, applied_now).max(*last)
    }

    fn read(office: &mut Option<Office>, term: u64, applied_now: impl FnOnce() -> u64) -> u64 {
        let current = match office {
            Some(o) if o.term == term => o,
            _ => {
                let base = match applied_now() {
                    0 => unix_ms(),
                    t => t,
                };
                office.insert(Office {
                    term,
                    base_ms: base,
                    since: Instant::now(),
                })
            }
        };
        current.base_ms + current.since.elapsed().as_millis() as u64
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_from_applied_time_on_new_term_and_never_goes_back() {
        let c = LeaderClock::new();
        let a = c.stamp(1, || 10_000);
        assert!((10_000..10_100).contains(&a));
        // A new term continuing from an older applied time cannot go below what was stamped.
        let b = c.stamp(2, || 5_000);
        assert!(b >= a);
        // The same term does not re-read the applied time.
        let d = c.stamp(2, || panic!("re-read"));
        assert!(d >= b);
    }

    #[test]
    fn fresh_cluster_anchors_to_unix_time() {
        let c = LeaderClock::new();
        assert!(c.stamp(1, || 0) > 1_600_000_000_000);
    }
}
