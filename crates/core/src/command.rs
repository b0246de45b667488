//! What goes into the log (`Request`) and what comes out of applying it (`Response`, `Event`).

use serde::{Deserialize, Serialize};

use crate::etcd::{
    CompactStats, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, Quota,
    TxnRequest, TxnResponse,
};
use crate::kv::limit::{Decision, LimitMode, Policy};
use crate::kv::{KvCommand, KvEvent, KvResponse};
use crate::CoreError;

pub use crate::semantics::Semantics;

/// Raft log index.
pub type Index = u64;
/// Store revision: a counter in the replicated state that every applied command advances by
/// one (see [`crate::StateMachine::revision`]).
pub type Revision = u64;
/// Fencing token: the revision of the command that granted the lock.
pub type Token = Revision;
/// Milliseconds of *log time* (see [`Request::time_ms`]).
pub type Millis = u64;
/// Session identifier: the revision of the command that opened the session.
pub type SessionId = Revision;

/// Identifies one client request for deduplication: a client numbers its requests 1, 2, 3, …
/// and a retry reuses the number, so the state machine can answer it with the first outcome.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId {
    pub client_id: u64,
    pub seq: u64,
}

/// One log entry's payload: the commands the leader collected while earlier entries were in
/// flight, applied in order, each taking the next revision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Batch {
    pub requests: Vec<Request>,
    /// Which rules apply the entry ([`Semantics`]). Encoded as one byte where entries of
    /// earlier versions had the `index_tokens` flag (`false` = 0, `true` = 1), so every entry
    /// ever written decodes unchanged.
    pub semantics: Semantics,
}

impl Batch {
    /// A batch of one request, under the newest rules.
    pub fn one(req: Request) -> Batch {
        Batch {
            requests: vec![req],
            semantics: Semantics::NEWEST,
        }
    }

    /// An entry written before revisions (see [`Semantics::INDEX_TOKENS`]).
    pub fn legacy(req: Request) -> Batch {
        Batch {
            requests: vec![req],
            semantics: Semantics::INDEX_TOKENS,
        }
    }
}

