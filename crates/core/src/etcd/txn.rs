//! `txn`: compares, then the success or the failure ops, all at one revision — validated
//! completely before anything changes (etcd's `checkTxnRequest`, `checkIntervals`,
//! `compareToPath` and `checkRequests`, in that order), so a refused txn changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use super::store::{check_put, check_size, put_size};
use super::{
    Bytes, Compare, CompareResult, CompareTarget, EtcdError, KeyRange, LeaseId, Outcome, RequestOp,
    ResponseOp, Rev, Span, TxnRequest, TxnResponse, MAX_RANGE_BYTES, MAX_TXN_DEPTH, MAX_TXN_OPS,
    OP_OVERHEAD,
};
use crate::Revision;

impl TxnRequest {
    /// The size counted against [`MAX_REQUEST_BYTES`](super::MAX_REQUEST_BYTES): the bytes of
    /// every key, range end, value and compared value, plus
    /// [`OP_OVERHEAD`] per compare and operation.
    pub fn size(&self) -> usize {
        let compares: usize = self
            .compare
            .iter()
            .map(|c| {
                let target = match &c.target {
                    CompareTarget::Value(v) => v.len(),
                    _ => 0,
                };
                c.range.key.len() + c.range.range_end.len() + target + OP_OVERHEAD
            })
            .sum();
        let ops: usize = self
            .success
            .iter()
            .chain(&self.failure)
            .map(|op| match op {
                RequestOp::Range(r) => r.range.key.len() + r.range.range_end.len() + OP_OVERHEAD,
                RequestOp::Put(p) => put_size(p),
                RequestOp::DeleteRange(d) => {
                    d.range.key.len() + d.range.range_end.len() + OP_OVERHEAD
                }
                RequestOp::Txn(t) => t.size() + OP_OVERHEAD,
            })
            .sum();
        compares + ops
    }
}

impl TxnRequest {
    /// Whether no op of either branch, nested txns included, writes (etcd's
    /// `isTxnReadonly`): such a txn can take the read path
    /// ([`EtcdStore::txn_read_only`](super::EtcdStore::txn_read_only)).
    pub fn is_read_only(&self) -> bool {
        self.success.iter().chain(&self.failure).all(|op| match op {
            RequestOp::Range(_) => true,
            RequestOp::Put(_) | RequestOp::DeleteRange(_) => false,
            RequestOp::Txn(t) => t.is_read_only(),
        })
    }

    /// Whether a put of either branch, nested txns included, names a lease (needs
    /// [`Semantics::LEASES`](crate::Semantics::LEASES)).
    pub fn names_a_lease(&self) -> bool {
        self.success.iter().chain(&self.failure).any(|op| match op {
            RequestOp::Put(p) => p.lease != 0,
            RequestOp::Txn(t) => t.names_a_lease(),
            RequestOp::Range(_) | RequestOp::DeleteRange(_) => false,
        })
    }

    /// The leases the puts of either branch name, nested txns included.
    pub fn leases_named(&self) -> Vec<crate::SessionId> {
        let mut out = Vec::new();
        for op in self.success.iter().chain(&self.failure) {
            match op {
                RequestOp::Put(p) if p.lease != 0 => out.push(p.lease as crate::SessionId),
                RequestOp::Txn(t) => out.extend(t.leases_named()),
                _ => {}
            }
        }
        out
    }
}

impl super::EtcdStore {
    /// A [read-only](TxnRequest::is_read_only) txn on the read path, at `current` (the store
    /// revision now): the same checks and answer as [`txn`](Self::txn), on an O(1) clone, so
    /// `&self`. A txn that could write is answered as if it had run, and nothing is kept:
    /// callers send those through the log.
    pub fn txn_read_only(
        &self,
        req: &TxnRequest,
        current: Revision,
    ) -> Result<TxnResponse, EtcdError> {
        let mut scratch = self.clone();
        let response = scratch
            .txn(req, current.saturating_add(1), &|_| false)?
            .response;
        if read_bytes(&response) > MAX_RANGE_BYTES {
            return Err(EtcdError::RangeTooLarge {
                max: MAX_RANGE_BYTES,
            });
        }
        Ok(response)
    }

