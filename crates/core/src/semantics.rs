//! The apply rules a log entry is stamped with ([`Semantics`]): which commands exist and how
//! they apply, by level, taken in landing order.

use serde::{Deserialize, Serialize};

use crate::command::{Command, EtcdCommand};

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
    /// The withdrawal rules, and a script's `redis.call` charged for the command's own work
    /// where it depends on the data (issue 49): `KEYS`/`SCAN` by the keys they visit and the
    /// pattern they match, `LREM`/`LTRIM`/`ZCOUNT`/`ZRANGE`… by the elements of the
    /// container they walk, a delete or an overwrite by the elements it drops
    /// (`kv/cmd/cost.rs`), charged before the command runs, so a script looping `KEYS *`
    /// stops `BUSY` at the same call on every replica. Older entries charge arguments and
    /// reply only, as they did.
    pub const CHARGED_COMMANDS: Semantics = Semantics(17);
    /// The charged-command rules, and a script's garbage collected by what is reachable,
    /// not by the order the collector visits it: during a run the patched Lua's collector
    /// marks in one step (`lgc.c`) instead of a little at every allocation. Marked step by
    /// step, what an object dropped mid-phase meant (kept or freed) followed the order of
    /// the registry's address-keyed hash part, and with it the collector's pace and what
    /// the string table's charged chains held: the same script stopped one write apart in
    /// two processes (issue 39; `kv/script/lua.rs`, third_party/README.md). Older entries
    /// collect as they did.
    pub const WHOLE_MARK: Semantics = Semantics(18);
    /// The newest rules this build applies (what it advertises to the leader).
    pub const NEWEST: Semantics = Semantics::WHOLE_MARK;

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

    /// A script's commands are charged by their work ([`Semantics::CHARGED_COMMANDS`]).
    pub fn charged_commands(self) -> bool {
        self.0 >= Semantics::CHARGED_COMMANDS.0
    }

    /// Lua's collector marks a run's heap in one step ([`Semantics::WHOLE_MARK`]).
    pub fn whole_mark(self) -> bool {
        self.0 >= Semantics::WHOLE_MARK.0
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
