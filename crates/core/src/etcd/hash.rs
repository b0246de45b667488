//! etcd's `Maintenance.HashKV` (and `Hash`) over the etcd keyspace: a CRC-32 of the history a
//! member keeps at or below a revision, for comparing members (`etcdctl endpoint hashkv`).
//!
//! The value is fenced's own (etcd hashes its bbolt encoding), but it is a function of the
//! replicated history only: every version above the compact revision and, for each key, the
//! one put at or below it that a finished compaction keeps — so a member still walking a
//! compaction (`compact_cursor`) hashes what a member that finished it hashes.

use super::store::{EtcdStore, Stored};
use super::EtcdError;
use crate::Revision;

impl EtcdStore {
    /// The hash of the history at or below `revision` (0: `current`, the store's revision),
    /// refused below the compact revision and above `current`, as etcd refuses them.
    pub fn hash_kv(&self, revision: Revision, current: Revision) -> Result<u32, EtcdError> {
        let at = if revision == 0 { current } else { revision };
        if at > current {
            return Err(EtcdError::FutureRevision { current });
        }
        if at < self.compact_revision {
            return Err(EtcdError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        let mut h = crc32fast::Hasher::new();
        let mut feed = |key: &[u8], main: Revision, sub: u32, stored: &Stored| {
            h.update(&(key.len() as u64).to_be_bytes());
            h.update(key);
            h.update(&main.to_be_bytes());
            h.update(&sub.to_be_bytes());
            match stored {
                Stored::Put {
                    create_revision,
                    version,
                    value,
                    lease,
                } => {
                    h.update(&[1]);
                    h.update(&create_revision.to_be_bytes());
                    h.update(&version.to_be_bytes());
                    h.update(&lease.to_be_bytes());
                    h.update(&(value.len() as u64).to_be_bytes());
                    h.update(value);
                }
                Stored::Tombstone => h.update(&[0]),
            }
        };
        // Versions come in (key, main, sub) order: per key, the newest at or below the
        // compact revision is held back until the key's first newer version (or its end).
        let mut kept: Option<(&[u8], Revision, u32, &Stored)> = None;
        for ((key, main, sub), stored) in self.versions.iter() {
            if kept.is_some_and(|(k, ..)| k != &key[..]) {
                if let Some((k, m, s, st)) = kept.take() {
                    if matches!(st, Stored::Put { .. }) {
                        feed(k, m, s, st);
                    }
                }
            }
            if *main <= self.compact_revision {
                kept = Some((&key[..], *main, *sub, stored));
                continue;
            }
            if let Some((k, m, s, st)) = kept.take() {
                if matches!(st, Stored::Put { .. }) {
                    feed(k, m, s, st);
                }
            }
            if *main <= at {
                feed(key, *main, *sub, stored);
            }
        }
        if let Some((k, m, s, st)) = kept {
            if matches!(st, Stored::Put { .. }) {
                feed(k, m, s, st);
            }
        }
        Ok(h.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{del, put};
    use super::super::*;

    fn store() -> EtcdStore {
        let mut s = EtcdStore::new();
        put(&mut s, 1, "a", "1");
        put(&mut s, 2, "b", "1");
        put(&mut s, 3, "a", "2");
        del(&mut s, 4, KeyRange::key("b"));
        put(&mut s, 5, "c", "1");
        s
    }

    #[test]
    fn equal_histories_hash_equal_and_a_different_value_does_not() {
        let (a, b) = (store(), store());
        assert_eq!(a.hash_kv(0, 5), b.hash_kv(0, 5));
        let mut c = store();
        put(&mut c, 6, "c", "2");
        assert_eq!(
            a.hash_kv(5, 5),
            c.hash_kv(5, 6),
            "later writes do not count"
        );
        assert_ne!(a.hash_kv(0, 5), c.hash_kv(0, 6));
        let mut d = EtcdStore::new();
        put(&mut d, 1, "a", "1");
        put(&mut d, 2, "b", "1");
        put(&mut d, 3, "a", "X");
        del(&mut d, 4, KeyRange::key("b"));
        put(&mut d, 5, "c", "1");
        assert_ne!(a.hash_kv(0, 5), d.hash_kv(0, 5));
    }

    #[test]
    fn a_compaction_in_progress_hashes_as_a_finished_one() {
        let mut whole = store();
        whole.compact(4, 5).expect("compact");
        let mut walking = store();
        walking.begin_compact(4, 5).expect("begin");
        let before = walking.hash_kv(0, 5);
        walking.compact_step(1);
        assert_eq!(before, walking.hash_kv(0, 5));
        assert_eq!(before, whole.hash_kv(0, 5));
        assert_eq!(whole.hash_kv(4, 5), whole.hash_kv(4, 5));
    }

    #[test]
    fn below_the_compact_revision_and_in_the_future_are_refused() {
        let mut s = store();
        s.compact(3, 5).expect("compact");
        assert_eq!(
            s.hash_kv(2, 5),
            Err(EtcdError::Compacted {
                compact_revision: 3
            })
        );
        assert_eq!(
            s.hash_kv(6, 5),
            Err(EtcdError::FutureRevision { current: 5 })
        );
        assert!(s.hash_kv(3, 5).is_ok());
    }
}
