//! Automatic compaction (etcd's `--auto-compaction-mode` and `--auto-compaction-retention`):
//! which revision to compact at, decided from committed states only.
//!
//! The decision is the leader's (it proposes [`crate::EtcdCommand::Compact`], as it proposes
//! expiry ticks), and the compaction itself is a logged command, so every replica removes the
//! same history. [`AutoCompactor`] is the pure rule: fed the committed state now and then, it
//! names a revision. It reads no clock:
//! * **periodic** retention is judged in **log time** — the time the log's entries carry
//!   ([`crate::StateMachine::now`]), never a replica's clock. Every node (followers too, so a
//!   new leader knows the past) samples `(log time, store revision)` of its committed state at
//!   most every tenth of the retention (etcd samples its revision every retention/10 too);
//!   the revision compacted at is the newest sample at least `retention` old. Everything it
//!   removes was superseded at a log time at least `retention` before the last committed
//!   one; the history kept spans between `retention` and 1.1 × `retention` of log time
//!   (more on a member that just started: it has no older samples).
//! * **revision** retention keeps the last N store revisions: compact at `revision − N` once
//!   that is at least max(N / 10, 2) above the compact revision (etcd looks every 5 minutes;
//!   fenced judges by the revisions, so history stays bounded at any write rate, and the
//!   compaction's own revision never triggers the next one).
//!
//! Nothing is proposed while the etcd keyspace holds no superseded version (every stored one
//! is a live key's newest), so a cluster that never uses etcd never has its keyspace touched.

use std::collections::VecDeque;

use crate::command::{Millis, Revision};
use crate::StateMachine;

/// etcd's `--auto-compaction-mode` with its `--auto-compaction-retention`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep this much log time of history (ms).
    Periodic { retention_ms: Millis },
    /// Keep the last this many store revisions.
    Revision { revisions: u64 },
}

/// Most log time between two samples of the periodic mode: a tenth of an hour, as etcd
/// caps its own sampling interval at one hour / 10.
const MAX_SAMPLE_INTERVAL_MS: Millis = 6 * 60 * 1000;

/// The rule of [`AutoCompaction`] (module docs): feed it committed states with
/// [`observe`](Self::observe), ask it with [`due`](Self::due).
#[derive(Clone, Debug)]
pub struct AutoCompactor {
    mode: AutoCompaction,
    /// Periodic mode: `(log time, store revision)` of committed states, oldest first.
    samples: VecDeque<(Millis, Revision)>,
}

impl AutoCompactor {
    pub fn new(mode: AutoCompaction) -> AutoCompactor {
        AutoCompactor {
            mode,
            samples: VecDeque::new(),
        }
    }

    pub fn mode(&self) -> AutoCompaction {
        self.mode
    }

    /// Note a committed state: its log time and store revision (every node calls this, leader
    /// or not).
    pub fn observe(&mut self, now: Millis, revision: Revision) {
        let AutoCompaction::Periodic { retention_ms } = self.mode else {
            return;
        };
        let every = (retention_ms / 10).clamp(1, MAX_SAMPLE_INTERVAL_MS);
        match self.samples.back() {
            Some(&(t, r)) if now < t.saturating_add(every) || revision <= r => {}
            _ => self.samples.push_back((now, revision)),
        }
        // Keep the newest sample old enough to compact at, and every newer one.
        let old_enough = |t: Millis| t.saturating_add(retention_ms) <= now;
        while self.samples.len() > 1 && old_enough(self.samples[1].0) {
            self.samples.pop_front();
        }
    }

