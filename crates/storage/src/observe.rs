//! Timings of the storage for whoever keeps metrics: the server implements
//! [`StorageObserver`] (Prometheus histograms) and installs it with
//! [`LogStore::observe`](crate::LogStore::observe). This crate knows no metrics library; it
//! only calls the observer, on the thread where the thing happened (the WAL's flusher thread,
//! a blocking snapshot task), so an observer must be cheap and must not block.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Receives the storage's timings. Every method has an empty default.
pub trait StorageObserver: Send + Sync + 'static {
    /// One `fdatasync` of a write-ahead log segment (the group commit's; one per round of
    /// the flusher thread, covering every append queued meanwhile).
    fn wal_fsync(&self, _took: Duration) {}
    /// One append, from openraft's `append` call to its acknowledgement: written and the log
    /// fsynced (the latency the leader's commit waits for on each voter). Not called for
    /// appends that fail.
    fn wal_append(&self, _took: Duration) {}
    /// A snapshot built on this node (`build_snapshot`): its file's size and how long
    /// writing and installing it took. Snapshots received from the leader are not counted.
    fn snapshot_built(&self, _bytes: u64, _took: Duration) {}

    /// Where a log index is on this node's path, for the latency breakdown (the server's
    /// stage tracer): entries `first..=last` written into the log (page cache, not durable).
    fn log_written(&self, _first: u64, _last: u64) {}
    /// The group commit's segment `fdatasync` covering the entries up to `last` finished.
    fn log_synced(&self, _last: u64) {}
    /// The hard state records the entries up to `last` (acknowledged already, except with
    /// inline I/O, where the record comes first).
    fn log_recorded(&self, _last: u64) {}
    /// The state machine begins applying entry `index` (it is committed).
    fn applying(&self, _index: u64) {}
    /// The state machine applied entry `index`.
    fn applied(&self, _index: u64) {}
}

/// The observer slot shared by the log store, its flusher thread and the state machine store
/// of one data dir: empty until the server installs an observer.
#[derive(Clone, Default)]
pub(crate) struct Hook(Arc<OnceLock<Arc<dyn StorageObserver>>>);

impl Hook {
    /// Install `observer`; `false` if one was installed before (it stays).
    pub(crate) fn set(&self, observer: Arc<dyn StorageObserver>) -> bool {
        self.0.set(observer).is_ok()
    }

    /// The observer, if any (one atomic load).
    pub(crate) fn get(&self) -> Option<&dyn StorageObserver> {
        self.0.get().map(|o| &**o)
    }
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Hook")
            .field(&self.0.get().is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Seen(Mutex<Vec<Duration>>);
    impl StorageObserver for Seen {
        fn wal_fsync(&self, took: Duration) {
            self.0.lock().unwrap().push(took);
        }
    }

    #[test]
    fn the_first_observer_stays_and_clones_share_it() {
        let hook = Hook::default();
        let clone = hook.clone();
        assert!(hook.get().is_none());
        let seen = Arc::new(Seen::default());
        assert!(hook.set(seen.clone()));
        assert!(!clone.set(Arc::new(Seen::default())));
        clone
            .get()
            .expect("installed")
            .wal_fsync(Duration::from_millis(2));
        assert_eq!(*seen.0.lock().unwrap(), vec![Duration::from_millis(2)]);
    }
}
