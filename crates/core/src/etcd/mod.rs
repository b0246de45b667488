//! An etcd v3 keyspace (etcd's `mvcc`): revisioned keys with their history, compaction and a
//! revision-ordered change feed for watches. Pure data and operations: no I/O, no clock, no
//! randomness, only ordered maps. The state machine applies it through [`crate::Command::Etcd`]
//! (`crate::machine`'s `etcd` module) and serves its reads on a state clone.
//!
//! It is separate from the Redis keyspace ([`crate::kv`]): Redis types, `FLUSHALL` and Redis
//! expiry never touch it.
//!
//! # Revisions
//! The caller passes the revision of every mutating call: the state machine's store revision
//! (the fencing-token counter), which also advances for lock grants, expiry ticks, limiter
//! decisions… So the revisions this keyspace sees are **strictly increasing but not
//! contiguous**: a put at 7 may be followed by one at 12. Clients only rely on their order
//! (etcd's own clients do). A call that changes several keys (a delete of a range, a
//! [`txn`](EtcdStore::txn)) writes all of them at one *main* revision, ordered by a *sub*
//! index ([`Rev`]), as etcd does; their watch events come in that order.
//!
//! A mutating call is given `rev`, the revision it takes if it writes: `rev - 1` is the store
//! revision before it (the state machine gives each command its revision + 1), so reads inside
//! a txn before its first write see the store at `rev - 1`, after it at `rev`. A call that
//! writes nothing (a delete that matched no key, a txn whose chosen branch only reads) changes
//! nothing at all and says so ([`Outcome::wrote`] is false): the caller may then leave its
//! counter where it was.
//!
//! Keys never expire by time. They go with their lease: a put naming a lease attaches the key
//! to it (the caller's `lease_exists` says which leases are live — the state machine's
//! sessions, under [`Semantics::LEASES`](crate::Semantics::LEASES)), a later put with
//! another lease or none moves or detaches it (`ignore_lease` keeps it), and
//! [`EtcdStore::delete_lease_keys`] deletes what is attached when the lease ends. The index
//! lease → keys is derived from the live keys' newest versions (never encoded). A range
//! needs the read barrier, not a committed-time tick.
//!
//! # Layout, and why
//! * `versions: CowMap<(key, main, sub), Stored>` — every version of every key (a put, or the
//!   tombstone a delete writes), **each its own copy-on-write entry**. A snapshot clones the
//!   map in O(1) and a later write copies only the B-tree path to its entry. (A per-key history
//!   `Vec` behind one `Arc` would be shared with the snapshot and copied whole on the next
//!   write to that key: O(history) per write while a snapshot is being taken.)
//! * `latest: CowMap<key, Latest>` — the newest version's metadata of every *live* key (no
//!   tombstones): current reads, compares, counts and the next version number without touching
//!   the history. Values stay in `versions` only.
//! * `by_rev: CowMap<Rev, key>` — the change feed: every stored version by revision, for
//!   watch replay and for compaction to find what it must look at.
//! * `compact_revision`, `last_write`, the position of a compaction in progress and the byte
//!   count of the stored history.
//!
//! Only `versions`, `compact_revision`, `last_write` and the compaction's position are
//! serialized (see [`EtcdStore`]'s `Serialize`): `latest`, `by_rev` and the byte count are
//! derived from them on decode (O(n log n), like decoding the maps would be). The encoding
//! depends only on the contents: two replicas that applied the same calls encode to the same
//! bytes.
//!
//! # Costs
//! With n stored versions and k keys in the requested range:
//! * put: O(log n); delete of a range: O(log n + k log n);
//! * range at the current revision (or any revision at or above the last write): O(log n + k)
//!   from `latest`, plus O(log n) per returned value; at an older revision: O(k log n), k
//!   counting every key with history in the range. Like etcd's, the count walks the whole
//!   range even with a limit;
//! * events after r: O(log n + e) for the e changes after r (all keys; a key range filters
//!   them), plus O(log n) per previous kv asked for;
//! * compaction to c: O(m log n) for the m versions written between the previous compact
//!   revision and c — never a scan of the whole store — and in bounded steps if wanted.
//!
//! Measured (release, `tests/etcd_scale.rs`, on a shared 2-core machine, two runs: 1 M
//! versions of 100-byte values over 100 k keys): a put 2.3–3.5 µs; an O(1) clone then a put
//! 60–100 µs; a range of all 100 k keys 145–220 ms now, 220–300 ms at an old revision; limit
//! 500 with its count of 100 k 13–17 ms; 10 k events with prev kvs ~22 ms; encode 0.4–1.1 s,
//! decode with the index rebuild ~3.2 s; compacting away 800 k versions ~1.1 s at once, or
//! 101 steps of budget 10,000 (about 12 ms each, the slowest 68 ms).
//!
//! # Compaction
//! [`EtcdStore::compact`] (or [`begin_compact`](EtcdStore::begin_compact) then
//! [`compact_step`](EtcdStore::compact_step)s) at c keeps, per key, the newest version at or
//! below c unless it is a tombstone, and every version above c; everything else below c goes. Reads at revisions at
//! or above c are unchanged; reads below fail with [`EtcdError::Compacted`]. The change feed
//! is complete only *after* c (a tombstone at c itself is gone). A watch may still start at c
//! (`after = c - 1`), as etcd's may — clients resume at the compact revision they were told
//! after a compacted cancel — and gets the puts at c but not the deletes at c, as in etcd;
//! [`events_since`](EtcdStore::events_since) refuses only `after < c - 1`.

