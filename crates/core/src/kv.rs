//! The replicated keyspace behind the RESP front end: strings, hashes, lists and sorted sets
//! with an absolute expiry in log time, per-key `create_revision`/`mod_revision` (store revisions),
//! per-key fence high-water marks (`FENCE.SET`), and the Lua script cache (plus, beside it and
//! not replicated, each cached script compiled in its own interpreter).
//!
//! Commands arrive as Redis argument vectors ([`Argv`]) and are interpreted here, inside
//! `apply`, on every replica — so a Lua script's `redis.call` runs the very same code as a
//! command sent over the wire, and replaying the log rebuilds the same keyspace. Everything is
//! deterministic: time is the entry's log time, `math.random` in scripts is seeded from the
//! command's revision, script budgets count instructions and bytes, never wall-clock time.
//!
//! Reads ([`Keyspace::read`]) run on `&Keyspace` at a caller-supplied log time, so a
//! linearizable read can evaluate expiry at the leader's current log time (see
//! `crates/server`'s read barrier) instead of the replica's last applied entry time.

mod cjson;
mod exec;
mod glob;
mod lua;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::cow::{CowMap, CowSet};
use crate::{Millis, Revision, Token};

pub use exec::{
    command_class, command_keys, command_table, key_spec, noperm_command, CommandClass, KeySpec,
    Keys, NOPERM_CHANNEL, NOPERM_KEY,
};
pub use glob::glob_match;

/// One byte string (a key, a value, an argument).
pub type Bytes = Vec<u8>;
/// A Redis command: its name (any case) followed by its arguments.
pub type Argv = Vec<Bytes>;

/// Most commands in one [`KvCommand::Batch`] or [`KvCommand::Multi`].
pub const MAX_BATCH: usize = 10_000;
/// Most cached scripts (`SCRIPT LOAD` and `EVAL` both cache; `EVAL` stops caching past this).
pub const MAX_SCRIPTS: usize = 10_000;
/// Lua instruction budget of one script run. Counted, never timed, so every replica stops a
/// runaway script at the same instruction.
pub const LUA_INSTRUCTION_BUDGET: u64 = 50_000_000;
/// Lua memory budget of one script run: bytes requested from the allocator on top of the
/// script's idle interpreter (deterministic).
pub const LUA_MEMORY_LIMIT: usize = 64 * 1024 * 1024;
/// Most script interpreters kept between runs (per replica, not replicated).
pub const LUA_CACHE_SCRIPTS: usize = 128;
/// Most idle interpreter heap kept between runs, summed over the cached scripts.
pub const LUA_CACHE_BYTES: usize = 32 * 1024 * 1024;
/// Largest string value or element a command may create (Redis's proto-max-bulk-len is 512 MiB;
/// ours is smaller because every value goes through the Raft log).
pub const MAX_VALUE_LEN: usize = 64 * 1024 * 1024;

/// A keyspace command, applied at a revision and log time.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum KvCommand {
    /// Independent commands run one after another in a single entry (a client pipeline's run
    /// of consecutive writes); one reply each.
    Batch(Vec<Argv>),
    /// `MULTI … EXEC`: if every watched key still has the recorded `mod_revision` (0 =
    /// absent), run the commands one after another and reply with one array of their replies;
    /// otherwise run nothing and reply with a nil array.
    Multi {
        watches: Vec<(Bytes, Revision)>,
        cmds: Vec<Argv>,
    },
    /// `cmd` on behalf of an ACL-restricted RESP user: before every command it runs —
    /// `redis.call` inside scripts included — the state machine checks `limits`
    /// ([`Restriction::check`]) and answers a refused one with its `NOPERM` error instead
    /// (a script sees that as a failed call). Replies are `cmd`'s. Appended last, so entries
    /// written before it existed still decode.
    Restricted {
        limits: Restriction,
        cmd: Box<KvCommand>,
    },
}

/// What an ACL-restricted user may do, enforced inside `apply` by
/// [`KvCommand::Restricted`] (deterministically, so scripts cannot get around it). `None`
/// in a field: no limit of that kind.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Restriction {
    /// The user's name, for the `NOPERM` error text.
    pub user: String,
    /// Glob patterns; every key a command names ([`command_keys`]) must match one, and
    /// commands on the whole keyspace ([`Keys::Whole`]) are refused.
    pub keys: Option<Vec<Bytes>>,
    /// Glob patterns for `PUBLISH`/`SUBSCRIBE` channels; `PSUBSCRIBE` patterns must be one of
    /// them literally.
    pub channels: Option<Vec<Bytes>>,
    /// Names of the commands allowed (any case).
    pub commands: Option<Vec<String>>,
}

/// The replies of a [`KvCommand`], one per command of a batch (one array for a `Multi`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct KvResponse {
    pub replies: Vec<Reply>,
}