    /// etcd's `Txn` at `rev`: if every compare holds at `rev - 1` (the store before it), the
    /// success ops run in order, else the failure ops; a nested txn's compares are judged
    /// against the store before the whole txn too, as etcd does. Reads see the txn's earlier
    /// writes. Every write takes `rev` with the next sub index.
    ///
    /// All or nothing: every check (sizes, op counts, empty keys, duplicate keys, the chosen
    /// ranges' revisions, `ignore_value` keys, leases) runs before the first write. `wrote` is
    /// false when the chosen ops wrote nothing; the store is then untouched.
    pub fn txn(
        &mut self,
        req: &TxnRequest,
        rev: Revision,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<Outcome<TxnResponse>, EtcdError> {
        self.check_rev(rev)?;
        check_txn(req, 0)?;
        check_size(req.size())?;
        check_intervals(&req.success)?;
        check_intervals(&req.failure)?;
        let current = rev - 1;
        let mut path = Vec::new();
        self.txn_path(req, current, &mut path);
        let mut at = 0;
        self.check_path(req, &path, &mut at, current, lease_exists)?;
        let (mut at, mut sub) = (0, 0);
        let response = self.exec_txn(req, &path, &mut at, rev, &mut sub);
        Ok(Outcome {
            response,
            wrote: sub > 0,
        })
    }

    /// Whether `c` holds at revision `at`: for every live key of its range, or for an absent
    /// key (version, revisions and lease 0; no value compare holds).
    pub(super) fn compare(&self, c: &Compare, at: Revision) -> bool {
        let mut hits = self.hits(c.range.span(), at).peekable();
        let judge = |ord: std::cmp::Ordering| match c.result {
            CompareResult::Equal => ord.is_eq(),
            CompareResult::NotEqual => ord.is_ne(),
            CompareResult::Greater => ord.is_gt(),
            CompareResult::Less => ord.is_lt(),
        };
        // i128: revisions are u64, etcd's targets i64.
        let int = |field: i128, target: i64| judge(field.cmp(&(target as i128)));
        if hits.peek().is_none() {
            return match &c.target {
                CompareTarget::Value(_) => false,
                CompareTarget::Version(t)
                | CompareTarget::CreateRevision(t)
                | CompareTarget::ModRevision(t)
                | CompareTarget::Lease(t) => int(0, *t),
            };
        }
        hits.all(|h| match &c.target {
            CompareTarget::Version(t) => int(h.version as i128, *t),
            CompareTarget::CreateRevision(t) => int(h.create_revision as i128, *t),
            CompareTarget::ModRevision(t) => int(h.rev.main as i128, *t),
            CompareTarget::Lease(t) => int(h.lease as i128, *t),
            CompareTarget::Value(t) => judge(self.value(h.key, h.rev).as_slice().cmp(t)),
        })
    }

    /// The branch each txn of the tree takes, in the order the ops reach them: the txn's own,
    /// then those of the nested txns of its chosen branch (etcd's `compareToPath`).
    fn txn_path(&self, req: &TxnRequest, at: Revision, path: &mut Vec<bool>) {
        let succeeded = req.compare.iter().all(|c| self.compare(c, at));
        path.push(succeeded);
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        for op in ops {
            if let RequestOp::Txn(t) = op {
                self.txn_path(t, at, path);
            }
        }
    }

    /// The checks of the ops on the path that depend on the state.
    fn check_path(
        &self,
        req: &TxnRequest,
        path: &[bool],
        at: &mut usize,
        current: Revision,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<(), EtcdError> {
        let succeeded = path.get(*at).copied().unwrap_or(false);
        *at += 1;
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        for op in ops {
            match op {
                RequestOp::Range(r) => {
                    self.read_revision(r.revision, current)?;
                }
                RequestOp::Put(p) => self.check_put_state(p, lease_exists)?,
                RequestOp::DeleteRange(_) => {}
                RequestOp::Txn(t) => self.check_path(t, path, at, current, lease_exists)?,
            }
        }
        Ok(())
    }

    /// Run a checked txn along `path`.
    fn exec_txn(
        &mut self,
        req: &TxnRequest,
        path: &[bool],
        at: &mut usize,
        rev: Revision,
        sub: &mut u32,
    ) -> TxnResponse {
        let succeeded = path.get(*at).copied().unwrap_or(false);
        *at += 1;
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            responses.push(match op {
                RequestOp::Range(r) => {
                    // The txn's own revision once it wrote, the store's before.
                    let current = if *sub > 0 { rev } else { rev - 1 };
                    let read_at = if r.revision == 0 { current } else { r.revision };
                    // Not limited: this txn was validated and runs all or nothing (a
                    // read-only txn is limited afterwards, `txn_read_only`).
                    ResponseOp::Range(self.range_at(r, read_at, usize::MAX).unwrap_or_default())
                }
                RequestOp::Put(p) => {
                    let response = self.exec_put(
                        p,
                        Rev {
                            main: rev,
                            sub: *sub,
                        },
                    );
                    *sub += 1;
                    ResponseOp::Put(response)
                }
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.exec_delete(d, rev, sub)),
                RequestOp::Txn(t) => ResponseOp::Txn(self.exec_txn(t, path, at, rev, sub)),
            });
        }
        TxnResponse {
            succeeded,
            responses,
        }
    }
}

/// Bytes of keys and values the ranges of a txn's answer return.
fn read_bytes(t: &TxnResponse) -> usize {
    t.responses
        .iter()
        .map(|op| match op {
            ResponseOp::Range(r) => r.kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum(),
            ResponseOp::Txn(t) => read_bytes(t),
            ResponseOp::Put(_) | ResponseOp::DeleteRange(_) => 0,
        })
        .fold(0usize, usize::saturating_add)
}

