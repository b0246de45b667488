//! What goes into the log (`Request`) and what comes out of applying it (`Response`, `Event`).

use serde::{Deserialize, Serialize};

use crate::etcd::{
    CompactStats, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, Quota,
    TxnRequest, TxnResponse,
};
use crate::kv::limit::{Decision, LimitMode, Policy};
use crate::kv::{KvCommand, KvEvent, KvResponse};
use crate::CoreError;

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

/// The apply rules an entry was written for. New code may render some commands differently
/// (a Lua script's `tostring({})`), so the leader stamps every entry with the newest rules
/// *every* member runs: a cluster in a rolling upgrade keeps applying the old rules until the
/// last member runs the new code, and replicas never diverge. Entries are applied by the
/// rules they carry, forever (a replay of the log gives the same state).
///
/// Encoded as one byte (a newtype of `u8`): 0 and 1 are the two values of the `bool` that
/// preceded it, so an older node decodes 0 and 1 and refuses anything newer — which it never
/// receives, since the leader waits until every member supports it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Semantics(pub u8);

impl Semantics {
    /// Tokens are revisions (log format 2); Lua as in Redis, which can show addresses.
    pub const REVISIONS: Semantics = Semantics(0);
    /// An entry written by fenced before tokens were revisions (log format 1), read back:
    /// such an entry is one command whose tokens (and session id) were its log index, and
    /// applying it again must give the same ones. It raises the revision to the index, so
    /// every later token exceeds every token issued before.
    pub const INDEX_TOKENS: Semantics = Semantics(1);
    /// Everything a command computes is replica-independent: Lua's `tostring` of tables,
    /// functions, threads and userdata shows no address, iteration over tables with table
    /// or function keys is refused, a returned function is nil.
    pub const DETERMINISTIC: Semantics = Semantics(2);
    /// The deterministic rules, and the etcd v3 keyspace: [`Command::Etcd`] exists. Entries
    /// carrying one are a log format older nodes cannot decode, so the leader proposes them
    /// only once every member runs these rules ([`crate::gate`]); under older rules an etcd
    /// command is refused with [`CoreError::NotUpgraded`] (it never is stamped so, but a
    /// replay must not depend on that).
    pub const ETCD: Semantics = Semantics(3);
    /// The etcd rules, and etcd's space quota with its `NOSPACE` alarm ([`crate::etcd::Quota`]):
    /// [`EtcdCommand::Quota`] and [`EtcdCommand::Alarm`] exist (a log format older nodes cannot
    /// decode), and an etcd write that would take the stored history above the quota is
    /// refused and raises the alarm — which changes what a `Put` or `Txn` computes, so only
    /// entries stamped with these rules are judged so (an older entry replays as it applied).
    pub const QUOTA: Semantics = Semantics(4);
    /// The quota rules, and etcd's leases as fenced sessions: [`Command::OpenLease`] and
    /// [`Command::KeepAliveMany`] exist (a log format older nodes cannot decode); an etcd
    /// `Put` (alone or in a `Txn`) may name a live session as its lease, attaching the key to
    /// it; and a session that ends — closed, revoked or expired — deletes every etcd key
    /// still attached to it, at the revision of the command (or expiry step) that ended it.
    /// Under older rules a put naming a lease is refused as "requested lease not found" and a
    /// session's end touches no etcd key, as before.
    pub const LEASES: Semantics = Semantics(5);
    /// The lease rules, and etcd's `Lock` and `Election` services on the lock table:
    /// [`Command::EtcdLock`] and [`Command::EtcdUnlock`] exist (a log format older nodes
    /// cannot decode), and a grant they make projects a key into the etcd keyspace
    /// (`machine::etcd_locks`), which a snapshot body of version 4 carries.
    pub const ELECTIONS: Semantics = Semantics(6);
    /// The election rules, and every script's work bounded: the work Lua's library functions
    /// and interpreter do in C (pattern matching, searching, comparing, converting, copying,
    /// allocating) is charged to the script's budget as instructions are, pattern matching
    /// recurses at most 200 deep ("pattern too complex"), a `redis.call`'s reply is charged
    /// by its size, and the budget is [`crate::kv::LUA_STEP_BUDGET`] steps instead of
    /// [`crate::kv::LUA_INSTRUCTION_BUDGET`] instructions — so a script stops at the same
    /// point on every replica within a bounded pause, whatever it does
    /// (`kv/script/lua.rs`, third_party/README.md). Older entries run as they did.
    pub const BOUNDED: Semantics = Semantics(7);
    /// The bounded rules, and sessions that belong to the user who opened them:
    /// [`Command::AsUser`] exists (a log format older nodes cannot decode). A session opened
    /// in one records its user (snapshot body 5), and a non-administrator's command that
    /// names a session another user opened is refused ([`CoreError::NotSessionOwner`]).
    pub const SESSION_OWNERS: Semantics = Semantics(8);
    /// The session-owner rules, and Lua deterministic at its root: the patched Lua hashes a
    /// script's tables, functions, coroutines and userdata by a per-run creation counter
    /// instead of their address, so the order `next`/`pairs` visit a table and `#t` of one
    /// with holes are functions of the script; the refusals that hid address order
    /// (iterating a table with such keys) are gone; and the steps along a table's hash
    /// chains and its rehashed slots are charged to the budget (`kv/script/lua.rs`,
    /// third_party/README.md). Older entries run as they did.
    pub const LUA_IDS: Semantics = Semantics(9);
    /// The Lua-id rules, and the cluster-wide `CORRUPT` alarm: [`Command::ClusterAlarm`]
    /// exists (a log format older nodes cannot decode). It raises or clears the alarm in the
    /// replicated state (snapshot body 6 while raised); what the alarm refuses is the front
    /// ends' business, apply itself judges every other command as before.
    pub const CLUSTER_ALARM: Semantics = Semantics(10);
    /// The cluster-alarm rules, and etcd leases as etcd grants them: [`Command::GrantLease`]
    /// exists (a lease id the client chose; a log format older nodes cannot decode), the ids
    /// assigned to sessions and leases skip ids that are taken (the revision that opens one,
    /// or the next free id above it), and `LeaseGrant` is refused with `NOSPACE` while the
    /// etcd keyspace's space alarm is raised (etcd's capped applier). Older entries open
    /// sessions at their revision, alarm or not, as they did.
    pub const CHOSEN_LEASES: Semantics = Semantics(11);
    /// The chosen-lease rules, and request ids bound to their command: the dedup record keeps a
    /// digest of each request's command (snapshot body 7), and a request whose id was used
    /// for a different command is refused ([`CoreError::RequestIdReused`]) instead of being
    /// answered the other command's outcome; and a script's `PUBLISH` on a reserved
    /// `fenced:*` channel is refused like a client's. Older entries answer as they did.
    pub const REQUEST_DIGESTS: Semantics = Semantics(12);
    /// The request-digest rules, and etcd's `Lock` and `Election` on the etcd keyspace, as
    /// etcd has them: the front end runs etcd's `concurrency.Mutex` / `Election` recipes with
    /// plain etcd commands (a put of `name/<lease hex>` on the lease, a compared delete), so
    /// they are one lock with every recipe client's on the same name; fenced's lock table
    /// (`LOCK.*`) is a separate namespace. [`Command::EtcdLock`], [`Command::EtcdUnlock`]
    /// and [`Command::EtcdCancel`] are refused in entries stamped so
    /// ([`CoreError::Retired`]), and the first entry under these rules migrates what they
    /// left (`machine::etcd_locks::migrate_etcd_locks`): a lock-table holder of an etcd lock
    /// keeps its projected key — attached to its lease, created at its token — and so holds
    /// it on the keyspace, its lock-table record dropped; a lock-table waiter (no key) is
    /// withdrawn. Older entries replay as they applied.
    pub const KEYSPACE_LOCKS: Semantics = Semantics(13);
    /// The keyspace-lock rules, and every helper a script calls charged by its work (issue
    /// 49): a call of a Rust helper (`redis.sha1hex`, `redis.error_reply`, `math.random`,
    /// cjson, `redis.call`, …) by its arguments and input bytes, and its errors raised as
    /// plain Lua strings (mlua's errors built a traceback walking the globals, uncharged);
    /// cjson's scan of a table's keys; and in the patched Lua (charging level 2) values
    /// moved in bulk (arguments, results, `...`, constructors, `unpack`, coroutine
    /// transfers), registers cleared, stacks reallocated, the empty slots `next` skips, the
    /// lookups `#t` makes, numbers converted to and from text (`kv/script/lua.rs`,
    /// third_party/README.md). Older entries count their steps as they did.
    pub const CHARGED_HELPERS: Semantics = Semantics(14);
    /// The charged-helper rules, and the cluster's `CORRUPT` alarm holding time: while it is
    /// raised the replicated clock stands still (an entry's time does not advance it), so no
    /// session, lease, leased grant, wait, lock-delay or idle client record expires — the
    /// cluster serves nothing, so no client can keep alive (etcd's leases do not run out
    /// while it does not serve either); and the entry that disarms it moves every such
    /// deadline by the time the clock stood still (`machine::expiry::hold_deadlines`), so each
    /// has the time left it had at the raise. Keys' TTLs do not move. Older entries expire
    /// as time passes, alarm or not.
    pub const ALARM_HOLDS_LEASES: Semantics = Semantics(15);
    /// [`Command::Withdraw`] exists: a waiting acquire whose client went away (a RESP
    /// connection closed mid-`WAIT`, a cancelled gRPC call) is taken out of its queue, so
    /// it never becomes a holder nobody knows about (issue 38 item 2).
    pub const WITHDRAWALS: Semantics = Semantics(16);
    /// The newest rules this build applies (what it advertises to the leader).
    pub const NEWEST: Semantics = Semantics::WITHDRAWALS;

