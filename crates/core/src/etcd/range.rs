//! Reads: `range` at the current or an older revision, with etcd's limit, count, sort and
//! filter rules.

use std::cmp::Ordering;
use std::ops::Bound;

use super::store::{Stored, VersionKey};
use super::{
    Bytes, EtcdError, KeyValue, LeaseId, RangeRequest, RangeResponse, Rev, SortOrder, SortTarget,
    Span, MAX_RANGE_BYTES,
};
use crate::Revision;

/// A live key at the revision read: its version's place and metadata (the value is fetched
/// only when it is returned).
pub(super) struct Hit<'a> {
    pub(super) key: &'a Bytes,
    pub(super) rev: Rev,
    pub(super) create_revision: Revision,
    pub(super) version: i64,
    pub(super) lease: LeaseId,
}

impl Hit<'_> {
    fn kv(&self, value: Bytes) -> KeyValue {
        KeyValue {
            key: self.key.clone(),
            create_revision: self.create_revision,
            mod_revision: self.rev.main,
            version: self.version,
            value,
            lease: self.lease,
        }
    }
}

impl super::EtcdStore {
    /// The revision a read asking for `requested` (0 = current) reads at, or why it cannot.
    pub(super) fn read_revision(
        &self,
        requested: Revision,
        current: Revision,
    ) -> Result<Revision, EtcdError> {
        let at = if requested == 0 { current } else { requested };
        if at > current {
            return Err(EtcdError::FutureRevision { current });
        }
        if at < self.compact_revision {
            return Err(EtcdError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        Ok(at)
    }

    /// etcd's `Range`, at `req.revision` (0 = `current`, the store revision now).
    pub fn range(&self, req: &RangeRequest, current: Revision) -> Result<RangeResponse, EtcdError> {
        if req.range.key.is_empty() {
            return Err(EtcdError::EmptyKey);
        }
        let at = self.read_revision(req.revision, current)?;
        self.range_at(req, at, MAX_RANGE_BYTES)
    }

    /// The live keys of `span` at revision `at`, in key order.
    pub(super) fn hits<'a>(
        &'a self,
        span: Span<'a>,
        at: Revision,
    ) -> Box<dyn Iterator<Item = Hit<'a>> + 'a> {
        if at >= self.last_write {
            // Nothing was written after `at`: the newest versions are the ones.
            return Box::new(self.live(span).map(|(key, l)| Hit {
                key,
                rev: l.rev,
                create_revision: l.create_revision,
                version: l.version,
                lease: l.lease,
            }));
        }
        // Walk the history key by key: each key's newest version at or below `at`.
        let single = matches!(span, Span::Single(_));
        let (start, end): (Bound<VersionKey>, Bound<VersionKey>) = match span {
            Span::Single(k) => (
                Bound::Included((k.to_vec(), 0, 0)),
                Bound::Included((k.to_vec(), Revision::MAX, u32::MAX)),
            ),
            Span::From(from) => (Bound::Included((from.to_vec(), 0, 0)), Bound::Unbounded),
            Span::Between(from, end) => (
                Bound::Included((from.to_vec(), 0, 0)),
                Bound::Excluded((end.to_vec(), 0, 0)),
            ),
            Span::Empty => return Box::new(std::iter::empty()),
        };
        let mut cursor = Some(start);
        Box::new(std::iter::from_fn(move || loop {
            let from = cursor.take()?;
            let ((key, _, _), _) = self.versions.range((from, end.clone())).next()?;
            if !single {
                cursor = Some(Bound::Excluded((key.clone(), Revision::MAX, u32::MAX)));
            }
            if let Some((
                rev,
                Stored::Put {
                    create_revision,
                    version,
                    lease,
                    ..
                },
            )) = self.version_at(key, at)
            {
                return Some(Hit {
                    key,
                    rev,
                    create_revision: *create_revision,
                    version: *version,
                    lease: *lease,
                });
            }
        }))
    }

    /// The value of a stored put (empty for a tombstone, never asked for).
    pub(super) fn value(&self, key: &[u8], rev: Rev) -> Bytes {
        match self.versions.get(&(key.to_vec(), rev.main, rev.sub)) {
            Some(Stored::Put { value, .. }) => value.clone(),
            _ => Vec::new(),
        }
    }

    /// A checked range at `at` (`compact_revision <= at <= current`), refused when the keys
    /// and values it fetches come to more than `max_bytes`.
    pub(super) fn range_at(
        &self,
        req: &RangeRequest,
        at: Revision,
        max_bytes: usize,
    ) -> Result<RangeResponse, EtcdError> {
        let mut response = RangeResponse::default();
        let hits = self.hits(req.range.span(), at);
        if req.count_only {
            response.count = hits.count() as u64;
            return Ok(response);
        }
        let filtered = req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        // etcd fetches everything when it sorts or filters, else `limit + 1` (for `more`).
        let fetch = if req.sort_order != SortOrder::None || filtered || req.limit == 0 {
            u64::MAX
        } else {
            req.limit.saturating_add(1)
        };
        let need_value = !req.keys_only || req.sort_target == SortTarget::Value;
        let mut bytes = 0usize;
        for hit in hits {
            response.count += 1;
            if (response.kvs.len() as u64) < fetch {
                let value = if need_value {
                    self.value(hit.key, hit.rev)
                } else {
                    Vec::new()
                };
                bytes = bytes.saturating_add(hit.key.len() + value.len());
                if bytes > max_bytes {
                    return Err(EtcdError::RangeTooLarge { max: max_bytes });
                }
                response.kvs.push(hit.kv(value));
            }
        }
        let keep = |kv: &KeyValue| {
            (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
                && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
                && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
                && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
        };
        response.kvs.retain(keep);
        // Results come in key order; etcd sorts ascending by default for other targets.
        let order = match (req.sort_target, req.sort_order) {
            (SortTarget::Key, SortOrder::Ascend) => SortOrder::None,
            (SortTarget::Key, order) => order,
            (_, SortOrder::None) => SortOrder::Ascend,
            (_, order) => order,
        };
        let by = |a: &KeyValue, b: &KeyValue| -> Ordering {
            match req.sort_target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            }
        };
        // Stable: ties stay in key order, on every replica.
        match order {
            SortOrder::None => {}
            SortOrder::Ascend => response.kvs.sort_by(by),
            SortOrder::Descend => response.kvs.sort_by(|a, b| by(b, a)),
        }
        if req.limit > 0 && response.kvs.len() as u64 > req.limit {
            response.kvs.truncate(req.limit as usize);
            response.more = true;
        }
        if req.keys_only {
            for kv in &mut response.kvs {
                kv.value = Vec::new();
            }
        }
        Ok(response)
    }
}