/// etcd's `checkTxnRequest`: op counts per level, empty keys, put flags; plus the depth.
fn check_txn(req: &TxnRequest, depth: usize) -> Result<(), EtcdError> {
    if depth >= MAX_TXN_DEPTH {
        return Err(EtcdError::TxnTooDeep { max: MAX_TXN_DEPTH });
    }
    let ops = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    if ops > MAX_TXN_OPS {
        return Err(EtcdError::TooManyOps { max: MAX_TXN_OPS });
    }
    if req.compare.iter().any(|c| c.range.key.is_empty()) {
        return Err(EtcdError::EmptyKey);
    }
    for op in req.success.iter().chain(&req.failure) {
        match op {
            RequestOp::Range(r) if r.range.key.is_empty() => return Err(EtcdError::EmptyKey),
            RequestOp::DeleteRange(d) if d.range.key.is_empty() => return Err(EtcdError::EmptyKey),
            RequestOp::Put(p) => check_put(p)?,
            RequestOp::Txn(t) => check_txn(t, depth + 1)?,
            _ => {}
        }
    }
    Ok(())
}

/// A union of key intervals `[start, end)` (`end` `None` = unbounded), kept disjoint.
#[derive(Default)]
struct Intervals {
    map: BTreeMap<Bytes, Option<Bytes>>,
}

fn max_end(a: Option<Bytes>, b: Option<Bytes>) -> Option<Bytes> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    }
}

impl Intervals {
    fn insert_range(&mut self, range: &KeyRange) {
        match range.span() {
            Span::Single(k) => {
                let mut end = k.to_vec();
                end.push(0);
                self.insert(k.to_vec(), Some(end));
            }
            Span::From(from) => self.insert(from.to_vec(), None),
            Span::Between(from, end) => self.insert(from.to_vec(), Some(end.to_vec())),
            Span::Empty => {}
        }
    }

    fn insert(&mut self, mut start: Bytes, mut end: Option<Bytes>) {
        let before = self
            .map
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(start.as_slice())))
            .next_back()
            .map(|(s, e)| (s.clone(), e.clone()));
        if let Some((s, e)) = before {
            if e.as_ref().is_none_or(|e| *e >= start) {
                self.map.remove(&s);
                start = s;
                end = max_end(end, e);
            }
        }
        loop {
            let next = self
                .map
                .range::<[u8], _>((Bound::Included(start.as_slice()), Bound::Unbounded))
                .next()
                .map(|(s, e)| (s.clone(), e.clone()));
            match next {
                Some((s, e)) if end.as_ref().is_none_or(|end| s <= *end) => {
                    self.map.remove(&s);
                    end = max_end(end, e);
                }
                _ => break,
            }
        }
        self.map.insert(start, end);
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.map
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .is_some_and(|(_, end)| end.as_ref().is_none_or(|end| key < end.as_slice()))
    }

    fn union(&mut self, other: Intervals) {
        for (start, end) in other.map {
            self.insert(start, end);
        }
    }
}

/// etcd's `checkIntervals`: no key put twice, nor put and deleted, on one path of the txn
/// tree (a key put in both branches of a nested txn is fine: one of them runs). Returns the
/// keys put and the ranges deleted under `reqs`.
fn check_intervals(reqs: &[RequestOp]) -> Result<(BTreeSet<Bytes>, Intervals), EtcdError> {
    let mut dels = Intervals::default();
    for op in reqs {
        if let RequestOp::DeleteRange(d) = op {
            dels.insert_range(&d.range);
        }
    }
    let mut puts = BTreeSet::new();
    for op in reqs {
        let RequestOp::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || dels.contains(k) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in puts_else {
            if (puts.contains(&k) && !puts_then.contains(&k)) || dels.contains(&k) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(k);
        }
        dels.union(dels_then);
        dels.union(dels_else);
    }
    for op in reqs {
        if let RequestOp::Put(p) = op {
            if puts.contains(&p.key) || dels.contains(&p.key) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(p.key.clone());
        }
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The merged intervals answer `contains` as the plain list of ranges does.
        #[test]
        fn intervals_contain_what_their_ranges_contain(
            ranges in proptest::collection::vec(
                (proptest::collection::vec(0u8..4, 1..3), proptest::collection::vec(0u8..4, 0..3)),
                0..12,
            ),
            probes in proptest::collection::vec(proptest::collection::vec(0u8..4, 1..4), 1..20),
        ) {
            let ranges: Vec<KeyRange> =
                ranges.into_iter().map(|(k, e)| KeyRange::new(k, e)).collect();
            let (mut one, mut halves, mut other) =
                (Intervals::default(), Intervals::default(), Intervals::default());
            for (i, r) in ranges.iter().enumerate() {
                one.insert_range(r);
                if i % 2 == 0 { halves.insert_range(r) } else { other.insert_range(r) }
            }
            halves.union(other);
            for p in probes {
                let want = ranges.iter().any(|r| r.contains(&p));
                prop_assert_eq!(one.contains(&p), want, "{:?} in {:?}", p, ranges);
                prop_assert_eq!(halves.contains(&p), want);
            }
            // Disjoint and ordered.
            let spans: Vec<_> = one.map.iter().collect();
            for w in spans.windows(2) {
                prop_assert!(w[0].1.as_ref().is_some_and(|end| end < w[1].0));
            }
        }
    }
}
