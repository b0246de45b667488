//! The etcd keyspace's data ([`EtcdStore`]), its encoding, and the writes: put and delete.

use std::ops::Bound;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    Bytes, DeleteRangeRequest, DeleteRangeResponse, EtcdError, KeyValue, LeaseId, Outcome,
    PutRequest, PutResponse, Rev, Span, MAX_REQUEST_BYTES, OP_OVERHEAD, VERSION_OVERHEAD,
};
use crate::cow::{CowMap, CowSet};
use crate::Revision;

/// One stored version of a key: a put, or the tombstone a delete writes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    Put {
        create_revision: Revision,
        version: i64,
        value: Bytes,
        lease: LeaseId,
    },
    Tombstone,
}

/// `(key, main revision, sub)`: a version's place in the history.
pub(crate) type VersionKey = (Bytes, Revision, u32);

/// The newest version of a live key, without its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Latest {
    pub(crate) rev: Rev,
    pub(crate) create_revision: Revision,
    pub(crate) version: i64,
    pub(crate) lease: LeaseId,
}

/// The etcd keyspace: every key's versions since the compact revision. See the module docs
/// for the layout. Cloning is O(1) (copy-on-write maps).
///
/// Encoded (serde) as the struct `{ versions: map (key, main, sub) → Stored, compact_revision:
/// u64, last_write: u64, compact_cursor: Option<Rev> }`, `Stored` being the enum `Put {
/// create_revision, version, value, lease } | Tombstone` and `Rev` `{ main: u64, sub: u32 }`;
/// the indexes and the byte count are rebuilt on decode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdStore {
    pub(super) versions: CowMap<VersionKey, Stored>,
    /// Live keys only.
    pub(super) latest: CowMap<Bytes, Latest>,
    pub(super) by_rev: CowMap<Rev, Bytes>,
    pub(super) compact_revision: Revision,
    /// Main revision of the last write, 0 before any.
    pub(super) last_write: Revision,
    /// A compaction in progress: every change-feed entry at or below this one has been
    /// compacted; those above it up to the compact revision remain to walk.
    pub(super) compact_cursor: Option<Rev>,
    pub(super) history_bytes: u64,
    /// `(lease, key)` for every live key whose newest version names a lease: the keys a
    /// lease's end deletes. Derived from `latest` (rebuilt on decode, never encoded).
    pub(super) by_lease: CowSet<(LeaseId, Bytes)>,
    /// An upper bound of the last write at or below the compact revision, as this node knows
    /// it: exact from the compactions it applied, the compact revision itself after a decode
    /// (the writes compaction removed are gone). Only watches read it
    /// ([`synced_position`](Self::synced_position)); never encoded, and equal in every
    /// comparison ([`NodeLocal`]), so replicas' states and digests are as before.
    pub(super) compacted_writes: NodeLocal<Revision>,
}

/// A value one node keeps beside the replicated state, for its own readers: not encoded and
/// ignored by `==`, so two replicas whose replicated state is equal compare equal whatever
/// each knows locally.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NodeLocal<T>(pub(crate) T);

impl<T> PartialEq for NodeLocal<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> Eq for NodeLocal<T> {}

#[derive(Serialize)]
#[serde(rename = "EtcdStore")]
struct WireRef<'a> {
    versions: &'a CowMap<VersionKey, Stored>,
    compact_revision: Revision,
    last_write: Revision,
    compact_cursor: Option<Rev>,
}

#[derive(Deserialize)]
#[serde(rename = "EtcdStore")]
struct Wire {
    versions: CowMap<VersionKey, Stored>,
    compact_revision: Revision,
    last_write: Revision,
    compact_cursor: Option<Rev>,
}

impl Serialize for EtcdStore {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        WireRef {
            versions: &self.versions,
            compact_revision: self.compact_revision,
            last_write: self.last_write,
            compact_cursor: self.compact_cursor,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for EtcdStore {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        let mut store = EtcdStore {
            compact_revision: wire.compact_revision,
            last_write: wire.last_write,
            compact_cursor: wire.compact_cursor,
            // Every write is at or below the last; otherwise the compaction may have removed
            // writes up to its revision.
            compacted_writes: NodeLocal(wire.last_write.min(wire.compact_revision)),
            ..EtcdStore::default()
        };
        for ((key, main, sub), stored) in wire.versions.iter() {
            let rev = Rev {
                main: *main,
                sub: *sub,
            };
            store.index(key, rev, stored);
        }
        store.versions = wire.versions;
        Ok(store)
    }
}

/// Bytes a stored version counts for.
pub(crate) fn version_bytes(key: &[u8], stored: &Stored) -> u64 {
    let value = match stored {
        Stored::Put { value, .. } => value.len(),
        Stored::Tombstone => 0,
    };
    (key.len() + value) as u64 + VERSION_OVERHEAD
}

impl EtcdStore {
    pub fn new() -> EtcdStore {
        EtcdStore::default()
    }