    /// The entry is from before revisions ([`Semantics::INDEX_TOKENS`]).
    pub fn index_tokens(self) -> bool {
        self == Semantics::INDEX_TOKENS
    }

    /// Commands must not show anything replica-dependent ([`Semantics::DETERMINISTIC`]).
    pub fn deterministic(self) -> bool {
        self.0 >= Semantics::DETERMINISTIC.0
    }

    /// Etcd commands apply ([`Semantics::ETCD`]).
    pub fn etcd(self) -> bool {
        self.0 >= Semantics::ETCD.0
    }

    /// etcd's space quota is enforced, and its commands exist ([`Semantics::QUOTA`]).
    pub fn quota(self) -> bool {
        self.0 >= Semantics::QUOTA.0
    }

    /// etcd keys may be attached to sessions as leases ([`Semantics::LEASES`]).
    pub fn leases(self) -> bool {
        self.0 >= Semantics::LEASES.0
    }

    /// etcd's Lock and Election commands exist ([`Semantics::ELECTIONS`]).
    pub fn elections(self) -> bool {
        self.0 >= Semantics::ELECTIONS.0
    }

    /// Every script's work is bounded ([`Semantics::BOUNDED`]).
    pub fn bounded(self) -> bool {
        self.0 >= Semantics::BOUNDED.0
    }