/// A reply in Redis's type system. Encoded as RESP2 or RESP3 by the front end.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Status(String),
    /// `-ERR …`: the full text after the `-`, starting with its prefix (`ERR`, `WRONGTYPE`, …).
    Error(String),
    Int(i64),
    Bulk(Bytes),
    /// Nil bulk string (RESP2 `$-1`, RESP3 `_`).
    Nil,
    Array(Vec<Reply>),
    /// Nil array (RESP2 `*-1`, RESP3 `_`).
    NilArray,
    /// A double, already formatted like Redis (RESP3 `,`, RESP2 bulk string).
    Double(String),
    /// Field/value pairs (RESP3 `%`, RESP2 flat array).
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Status("OK".into())
    }
    pub fn err(msg: impl Into<String>) -> Reply {
        Reply::Error(msg.into())
    }
    pub fn bulk(b: impl AsRef<[u8]>) -> Reply {
        Reply::Bulk(b.as_ref().to_vec())
    }
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

/// Side effects of a keyspace entry that the front ends of every node deliver.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// `PUBLISH channel message` was applied.
    Published { channel: Bytes, message: Bytes },
    /// Elements were pushed onto list `key` (wakes `BLPOP`/`BRPOP` waiters to retry).
    Pushed { key: Bytes },
}

/// A sorted-set score: a non-NaN double with a total order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub struct Score(pub f64);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0).is_eq()
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // -0.0 and 0.0 compare equal in Redis; normalise so total_cmp agrees.
        let a = if self.0 == 0.0 { 0.0 } else { self.0 };
        let b = if other.0 == 0.0 { 0.0 } else { other.0 };
        a.total_cmp(&b)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ZSet {
    pub(crate) by_member: BTreeMap<Bytes, Score>,
    pub(crate) by_score: BTreeSet<(Score, Bytes)>,
}

impl ZSet {
    pub(crate) fn insert(&mut self, member: Bytes, score: Score) {
        if let Some(old) = self.by_member.insert(member.clone(), score) {
            self.by_score.remove(&(old, member.clone()));
        }
        self.by_score.insert((score, member));
    }
    pub(crate) fn remove(&mut self, member: &[u8]) -> bool {
        match self.by_member.remove(member) {
            Some(old) => {
                self.by_score.remove(&(old, member.to_vec()));
                true
            }
            None => false,
        }
    }
    pub fn len(&self) -> usize {
        self.by_member.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_member.is_empty()
    }
}

/// The value of a key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Str(Bytes),
    Hash(BTreeMap<Bytes, Bytes>),
    List(VecDeque<Bytes>),
    ZSet(ZSet),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Hash(_) => "hash",
            Value::List(_) => "list",
            Value::ZSet(_) => "zset",
        }
    }
    fn is_empty_container(&self) -> bool {
        match self {
            Value::Str(_) => false,
            Value::Hash(h) => h.is_empty(),
            Value::List(l) => l.is_empty(),
            Value::ZSet(z) => z.is_empty(),
        }
    }
}

/// A key's value and metadata.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub value: Value,
    /// Revision of the command that created the key (its token when taken with `SET NX`).
    pub create_revision: Revision,
    /// Revision of the command that last modified it.
    pub mod_revision: Revision,
    /// Absolute expiry in log time; the key is gone from this time on.
    pub expire_at: Option<Millis>,
}

/// The replicated keyspace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyspace {
    // Copy-on-write tables: a snapshot clones the keyspace in O(1) (see `crate::cow`).
    keys: CowMap<Bytes, Entry>,
    /// `(expire_at, key)` for every key with an expiry.
    expiries: CowSet<(Millis, Bytes)>,
    /// Highest token accepted by `FENCE.SET` per key. Kept when the key is deleted or
    /// flushed, so a stale writer stays fenced off.
    fences: CowMap<Bytes, Token>,
    /// Script cache: lower-case hex SHA1 → source.
    scripts: CowMap<String, String>,
    /// Compiled scripts, each in its interpreter: this replica's, not replicated (skipped by
    /// serde, empty in a clone, ignored by `==`).
    #[serde(skip)]
    lua: lua::LuaCache,
}

impl Keyspace {
    /// Apply `cmd` at log time `now`; `revision` is the command's revision. A
    /// [`KvCommand::Batch`] (a pipeline) is several commands: with `per_command`, each one
    /// after the first takes the next revision, and `revision` is left at the last one used
    /// (without, all share it — entries from before revisions). `MULTI`/`EXEC` and a script
    /// are one command. Events for the front ends (pub/sub messages, list pushes) are
    /// appended to `events`.
    pub fn apply(
        &mut self,
        revision: &mut Revision,
        per_command: bool,
        now: Millis,
        cmd: &KvCommand,
        events: &mut Vec<crate::Event>,
    ) -> KvResponse {
        let mut kv_events = Vec::new();
        let replies = {
            let mut ctx = exec::Ctx {
                ks: self,
                revision: *revision,
                now,
                events: &mut kv_events,
                in_script: false,
                limits: Vec::new(),
            };
            let replies = Self::run(&mut ctx, cmd, per_command);
            *revision = ctx.revision;
            replies
        };
        events.extend(kv_events.into_iter().map(crate::Event::Kv));
        KvResponse { replies }
    }