mod auto_compact;
mod compact;
mod error;
mod hash;
mod quota;
mod range;
mod store;
mod txn;
mod watch;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_history;

use serde::{Deserialize, Serialize};

pub use auto_compact::{AutoCompaction, AutoCompactor};
pub use compact::CompactStats;
pub use error::EtcdError;
pub use quota::{effective as effective_quota, put_cost, txn_cost, Quota, DEFAULT_QUOTA_BYTES};
pub use store::EtcdStore;

use crate::Revision;

/// Keys and values are byte strings.
pub type Bytes = Vec<u8>;

/// A lease id (etcd's `int64`; 0 = no lease). A lease is a fenced session: its id is the
/// session's ([`crate::SessionId`], the revision that opened it).
pub type LeaseId = i64;

/// etcd's longest lease TTL (`MaxLeaseTTL`), in seconds: a longer grant is refused with
/// [`EtcdError::LeaseTtlTooLarge`].
pub const MAX_LEASE_TTL_S: i64 = 9_000_000_000;
/// etcd's shortest lease TTL with its default election timeout (1 s: ⌈1.5 × 1 s⌉): a grant
/// asking less is raised to it, as etcd's lessor does.
pub const MIN_LEASE_TTL_S: i64 = 2;

/// The longest TTL a `LeaseGrant` is granted: one day, the sessions' cap
/// ([`crate::limits::MAX_TTL_MS`]), since a lease is a session (etcd's own cap,
/// [`MAX_LEASE_TTL_S`], is 285 years: a lease of a client that died then outlives everyone).
/// Checked where a grant comes in ([`lease_ttl`]); apply keeps etcd's cap, so that entries
/// already in a log replay as they applied.
pub const MAX_GRANTED_LEASE_TTL_S: i64 = (crate::limits::MAX_TTL_MS / 1000) as i64;

/// The TTL a `LeaseGrant` asking `ttl_s` seconds is granted (etcd's rules): raised to
/// [`MIN_LEASE_TTL_S`], refused above [`MAX_GRANTED_LEASE_TTL_S`] with etcd's error.
pub fn lease_ttl(ttl_s: i64) -> Result<i64, EtcdError> {
    if ttl_s > MAX_GRANTED_LEASE_TTL_S {
        return Err(EtcdError::LeaseTtlTooLarge);
    }
    Ok(ttl_s.max(MIN_LEASE_TTL_S))
}

/// A lease id as the session it names (`None`: 0 or negative, no session).
pub fn lease_session(lease: LeaseId) -> Option<crate::SessionId> {
    u64::try_from(lease).ok().filter(|s| *s != 0)
}

