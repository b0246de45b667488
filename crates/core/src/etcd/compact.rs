//! Compaction: drop the history a read at or above the compact revision can no longer see.
//!
//! In two halves, so that a large compaction need not stall apply: [`begin_compact`] moves
//! the compact revision (reads and watches below it fail from then on: O(1)), and
//! [`compact_step`] removes the superseded versions a bounded amount of work at a time,
//! walking the change feed from where the previous step stopped. Until the steps are done the
//! store keeps some versions below the compact revision that nothing can read any more: reads
//! and watches at or above it are the same either way. [`compact`] does both at once.
//!
//! Both halves change the replicated state: call them from apply, at the same points on every
//! replica (the position of the walk is encoded with the store).
//!
//! [`begin_compact`]: super::EtcdStore::begin_compact
//! [`compact_step`]: super::EtcdStore::compact_step
//! [`compact`]: super::EtcdStore::compact

use std::ops::Bound;

use serde::{Deserialize, Serialize};

use super::store::{version_bytes, Stored};
use super::{EtcdError, Rev};
use crate::Revision;

/// What a compaction (or one step of it) removed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// Versions (puts and tombstones) removed.
    pub removed: u64,
    /// [`history_bytes`](super::EtcdStore::history_bytes) freed.
    pub freed_bytes: u64,
    /// Whether versions may remain to remove (another [`compact_step`] is due).
    ///
    /// [`compact_step`]: super::EtcdStore::compact_step
    pub pending: bool,
}

impl super::EtcdStore {
    /// etcd's `Compact` at `rev` (`current` = the store revision now), all at once: per key,
    /// keep the newest version at or below `rev` unless it is a tombstone, and every later
    /// one; remove the rest. Reads at `rev` and above see what they saw; below,
    /// [`EtcdError::Compacted`]. Refused with `Compacted` at or below the compact revision,
    /// with `FutureRevision` above `current`.
    ///
    /// Costs O(m log n) for the m versions written since the previous compaction's revision
    /// up to `rev` — about 1 s per 800,000 versions removed (release build): for large ones,
    /// [`begin_compact`](Self::begin_compact) and [`compact_step`](Self::compact_step).
    pub fn compact(&mut self, rev: Revision, current: Revision) -> Result<CompactStats, EtcdError> {
        self.begin_compact(rev, current)?;
        Ok(self.compact_step(usize::MAX))
    }

    /// Move the compact revision to `rev` (same refusals as [`compact`](Self::compact)) and
    /// leave the removal of what it supersedes to [`compact_step`](Self::compact_step). A
    /// compaction still in progress continues towards the new revision.
    pub fn begin_compact(&mut self, rev: Revision, current: Revision) -> Result<(), EtcdError> {
        if rev <= self.compact_revision {
            return Err(EtcdError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        if rev > current {
            return Err(EtcdError::FutureRevision { current });
        }
        // The newest write at or below `rev`: those above the previous compact revision are
        // all still in the change feed (only this compaction removes them), older ones were
        // counted by the previous compactions.
        let newest_below = self
            .by_rev
            .range((
                Bound::Unbounded,
                Bound::Included(Rev {
                    main: rev,
                    sub: u32::MAX,
                }),
            ))
            .next_back()
            .map_or(0, |(r, _)| r.main);
        self.compacted_writes.0 = self.compacted_writes.0.max(newest_below);
        // Every entry at or below the previous compact revision has been walked already.
        self.compact_cursor.get_or_insert(Rev {
            main: self.compact_revision,
            sub: u32::MAX,
        });
        self.compact_revision = rev;
        Ok(())
    }

    /// Whether a compaction has versions left to remove.
    pub fn compaction_pending(&self) -> bool {
        self.compact_cursor.is_some()
    }

    /// Remove superseded versions, about `budget` units of work: one per change-feed entry
    /// walked and one per version removed (O(log n) each). Only keys written since the
    /// previous compact revision can hold something to remove, and each such write has an
    /// entry in the feed: the walk visits those entries up to the compact revision, and for
    /// each, compacts its key (oldest versions first, so a key with a long history is done
    /// over several steps).
    pub fn compact_step(&mut self, budget: usize) -> CompactStats {
        let mut stats = CompactStats::default();
        let end = Rev {
            main: self.compact_revision,
            sub: u32::MAX,
        };
        let mut work = 0;
        while let Some(cursor) = self.compact_cursor {
            if work >= budget {
                break;
            }
            let next = self
                .by_rev
                .range((Bound::Excluded(cursor), Bound::Included(end)))
                .next()
                .map(|(rev, key)| (*rev, key.clone()));
            let Some((rev, key)) = next else {
                self.compact_cursor = None;
                break;
            };
            work += 1;
            // At least one removal per entry walked, or a step of budget 1 would never progress.
            let limit = (budget - work).max(1);
            let (removed, finished) = self.compact_key(&key, limit, &mut stats);
            work += removed;
            if finished {
                self.compact_cursor = Some(rev);
            }
        }
        stats.pending = self.compact_cursor.is_some();
        stats
    }

    /// Remove at most `limit` of the versions of `key` that the compact revision supersedes,
    /// oldest first: how many were removed, and whether none remains.
    fn compact_key(&mut self, key: &[u8], limit: usize, stats: &mut CompactStats) -> (usize, bool) {
        let Some((keep, stored)) = self.version_at(key, self.compact_revision) else {
            return (0, true);
        };
        let upto = (key.to_vec(), keep.main, keep.sub);
        let upto = if matches!(stored, Stored::Tombstone) {
            Bound::Included(upto)
        } else {
            Bound::Excluded(upto)
        };
        let doomed: Vec<Rev> = self
            .versions
            .range((Bound::Included((key.to_vec(), 0, 0)), upto))
            .take(limit.saturating_add(1))
            .map(|((_, main, sub), _)| Rev {
                main: *main,
                sub: *sub,
            })
            .collect();
        let finished = doomed.len() <= limit;
        let mut removed = 0;
        for r in doomed.into_iter().take(limit) {
            if let Some(stored) = self.versions.remove(&(key.to_vec(), r.main, r.sub)) {
                let bytes = version_bytes(key, &stored);
                self.history_bytes = self.history_bytes.saturating_sub(bytes);
                stats.freed_bytes += bytes;
                stats.removed += 1;
            }
            self.by_rev.remove(&r);
            removed += 1;
        }
        (removed, finished)
    }
}
