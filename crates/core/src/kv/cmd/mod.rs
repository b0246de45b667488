//! The command table — one module per data type, each with its rows ([`CommandSpec`]) and
//! handlers — and what reads it: lookup and arity, the dispatcher `apply` runs commands
//! through, key positions and ACL restrictions.
//!
//! Adding a Redis command is one row and its handler in the module of its type (plus a test
//! in `kv/tests.rs`); the front end, ACL categories and `COMMAND INFO` follow from the row.

pub(crate) mod cost;
mod fence;
mod frontend;
mod hash;
mod keys;
mod limit;
mod list;
mod prelude;
mod pubsub;
mod script;
mod string;
mod zset;

use std::collections::HashMap;
use std::sync::OnceLock;

use super::error::{KvError, KvResult, NOPERM_CHANNEL, NOPERM_KEY};
use super::exec::Ctx;
use super::glob::glob_match;
use super::spec::{ChannelSpec, CommandClass, CommandSpec, KeySpec, Run};
use super::store::Keyspace;
use super::types::{Bytes, Reply, Restriction};
use crate::Millis;

/// The modules' rows, in the order `COMMAND` and the ACL categories list them.
const GROUPS: &[&[CommandSpec]] = &[
    string::COMMANDS,
    keys::COMMANDS,
    hash::COMMANDS,
    list::COMMANDS,
    zset::COMMANDS,
    script::COMMANDS,
    pubsub::COMMANDS,
    fence::COMMANDS,
    limit::COMMANDS,
    frontend::COMMANDS,
];

/// Every command.
pub fn command_table() -> &'static [&'static CommandSpec] {
    static TABLE: OnceLock<Vec<&'static CommandSpec>> = OnceLock::new();
    TABLE.get_or_init(|| GROUPS.iter().flat_map(|g| g.iter()).collect())
}

/// Longest command name in the table (a longer `name` is no command).
const MAX_NAME: usize = 32;

/// The row of command `name` (any case). A hash lookup of the upper-cased name: every RESP
/// command is looked up several times (class, keys, metrics, `CLIENT LIST`), and a scan of
/// the ~170 rows was a measurable part of a command's cost.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    static INDEX: OnceLock<HashMap<&'static [u8], &'static CommandSpec>> = OnceLock::new();
    let index = INDEX.get_or_init(|| {
        command_table()
            .iter()
            .map(|c| (c.name.as_bytes(), *c))
            .collect()
    });
    if name.len() > MAX_NAME {
        return None;
    }
    let mut upper = [0u8; MAX_NAME];
    for (u, c) in upper.iter_mut().zip(name) {
        *u = c.to_ascii_uppercase();
    }
    index.get(&upper[..name.len()]).copied()
}

/// Look `argv` up in the command table and check its arity: its row, or Redis's
/// unknown-command or wrong-arity error.
pub fn command_spec(argv: &[Bytes]) -> KvResult<&'static CommandSpec> {
    let Some(name) = argv.first() else {
        return Err(KvError::invalid("empty command"));
    };
    let Some(spec) = lookup(name) else {
        let mut msg = format!(
            "ERR unknown command '{}', with args beginning with: ",
            String::from_utf8_lossy(&name[..name.len().min(128)])
        );
        for a in argv.iter().skip(1).take(10) {
            msg.push_str(&format!(
                "'{}' ",
                String::from_utf8_lossy(&a[..a.len().min(128)])
            ));
        }
        return Err(KvError::UnknownCommand(msg));
    };
    if !spec.arity_ok(argv.len()) {
        return Err(KvError::Arity(
            String::from_utf8_lossy(name).to_ascii_lowercase(),
        ));
    }
    Ok(spec)
}

/// How the front end serves `argv`, after [`command_spec`]'s checks.
pub fn command_class(argv: &[Bytes]) -> KvResult<CommandClass> {
    command_spec(argv).map(|spec| spec.class(&argv[1..]))
}

/// The key specification of command `name` (any case); none for unknown commands.
pub fn key_spec(name: &str) -> KeySpec {
    lookup(name.as_bytes()).map_or(KeySpec::None, |c| c.keys)
}

/// Run one command inside `apply` (the [`Ctx`]'s dispatcher): errors become error replies.
pub(crate) fn exec(ctx: &mut Ctx<'_>, argv: &[Bytes]) -> Reply {
    run(ctx, argv).unwrap_or_else(|e| Reply::Error(e.to_string()))
}