/// Most operations in one level of a txn (compares, success ops or failure ops each), etcd's
/// `--max-txn-ops` default.
pub const MAX_TXN_OPS: usize = 128;
/// Largest request, etcd's `--max-request-bytes` default (1.5 MiB). Measured by
/// [`request_size`](TxnRequest::size): the bytes of every key, range end and value in it plus
/// [`OP_OVERHEAD`] per operation and compare — close to, and never far above, its protobuf
/// size.
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// Most bytes of keys and values one read (a `Range`, or the ranges of a read-only `Txn`)
/// returns: a larger one is refused with [`EtcdError::RangeTooLarge`] — page with `limit`.
/// Ranges inside a txn that writes are not limited (that txn was validated before it ran
/// and is all or nothing).
pub const MAX_RANGE_BYTES: usize = 64 * 1024 * 1024;
/// Bytes counted per operation or compare on top of its keys and values.
pub const OP_OVERHEAD: usize = 16;
/// Deepest nesting of txns in a txn (gRPC's decoder stops at 100 nested messages anyway; a
/// nested txn costs several).
pub const MAX_TXN_DEPTH: usize = 16;
/// Bytes counted per stored version on top of its key and value, for the quota
/// ([`EtcdStore::history_bytes`]): roughly what etcd's backend spends on a revision key and a
/// `KeyValue`'s integers.
pub const VERSION_OVERHEAD: u64 = 48;

/// etcd's revision: a main revision (the store revision of the call) and a sub index ordering
/// the writes of one call.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rev {
    pub main: Revision,
    pub sub: u32,
}

/// A key's version as clients see it (etcd's `mvccpb.KeyValue`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Bytes,
    /// Revision of the put that started this generation of the key.
    pub create_revision: Revision,
    /// Revision of this version.
    pub mod_revision: Revision,
    /// 1 for the generation's first put, +1 for each later one.
    pub version: i64,
    pub value: Bytes,
    pub lease: LeaseId,
}

/// What a mutating call did. `wrote` is false when it changed nothing at all (the store is
/// exactly as before): the caller may then not consume the revision it passed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Outcome<T> {
    pub response: T,
    pub wrote: bool,
}

/// A key or a range of keys, as etcd names them: `range_end` empty = the key alone; `"\0"` =
/// every key `>= key`; otherwise `[key, range_end)` (a prefix p is `[p, p+1)`, see
/// [`prefix_end`]). A `range_end` at or below `key` names nothing. The key `"\0"` with
/// `range_end` `"\0"` is every key.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRange {
    pub key: Bytes,
    pub range_end: Bytes,
}

impl KeyRange {
    pub fn key(key: impl Into<Bytes>) -> KeyRange {
        KeyRange {
            key: key.into(),
            range_end: Vec::new(),
        }
    }

    pub fn new(key: impl Into<Bytes>, range_end: impl Into<Bytes>) -> KeyRange {
        KeyRange {
            key: key.into(),
            range_end: range_end.into(),
        }
    }

    /// Every key starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> KeyRange {
        let key = prefix.into();
        let range_end = prefix_end(&key);
        KeyRange { key, range_end }
    }

    /// Every key.
    pub fn all() -> KeyRange {
        KeyRange::new(vec![0], vec![0])
    }

    /// The keys the range names.
    pub(crate) fn span(&self) -> Span<'_> {
        match self.range_end.as_slice() {
            [] => Span::Single(&self.key),
            [0] => Span::From(&self.key),
            end if end <= self.key.as_slice() => Span::Empty,
            end => Span::Between(&self.key, end),
        }
    }

    /// Whether `key` lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self.span() {
            Span::Single(k) => key == k,
            Span::From(from) => key >= from,
            Span::Between(from, end) => key >= from && key < end,
            Span::Empty => false,
        }
    }
}