/// One client request (or leader-internal command) of a [`Batch`]: one command.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Log time stamped by the leader (ms). The state machine's clock is
    /// `max(previous, time_ms)`; it never reads a clock of its own.
    pub time_ms: Millis,
    /// Present for client requests; absent for leader-internal entries such as [`Command::Tick`].
    pub client: Option<RequestId>,
    pub cmd: Command,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Take `name` for `owner`.
    ///
    /// * With `session`, the grant lives as long as the session (keep-alives extend it) and
    ///   `ttl_ms` is ignored; without, the grant has its own lease of `ttl_ms`.
    /// * The same owner (and session) again is reentrant: the same token, one more hold.
    /// * If the lock is held and `wait_ms > 0`, the request joins the lock's FIFO queue and is
    ///   answered [`Response::Pending`]; the grant (or the timeout) arrives later as an [`Event`]
    ///   and also replaces the dedup record, so a retry sees the final outcome.
    Acquire {
        name: String,
        owner: String,
        ttl_ms: Millis,
        session: Option<SessionId>,
        wait_ms: Millis,
    },
    /// The general acquire: read/write locks, semaphores, atomic multi-locks, lock-delay.
    /// `Acquire` is the same as `AcquireWith` with one name and [`Mode::Exclusive`].
    AcquireWith(Box<AcquireSpec>),
    /// Drop one hold of the grant `token` of `name`; the last hold frees the lock and grants
    /// it to the first waiter in the same command (same revision).
    Release {
        name: String,
        owner: String,
        token: Token,
    },
    /// Release a multi-lock grant: one hold of `token` on each of `names`.
    ReleaseAll {
        names: Vec<String>,
        owner: String,
        token: Token,
    },
    /// Administrative: end every grant of `name` now (no lock-delay), and hand it on.
    ForceUnlock {
        name: String,
    },
    /// Extend the lease of grant `token` to at least `now + ttl_ms`. A renewal that names an
    /// older token can never extend a newer grant.
    Renew {
        name: String,
        owner: String,
        token: Token,
        ttl_ms: Millis,
    },
    OpenSession {
        ttl_ms: Millis,
    },
    KeepAlive {
        session: SessionId,
    },
    /// Closes the session and releases every lock it holds.
    CloseSession {
        session: SessionId,
    },
    /// Carries only time: proposed by the leader when a deadline has passed so that expiry
    /// (and handing the lock to the next waiter) happens without other traffic.
    Tick,
    /// A keyspace command (RESP front end).
    Kv(KvCommand),
    /// Write `value` under keyspace key `key` if `token` is at least the key's fence mark
    /// (what `FENCE.SET key value token` does, with a typed answer): [`Response::Fenced`].
    /// Appended last, so entries written before it existed still decode.
    FencedPut {
        key: Vec<u8>,
        value: Vec<u8>,
        token: Token,
    },
    /// A rate-limiter request on keyspace key `key` (what `CL.THROTTLE` and the `LIMIT.*`
    /// commands do, typed): [`Response::Limited`], or [`Response::Rejected`] with
    /// [`CoreError::Limit`] for a bad policy or quantity, or a key of another type (nothing
    /// consumed). Decided at the command's log time; a retry with the same request id gets
    /// the first decision and consumes nothing. Appended last.
    Limit {
        key: Vec<u8>,
        policy: Policy,
        quantity: u64,
        mode: LimitMode,
    },
    /// An etcd v3 call that changes the etcd keyspace ([`crate::etcd`]), at the command's
    /// revision: [`Response::Etcd`], or [`Response::Rejected`] with [`CoreError::Etcd`]
    /// (nothing changed in the etcd keyspace; the command took its revision all the same,
    /// as every refused command does). Only in entries stamped [`Semantics::ETCD`] or newer.
    /// Reads (`Range`, a read-only `Txn`) take the read path instead
    /// ([`crate::StateMachine::etcd_range`]). Appended last.
    Etcd(EtcdCommand),
    /// Open a session as an etcd lease (`Lease.LeaseGrant`): [`Response::SessionOpened`],
    /// its id being the lease id. Like [`Command::OpenSession`] but with etcd's TTL limits
    /// (up to [`crate::etcd::MAX_LEASE_TTL_S`] seconds; the front end raises a TTL below
    /// [`crate::etcd::MIN_LEASE_TTL_S`] first) instead of the sessions' one-day cap.
    /// Appended last; needs [`Semantics::LEASES`].
    OpenLease {
        ttl_ms: Millis,
    },
    /// Keep several sessions alive in one command (etcd's `LeaseKeepAlive` streams,
    /// coalesced): [`Response::SessionsAlive`], one answer per id in order. Appended last;
    /// needs [`Semantics::LEASES`].
    KeepAliveMany {
        sessions: Vec<SessionId>,
    },
    /// etcd's `Lock.Lock` and `Election.Campaign`: take exclusive lock `name` of the lock
    /// table for session `lease` (owner: the lease id in lowercase hex), waiting FIFO for as
    /// long as the lease lives. The grant puts the etcd key `name/<lease id in hex>` holding
    /// `value`, attached to the lease, at the grant's revision — so the key's
    /// `create_revision` is the grant's token — and every end of the grant deletes it at that
    /// command's revision (a hand-over: the delete and the next holder's put at one
    /// revision). Waiters put no key. Idempotent: a lease that holds the lock gets its grant
    /// again (no second hold); a lease already waiting moves its place in the queue to this
    /// request (the earlier one gives up). Answers `Granted` or `Pending` (needs a request
    /// id), or `Rejected`. Appended last; needs [`Semantics::ELECTIONS`].
    EtcdLock {
        name: String,
        lease: SessionId,
        value: Vec<u8>,
    },
    /// etcd's `Lock.Unlock`, `Election.Resign`, and the withdrawal of a cancelled
    /// `Lock`/`Campaign`: end lease `lease`'s grant of `name` (every hold) — only if its
    /// token is `token`, when given — or withdraw its wait. `Released { holds: 0 }`, or
    /// `NotHeld` when it neither holds nor waits. Appended last; needs
    /// [`Semantics::ELECTIONS`].
    EtcdUnlock {
        name: String,
        lease: SessionId,
        token: Option<Token>,
    },
    /// A `Lock`/`Campaign` call whose client went away: undo what its [`Command::EtcdLock`]
    /// `request` did, whichever of the two commands is applied first — withdraw its wait,
    /// or end the grant it got (if that request still has it: a later `EtcdLock` of the
    /// same lease that got the grant again — the call's retry — takes it over); if the
    /// request was not applied yet, record it as answered `NotGranted` so that it never
    /// acts. `Released { holds: 0 }` or `NotHeld`. Appended last; needs
    /// [`Semantics::ELECTIONS`].
    EtcdCancel {
        name: String,
        lease: SessionId,
        request: RequestId,
    },
    /// `cmd` as user `user` asks it (a front end wraps what an authenticated user sends,
    /// [`Command::as_user`]): a session it opens belongs to `user`, and unless `admin` it is
    /// refused ([`CoreError::NotSessionOwner`], nothing done) if it names a session another
    /// user opened — a keep-alive of several answers "not alive" for those instead. Sessions
    /// opened outside one (by entries before these rules) belong to nobody and stay open
    /// to all. Appended last; needs [`Semantics::SESSION_OWNERS`].
    AsUser {
        user: String,
        admin: bool,
        cmd: Box<Command>,
    },
    /// Raise (`Some`) or clear (`None`) the cluster-wide `CORRUPT` alarm: the leader raises
    /// it when the members' state digests at one index have no majority among the members
    /// not already alarmed; an operator clears it (etcd's `Maintenance.Alarm` DEACTIVATE of
    /// `CORRUPT`, `etcdctl alarm disarm`). Raising an alarm already raised keeps the first.
    /// Appended last; needs [`Semantics::CLUSTER_ALARM`].
    ClusterAlarm {
        raise: Option<CorruptAlarm>,
    },
    /// etcd's `LeaseGrant` with the client's own `id`: [`Command::OpenLease`] as session
    /// `id`, refused with etcd's "lease already exists" while a session of that id is live.
    /// Appended last; needs [`Semantics::CHOSEN_LEASES`].
    GrantLease {
        id: SessionId,
        ttl_ms: Millis,
    },
    /// A waiting acquire `request` (of `names` for `owner`) whose client went away: the
    /// front end that served the call proposes this when the call ends unanswered (a RESP
    /// connection closed or killed mid-`WAIT`, a cancelled or timed-out gRPC call),
    /// whichever of the two commands is applied first:
    ///
    /// * still queued: its wait is withdrawn (resolved `NotGranted`, as a timeout is), so a
    ///   retry of the request, anywhere, learns it was not granted;
    /// * not applied yet: recorded as answered `NotGranted`, so it never acts;
    /// * already granted: the grant is ended (one hold) only when `grant` is set — the front
    ///   end chose the request id itself, so no other attempt can have told a client about
    ///   the grant; with a client-chosen id (gRPC, RESP `REQID`) a retry elsewhere may hold
    ///   it, so it stays, bounded by its TTL or session like any holder that crashed.
    ///
    /// `Released { holds: 0 }` when something was withdrawn, else `NotHeld`. Appended
    /// last; needs [`Semantics::WITHDRAWALS`].
    Withdraw {
        request: RequestId,
        names: Vec<String>,
        owner: String,
        grant: bool,
    },
}

