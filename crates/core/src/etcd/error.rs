//! Why the etcd keyspace refused a call: etcd's errors, with etcd's messages (clients match
//! some of them by text). A refused call changes nothing.

use serde::{Deserialize, Serialize};

use crate::Revision;

#[derive(thiserror::Error, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum EtcdError {
    /// A read, watch or compaction below the compact revision.
    #[error("mvcc: required revision has been compacted")]
    Compacted { compact_revision: Revision },
    /// A read or compaction above the current revision.
    #[error("mvcc: required revision is a future revision")]
    FutureRevision { current: Revision },
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// `ignore_value`/`ignore_lease` on a key that does not exist.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound { lease: i64 },
    /// A `LeaseGrant` above [`super::MAX_LEASE_TTL_S`].
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    /// A `LeaseGrant` naming a negative id: a lease is a session, whose ids are positive.
    #[error("etcdserver: fenced's lease ids are positive: grant with ID 0 or a positive ID (lease {lease} requested)")]
    LeaseIdChosen { lease: i64 },
    /// More than [`super::MAX_TXN_OPS`] compares, success or failure ops in one txn.
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps { max: usize },
    /// Txns nested deeper than [`super::MAX_TXN_DEPTH`] (etcd has no such limit of its own;
    /// its gRPC decoder has one).
    #[error("etcdserver: too many operations in txn request (txns nested deeper than {max})")]
    TxnTooDeep { max: usize },
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    /// Larger than [`super::MAX_REQUEST_BYTES`].
    #[error("etcdserver: request is too large")]
    RequestTooLarge { size: usize, max: usize },
    /// A read whose keys and values come to more than [`super::MAX_RANGE_BYTES`]: ask with a
    /// `limit` and page (fenced's own limit; etcd's is its clients' receive limit).
    #[error("etcdserver: range response is too large (over {max} bytes of keys and values): ask with a limit and page")]
    RangeTooLarge { max: usize },
    /// The caller's revisions must grow: a bug of the caller, never of a client.
    #[error("etcd keyspace: revision {rev} is not above the last write's {last}")]
    RevisionNotIncreasing { rev: Revision, last: Revision },
    /// A write that may put, refused by the space quota: the `NOSPACE` alarm is raised (by
    /// this write, or before it) until `Maintenance.Alarm` disarms it ([`super::Quota`]).
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    /// A `LeaseGrant` naming the id of a live lease (or session).
    #[error("etcdserver: lease already exists")]
    LeaseExists { lease: i64 },
}
