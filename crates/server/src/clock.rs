//! The leader's log clock (docs/architecture.md, "Rules of the core": log time).
//!
//! Log time is stamped by the leader as *the log time when it took office + its monotonic
//! clock's elapsed time since then*, never its wall clock. A wall-clock jump on any node can
//! then neither shorten nor lengthen a lease, and the time an election takes is not counted
//! (leases stretch by the failover time: the safe direction). The very first leader of a new
//! cluster anchors log time to Unix time, so log time reads as Unix milliseconds.
//!
//! **Test-only hook**: if the environment variable `FENCED_TEST_CLOCK_OFFSET_FILE` names a
//! file holding a signed integer, this node's wall clock reads that many milliseconds off
//! (re-read at every reading). The fault-injection harness (`jepsen/`, clock nemesis) steps
//! it exactly like it steps Redis' clock. Since only the first leader of a new cluster reads
//! the wall clock, a step changes nothing else — which is the point the harness checks.
//! Never set it in production.

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

    /// Whether the clock has anchored for `term` (stamped or peeked in it).
    pub fn anchored(&self, term: u64) -> bool {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.as_ref().is_some_and(|o| o.term == term)
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

/// Environment variable naming the test-only wall-clock offset file (see the module docs).
pub const TEST_CLOCK_OFFSET_ENV: &str = "FENCED_TEST_CLOCK_OFFSET_FILE";

/// The test-only wall-clock offset in ms: 0 unless [`TEST_CLOCK_OFFSET_ENV`] names a readable
/// file holding a signed integer.
fn test_offset_ms() -> i64 {
    std::env::var_os(TEST_CLOCK_OFFSET_ENV)
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or(0)
}

fn unix_ms() -> u64 {
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    real.saturating_add_signed(test_offset_ms())
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
        assert!(c.anchored(2) && !c.anchored(3));
    }

    #[test]
    fn test_offset_file_steps_the_wall_clock_only() {
        let dir = std::env::temp_dir().join(format!("fenced-clock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("offset");
        std::fs::write(&f, "-86400000\n").expect("write");
        // Set for this test only; other tests do not read the variable's file concurrently
        // in a way that matters (a missing/unparsable file reads as 0).
        std::env::set_var(TEST_CLOCK_OFFSET_ENV, &f);
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let skewed = unix_ms();
        std::env::remove_var(TEST_CLOCK_OFFSET_ENV);
        assert!(real - skewed >= 86_399_000, "{real} {skewed}");
        // A leader already in office keeps counting monotonic time, whatever the file says.
        let c = LeaderClock::new();
        let a = c.stamp(1, || 10_000);
        std::fs::write(&f, "99999999").expect("write");
        assert!(c.stamp(1, || 0) - a < 1_000);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn fresh_cluster_anchors_to_unix_time() {
        let c = LeaderClock::new();
        assert!(c.stamp(1, || 0) > 1_600_000_000_000);
    }
}