/// The cluster-wide `CORRUPT` alarm, as raised ([`Command::ClusterAlarm`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CorruptAlarm {
    /// The log index whose digests had no majority.
    pub index: Index,
    /// The member (the leader) that raised it.
    pub raised_by: u64,
    /// What was found: each member's digest at `index`.
    pub detail: String,
}

impl Command {
    /// `self` as `user` sends it: wrapped in [`Command::AsUser`] if it opens or names a
    /// session, unchanged otherwise (nothing else depends on who asks).
    pub fn as_user(self, user: &str, admin: bool) -> Command {
        let scoped = self.opens_session() || !self.sessions_named().is_empty();
        if !scoped || matches!(self, Command::AsUser { .. }) {
            return self;
        }
        Command::AsUser {
            user: user.to_owned(),
            admin,
            cmd: Box::new(self),
        }
    }

    /// The command inside any [`Command::AsUser`] (what a leader proposes while some member
    /// runs rules older than [`Semantics::SESSION_OWNERS`]).
    pub fn without_user(self) -> Command {
        match self {
            Command::AsUser { cmd, .. } => cmd.without_user(),
            other => other,
        }
    }

    /// This command runs a Lua script (`EVAL`, `EVALSHA` and their `_RO` forms, alone, in a
    /// pipeline or in `MULTI`).
    pub fn runs_script(&self) -> bool {
        match self {
            Command::Kv(kv) => kv.runs_script(),
            Command::AsUser { cmd, .. } => cmd.runs_script(),
            _ => false,
        }
    }