    /// Nothing was ever written or compacted: equal to [`EtcdStore::new`].
    pub fn is_untouched(&self) -> bool {
        self.versions.is_empty()
            && self.compact_revision == 0
            && self.last_write == 0
            && self.compact_cursor.is_none()
    }

    /// Revisions below this one are compacted (0: nothing ever was).
    pub fn compact_revision(&self) -> Revision {
        self.compact_revision
    }

    /// The main revision of the last write (0 before any).
    pub fn last_write(&self) -> Revision {
        self.last_write
    }

    /// Bytes of the stored history (every version's key and value plus
    /// [`VERSION_OVERHEAD`](super::VERSION_OVERHEAD)), kept as versions come and go: what a
    /// `--quota-backend-bytes` alarm compares.
    pub fn history_bytes(&self) -> u64 {
        self.history_bytes
    }

    /// Live keys now.
    pub fn key_count(&self) -> usize {
        self.latest.len()
    }

    /// Stored versions (puts and tombstones) since the compact revision.
    pub fn version_count(&self) -> usize {
        self.versions.len()
    }

    /// `latest`, `by_rev` and the byte count for a version being added (in revision order
    /// per key).
    fn index(&mut self, key: &Bytes, rev: Rev, stored: &Stored) {
        self.by_rev.insert(rev, key.clone());
        self.history_bytes += version_bytes(key, stored);
        if let Some(old) = self.latest.get(key).map(|l| l.lease).filter(|l| *l != 0) {
            self.by_lease.remove(&(old, key.clone()));
        }
        if let Stored::Put { lease, .. } = stored {
            if *lease != 0 {
                self.by_lease.insert((*lease, key.clone()));
            }
        }
        match stored {
            Stored::Put {
                create_revision,
                version,
                lease,
                ..
            } => {
                self.latest.insert(
                    key.clone(),
                    Latest {
                        rev,
                        create_revision: *create_revision,
                        version: *version,
                        lease: *lease,
                    },
                );
            }
            Stored::Tombstone => {
                self.latest.remove(key);
            }
        }
    }

    /// Store a new version (the newest of its key).
    fn write(&mut self, key: &[u8], rev: Rev, stored: Stored) {
        let key = key.to_vec();
        self.index(&key, rev, &stored);
        self.versions.insert((key, rev.main, rev.sub), stored);
        self.last_write = rev.main;
    }

    /// The version of `key` at `rev` as a client sees it (a tombstone: `None`).
    pub(super) fn kv(&self, key: &[u8], rev: Rev) -> Option<KeyValue> {
        match self.versions.get(&(key.to_vec(), rev.main, rev.sub))? {
            Stored::Put {
                create_revision,
                version,
                value,
                lease,
            } => Some(KeyValue {
                key: key.to_vec(),
                create_revision: *create_revision,
                mod_revision: rev.main,
                version: *version,
                value: value.clone(),
                lease: *lease,
            }),
            Stored::Tombstone => None,
        }
    }

    /// The live version of `key` now.
    pub(super) fn current(&self, key: &[u8]) -> Option<KeyValue> {
        let latest = self.latest.get(key)?;
        self.kv(key, latest.rev)
    }

    /// The newest version of `key` at or below `at` (main revision), with its place.
    pub(super) fn version_at(&self, key: &[u8], at: Revision) -> Option<(Rev, &Stored)> {
        let lo = (key.to_vec(), 0, 0);
        let hi = (key.to_vec(), at, u32::MAX);
        self.versions
            .range((Bound::Included(lo), Bound::Included(hi)))
            .next_back()
            .map(|((_, main, sub), stored)| {
                (
                    Rev {
                        main: *main,
                        sub: *sub,
                    },
                    stored,
                )
            })
    }