    fn run<'a>(ctx: &mut exec::Ctx<'a>, cmd: &'a KvCommand, per_command: bool) -> Vec<Reply> {
        match cmd {
            KvCommand::Batch(cmds) => cmds
                .iter()
                .enumerate()
                .map(|(i, argv)| {
                    if i > 0 && per_command {
                        ctx.revision += 1;
                    }
                    ctx.exec(argv)
                })
                .collect(),
            KvCommand::Multi { watches, cmds } => {
                let intact = watches
                    .iter()
                    .all(|(k, rev)| ctx.ks.mod_revision(k, ctx.now) == *rev);
                if intact {
                    vec![Reply::Array(cmds.iter().map(|a| ctx.exec(a)).collect())]
                } else {
                    vec![Reply::NilArray]
                }
            }
            KvCommand::Restricted { limits, cmd } => {
                ctx.limits.push(limits);
                let replies = Self::run(ctx, cmd, per_command);
                ctx.limits.pop();
                replies
            }
        }
    }

    /// Answer a read-only command at log time `now` (keys expired at `now` are absent).
    /// `None` if `argv` is not a read-only command.
    pub fn read(&self, now: Millis, argv: &[Bytes]) -> Option<Reply> {
        exec::read(self, now, argv)
    }

    /// Remove keys whose expiry is at or before `now`.
    pub fn expire_due(&mut self, now: Millis) {
        while let Some((t, key)) = self.expiries.first().cloned() {
            if t > now {
                break;
            }
            self.expiries.remove(&(t, key.clone()));
            if self.keys.get(&key).and_then(|e| e.expire_at) == Some(t) {
                self.keys.remove(&key);
            }
        }
    }

    /// The earliest key expiry, if any.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.expiries.first().map(|(t, _)| *t)
    }

    /// The live entry of `key` at log time `now`.
    pub fn get(&self, key: &[u8], now: Millis) -> Option<&Entry> {
        self.keys
            .get(key)
            .filter(|e| !matches!(e.expire_at, Some(t) if t <= now))
    }

    /// `mod_revision` of `key` at `now`, 0 if absent (what `WATCH` records).
    pub fn mod_revision(&self, key: &[u8], now: Millis) -> Revision {
        self.get(key, now).map_or(0, |e| e.mod_revision)
    }

    /// The fence high-water mark of `key` (0 if no `FENCE.SET` ever wrote it).
    pub fn fence(&self, key: &[u8]) -> Token {
        self.fences.get(key).copied().unwrap_or(0)
    }

    /// Number of live keys at `now`.
    pub fn len(&self, now: Millis) -> usize {
        let expired = self.expiries.iter().take_while(|(t, _)| *t <= now).count();
        self.keys.len() - expired.min(self.keys.len())
    }

    pub fn is_empty(&self, now: Millis) -> bool {
        self.len(now) == 0
    }

    pub fn has_script(&self, sha: &str) -> bool {
        self.scripts.contains_key(&sha.to_ascii_lowercase())
    }

    // ---- mutation helpers used by the interpreter -------------------------------------

    /// Mutable live entry (during apply every expired key was already removed).
    fn entry_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.keys.get_mut(key)
    }

    /// Store `value` under `key` at `revision`: keeps `create_revision` if the key exists,
    /// replaces the expiry with `expire_at` unless `keep_ttl`.
    fn put(
        &mut self,
        revision: Revision,
        key: &[u8],
        value: Value,
        expire_at: Option<Millis>,
        keep_ttl: bool,
    ) {
        let (create, old_exp) = match self.keys.get(key) {
            Some(e) => (e.create_revision, e.expire_at),
            None => (revision, None),
        };
        let exp = if keep_ttl { old_exp } else { expire_at };
        if old_exp != exp {
            if let Some(t) = old_exp {
                self.expiries.remove(&(t, key.to_vec()));
            }
            if let Some(t) = exp {
                self.expiries.insert((t, key.to_vec()));
            }
        }
        self.keys.insert(
            key.to_vec(),
            Entry {
                value,
                create_revision: create,
                mod_revision: revision,
                expire_at: exp,
            },
        );
    }

    fn set_expiry(&mut self, key: &[u8], revision: Revision, expire_at: Option<Millis>) -> bool {
        let Some(e) = self.keys.get_mut(key) else {
            return false;
        };
        if let Some(t) = e.expire_at {
            self.expiries.remove(&(t, key.to_vec()));
        }
        if let Some(t) = expire_at {
            self.expiries.insert((t, key.to_vec()));
        }
        e.expire_at = expire_at;
        e.mod_revision = revision;
        true
    }

    fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let e = self.keys.remove(key)?;
        if let Some(t) = e.expire_at {
            self.expiries.remove(&(t, key.to_vec()));
        }
        Some(e)
    }

    /// After a container was modified: bump its revision, drop it if it became empty.
    fn touched(&mut self, key: &[u8], revision: Revision) {
        let empty = match self.keys.get_mut(key) {
            Some(e) => {
                e.mod_revision = revision;
                e.value.is_empty_container()
            }
            None => return,
        };
        if empty {
            self.remove(key);
        }
    }

    fn flush(&mut self) {
        self.keys.clear();
        self.expiries.clear();
    }
}

#[cfg(test)]
mod tests;