/// What a [`KeyRange`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Span<'a> {
    Single(&'a [u8]),
    /// Every key at or above.
    From(&'a [u8]),
    /// `[from, end)`, `from < end`.
    Between(&'a [u8], &'a [u8]),
    Empty,
}

/// The end of the range of keys starting with `prefix` (etcd's `GetPrefixRangeEnd`): the
/// prefix with its last byte below 0xff incremented and what follows dropped; `"\0"` (every
/// key) for an empty prefix or one of 0xff bytes only.
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Result order of a range (etcd's `SortOrder`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

/// What a range sorts by (etcd's `SortTarget`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

/// etcd's `RangeRequest` (without `serializable`, a read-path matter).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    pub range: KeyRange,
    /// Most keys returned; 0 = no limit.
    pub limit: u64,
    /// The revision to read at; 0 = the current one.
    pub revision: Revision,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub keys_only: bool,
    pub count_only: bool,
    /// Filters; 0 = none.
    pub min_mod_revision: Revision,
    pub max_mod_revision: Revision,
    pub min_create_revision: Revision,
    pub max_create_revision: Revision,
}

impl RangeRequest {
    pub fn new(range: KeyRange) -> RangeRequest {
        RangeRequest {
            range,
            ..RangeRequest::default()
        }
    }
}

/// etcd's `RangeResponse` (the header is the caller's).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    pub kvs: Vec<KeyValue>,
    /// Keys in the range at the revision read, whatever the limit and the filters.
    pub count: u64,
    /// Whether the limit cut the result.
    pub more: bool,
}

/// etcd's `PutRequest`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct PutRequest {
    pub key: Bytes,
    pub value: Bytes,
    pub lease: LeaseId,
    pub prev_kv: bool,
    /// Keep the current value (the key must exist; `value` must be empty).
    pub ignore_value: bool,
    /// Keep the current lease (the key must exist; `lease` must be 0).
    pub ignore_lease: bool,
}

impl PutRequest {
    pub fn new(key: impl Into<Bytes>, value: impl Into<Bytes>) -> PutRequest {
        PutRequest {
            key: key.into(),
            value: value.into(),
            ..PutRequest::default()
        }
    }
}

/// etcd's `PutResponse`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct PutResponse {
    /// The key's previous live version, if asked for and there was one.
    pub prev_kv: Option<KeyValue>,
}

/// etcd's `DeleteRangeRequest`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRangeRequest {
    pub range: KeyRange,
    pub prev_kv: bool,
}

/// etcd's `DeleteRangeResponse`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRangeResponse {
    pub deleted: u64,
    /// The deleted keys' last versions, in key order, if asked for.
    pub prev_kvs: Vec<KeyValue>,
}

/// How a compare judges (etcd's `Compare.CompareResult`): `target <op> the key's field`, read
/// as "the key's field is EQUAL/GREATER/… than the target".
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// What a compare looks at, with the value compared against (etcd's `target` + `target_union`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(Bytes),
    Lease(LeaseId),
}

/// etcd's `Compare`: over one key, or every key of a range (all must satisfy it). An absent
/// key compares as version, revisions and lease 0, and fails every `Value` compare.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub range: KeyRange,
    pub result: CompareResult,
    pub target: CompareTarget,
}

/// One operation of a txn (etcd's `RequestOp`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

/// etcd's `ResponseOp`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

/// etcd's `TxnRequest`: if every compare holds, the success ops run, else the failure ops.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

/// etcd's `TxnResponse`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnResponse {
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

/// A change, for watchers (etcd's `mvccpb.Event`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// etcd's `mvccpb.Event`. A delete's `kv` has the key and the delete's revision as
/// `mod_revision`, every other field zero (as etcd sends it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    /// The key's version before this change, if asked for and it was live.
    pub prev_kv: Option<KeyValue>,
}

/// A page of the change feed ([`EtcdStore::events_since`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Events {
    /// In revision order, then sub order.
    pub events: Vec<Event>,
    /// Every matching change at or below this revision has been returned (now or before):
    /// ask again with `after = resume_after`, with no gap and no duplicate. A page never
    /// splits a revision.
    pub resume_after: Revision,
    /// The limit stopped the page: more changes may follow at once.
    pub more: bool,
}
