//! Compaction: drop the history a read at or above the compact revision can no longer see.

use std::collections::BTreeSet;
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use super::store::{version_bytes, Stored};
use super::{Bytes, EtcdError, Rev};
use crate::Revision;

/// What a compaction removed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// Versions (puts and tombstones) removed.
    pub removed: u64,
    /// [`history_bytes`](super::EtcdStore::history_bytes) freed.
    pub freed_bytes: u64,
}

impl super::EtcdStore {
    /// etcd's `Compact` at `rev` (`current` = the store revision now): per key, keep the newest
    /// version at or below `rev` unless it is a tombstone, and every later one; remove the
    /// rest. Reads at `rev` and above see what they saw; below, [`EtcdError::Compacted`].
    ///
    /// Refused with `Compacted` at or below the compact revision, with `FutureRevision` above
    /// `current`. Costs O(m log n) for the m versions written since the previous compaction's
    /// revision, up to `rev`.
    pub fn compact(&mut self, rev: Revision, current: Revision) -> Result<CompactStats, EtcdError> {
        if rev <= self.compact_revision {
            return Err(EtcdError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        if rev > current {
            return Err(EtcdError::FutureRevision { current });
        }
        // Versions at or below the previous compact revision are already their key's only
        // one (or gone): only keys written since can have something to remove.
        let keys: BTreeSet<Bytes> = self
            .by_rev
            .range((
                Bound::Excluded(Rev {
                    main: self.compact_revision,
                    sub: u32::MAX,
                }),
                Bound::Included(Rev {
                    main: rev,
                    sub: u32::MAX,
                }),
            ))
            .map(|(_, key)| key.clone())
            .collect();
        let mut stats = CompactStats::default();
        for key in keys {
            let Some((keep, stored)) = self.version_at(&key, rev) else {
                continue;
            };
            let upto = if matches!(stored, Stored::Tombstone) {
                Bound::Included((key.clone(), keep.main, keep.sub))
            } else {
                Bound::Excluded((key.clone(), keep.main, keep.sub))
            };
            let doomed: Vec<Rev> = self
                .versions
                .range((Bound::Included((key.clone(), 0, 0)), upto))
                .map(|((_, main, sub), _)| Rev {
                    main: *main,
                    sub: *sub,
                })
                .collect();
            for r in doomed {
                if let Some(stored) = self.versions.remove(&(key.clone(), r.main, r.sub)) {
                    let bytes = version_bytes(&key, &stored);
                    self.history_bytes = self.history_bytes.saturating_sub(bytes);
                    stats.freed_bytes += bytes;
                    stats.removed += 1;
                }
                self.by_rev.remove(&r);
            }
        }
        self.compact_revision = rev;
        Ok(stats)
    }
}
