//! The keyspace's vocabulary: commands as they travel in the log, replies, events, ACL
//! restrictions and the limits of one command.

use serde::{Deserialize, Serialize};

use crate::Revision;

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
/// The budget of one script run under [`crate::Semantics::BOUNDED`]: steps, each a Lua
/// instruction or a unit of work a library function or the interpreter did in C (a pattern
/// matching step, 64 bytes compared, scanned, copied or allocated, an element of a table
/// function, a `redis.call` reply's element or 64 bytes). Counted, never timed; chosen so
/// that the costliest script stops within docs/operations.md's stated pause.
pub const LUA_STEP_BUDGET: u64 = 3_000_000;
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

impl KvCommand {
    /// Runs a Lua script: `EVAL`, `EVALSHA`, `EVAL_RO` or `EVALSHA_RO` among its commands.
    pub fn runs_script(&self) -> bool {
        let script = |argv: &Argv| {
            argv.first().is_some_and(|name| {
                [&b"EVAL"[..], b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO"]
                    .iter()
                    .any(|s| name.eq_ignore_ascii_case(s))
            })
        };
        match self {
            KvCommand::Batch(cmds) | KvCommand::Multi { cmds, .. } => cmds.iter().any(script),
            KvCommand::Restricted { cmd, .. } => cmd.runs_script(),
        }
    }
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
    // The text fields hash in a canonical form inside a state digest (see `crate::digest`);
    // their encoding is unchanged.
    /// `+OK`.
    Status(#[serde(serialize_with = "crate::digest::reply_text")] String),
    /// `-ERR …`: the full text after the `-`, starting with its prefix (`ERR`, `WRONGTYPE`, …).
    Error(#[serde(serialize_with = "crate::digest::reply_text")] String),
    Int(i64),
    Bulk(#[serde(serialize_with = "crate::digest::reply_bytes")] Bytes),
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
