//! The pure core of fenced: a deterministic state machine of leased locks, sessions and
//! request deduplication, applied to Raft log entries.
//!
//! Rules (docs/architecture.md, "Rules of the core"):
//! * time comes only from the entries (`now = max(now, entry.time_ms)`); no clock, no
//!   randomness, no I/O;
//! * a log entry carries a [`Batch`] of commands; every applied command takes the next store
//!   *revision* (one counter in the replicated state), and the fencing token of a grant is the
//!   revision of the command that granted it, so tokens only grow, across leader changes and
//!   restarts, and one entry can carry many commands;
//! * every client request carries a [`RequestId`]; a retried request is answered with the
//!   outcome of its first application and never acts twice.

pub mod command;
pub mod cow;
pub mod digest;
pub mod etcd;
pub mod gate;
pub mod kv;
pub mod limits;
pub mod machine;
pub mod semantics;
pub mod small_map;

pub use command::{
    AcquireSpec, Applied, AppliedBatch, Batch, Command, CorruptAlarm, EtcdCommand, EtcdReply,
    Event, Index, Millis, Mode, ReleaseReason, Request, RequestId, Response, Revision, Semantics,
    SessionId, SessionLife, Token,
};
pub use digest::StateDigest;
pub use kv::limit::{Decision, LimitError, LimitMode, LogPolicy, Policy};
pub use machine::{
    lease_owner, lock_key, HolderInfo, LockInfo, LockKind, SessionInfo, StateMachine,
};

use serde::{Deserialize, Serialize};

/// Why the state machine refused a request. Part of the replicated state (stored in the dedup
/// table), hence `Serialize`.
#[derive(thiserror::Error, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum CoreError {
    #[error("lock name must be 1..={max} bytes, got {len}")]
    InvalidName { len: usize, max: usize },
    #[error("owner must be 1..={max} bytes, got {len}")]
    InvalidOwner { len: usize, max: usize },
    #[error("ttl_ms must be in 1..={max}, got {ttl_ms}")]
    InvalidTtl { ttl_ms: u64, max: u64 },
    #[error("wait_ms must be at most {max}, got {wait_ms}")]
    InvalidWait { wait_ms: u64, max: u64 },
    #[error("a waiting acquire needs a request id (client_id, seq)")]
    WaitNeedsRequestId,
    #[error("session {0} does not exist or has expired")]
    NoSuchSession(u64),
    #[error("lock {name} already has {max} waiters")]
    TooManyWaiters { name: String, max: usize },
    #[error("lock {name} is already held {max} times by its owner")]
    TooManyHolds { name: String, max: u32 },
    #[error("the lease of lock {0} belongs to its session; keep the session alive instead")]
    LockBoundToSession(String),
    #[error("request {seq} of client {client_id} is older than the dedup window")]
    RequestTooOld { client_id: u64, seq: u64 },
    #[error("{what} limit of {max} reached")]
    LimitReached { what: String, max: usize },
    #[error("lock {name} is a {existing} lock, not a {requested} one")]
    WrongKind {
        name: String,
        existing: String,
        requested: String,
    },
    #[error("a multi-lock takes 1..={max} distinct names, got {got}")]
    InvalidNames { got: usize, max: usize },
    #[error("only exclusive locks can be taken together in a multi-lock")]
    MultiLockMode,
    #[error("permits must be in 1..={max}, got {permits}")]
    InvalidPermits { permits: u32, max: u32 },
    #[error("lock_delay_ms must be at most {max}, got {delay_ms}")]
    InvalidLockDelay { delay_ms: u64, max: u64 },
    #[error("{owner} holds a read lock on {name}; upgrading to write is not supported")]
    UpgradeNotSupported { name: String, owner: String },
    #[error("{owner} already holds part of this multi-lock with another grant")]
    PartiallyHeld { owner: String },
    /// Appended last (the enum is part of the dedup table's encoding).
    #[error("value must be at most {max} bytes, got {len}")]
    ValueTooLarge { len: usize, max: usize },
    /// A refused rate-limiter request ([`Command::Limit`]). Appended last.
    #[error("{0}")]
    Limit(LimitError),
    /// A refused etcd call ([`Command::Etcd`]), with etcd's message. Appended last.
    #[error("{0}")]
    Etcd(etcd::EtcdError),
    /// A command the entry's apply rules (or, at the leader's door, the cluster's) do not
    /// have yet: some member runs older code ([`gate`]). Appended last.
    #[error("cluster not upgraded: {detail}")]
    NotUpgraded { needs: u8, detail: String },
    /// A command of one user ([`Command::AsUser`]) named a session another user opened.
    /// Appended last.
    #[error("session {session} belongs to another user")]
    NotSessionOwner { session: u64 },
    /// The request's log entry was quarantined by the operator (`fenced debug quarantine`):
    /// it was applied as a no-op ([`StateMachine::apply_quarantined`]). Appended last.
    #[error(
        "quarantined by the operator: the log entry at index {index} that carried this \
         request was applied as a no-op; the request did nothing"
    )]
    Quarantined { index: u64 },
    /// A script, refused at the leader's door while a member runs another Lua build (its
    /// fingerprint, [`kv::lua_build`], differs from the leader's): they could compute
    /// different results for it. Appended last.
    #[error(
        "scripts are refused while members run different Lua builds: member {member}'s \
         fingerprint is {theirs:016x}, the leader's {ours:016x} (docs/operations.md, 'Scripts')"
    )]
    LuaBuildDiffers { member: u64, theirs: u64, ours: u64 },
    /// A request id (RESP `REQID`, gRPC `client_id`/`seq`) already used for a different
    /// command ([`Semantics::REQUEST_DIGESTS`]). Never stored: the id keeps its first
    /// outcome. Appended last.
    #[error(
        "REQID {client_id} {seq} was already used for a different command; a retry must \
         repeat the same command, a new command needs a new REQID"
    )]
    RequestIdReused { client_id: u64, seq: u64 },
    /// A command the entry's rules no longer apply (`since`: the rules that retired it),
    /// e.g. [`Command::EtcdLock`] under [`Semantics::KEYSPACE_LOCKS`]. Appended last.
    #[error("retired by apply rules {since}: {detail}")]
    Retired { since: u8, detail: String },
}

/// Errors decoding a snapshot of the state machine.
#[derive(thiserror::Error, Debug)]
pub enum SnapshotError {
    #[error("corrupt state machine snapshot: {0}")]
    Decode(#[from] bincode::Error),
}