    /// The revision to compact at for the committed state `sm`, if one is due now. The
    /// caller proposes `Compact` at it (a proposal that fails is simply asked again later).
    pub fn due(&mut self, sm: &StateMachine) -> Option<Revision> {
        self.observe(sm.now(), sm.revision());
        let etcd = sm.etcd();
        // Nothing superseded: a compaction would remove nothing (and would touch an untouched
        // keyspace).
        if etcd.version_count() <= etcd.key_count() {
            return None;
        }
        let at = match self.mode {
            AutoCompaction::Periodic { retention_ms } => {
                let &(t, r) = self.samples.front()?;
                if t.saturating_add(retention_ms) > sm.now() {
                    return None;
                }
                r
            }
            AutoCompaction::Revision { revisions } => {
                let at = sm.revision().checked_sub(revisions)?;
                let slack = (revisions / 10).max(2);
                if at < etcd.compact_revision().saturating_add(slack) {
                    return None;
                }
                at
            }
        };
        (at > etcd.compact_revision() && at <= sm.revision()).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::PutRequest;
    use crate::{Batch, Command, EtcdCommand, Request, Response, Semantics};

    /// A replica fed entries of one put each, at log times the test chooses.
    struct Replica {
        sm: StateMachine,
        index: u64,
    }

    impl Replica {
        fn new() -> Replica {
            Replica {
                sm: StateMachine::new(),
                index: 0,
            }
        }

        fn apply(&mut self, time_ms: Millis, cmd: EtcdCommand) -> Response {
            self.index += 1;
            let batch = Batch {
                requests: vec![Request {
                    time_ms,
                    client: None,
                    cmd: Command::Etcd(cmd),
                }],
                semantics: Semantics::NEWEST,
            };
            let mut out = self.sm.apply_batch(self.index, &batch);
            out.responses.pop().expect("one response")
        }

        fn put(&mut self, time_ms: Millis, key: &str) -> Revision {
            self.apply(time_ms, EtcdCommand::Put(PutRequest::new(key, "v")));
            self.sm.revision()
        }
    }

    #[test]
    fn periodic_compacts_at_the_newest_revision_a_retention_old_in_log_time() {
        let hour = 3_600_000;
        let mut c = AutoCompactor::new(AutoCompaction::Periodic { retention_ms: hour });
        let mut r = Replica::new();
        // One put a minute, the compactor looking after each, for 3 hours of log time.
        // `applied`: (log time, revision) of every command applied.
        let mut applied = Vec::new();
        let mut compacted = Vec::new();
        for minute in 0..180u64 {
            let t = 1_000_000 + minute * 60_000;
            applied.push((t, r.put(t, "k")));
            if let Some(at) = c.due(&r.sm) {
                r.apply(t, EtcdCommand::Compact { revision: at });
                applied.push((t, r.sm.revision()));
                compacted.push((t, at));
            }
        }
        assert!(!compacted.is_empty(), "compacted in three hours");
        // Nothing before an hour of log time had passed.
        let (first_t, _) = compacted[0];
        assert!(first_t >= 1_000_000 + hour, "{first_t}");
        for &(t, at) in &compacted {
            // The store was at revision `at` at a log time between 1 and 1.1 hours before
            // (samples every 6 minutes).
            let reached = applied
                .iter()
                .rev()
                .find(|(_, rev)| *rev <= at)
                .map(|(t, _)| *t)
                .expect("applied");
            assert!(
                reached + hour <= t,
                "compacted at {at} (reached {reached}) at {t}"
            );
            assert!(reached + hour + hour / 10 >= t, "{at} {reached} {t}");
        }
        let rev_at = applied;
        // Every 6 minutes of log time at most once.
        assert!(compacted.len() <= 21, "{}", compacted.len());
        // Reads an hour back still work; a revision 1.2 hours back is gone.
        let now = r.sm.now();
        let keep = rev_at
            .iter()
            .find(|(t, _)| *t >= now - hour)
            .expect("kept")
            .1;
        let mut range = crate::etcd::RangeRequest::new(crate::etcd::KeyRange::key("k"));
        range.revision = keep;
        assert!(r.sm.etcd_range(&range).is_ok());
        range.revision = rev_at
            .iter()
            .find(|(t, _)| *t >= now - hour * 12 / 10)
            .expect("old")
            .1;
        assert!(r.sm.etcd_range(&range).is_err());
    }

    #[test]
    fn periodic_judges_log_time_not_how_often_it_is_asked() {
        // Asked a thousand times while the log time stands still: nothing is due.
        let mut c = AutoCompactor::new(AutoCompaction::Periodic {
            retention_ms: 60_000,
        });
        let mut r = Replica::new();
        r.put(10_000, "k");
        r.put(10_000, "k");
        for _ in 0..1_000 {
            assert_eq!(c.due(&r.sm), None);
        }
        // A minute of log time later (carried by the next entry), the first sample is due.
        let sampled = 2;
        r.put(70_000, "k");
        assert_eq!(c.due(&r.sm), Some(sampled));
    }

    #[test]
    fn periodic_on_a_new_leader_waits_for_samples_of_its_own() {
        let mut r = Replica::new();
        for t in 0..100 {
            r.put(t * 1_000, "k");
        }
        // A compactor that starts now has seen nothing older: it keeps everything for a
        // retention, the safe direction.
        let mut c = AutoCompactor::new(AutoCompaction::Periodic {
            retention_ms: 10_000,
        });
        assert_eq!(c.due(&r.sm), None);
        let seen = r.sm.revision();
        r.put(108_000, "k");
        assert_eq!(c.due(&r.sm), None);
        r.put(109_000, "k");
        assert_eq!(c.due(&r.sm), Some(seen));
    }

    #[test]
    fn revision_mode_keeps_the_last_n_and_never_feeds_itself() {
        let mut c = AutoCompactor::new(AutoCompaction::Revision { revisions: 10 });
        let mut r = Replica::new();
        for _ in 0..11 {
            r.put(1_000, "k");
        }
        assert_eq!(c.due(&r.sm), None, "11 revisions: 1 over the 10 kept");
        r.put(1_000, "k");
        assert_eq!(c.due(&r.sm), Some(2));
        assert!(matches!(
            r.apply(1_000, EtcdCommand::Compact { revision: 2 }),
            Response::Etcd { .. }
        ));
        // The compaction took a revision of its own: not enough to compact again.
        assert_eq!(c.due(&r.sm), None);
        r.put(1_000, "k");
        assert_eq!(c.due(&r.sm), Some(4));
    }

    #[test]
    fn nothing_superseded_nothing_compacted() {
        let mut c = AutoCompactor::new(AutoCompaction::Revision { revisions: 1 });
        let mut r = Replica::new();
        // Only ticks: the etcd keyspace stays untouched.
        for i in 0..20 {
            r.index += 1;
            r.sm.apply(
                r.index,
                &Request {
                    time_ms: i,
                    client: None,
                    cmd: Command::Tick,
                },
            );
        }
        assert_eq!(c.due(&r.sm), None);
        // Distinct keys, each written once: nothing to remove either.
        for k in 0..20 {
            r.put(100, &format!("k{k}"));
        }
        assert_eq!(c.due(&r.sm), None);
        r.put(100, "k0");
        assert!(c.due(&r.sm).is_some());
    }
}