    /// Live keys now in `span`, in key order.
    pub(super) fn live<'a>(
        &'a self,
        span: Span<'a>,
    ) -> Box<dyn Iterator<Item = (&'a Bytes, &'a Latest)> + 'a> {
        match span {
            Span::Single(key) => Box::new(
                self.latest
                    .range::<_, [u8]>((Bound::Included(key), Bound::Included(key))),
            ),
            Span::From(from) => Box::new(
                self.latest
                    .range::<_, [u8]>((Bound::Included(from), Bound::Unbounded)),
            ),
            Span::Between(from, end) => Box::new(
                self.latest
                    .range::<_, [u8]>((Bound::Included(from), Bound::Excluded(end))),
            ),
            Span::Empty => Box::new(std::iter::empty()),
        }
    }

    /// Refuses a revision at or below the last write's.
    pub(super) fn check_rev(&self, rev: Revision) -> Result<(), EtcdError> {
        if rev <= self.last_write || rev == 0 {
            return Err(EtcdError::RevisionNotIncreasing {
                rev,
                last: self.last_write,
            });
        }
        Ok(())
    }

    /// The live keys attached to `lease` (their newest version names it), in key order.
    pub fn lease_keys(&self, lease: LeaseId) -> impl Iterator<Item = &Bytes> + '_ {
        let from = (lease, Vec::new());
        self.by_lease
            .range::<_, (LeaseId, Bytes)>((Bound::Included(from), Bound::Unbounded))
            .take_while(move |(l, _)| *l == lease)
            .map(|(_, k)| k)
    }

    /// The leases some live key is attached to, ascending.
    pub fn attached_leases(&self) -> Vec<LeaseId> {
        let mut out: Vec<LeaseId> = self.by_lease.iter().map(|(l, _)| *l).collect();
        out.dedup();
        out
    }

    /// Delete every live key attached to `lease` at main revision `main` (a lease ended: its
    /// session closed or expired), in key order, one tombstone each. Several leases may end
    /// at one revision (an expiry step): their deletes continue the sub indexes already
    /// written at `main`. `main` must be at least the last write's. Returns how many keys
    /// were deleted (0: nothing written).
    pub fn delete_lease_keys(&mut self, lease: LeaseId, main: Revision) -> Result<u64, EtcdError> {
        let keys: Vec<Bytes> = self.lease_keys(lease).cloned().collect();
        if keys.is_empty() {
            return Ok(0);
        }
        self.check_same_or_later(main)?;
        for (sub, key) in (self.next_sub(main)..).zip(keys.iter()) {
            self.write(key, Rev { main, sub }, Stored::Tombstone);
        }
        Ok(keys.len() as u64)
    }

    /// Put `value` under `key`, attached to `lease`, at main revision `main` after whatever
    /// that revision already wrote: a lock-table grant projected into the keyspace (etcd's
    /// `Lock` and `Election`, `machine::etcd_locks`). The grant was the check: no quota, no
    /// lease lookup. `main` must be at least the last write's.
    pub fn project_put(
        &mut self,
        key: &[u8],
        value: &[u8],
        lease: LeaseId,
        main: Revision,
    ) -> Result<(), EtcdError> {
        self.check_same_or_later(main)?;
        let req = PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
            ..PutRequest::default()
        };
        let sub = self.next_sub(main);
        self.exec_put(&req, Rev { main, sub });
        Ok(())
    }

    /// Delete `key` at main revision `main` after whatever that revision already wrote, if
    /// it is live (a projected grant ended). Whether it was.
    pub fn project_delete(&mut self, key: &[u8], main: Revision) -> Result<bool, EtcdError> {
        if !self.latest.contains_key(key) {
            return Ok(false);
        }
        self.check_same_or_later(main)?;
        let sub = self.next_sub(main);
        self.write(key, Rev { main, sub }, Stored::Tombstone);
        Ok(true)
    }

    /// Refuses a revision below the last write's (writes continuing a revision: lease ends
    /// and projections, which may share the revision of the command that caused them).
    fn check_same_or_later(&self, main: Revision) -> Result<(), EtcdError> {
        if main < self.last_write || main == 0 {
            return Err(EtcdError::RevisionNotIncreasing {
                rev: main,
                last: self.last_write,
            });
        }
        Ok(())
    }

    /// The first sub index free at main revision `main`.
    fn next_sub(&self, main: Revision) -> u32 {
        let lo = Rev { main, sub: 0 };
        let hi = Rev {
            main,
            sub: u32::MAX,
        };
        self.by_rev
            .range((Bound::Included(lo), Bound::Included(hi)))
            .next_back()
            .map_or(0, |(r, _)| r.sub + 1)
    }

    /// `put`: store `req.value` under `req.key` at `rev`. Always writes.
    /// `lease_exists` says whether a lease id names a live lease (until leases exist: `|_|
    /// false`).
    pub fn put(
        &mut self,
        req: &PutRequest,
        rev: Revision,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<Outcome<PutResponse>, EtcdError> {
        self.check_rev(rev)?;
        check_put(req)?;
        check_size(put_size(req))?;
        self.check_put_state(req, lease_exists)?;
        let response = self.exec_put(req, Rev { main: rev, sub: 0 });
        Ok(Outcome {
            response,
            wrote: true,
        })
    }

    /// `delete_range`: delete every live key of `req.range` at `rev`, one tombstone each, in
    /// key order. Writes nothing (and `wrote` is false) when no key was live.
    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
        rev: Revision,
    ) -> Result<Outcome<DeleteRangeResponse>, EtcdError> {
        self.check_rev(rev)?;
        if req.range.key.is_empty() {
            return Err(EtcdError::EmptyKey);
        }
        check_size(req.range.key.len() + req.range.range_end.len() + OP_OVERHEAD)?;
        let mut sub = 0;
        let response = self.exec_delete(req, rev, &mut sub);
        Ok(Outcome {
            wrote: response.deleted > 0,
            response,
        })
    }

    /// A put's checks against the state (after its own, [`check_put`]).
    pub(super) fn check_put_state(
        &self,
        req: &PutRequest,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<(), EtcdError> {
        if (req.ignore_value || req.ignore_lease) && !self.latest.contains_key(&req.key) {
            return Err(EtcdError::KeyNotFound);
        }
        if req.lease != 0 && !lease_exists(req.lease) {
            return Err(EtcdError::LeaseNotFound { lease: req.lease });
        }
        Ok(())
    }

    /// Write a checked put at `at`.
    pub(super) fn exec_put(&mut self, req: &PutRequest, at: Rev) -> PutResponse {
        let prev = self.current(&req.key);
        let (create_revision, version) = match self.latest.get(&req.key) {
            Some(l) => (l.create_revision, l.version + 1),
            None => (at.main, 1),
        };
        let value = match (&prev, req.ignore_value) {
            (Some(p), true) => p.value.clone(),
            _ => req.value.clone(),
        };
        let lease = match (&prev, req.ignore_lease) {
            (Some(p), true) => p.lease,
            _ => req.lease,
        };
        self.write(
            &req.key,
            at,
            Stored::Put {
                create_revision,
                version,
                value,
                lease,
            },
        );
        PutResponse {
            prev_kv: if req.prev_kv { prev } else { None },
        }
    }

    /// Delete the live keys of a checked delete at `main`, from sub index `*sub` on.
    pub(super) fn exec_delete(
        &mut self,
        req: &DeleteRangeRequest,
        main: Revision,
        sub: &mut u32,
    ) -> DeleteRangeResponse {
        let keys: Vec<Bytes> = self
            .live(req.range.span())
            .map(|(k, _)| k.clone())
            .collect();
        let mut response = DeleteRangeResponse {
            deleted: keys.len() as u64,
            prev_kvs: Vec::new(),
        };
        for key in keys {
            if req.prev_kv {
                response.prev_kvs.extend(self.current(&key));
            }
            self.write(&key, Rev { main, sub: *sub }, Stored::Tombstone);
            *sub += 1;
        }
        response
    }
}

/// A put's own checks (etcd's `checkPutRequest`).
pub(super) fn check_put(req: &PutRequest) -> Result<(), EtcdError> {
    if req.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    if req.ignore_value && !req.value.is_empty() {
        return Err(EtcdError::ValueProvided);
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(EtcdError::LeaseProvided);
    }
    Ok(())
}

pub(super) fn put_size(req: &PutRequest) -> usize {
    req.key.len() + req.value.len() + OP_OVERHEAD
}

pub(super) fn check_size(size: usize) -> Result<(), EtcdError> {
    if size > MAX_REQUEST_BYTES {
        return Err(EtcdError::RequestTooLarge {
            size,
            max: MAX_REQUEST_BYTES,
        });
    }
    Ok(())
}
