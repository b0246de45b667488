//! One row per command: everything the rest of the system needs to know about a command —
//! its name and arity, how the front end serves it, where its keys and channels are, its ACL
//! categories and the code that runs it. Parsing, routing, ACL checks and `COMMAND INFO`
//! all read these rows (`cmd::TABLE`); nothing else lists commands.

use super::error::KvResult;
use super::exec::Ctx;
use super::store::Keyspace;
use super::types::{Bytes, Reply};
use crate::Millis;

/// A read-only command: the keyspace at log time `now`, the arguments after the name.
pub(crate) type ReadFn = fn(&Keyspace, Millis, &[Bytes]) -> KvResult<Reply>;
/// A write command inside `apply`: the arguments after the name.
pub(crate) type WriteFn = fn(&mut Ctx<'_>, &[Bytes]) -> KvResult<Reply>;

/// How the front end serves a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandClass {
    /// Answered from the state machine after a read barrier (`Keyspace::read`).
    Read,
    /// Proposed through the log as part of a [`super::KvCommand`].
    Write,
    /// Connection, server, transaction and pub/sub commands handled by the front end itself.
    Connection,
    /// Native lock commands (`LOCK.*`): the lock table, not the keyspace.
    Lock,
    /// `BLPOP`/`BRPOP`: a write that the front end retries until it pops or times out.
    Blocking,
}

/// What runs a command.
#[derive(Clone, Copy)]
pub(crate) enum Run {
    Read(ReadFn),
    Write(WriteFn),
    /// A write command with read-only forms (`SCRIPT EXISTS`): `reads(args)` says which.
    Mixed {
        reads: fn(&[Bytes]) -> bool,
        read: ReadFn,
        write: WriteFn,
    },
    /// One attempt of a blocking command; the front end retries until it succeeds or times out.
    Blocking(WriteFn),
    /// Served by the lock table (`LOCK.*`), through the front end.
    Lock,
    /// Served by the front end itself.
    FrontEnd,
}

/// Where a command's keys are in its argument vector: what ACL key patterns are checked
/// against (on the front end and inside `apply`) and what `COMMAND INFO` reports. Lock names
/// (`LOCK.*`) count as keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySpec {
    /// No keys: connection, server, pub/sub and script-cache commands, `TIME`.
    None,
    /// The whole keyspace without naming keys: `KEYS`, `SCAN`, `DBSIZE`, `FLUSHDB`,
    /// `FLUSHALL`. Refused to users restricted to key patterns.
    Whole,
    /// One key, `argv[1]`.
    First,
    /// Every argument (`DEL`, `UNLINK`, `EXISTS`, `MGET`, `WATCH`).
    All,
    /// `argv[1]`, `argv[3]`, … (`MSET`).
    EveryOther,
    /// Every argument but the last (`BLPOP`/`BRPOP` and their timeout).
    AllButLast,
    /// `EVAL`/`EVALSHA`: `argv[2]` is `numkeys`, the keys follow it.
    Script,
    /// `argv[n]` is the number of keys, which follow it (`LOCK.MACQUIRE owner ttl_ms
    /// numnames name…`: 3); like [`KeySpec::Script`] at another position.
    Counted(usize),
}

/// Where a command's pub/sub channels are, for ACL channel patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelSpec {
    None,
    /// `argv[1]` is a channel (`PUBLISH`).
    First,
    /// Every argument is a channel (`SUBSCRIBE`).
    All,
    /// Every argument is a channel pattern, which must be one of the user's patterns
    /// literally (`PSUBSCRIBE`, as in Redis).
    Patterns,
}

/// ACL categories, as bits of [`CommandSpec::acl`].
pub mod cat {
    pub const KEYSPACE: u32 = 1 << 0;
    pub const READ: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const SORTEDSET: u32 = 1 << 3;
    pub const LIST: u32 = 1 << 4;
    pub const HASH: u32 = 1 << 5;
    pub const STRING: u32 = 1 << 6;
    pub const PUBSUB: u32 = 1 << 7;
    pub const ADMIN: u32 = 1 << 8;
    pub const BLOCKING: u32 = 1 << 9;
    pub const DANGEROUS: u32 = 1 << 10;
    pub const CONNECTION: u32 = 1 << 11;
    pub const TRANSACTION: u32 = 1 << 12;
    pub const SCRIPTING: u32 = 1 << 13;
    pub const FENCING: u32 = 1 << 14;
    pub const RATELIMIT: u32 = 1 << 15;
}