    /// Opens a session ([`Command::OpenSession`], [`Command::OpenLease`]).
    pub fn opens_session(&self) -> bool {
        matches!(
            self,
            Command::OpenSession { .. } | Command::OpenLease { .. } | Command::GrantLease { .. }
        )
    }

    /// The sessions this command acts in or on: kept alive, closed, acquired in, a lease an
    /// etcd key is attached to or an etcd lock is taken for.
    pub fn sessions_named(&self) -> Vec<SessionId> {
        match self {
            Command::Acquire { session, .. } => session.iter().copied().collect(),
            Command::AcquireWith(spec) => spec.session.iter().copied().collect(),
            Command::KeepAlive { session } | Command::CloseSession { session } => vec![*session],
            Command::KeepAliveMany { sessions } => sessions.clone(),
            Command::EtcdLock { lease, .. }
            | Command::EtcdUnlock { lease, .. }
            | Command::EtcdCancel { lease, .. } => vec![*lease],
            Command::Etcd(EtcdCommand::Put(p)) if p.lease != 0 => vec![p.lease as SessionId],
            Command::Etcd(EtcdCommand::Txn(t)) => t.leases_named(),
            Command::AsUser { cmd, .. } => cmd.sessions_named(),
            _ => Vec::new(),
        }
    }
}

/// The etcd v3 calls that go through the log (etcd's `KV.Put`, `KV.DeleteRange`, `KV.Txn`,
/// `KV.Compact`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum EtcdCommand {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    /// Any txn; a read-only one (which the read path serves) is answered the same way here.
    Txn(TxnRequest),
    /// Compact the history below `revision` (etcd's `CompactionRequest`; `physical` is not
    /// carried: the removal is done in steps by later commands, and reads and watches behave
    /// as after it from this command on).
    Compact {
        revision: Revision,
    },
    /// Set the space quota of the stored history to `bytes` (0: etcd's default,
    /// [`crate::etcd::DEFAULT_QUOTA_BYTES`]): proposed by the leader when its
    /// `--quota-backend-bytes` differs from the replicated one, so every replica judges
    /// writes by the same quota. Appended last; needs [`Semantics::QUOTA`].
    Quota {
        bytes: u64,
    },
    /// Raise (`activate`) or clear etcd's `NOSPACE` alarm (`Maintenance.Alarm` ACTIVATE or
    /// DEACTIVATE, `etcdctl alarm disarm`). Appended last; needs [`Semantics::QUOTA`].
    Alarm {
        activate: bool,
    },
}

