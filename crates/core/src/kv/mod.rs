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
//!
//! Where things are:
//! * [`types`] — the vocabulary: [`KvCommand`], [`Reply`], [`KvEvent`], [`Restriction`];
//! * [`store`] — the data: [`Keyspace`], values and their primitive operations;
//! * `cmd/` — one module per data type with its command rows ([`CommandSpec`]) and handlers,
//!   and the table everything reads (lookup, dispatch, keys, ACL restrictions);
//! * `spec` — what a row says; `exec` — the context a write runs in;
//! * `apply` — a [`KvCommand`] (batch, `MULTI`, restricted) applied to the keyspace;
//! * [`limit`] — rate limiters (GCRA, buckets, windows, sliding log): [`limit::Policy`],
//!   [`Keyspace::limit`];
//! * `script/` — the Lua sandbox and cjson; `args` — argument parsing; [`error`] — typed
//!   errors with Redis's texts; `glob` — Redis glob patterns.

mod apply;
mod args;
mod cmd;
pub mod error;
mod exec;
mod glob;
pub mod limit;
mod script;
mod spec;
pub mod store;
pub mod types;

#[cfg(test)]
mod tests;

pub use cmd::{
    command_class, command_keys, command_spec, command_table, key_spec, lookup, noperm_command,
    Keys,
};
pub use error::{FenceError, KvError, Stale, NOPERM_CHANNEL, NOPERM_KEY, WRONGTYPE};
pub use glob::glob_match;
pub use script::{lua_build, COSTLY_SCRIPTS};
pub use spec::{cat, ChannelSpec, CommandClass, CommandSpec, KeySpec, CATEGORIES};
pub use store::{Entry, Keyspace, Score, Value, ZSet};
pub use types::*;