fn run(ctx: &mut Ctx<'_>, argv: &[Bytes]) -> KvResult<Reply> {
    let spec = command_spec(argv)?;
    for l in &ctx.limits {
        l.check(argv).map_err(KvError::NoPerm)?;
    }
    let a = &argv[1..];
    match spec.run {
        Run::Read(read) => read(ctx.ks, ctx.now, a),
        Run::Mixed { reads, read, .. } if reads(a) => read(ctx.ks, ctx.now, a),
        Run::Write(write) | Run::Mixed { write, .. } => write(ctx, a),
        Run::Blocking(_) if ctx.in_script => Err(KvError::NotFromScript),
        // Inside MULTI: one attempt, no waiting.
        Run::Blocking(write) => write(ctx, a),
        Run::Lock => Err(KvError::invalid(format!(
            "{} cannot run inside MULTI or a script (it uses the lock table)",
            spec.name
        ))),
        Run::FrontEnd if ctx.in_script => Err(KvError::NotFromScript),
        Run::FrontEnd => Err(KvError::invalid(format!(
            "{} cannot run inside MULTI",
            spec.name
        ))),
    }
}

/// A read-only command at log time `now`; `None` if `argv` is not one.
pub(crate) fn read(ks: &Keyspace, now: Millis, argv: &[Bytes]) -> Option<Reply> {
    let spec = command_spec(argv).ok()?;
    let a = &argv[1..];
    let read = match spec.run {
        Run::Read(read) => read,
        Run::Mixed { reads, read, .. } if reads(a) => read,
        _ => return None,
    };
    Some(read(ks, now, a).unwrap_or_else(|e| Reply::Error(e.to_string())))
}

/// The keys `argv` touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keys<'a> {
    /// No key.
    None,
    /// The whole keyspace, without naming keys.
    Whole,
    /// These keys (possibly none, e.g. `EVAL` with `numkeys` 0).
    Args(Vec<&'a [u8]>),
}

/// The keys of `argv` according to its row's [`KeySpec`]. Malformed argument vectors (wrong
/// arity, a bad `numkeys`) give the keys that can be read; such commands fail before
/// touching any.
pub fn command_keys(argv: &[Bytes]) -> Keys<'_> {
    let Some(name) = argv.first() else {
        return Keys::None;
    };
    let args = &argv[1..];
    let spec = lookup(name).map_or(KeySpec::None, |c| c.keys);
    let keys: Vec<&[u8]> = match spec {
        KeySpec::None => return Keys::None,
        KeySpec::Whole => return Keys::Whole,
        KeySpec::First => args.iter().take(1).map(|k| k.as_slice()).collect(),
        KeySpec::All => args.iter().map(|k| k.as_slice()).collect(),
        KeySpec::EveryOther => args.iter().step_by(2).map(|k| k.as_slice()).collect(),
        KeySpec::AllButLast => args[..args.len().saturating_sub(1)]
            .iter()
            .map(|k| k.as_slice())
            .collect(),
        KeySpec::Script => counted(args, 2),
        KeySpec::Counted(at) => counted(args, at),
    };
    Keys::Args(keys)
}

/// The keys after a count at `argv[at]` (`args` is `argv[1..]`); none for a bad count.
fn counted(args: &[Bytes], at: usize) -> Vec<&[u8]> {
    let n = args
        .get(at - 1)
        .and_then(|n| super::args::parse_i64(n).ok())
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| *n <= args.len().saturating_sub(at))
        .unwrap_or(0);
    args.iter().skip(at).take(n).map(|k| k.as_slice()).collect()
}

/// Reply text when `user` may not run `cmd` (Redis 7.2's).
pub fn noperm_command(user: &str, cmd: &[u8]) -> String {
    format!(
        "NOPERM User {user} has no permissions to run the '{}' command",
        String::from_utf8_lossy(cmd).to_ascii_lowercase()
    )
}

impl Restriction {
    /// Whether this restriction lets `argv` run: its command, then its keys, then its
    /// channels (Redis's order). `Err` is the full `NOPERM …` reply text.
    pub fn check(&self, argv: &[Bytes]) -> Result<(), String> {
        let Some(name) = argv.first() else {
            return Ok(());
        };
        if let Some(allowed) = &self.commands {
            let name = String::from_utf8_lossy(name);
            if !allowed.iter().any(|c| c.eq_ignore_ascii_case(&name)) {
                return Err(noperm_command(&self.user, name.as_bytes()));
            }
        }
        if let Some(patterns) = &self.keys {
            let ok = match command_keys(argv) {
                Keys::None => true,
                Keys::Whole => false,
                Keys::Args(keys) => keys
                    .iter()
                    .all(|k| patterns.iter().any(|p| glob_match(p, k))),
            };
            if !ok {
                return Err(NOPERM_KEY.into());
            }
        }
        if let Some(patterns) = &self.channels {
            let matches = |c: &Bytes| patterns.iter().any(|p| glob_match(p, c));
            let args = &argv[1..];
            let ok = match lookup(name).map_or(ChannelSpec::None, |c| c.channels) {
                ChannelSpec::None => true,
                // A channel must match one of the patterns.
                ChannelSpec::First => args.iter().take(1).all(matches),
                ChannelSpec::All => args.iter().all(matches),
                // A subscription pattern must be one of the patterns, literally (Redis).
                ChannelSpec::Patterns => args.iter().all(|c| patterns.contains(c)),
            };
            if !ok {
                return Err(NOPERM_CHANNEL.into());
            }
        }
        Ok(())
    }
}