impl EtcdCommand {
    /// Short name, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            EtcdCommand::Put(_) => "etcd_put",
            EtcdCommand::DeleteRange(_) => "etcd_delete_range",
            EtcdCommand::Txn(_) => "etcd_txn",
            EtcdCommand::Compact { .. } => "etcd_compact",
            EtcdCommand::Quota { .. } => "etcd_quota",
            EtcdCommand::Alarm { .. } => "etcd_alarm",
        }
    }
}

/// What an [`EtcdCommand`] answered (etcd's responses without their header).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum EtcdReply {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    /// What the compaction's first step removed (`pending`: later commands remove the rest).
    Compact(CompactStats),
    /// The quota and alarm before and after an [`EtcdCommand::Quota`] or
    /// [`EtcdCommand::Alarm`]. Appended last.
    Quota {
        before: Quota,
        after: Quota,
    },
}

impl Command {
    /// Short name, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Acquire { .. } => "acquire",
            Command::AcquireWith(_) => "acquire",
            Command::Release { .. } => "release",
            Command::ReleaseAll { .. } => "release_all",
            Command::ForceUnlock { .. } => "force_unlock",
            Command::Renew { .. } => "renew",
            Command::OpenSession { .. } => "open_session",
            Command::KeepAlive { .. } => "keep_alive",
            Command::CloseSession { .. } => "close_session",
            Command::Tick => "tick",
            Command::Kv(_) => "kv",
            Command::FencedPut { .. } => "fenced_put",
            Command::Limit { .. } => "limit",
            Command::Etcd(cmd) => cmd.kind(),
            Command::OpenLease { .. } => "open_lease",
            Command::GrantLease { .. } => "grant_lease",
            Command::KeepAliveMany { .. } => "keep_alive_many",
            Command::EtcdLock { .. } => "etcd_lock",
            Command::EtcdUnlock { .. } => "etcd_unlock",
            Command::EtcdCancel { .. } => "etcd_cancel",
            Command::AsUser { cmd, .. } => cmd.kind(),
            Command::ClusterAlarm { .. } => "cluster_alarm",
            Command::Withdraw { .. } => "withdraw",
        }
    }

    /// The command a [`Command::AsUser`] carries (itself for any other): what callers that
    /// ask "what kind of command is this" look at.
    pub fn inner(&self) -> &Command {
        match self {
            Command::AsUser { cmd, .. } => cmd.inner(),
            other => other,
        }
    }
}