/// The ACL categories in the order `ACL CAT` lists them (`all` is accepted but not listed,
/// as in Redis), with their bits.
pub const CATEGORIES: &[(&str, u32)] = &[
    ("keyspace", cat::KEYSPACE),
    ("read", cat::READ),
    ("write", cat::WRITE),
    ("sortedset", cat::SORTEDSET),
    ("list", cat::LIST),
    ("hash", cat::HASH),
    ("string", cat::STRING),
    ("pubsub", cat::PUBSUB),
    ("admin", cat::ADMIN),
    ("blocking", cat::BLOCKING),
    ("dangerous", cat::DANGEROUS),
    ("connection", cat::CONNECTION),
    ("transaction", cat::TRANSACTION),
    ("scripting", cat::SCRIPTING),
    ("fencing", cat::FENCING),
    ("ratelimit", cat::RATELIMIT),
];

/// Everything about one command.
#[derive(Clone, Copy)]
pub struct CommandSpec {
    /// Upper case.
    pub name: &'static str,
    /// As in Redis: `n` exact, `-n` at least `n` (the name included).
    pub arity: i32,
    pub keys: KeySpec,
    pub channels: ChannelSpec,
    /// ACL categories ([`cat`] bits).
    pub acl: u32,
    pub(crate) run: Run,
}

impl CommandSpec {
    const fn new(name: &'static str, arity: i32, acl: u32, run: Run, keys: KeySpec) -> Self {
        CommandSpec {
            name,
            arity,
            keys,
            channels: ChannelSpec::None,
            acl,
            run,
        }
    }

    /// A read-only command of one key (`argv[1]`).
    pub(crate) const fn read(name: &'static str, arity: i32, acl: u32, f: ReadFn) -> Self {
        Self::new(name, arity, acl, Run::Read(f), KeySpec::First)
    }

    /// A write command of one key (`argv[1]`).
    pub(crate) const fn write(name: &'static str, arity: i32, acl: u32, f: WriteFn) -> Self {
        Self::new(name, arity, acl, Run::Write(f), KeySpec::First)
    }

    /// A blocking command of one key (`argv[1]`).
    pub(crate) const fn blocking(name: &'static str, arity: i32, acl: u32, f: WriteFn) -> Self {
        Self::new(name, arity, acl, Run::Blocking(f), KeySpec::First)
    }

    /// A command of `run` with no keys.
    pub(crate) const fn other(name: &'static str, arity: i32, acl: u32, run: Run) -> Self {
        Self::new(name, arity, acl, run, KeySpec::None)
    }

    /// The same command with its keys at `keys`.
    pub(crate) const fn keys(mut self, keys: KeySpec) -> Self {
        self.keys = keys;
        self
    }

    /// The same command with pub/sub channels at `channels`.
    pub(crate) const fn channels(mut self, channels: ChannelSpec) -> Self {
        self.channels = channels;
        self
    }

    /// How the front end serves `args` (the arguments after the name) of this command.
    pub fn class(&self, args: &[Bytes]) -> CommandClass {
        match self.run {
            Run::Read(_) => CommandClass::Read,
            Run::Mixed { reads, .. } if reads(args) => CommandClass::Read,
            Run::Write(_) | Run::Mixed { .. } => CommandClass::Write,
            Run::Blocking(_) => CommandClass::Blocking,
            Run::Lock => CommandClass::Lock,
            Run::FrontEnd => CommandClass::Connection,
        }
    }

    /// The class of the command without arguments (its usual one, for `COMMAND INFO`).
    pub fn base_class(&self) -> CommandClass {
        self.class(&[])
    }

    /// Whether the command is in ACL category `bit`.
    pub fn in_category(&self, bit: u32) -> bool {
        self.acl & bit != 0
    }

    /// Whether argument count `n` (the name included) fits the arity.
    pub fn arity_ok(&self, n: usize) -> bool {
        let n = n as i32;
        if self.arity >= 0 {
            n == self.arity
        } else {
            n >= -self.arity
        }
    }
}