    /// Sessions belong to their users ([`Semantics::SESSION_OWNERS`]).
    pub fn session_owners(self) -> bool {
        self.0 >= Semantics::SESSION_OWNERS.0
    }

    /// Lua hashes objects by creation id and charges hash chains ([`Semantics::LUA_IDS`]).
    pub fn lua_ids(self) -> bool {
        self.0 >= Semantics::LUA_IDS.0
    }

    /// The cluster-wide `CORRUPT` alarm exists ([`Semantics::CLUSTER_ALARM`]).
    pub fn cluster_alarm(self) -> bool {
        self.0 >= Semantics::CLUSTER_ALARM.0
    }

    /// Lease ids may be chosen, assigned ids skip taken ones, and `NOSPACE` refuses
    /// `LeaseGrant` ([`Semantics::CHOSEN_LEASES`]).
    pub fn chosen_leases(self) -> bool {
        self.0 >= Semantics::CHOSEN_LEASES.0
    }

    /// A request id is bound to its command ([`Semantics::REQUEST_DIGESTS`]).
    pub fn request_digests(self) -> bool {
        self.0 >= Semantics::REQUEST_DIGESTS.0
    }

    /// etcd's locks and elections live on the keyspace ([`Semantics::KEYSPACE_LOCKS`]).
    pub fn keyspace_locks(self) -> bool {
        self.0 >= Semantics::KEYSPACE_LOCKS.0
    }

    /// [`Command::Withdraw`] exists ([`Semantics::WITHDRAWALS`]).
    pub fn withdrawals(self) -> bool {
        self.0 >= Semantics::WITHDRAWALS.0
    }

    /// Scripts' helpers are charged by their work ([`Semantics::CHARGED_HELPERS`]).
    pub fn charged_helpers(self) -> bool {
        self.0 >= Semantics::CHARGED_HELPERS.0
    }

    /// The cluster's `CORRUPT` alarm stops the replicated clock
    /// ([`Semantics::ALARM_HOLDS_LEASES`]).
    pub fn alarm_holds_leases(self) -> bool {
        self.0 >= Semantics::ALARM_HOLDS_LEASES.0
    }

    /// The oldest rules under which `cmd` does what its caller means: the rules it exists
    /// under ([`Semantics::defined_by`]), and [`Semantics::LEASES`] for an etcd put naming a
    /// lease (older rules refuse it). The leader's gate ([`crate::gate::admit`]) asks this.
    pub fn needed_by(cmd: &Command) -> Semantics {
        match cmd {
            Command::Etcd(EtcdCommand::Put(p)) if p.lease != 0 => Semantics::LEASES,
            Command::Etcd(EtcdCommand::Txn(t)) if t.names_a_lease() => Semantics::LEASES,
            _ => Semantics::defined_by(cmd),
        }
    }

    /// The oldest rules under which `cmd` exists at all (a log format older nodes cannot
    /// decode): apply refuses it in an entry stamped older. A put naming a lease exists
    /// since [`Semantics::ETCD`] (refused then as "requested lease not found"), so an old
    /// entry carrying one replays as it applied.
    pub fn defined_by(cmd: &Command) -> Semantics {
        match cmd {
            Command::OpenLease { .. } | Command::KeepAliveMany { .. } => Semantics::LEASES,
            Command::EtcdLock { .. } | Command::EtcdUnlock { .. } | Command::EtcdCancel { .. } => {
                Semantics::ELECTIONS
            }
            Command::Etcd(EtcdCommand::Quota { .. } | EtcdCommand::Alarm { .. }) => {
                Semantics::QUOTA
            }
            Command::Etcd(_) => Semantics::ETCD,
            Command::AsUser { .. } => Semantics::SESSION_OWNERS,
            Command::ClusterAlarm { .. } => Semantics::CLUSTER_ALARM,
            Command::GrantLease { .. } => Semantics::CHOSEN_LEASES,
            Command::Withdraw { .. } => Semantics::WITHDRAWALS,
            _ => Semantics::REVISIONS,
        }
    }

    /// This build knows how to apply entries stamped `self`.
    pub fn supported(self) -> bool {
        self.0 <= Semantics::NEWEST.0
    }
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