/// How a grant holds its lock. The first acquire of a name fixes the lock's kind
/// (exclusive, read-write or semaphore) until the lock is idle again.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// A plain mutex (fair: FIFO).
    Exclusive,
    /// Shared side of a read-write lock: many readers, no writer. A queued writer blocks new
    /// readers, so writers do not starve.
    Read,
    /// Exclusive side of a read-write lock.
    Write,
    /// One permit of a counting semaphore with `permits` permits in all; each permit has its
    /// own lease (like Redisson's PermitExpirableSemaphore). Its token is the revision of the
    /// command that granted it: permits (and readers) handed over by one release share it.
    Permit { permits: u32 },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct AcquireSpec {
    /// One name, or several for an atomic multi-lock (exclusive mode only): all granted by one
    /// command with one token, or none; waiting in every queue at once, so no deadlock by order.
    pub names: Vec<String>,
    pub owner: String,
    pub mode: Mode,
    /// Lease of the grant when `session` is `None`.
    pub ttl_ms: Millis,
    pub session: Option<SessionId>,
    pub wait_ms: Millis,
    /// After this grant *expires* (lease or session ran out, not a release), the lock is not
    /// granted again for this long (Chubby/Consul lock-delay).
    pub lock_delay_ms: Millis,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// The lock is held by the requester. `deadline_ms` is the lease end in log time, `None`
    /// when the lease is the session's.
    Granted {
        token: Token,
        holds: u32,
        deadline_ms: Option<Millis>,
    },
    /// Queued behind the current holder; see [`Command::Acquire`].
    Pending,
    /// Not granted (held by someone else and no wait, or the wait ran out).
    NotGranted,
    /// One hold dropped; `holds` remain (0: the lock was freed or passed to a waiter).
    Released {
        holds: u32,
    },
    /// `name` is not held by that owner with that token.
    NotHeld,
    Renewed {
        deadline_ms: Millis,
    },
    SessionOpened {
        session: SessionId,
        deadline_ms: Millis,
    },
    SessionAlive {
        deadline_ms: Millis,
    },
    SessionClosed,
    NoSuchSession,
    Ticked,
    Kv(KvResponse),
    Rejected(CoreError),
    /// The answer to [`Command::FencedPut`]: whether the write was accepted, and the key's
    /// fence mark it was checked against (the token itself when accepted). Appended last.
    Fenced {
        accepted: bool,
        highest: Token,
    },
    /// The answer to [`Command::Limit`]. Appended last.
    Limited(Decision),
    /// The answer to [`Command::Etcd`]. `revision` is the command's own (the store revision
    /// after it, etcd's `header.revision`); `wrote` whether the etcd keyspace changed (a
    /// delete that matched nothing, a txn whose branch only read, a compaction: false).
    /// Appended last.
    Etcd {
        revision: Revision,
        wrote: bool,
        reply: EtcdReply,
    },
    /// The answer to [`Command::KeepAliveMany`]: per session in the command's order, its
    /// new deadline and TTL, or `None` for a session that does not exist. Appended last.
    SessionsAlive {
        alive: Vec<Option<SessionLife>>,
    },
    /// The answer to [`Command::ClusterAlarm`]: the alarm before and after it. Appended
    /// last.
    ClusterAlarm {
        before: Option<CorruptAlarm>,
        after: Option<CorruptAlarm>,
    },
}

/// A session's deadline (log time) and TTL after a keep-alive.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLife {
    pub deadline_ms: Millis,
    pub ttl_ms: Millis,
}

/// Why a grant ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseReason {
    Released,
    Expired,
    SessionExpired,
    SessionClosed,
    ForceUnlocked,
}

impl ReleaseReason {
    /// The reason's name in lock-loss events (gRPC's `SessionEvent.reason`, the RESP
    /// lock-loss channels' messages).
    pub fn name(self) -> &'static str {
        match self {
            ReleaseReason::Released => "released",
            ReleaseReason::Expired => "expired",
            ReleaseReason::SessionExpired => "session_expired",
            ReleaseReason::SessionClosed => "session_closed",
            ReleaseReason::ForceUnlocked => "force_unlocked",
        }
    }
}

/// Side effects of applying one entry that someone outside the state machine may wait for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A queued acquire was granted (its dedup record now holds the same `Granted`).
    WaiterGranted {
        request: RequestId,
        name: String,
        token: Token,
        deadline_ms: Option<Millis>,
    },
    /// A queued acquire gave up: its wait ran out or its session ended.
    WaiterGaveUp { request: RequestId, name: String },
    /// A grant ended (for lock-loss notifications). `session` is the grant's session.
    LockReleased {
        name: String,
        owner: String,
        session: Option<SessionId>,
        token: Token,
        reason: ReleaseReason,
    },
    /// A keyspace side effect (pub/sub message, list push), delivered on every node.
    Kv(KvEvent),
    /// The etcd keyspace changed at `revision`: a write, or a compaction that moved the
    /// compact revision (also sent by the storage when a snapshot replaced the state). Only a
    /// wake-up for watches, which read the changes themselves from the keyspace's history:
    /// a lost one delays a watcher, never costs it an event.
    EtcdChanged { revision: Revision },
}

/// The outcome of applying one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub response: Response,
    pub events: Vec<Event>,
}

/// The outcome of applying one entry: one response per request of the [`Batch`], in order,
/// and the events of all of them.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AppliedBatch {
    pub responses: Vec<Response>,
    pub events: Vec<Event>,
}
