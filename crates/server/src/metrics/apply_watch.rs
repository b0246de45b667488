//! Is apply stuck? The entry this node is applying now and since when, stamped by the
//! storage observer's `applying`/`applied` hooks (two atomics, no lock), so that a node whose
//! apply hangs — a poisoned log entry (docs/operations.md, "Recover from a poisoned log
//! entry") — still says which index and for how long: `/health` answers unhealthy
//! ([`crate::node::Node::health`]) and the watchdog thread logs a warning every
//! [`WARN_EVERY`] ([`warn_while_stuck`]). Neither reads the state machine, whose lock the
//! hung apply holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// An entry applying for this long counts as stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(5);
/// How often the watchdog logs a stuck apply.
pub const WARN_EVERY: Duration = Duration::from_secs(5);

/// The entry being applied, if any (see the module docs).
pub struct ApplyWatch {
    epoch: Instant,
    index: AtomicU64,
    /// Nanoseconds since `epoch` + 1 when the entry began applying; 0: none is.
    since: AtomicU64,
}

impl Default for ApplyWatch {
    fn default() -> Self {
        ApplyWatch {
            epoch: Instant::now(),
            index: AtomicU64::new(0),
            since: AtomicU64::new(0),
        }
    }
}

impl ApplyWatch {
    fn nanos(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    pub fn applying(&self, index: u64) {
        self.since.store(0, Ordering::Release);
        self.index.store(index, Ordering::Release);
        self.since.store(self.nanos() + 1, Ordering::Release);
    }

    pub fn applied(&self, _index: u64) {
        self.since.store(0, Ordering::Release);
    }

    /// The entry being applied and for how long, if one is.
    pub fn current(&self) -> Option<(u64, Duration)> {
        let since = self.since.load(Ordering::Acquire);
        let index = self.index.load(Ordering::Acquire);
        if since == 0 || self.since.load(Ordering::Acquire) != since {
            return None;
        }
        Some((
            index,
            Duration::from_nanos(self.nanos().saturating_sub(since - 1)),
        ))
    }

    /// The entry being applied if it has been for at least [`STUCK_AFTER`].
    pub fn stuck(&self) -> Option<(u64, Duration)> {
        self.current().filter(|(_, took)| *took >= STUCK_AFTER)
    }
}

/// What `/health` and the log say of a stuck apply.
pub fn describe(index: u64, took: Duration) -> String {
    format!(
        "apply stuck: log entry {index} has been applying for {} s (a poisoned entry? see \
         docs/operations.md, \"Recover from a poisoned log entry\")",
        took.as_secs()
    )
}

/// Log a warning every [`WARN_EVERY`] while one entry has been applying for more than
/// [`STUCK_AFTER`], until `stop`. Runs on the watchdog thread's runtime, never on the node's
/// (whose workers a hung apply, and the readers waiting for its lock, can all hold).
pub async fn warn_while_stuck(watch: &ApplyWatch, stop: impl std::future::Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut last_warned: Option<(u64, Instant)> = None;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let Some((index, took)) = watch.stuck() else {
            last_warned = None;
            continue;
        };
        let due = match last_warned {
            Some((i, at)) => i != index || at.elapsed() >= WARN_EVERY,
            None => true,
        };
        if due {
            tracing::warn!(index, secs = took.as_secs(), "{}", describe(index, took));
            last_warned = Some((index, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_applying_is_seen_until_applied() {
        let w = ApplyWatch::default();
        assert_eq!(w.current(), None);
        w.applying(12);
        let (index, took) = w.current().expect("applying");
        assert_eq!(index, 12);
        assert!(took < STUCK_AFTER);
        assert_eq!(w.stuck(), None);
        w.applied(12);
        assert_eq!(w.current(), None);
    }
}
