//! The Redis command interpreter of the keyspace: argument parsing, the command table
//! (arity and class), read commands on `&Keyspace` and write commands inside `apply`.
//!
//! Errors are `Err(String)` holding the full error text (`"ERR syntax error"`,
//! `"WRONGTYPE …"`), turned into [`Reply::Error`] at the edge.

use std::collections::{BTreeMap, VecDeque};

use super::{
    Bytes, Entry, Keyspace, KvEvent, Reply, Score, Value, ZSet, MAX_SCRIPTS, MAX_VALUE_LEN,
};
use crate::{Millis, Revision};

type R = Result<Reply, String>;

pub(crate) const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INT: &str = "ERR value is not an integer or out of range";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const SYNTAX: &str = "ERR syntax error";
const OVERFLOW: &str = "ERR increment or decrement would overflow";

/// How the front end serves a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandClass {
    /// Answered from the state machine after a read barrier ([`Keyspace::read`]).
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

use CommandClass::*;

/// `(name, arity, class)`; arity as in Redis: `n` exact, `-n` at least `n` (name included).
const TABLE: &[(&str, i32, CommandClass)] = &[
    // strings
    ("GET", 2, Read),
    ("SET", -3, Write),
    ("SETNX", 3, Write),
    ("SETEX", 4, Write),
    ("PSETEX", 4, Write),
    ("GETDEL", 2, Write),
    ("GETSET", 3, Write),
    ("INCR", 2, Write),
    ("INCRBY", 3, Write),
    ("DECR", 2, Write),
    ("DECRBY", 3, Write),
    ("APPEND", 3, Write),
    ("STRLEN", 2, Read),
    ("MGET", -2, Read),
    ("MSET", -3, Write),
    // keys
    ("DEL", -2, Write),
    ("UNLINK", -2, Write),
    ("EXISTS", -2, Read),
    ("TYPE", 2, Read),
    ("KEYS", 2, Read),
    ("SCAN", -2, Read),
    ("EXPIRE", -3, Write),
    ("PEXPIRE", -3, Write),
    ("EXPIREAT", -3, Write),
    ("PEXPIREAT", -3, Write),
    ("TTL", 2, Read),
    ("PTTL", 2, Read),
    ("EXPIRETIME", 2, Read),
    ("PEXPIRETIME", 2, Read),
    ("PERSIST", 2, Write),
    ("DBSIZE", 1, Read),
    ("FLUSHDB", -1, Write),
    ("FLUSHALL", -1, Write),
    ("TIME", 1, Read),
    // hashes
    ("HSET", -4, Write),
    ("HMSET", -4, Write),
    ("HSETNX", 4, Write),
    ("HGET", 3, Read),
    ("HMGET", -3, Read),
    ("HDEL", -3, Write),
    ("HEXISTS", 3, Read),
    ("HINCRBY", 4, Write),
    ("HGETALL", 2, Read),
    ("HLEN", 2, Read),
    ("HKEYS", 2, Read),
    ("HVALS", 2, Read),
    // lists
    ("LPUSH", -3, Write),
    ("RPUSH", -3, Write),
    ("LPOP", -2, Write),
    ("RPOP", -2, Write),
    ("LLEN", 2, Read),
    ("LRANGE", 4, Read),
    ("LINDEX", 3, Read),
    ("LSET", 4, Write),
    ("LREM", 4, Write),
    ("LTRIM", 4, Write),
    ("BLPOP", -3, Blocking),
    ("BRPOP", -3, Blocking),
    // sorted sets
    ("ZADD", -4, Write),
    ("ZINCRBY", 4, Write),
    ("ZREM", -3, Write),
    ("ZCARD", 2, Read),
    ("ZSCORE", 3, Read),
    ("ZRANGE", -4, Read),
    ("ZRANGEBYSCORE", -4, Read),
    ("ZREMRANGEBYSCORE", 4, Write),
    ("ZCOUNT", 4, Read),
    // scripting
    ("EVAL", -3, Write),
    ("EVALSHA", -3, Write),
    ("SCRIPT", -2, Write),
    // pub/sub (publishing goes through the log so every node's subscribers see it)
    ("PUBLISH", 3, Write),
    // fencing
    ("FENCE.SET", 4, Write),
    ("FENCE.TOKEN", -2, Read),
    ("LOCK.ACQUIRE", -4, Lock),
    ("LOCK.RELEASE", 4, Lock),
    ("LOCK.RENEW", 5, Lock),
    ("LOCK.INFO", 2, Lock),
    // served by the front end
    ("PING", -1, Connection),
    ("ECHO", 2, Connection),
    ("HELLO", -1, Connection),
    ("AUTH", -2, Connection),
    ("SELECT", 2, Connection),
    ("QUIT", -1, Connection),
    ("RESET", 1, Connection),
    ("CLIENT", -2, Connection),
    ("INFO", -1, Connection),
    ("COMMAND", -1, Connection),
    ("CONFIG", -2, Connection),
    ("MULTI", 1, Connection),
    ("EXEC", 1, Connection),
    ("DISCARD", 1, Connection),
    ("WATCH", -2, Connection),
    ("UNWATCH", 1, Connection),
    ("SUBSCRIBE", -2, Connection),
    ("UNSUBSCRIBE", -1, Connection),
    ("PSUBSCRIBE", -2, Connection),
    ("PUNSUBSCRIBE", -1, Connection),
    ("ACL", -2, Connection),
];

/// Every command of the table: `(name, arity, class)`.
pub fn command_table() -> &'static [(&'static str, i32, CommandClass)] {
    TABLE
}

/// Look `argv` up in the command table and check its arity. The error is Redis's exact
/// unknown-command or wrong-arity reply text.
pub fn command_class(argv: &[Bytes]) -> Result<CommandClass, String> {
    let Some(name) = argv.first() else {
        return Err("ERR empty command".into());
    };
    let upper = name.to_ascii_uppercase();
    let Some((_, arity, class)) = TABLE.iter().find(|(n, _, _)| n.as_bytes() == upper) else {
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
        return Err(msg);
    };
    let n = argv.len() as i32;
    if (*arity > 0 && n != *arity) || (*arity < 0 && n < -arity) {
        return Err(format!(
            "ERR wrong number of arguments for '{}' command",
            String::from_utf8_lossy(name).to_ascii_lowercase()
        ));
    }
    // SCRIPT EXISTS only reads.
    if upper == b"SCRIPT"
        && argv
            .get(1)
            .is_some_and(|s| s.eq_ignore_ascii_case(b"EXISTS"))
    {
        return Ok(Read);
    }
    Ok(*class)
}

// ---- keys and ACL restrictions -----------------------------------------------------------

/// Reply text when a restricted user names a key outside its patterns (Redis 7.2's).
pub const NOPERM_KEY: &str = "NOPERM No permissions to access a key";
/// Reply text when a restricted user names a channel outside its patterns (Redis 7.2's).
pub const NOPERM_CHANNEL: &str = "NOPERM No permissions to access a channel";

/// Reply text when `user` may not run `cmd` (Redis 7.2's).
pub fn noperm_command(user: &str, cmd: &[u8]) -> String {
    format!(
        "NOPERM User {user} has no permissions to run the '{}' command",
        String::from_utf8_lossy(cmd).to_ascii_lowercase()
    )
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
}

/// The key specification of command `name` (any case). Commands that are not in the table
/// have none.
pub fn key_spec(name: &str) -> KeySpec {
    let upper = name.to_ascii_uppercase();
    let Some((_, _, class)) = TABLE.iter().find(|(n, _, _)| *n == upper) else {
        return KeySpec::None;
    };
    match upper.as_str() {
        "KEYS" | "SCAN" | "DBSIZE" | "FLUSHDB" | "FLUSHALL" => KeySpec::Whole,
        "DEL" | "UNLINK" | "EXISTS" | "MGET" | "WATCH" => KeySpec::All,
        "MSET" => KeySpec::EveryOther,
        "BLPOP" | "BRPOP" => KeySpec::AllButLast,
        "EVAL" | "EVALSHA" => KeySpec::Script,
        "TIME" | "SCRIPT" | "PUBLISH" => KeySpec::None,
        // Anything else that reaches the keyspace or the lock table names its key first;
        // a new command defaults to that (the restrictive side for ACLs).
        _ if *class == Connection => KeySpec::None,
        _ => KeySpec::First,
    }
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

/// The keys of `argv` according to [`key_spec`]. Malformed argument vectors (wrong arity, a
/// bad `numkeys`) give the keys that can be read; such commands fail before touching any.
pub fn command_keys(argv: &[Bytes]) -> Keys<'_> {
    let Some(name) = argv.first() else {
        return Keys::None;
    };
    let args = &argv[1..];
    let keys: Vec<&[u8]> = match key_spec(&String::from_utf8_lossy(name)) {
        KeySpec::None => return Keys::None,
        KeySpec::Whole => return Keys::Whole,
        KeySpec::First => args.iter().take(1).map(|k| k.as_slice()).collect(),
        KeySpec::All => args.iter().map(|k| k.as_slice()).collect(),
        KeySpec::EveryOther => args.iter().step_by(2).map(|k| k.as_slice()).collect(),
        KeySpec::AllButLast => args[..args.len().saturating_sub(1)]
            .iter()
            .map(|k| k.as_slice())
            .collect(),
        KeySpec::Script => {
            let n = args
                .get(1)
                .and_then(|n| parse_i64(n).ok())
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| *n <= args.len().saturating_sub(2))
                .unwrap_or(0);
            args.iter().skip(2).take(n).map(|k| k.as_slice()).collect()
        }
    };
    Keys::Args(keys)
}

impl super::Restriction {
    /// Whether this restriction lets `argv` run: its command, then its keys, then its
    /// channels (Redis's order). `Err` is the full `NOPERM …` reply text.
    pub fn check(&self, argv: &[Bytes]) -> Result<(), String> {
        let Some(name) = argv.first() else {
            return Ok(());
        };
        if let Some(allowed) = &self.commands {
            let upper = String::from_utf8_lossy(name).to_ascii_uppercase();
            if !allowed.iter().any(|c| c.eq_ignore_ascii_case(&upper)) {
                return Err(noperm_command(&self.user, name));
            }
        }
        if let Some(patterns) = &self.keys {
            let ok = match command_keys(argv) {
                Keys::None => true,
                Keys::Whole => false,
                Keys::Args(keys) => keys
                    .iter()
                    .all(|k| patterns.iter().any(|p| super::glob_match(p, k))),
            };
            if !ok {
                return Err(NOPERM_KEY.into());
            }
        }
        if let Some(patterns) = &self.channels {
            let upper = name.to_ascii_uppercase();
            let args = &argv[1..];
            let ok = match upper.as_slice() {
                // A channel must match one of the patterns.
                b"PUBLISH" => args
                    .iter()
                    .take(1)
                    .all(|c| patterns.iter().any(|p| super::glob_match(p, c))),
                b"SUBSCRIBE" => args
                    .iter()
                    .all(|c| patterns.iter().any(|p| super::glob_match(p, c))),
                // A subscription pattern must be one of the patterns, literally (Redis).
                b"PSUBSCRIBE" => args.iter().all(|c| patterns.contains(c)),
                _ => true,
            };
            if !ok {
                return Err(NOPERM_CHANNEL.into());
            }
        }
        Ok(())
    }
}

// ---- argument parsing ---------------------------------------------------------------------

pub(crate) fn parse_i64(b: &[u8]) -> Result<i64, String> {
    let s = std::str::from_utf8(b).map_err(|_| NOT_INT.to_string())?;
    if s.is_empty()
        || s.starts_with('+')
        || (s.len() > 1 && s.starts_with('0'))
        || s.starts_with("-0")
    {
        return Err(NOT_INT.into());
    }
    s.parse::<i64>().map_err(|_| NOT_INT.into())
}

pub(crate) fn parse_f64(b: &[u8]) -> Result<f64, String> {
    let s = std::str::from_utf8(b).map_err(|_| NOT_FLOAT.to_string())?;
    let v = match s.to_ascii_lowercase().as_str() {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        l if l.contains("inf") || l.contains("nan") || l.is_empty() || l.trim() != l => {
            return Err(NOT_FLOAT.into())
        }
        _ => s.parse::<f64>().map_err(|_| NOT_FLOAT.to_string())?,
    };
    if v.is_nan() {
        return Err(NOT_FLOAT.into());
    }
    Ok(v)
}

/// Redis's formatting of doubles: integers without a fraction, `inf`/`-inf`, else the
/// shortest representation that round-trips.
pub(crate) fn fmt_f64(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == v.trunc() && v.abs() < 1e17 {
        return format!("{}", v as i64);
    }
    format!("{v}")
}

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

fn is(b: &[u8], word: &str) -> bool {
    b.eq_ignore_ascii_case(word.as_bytes())
}

fn check_len(b: &[u8]) -> Result<(), String> {
    if b.len() > MAX_VALUE_LEN {
        return Err("ERR string exceeds maximum allowed size".into());
    }
    Ok(())
}

/// A relative expiry in `unit_ms` units → absolute log time.
fn rel_expiry(now: Millis, amount: i64, unit_ms: i64, cmd: &str) -> Result<Millis, String> {
    let bad = || format!("ERR invalid expire time in '{cmd}' command");
    if amount <= 0 {
        return Err(bad());
    }
    let ms = amount.checked_mul(unit_ms).ok_or_else(bad)?;
    (now as i64)
        .checked_add(ms)
        .map(|t| t as Millis)
        .ok_or_else(bad)
}

fn abs_expiry(amount: i64, unit_ms: i64, cmd: &str) -> Result<Millis, String> {
    let bad = || format!("ERR invalid expire time in '{cmd}' command");
    if amount <= 0 {
        return Err(bad());
    }
    amount
        .checked_mul(unit_ms)
        .map(|t| t as Millis)
        .ok_or_else(bad)
}

// ---- typed views ----------------------------------------------------------------------------

fn as_str(e: &Entry) -> Result<&Bytes, String> {
    match &e.value {
        Value::Str(s) => Ok(s),
        _ => Err(WRONGTYPE.into()),
    }
}
fn as_hash(e: &Entry) -> Result<&BTreeMap<Bytes, Bytes>, String> {
    match &e.value {
        Value::Hash(h) => Ok(h),
        _ => Err(WRONGTYPE.into()),
    }
}
fn as_list(e: &Entry) -> Result<&VecDeque<Bytes>, String> {
    match &e.value {
        Value::List(l) => Ok(l),
        _ => Err(WRONGTYPE.into()),
    }
}
fn as_zset(e: &Entry) -> Result<&ZSet, String> {
    match &e.value {
        Value::ZSet(z) => Ok(z),
        _ => Err(WRONGTYPE.into()),
    }
}

fn bulk_or_nil(v: Option<&Bytes>) -> Reply {
    v.map_or(Reply::Nil, |b| Reply::Bulk(b.clone()))
}

/// Normalise Redis's inclusive `start..=stop` (negative from the end) over `len` items.
fn range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let mut s = if start < 0 { len + start } else { start };
    let mut e = if stop < 0 { len + stop } else { stop };
    if s < 0 {
        s = 0;
    }
    if e >= len {
        e = len - 1;
    }
    if s > e || s >= len {
        return None;
    }
    Some((s as usize, e as usize))
}

#[derive(Clone, Copy)]
struct Bound {
    v: f64,
    excl: bool,
}

fn parse_bound(b: &[u8]) -> Result<Bound, String> {
    let bad = || "ERR min or max is not a float".to_string();
    let (excl, rest) = match b.first() {
        Some(b'(') => (true, &b[1..]),
        _ => (false, b),
    };
    let v = parse_f64(rest).map_err(|_| bad())?;
    Ok(Bound { v, excl })
}

fn above(x: f64, min: Bound) -> bool {
    if min.excl {
        x > min.v
    } else {
        x >= min.v
    }
}
fn below(x: f64, max: Bound) -> bool {
    if max.excl {
        x < max.v
    } else {
        x <= max.v
    }
}

// ---- reads ----------------------------------------------------------------------------------

/// Read-only commands at log time `now`. `None` if `argv` is not a read command.
pub(crate) fn read(ks: &Keyspace, now: Millis, argv: &[Bytes]) -> Option<Reply> {
    match command_class(argv) {
        Ok(Read) => Some(read_cmd(ks, now, argv).unwrap_or_else(Reply::Error)),
        _ => None,
    }
}

fn read_cmd(ks: &Keyspace, now: Millis, argv: &[Bytes]) -> R {
    let name = upper(&argv[0]);
    let a = &argv[1..];
    let get = |k: &[u8]| ks.get(k, now);
    Ok(match name.as_str() {
        "GET" => match get(&a[0]) {
            Some(e) => Reply::Bulk(as_str(e)?.clone()),
            None => Reply::Nil,
        },
        "STRLEN" => match get(&a[0]) {
            Some(e) => Reply::Int(as_str(e)?.len() as i64),
            None => Reply::Int(0),
        },
        "MGET" => Reply::Array(
            a.iter()
                .map(|k| match get(k).map(|e| &e.value) {
                    Some(Value::Str(s)) => Reply::Bulk(s.clone()),
                    _ => Reply::Nil,
                })
                .collect(),
        ),
        "EXISTS" => Reply::Int(a.iter().filter(|k| get(k).is_some()).count() as i64),
        "TYPE" => Reply::Status(get(&a[0]).map_or("none", |e| e.value.type_name()).into()),
        "KEYS" => Reply::Array(
            ks.keys
                .keys()
                .filter(|k| get(k).is_some() && super::glob_match(&a[0], k))
                .map(|k| Reply::Bulk(k.clone()))
                .collect(),
        ),
        "SCAN" => scan(ks, now, a)?,
        "TTL" | "PTTL" => match get(&a[0]) {
            None => Reply::Int(-2),
            Some(Entry {
                expire_at: None, ..
            }) => Reply::Int(-1),
            Some(Entry {
                expire_at: Some(t), ..
            }) => {
                let ms = t.saturating_sub(now) as i64;
                Reply::Int(if name == "TTL" { (ms + 500) / 1000 } else { ms })
            }
        },
        "EXPIRETIME" | "PEXPIRETIME" => match get(&a[0]) {
            None => Reply::Int(-2),
            Some(Entry {
                expire_at: None, ..
            }) => Reply::Int(-1),
            Some(Entry {
                expire_at: Some(t), ..
            }) => Reply::Int(if name == "EXPIRETIME" {
                (*t / 1000) as i64
            } else {
                *t as i64
            }),
        },
        "DBSIZE" => Reply::Int(ks.len(now) as i64),
        "TIME" => Reply::Array(vec![
            Reply::bulk((now / 1000).to_string()),
            Reply::bulk(((now % 1000) * 1000).to_string()),
        ]),
        "HGET" => match get(&a[0]) {
            Some(e) => bulk_or_nil(as_hash(e)?.get(&a[1])),
            None => Reply::Nil,
        },
        "HMGET" => {
            let h = get(&a[0]).map(as_hash).transpose()?;
            Reply::Array(
                a[1..]
                    .iter()
                    .map(|f| bulk_or_nil(h.and_then(|h| h.get(f))))
                    .collect(),
            )
        }
        "HEXISTS" => match get(&a[0]) {
            Some(e) => Reply::Int(as_hash(e)?.contains_key(&a[1]) as i64),
            None => Reply::Int(0),
        },
        "HGETALL" => match get(&a[0]) {
            Some(e) => Reply::Map(
                as_hash(e)?
                    .iter()
                    .map(|(k, v)| (Reply::Bulk(k.clone()), Reply::Bulk(v.clone())))
                    .collect(),
            ),
            None => Reply::Map(vec![]),
        },
        "HLEN" => match get(&a[0]) {
            Some(e) => Reply::Int(as_hash(e)?.len() as i64),
            None => Reply::Int(0),
        },
        "HKEYS" | "HVALS" => match get(&a[0]) {
            Some(e) => Reply::Array(
                as_hash(e)?
                    .iter()
                    .map(|(k, v)| Reply::Bulk(if name == "HKEYS" { k } else { v }.clone()))
                    .collect(),
            ),
            None => Reply::Array(vec![]),
        },
        "LLEN" => match get(&a[0]) {
            Some(e) => Reply::Int(as_list(e)?.len() as i64),
            None => Reply::Int(0),
        },
        "LRANGE" => {
            let (s, e) = (parse_i64(&a[1])?, parse_i64(&a[2])?);
            match get(&a[0]) {
                Some(en) => {
                    let l = as_list(en)?;
                    match range(s, e, l.len()) {
                        Some((s, e)) => {
                            Reply::Array(l.range(s..=e).map(|v| Reply::Bulk(v.clone())).collect())
                        }
                        None => Reply::Array(vec![]),
                    }
                }
                None => Reply::Array(vec![]),
            }
        }
        "LINDEX" => {
            let i = parse_i64(&a[1])?;
            match get(&a[0]) {
                Some(e) => {
                    let l = as_list(e)?;
                    let i = if i < 0 { l.len() as i64 + i } else { i };
                    if i < 0 {
                        Reply::Nil
                    } else {
                        bulk_or_nil(l.get(i as usize))
                    }
                }
                None => Reply::Nil,
            }
        }
        "ZCARD" => match get(&a[0]) {
            Some(e) => Reply::Int(as_zset(e)?.len() as i64),
            None => Reply::Int(0),
        },
        "ZSCORE" => match get(&a[0]) {
            Some(e) => as_zset(e)?
                .by_member
                .get(&a[1])
                .map_or(Reply::Nil, |s| Reply::Double(fmt_f64(s.0))),
            None => Reply::Nil,
        },
        "ZCOUNT" => {
            let (min, max) = (parse_bound(&a[1])?, parse_bound(&a[2])?);
            match get(&a[0]) {
                Some(e) => Reply::Int(
                    as_zset(e)?
                        .by_score
                        .iter()
                        .filter(|(s, _)| above(s.0, min) && below(s.0, max))
                        .count() as i64,
                ),
                None => Reply::Int(0),
            }
        }
        "ZRANGE" => zrange(get(&a[0]), &a[1..], false)?,
        "ZRANGEBYSCORE" => zrange(get(&a[0]), &a[1..], true)?,
        // `FENCE.TOKEN key [value]`: with `value`, only while the key still holds exactly that
        // value — so a client whose `SET NX` lease ran out cannot read the next holder's token.
        "FENCE.TOKEN" => match (get(&a[0]), a.get(1)) {
            _ if a.len() > 2 => return Err(SYNTAX.into()),
            (None, _) => Reply::Nil,
            (Some(e), None) => Reply::Int(e.create_revision as i64),
            (Some(e), Some(want)) => match &e.value {
                Value::Str(v) if v == want => Reply::Int(e.create_revision as i64),
                Value::Str(_) => Reply::Nil,
                _ => return Err(WRONGTYPE.into()),
            },
        },
        "SCRIPT" => {
            // SCRIPT EXISTS sha...
            Reply::Array(
                a[1..]
                    .iter()
                    .map(|s| Reply::Int(ks.has_script(&String::from_utf8_lossy(s)) as i64))
                    .collect(),
            )
        }
        _ => {
            return Err(format!(
                "ERR unknown command '{}'",
                name.to_ascii_lowercase()
            ))
        }
    })
}

fn scan(ks: &Keyspace, now: Millis, a: &[Bytes]) -> R {
    // The whole keyspace in one call (cursor 0 back): valid SCAN semantics, and simple.
    let _cursor = parse_i64(&a[0]).map_err(|_| "ERR invalid cursor".to_string())?;
    let mut pattern: Option<&[u8]> = None;
    let mut typ: Option<String> = None;
    let mut i = 1;
    while i < a.len() {
        if is(&a[i], "MATCH") && i + 1 < a.len() {
            pattern = Some(&a[i + 1]);
        } else if is(&a[i], "COUNT") && i + 1 < a.len() {
            if parse_i64(&a[i + 1])? < 1 {
                return Err(SYNTAX.into());
            }
        } else if is(&a[i], "TYPE") && i + 1 < a.len() {
            typ = Some(String::from_utf8_lossy(&a[i + 1]).to_ascii_lowercase());
        } else {
            return Err(SYNTAX.into());
        }
        i += 2;
    }
    let keys = ks
        .keys
        .iter()
        .filter(|(k, _)| ks.get(k, now).is_some())
        .filter(|(k, _)| pattern.is_none_or_match(k))
        .filter(|(_, e)| typ.as_deref().is_none_or_eq(e.value.type_name()))
        .map(|(k, _)| Reply::Bulk(k.clone()))
        .collect();
    Ok(Reply::Array(vec![Reply::bulk("0"), Reply::Array(keys)]))
}

trait OptPattern {
    fn is_none_or_match(&self, k: &[u8]) -> bool;
}
impl OptPattern for Option<&[u8]> {
    fn is_none_or_match(&self, k: &[u8]) -> bool {
        match self {
            None => true,
            Some(p) => super::glob_match(p, k),
        }
    }
}
trait OptEq {
    fn is_none_or_eq(&self, s: &str) -> bool;
}
impl OptEq for Option<&str> {
    fn is_none_or_eq(&self, s: &str) -> bool {
        match self {
            None => true,
            Some(t) => *t == s,
        }
    }
}

/// `ZRANGE key start stop [BYSCORE] [REV] [LIMIT off n] [WITHSCORES]` and
/// `ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT off n]` (`a` starts after the key).
fn zrange(e: Option<&Entry>, a: &[Bytes], by_score_cmd: bool) -> R {
    let mut by_score = by_score_cmd;
    let (mut rev, mut with_scores) = (false, false);
    let mut limit: Option<(i64, i64)> = None;
    let mut i = 2;
    while i < a.len() {
        if is(&a[i], "WITHSCORES") {
            with_scores = true;
        } else if is(&a[i], "BYSCORE") && !by_score_cmd {
            by_score = true;
        } else if is(&a[i], "REV") && !by_score_cmd {
            rev = true;
        } else if is(&a[i], "BYLEX") && !by_score_cmd {
            return Err("ERR BYLEX is not supported by fenced".into());
        } else if is(&a[i], "LIMIT") && i + 2 < a.len() {
            limit = Some((parse_i64(&a[i + 1])?, parse_i64(&a[i + 2])?));
            i += 2;
        } else {
            return Err(SYNTAX.into());
        }
        i += 1;
    }
    if limit.is_some() && !by_score {
        return Err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"
                .into(),
        );
    }
    let items: Vec<(Score, Bytes)> = if by_score {
        let (mut min, mut max) = (parse_bound(&a[0])?, parse_bound(&a[1])?);
        if rev {
            std::mem::swap(&mut min, &mut max);
        }
        let Some(e) = e else {
            return Ok(Reply::Array(vec![]));
        };
        let z = as_zset(e)?;
        let it = z
            .by_score
            .iter()
            .filter(|(s, _)| above(s.0, min) && below(s.0, max))
            .cloned();
        let mut v: Vec<_> = if rev {
            it.rev().collect()
        } else {
            it.collect()
        };
        if let Some((off, n)) = limit {
            if off < 0 {
                v.clear();
            } else {
                v = v
                    .into_iter()
                    .skip(off as usize)
                    .take(if n < 0 { usize::MAX } else { n as usize })
                    .collect();
            }
        }
        v
    } else {
        let (s, st) = (parse_i64(&a[0])?, parse_i64(&a[1])?);
        let Some(e) = e else {
            return Ok(Reply::Array(vec![]));
        };
        let z = as_zset(e)?;
        let all: Vec<_> = if rev {
            z.by_score.iter().rev().cloned().collect()
        } else {
            z.by_score.iter().cloned().collect()
        };
        match range(s, st, all.len()) {
            Some((s, e)) => all[s..=e].to_vec(),
            None => vec![],
        }
    };
    let mut out = Vec::with_capacity(items.len() * 2);
    for (s, m) in items {
        out.push(Reply::Bulk(m));
        if with_scores {
            out.push(Reply::Double(fmt_f64(s.0)));
        }
    }
    Ok(Reply::Array(out))
}

// ---- writes ---------------------------------------------------------------------------------

/// The context of one command inside `apply`.
pub(crate) struct Ctx<'a> {
    pub ks: &'a mut Keyspace,
    /// Revision of the command being run (keys it writes get it as `mod_revision`).
    pub revision: Revision,
    pub now: Millis,
    pub events: &'a mut Vec<KvEvent>,
    /// Inside a Lua script: scripting, blocking and connection commands are refused.
    pub in_script: bool,
    /// ACL restrictions of the entry ([`super::KvCommand::Restricted`], nested ones all
    /// apply): checked before every command, `redis.call` inside scripts included.
    pub limits: Vec<&'a super::Restriction>,
}

impl Ctx<'_> {
    /// Run one command; errors become error replies.
    pub fn exec(&mut self, argv: &[Bytes]) -> Reply {
        self.exec_inner(argv).unwrap_or_else(Reply::Error)
    }

    fn exec_inner(&mut self, argv: &[Bytes]) -> R {
        let class = command_class(argv)?;
        for l in &self.limits {
            l.check(argv)?;
        }
        let name = upper(&argv[0]);
        match class {
            Read => return read_cmd(self.ks, self.now, argv),
            Write => {}
            Blocking if !self.in_script => return self.blocking_pop(&name, &argv[1..]),
            Blocking => {
                return Err("ERR This Redis command is not allowed from script".into());
            }
            Lock => {
                return Err(format!(
                    "ERR {} cannot run inside MULTI or a script (it uses the lock table)",
                    name
                ))
            }
            Connection => {
                return Err(if self.in_script {
                    "ERR This Redis command is not allowed from script".into()
                } else {
                    format!("ERR {} cannot run inside MULTI", name)
                })
            }
        }
        let a = &argv[1..];
        match name.as_str() {
            "SET" => self.set(a),
            "SETNX" => {
                if self.ks.entry_mut(&a[0]).is_some() {
                    return Ok(Reply::Int(0));
                }
                check_len(&a[1])?;
                self.ks
                    .put(self.revision, &a[0], Value::Str(a[1].clone()), None, false);
                Ok(Reply::Int(1))
            }
            "SETEX" | "PSETEX" => {
                let unit = if name == "SETEX" { 1000 } else { 1 };
                let exp = rel_expiry(
                    self.now,
                    parse_i64(&a[1])?,
                    unit,
                    &name.to_ascii_lowercase(),
                )?;
                check_len(&a[2])?;
                self.ks.put(
                    self.revision,
                    &a[0],
                    Value::Str(a[2].clone()),
                    Some(exp),
                    false,
                );
                Ok(Reply::ok())
            }
            "GETDEL" => {
                let old = match self.ks.get(&a[0], self.now) {
                    Some(e) => as_str(e)?.clone(),
                    None => return Ok(Reply::Nil),
                };
                self.ks.remove(&a[0]);
                Ok(Reply::Bulk(old))
            }
            "GETSET" => {
                let old = match self.ks.get(&a[0], self.now) {
                    Some(e) => Reply::Bulk(as_str(e)?.clone()),
                    None => Reply::Nil,
                };
                check_len(&a[1])?;
                self.ks
                    .put(self.revision, &a[0], Value::Str(a[1].clone()), None, false);
                Ok(old)
            }
            "INCR" => self.incr(&a[0], 1),
            "DECR" => self.incr(&a[0], -1),
            "INCRBY" => self.incr(&a[0], parse_i64(&a[1])?),
            "DECRBY" => {
                let by = parse_i64(&a[1])?;
                self.incr(&a[0], by.checked_neg().ok_or(OVERFLOW)?)
            }
            "APPEND" => {
                let mut v = match self.ks.get(&a[0], self.now) {
                    Some(e) => as_str(e)?.clone(),
                    None => Vec::new(),
                };
                v.extend_from_slice(&a[1]);
                check_len(&v)?;
                let n = v.len();
                self.ks.put(self.revision, &a[0], Value::Str(v), None, true);
                Ok(Reply::Int(n as i64))
            }
            "MSET" => {
                if a.len() & 1 == 1 {
                    return Err("ERR wrong number of arguments for 'mset' command".into());
                }
                for kv in a.chunks(2) {
                    check_len(&kv[1])?;
                }
                for kv in a.chunks(2) {
                    self.ks.put(
                        self.revision,
                        &kv[0],
                        Value::Str(kv[1].clone()),
                        None,
                        false,
                    );
                }
                Ok(Reply::ok())
            }
            "DEL" | "UNLINK" => Ok(Reply::Int(
                a.iter().filter(|k| self.ks.remove(k).is_some()).count() as i64,
            )),
            "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" => self.expire(&name, a),
            "PERSIST" => match self.ks.get(&a[0], self.now) {
                Some(e) if e.expire_at.is_some() => {
                    self.ks.set_expiry(&a[0], self.revision, None);
                    Ok(Reply::Int(1))
                }
                _ => Ok(Reply::Int(0)),
            },
            "FLUSHDB" | "FLUSHALL" => {
                if a.len() > 1 || a.first().is_some_and(|m| !is(m, "SYNC") && !is(m, "ASYNC")) {
                    return Err(SYNTAX.into());
                }
                self.ks.flush();
                Ok(Reply::ok())
            }
            "HSET" | "HMSET" => {
                if a.len() % 2 != 1 {
                    return Err(format!(
                        "ERR wrong number of arguments for '{}' command",
                        name.to_ascii_lowercase()
                    ));
                }
                let mut added = 0;
                self.with_hash(&a[0], true, |h| {
                    for fv in a[1..].chunks(2) {
                        if h.insert(fv[0].clone(), fv[1].clone()).is_none() {
                            added += 1;
                        }
                    }
                    Ok(())
                })?;
                Ok(if name == "HSET" {
                    Reply::Int(added)
                } else {
                    Reply::ok()
                })
            }
            "HSETNX" => {
                let mut set = 0;
                self.with_hash(&a[0], true, |h| {
                    if !h.contains_key(&a[1]) {
                        h.insert(a[1].clone(), a[2].clone());
                        set = 1;
                    }
                    Ok(())
                })?;
                Ok(Reply::Int(set))
            }
            "HDEL" => {
                let mut n = 0;
                self.with_hash(&a[0], false, |h| {
                    n = a[1..].iter().filter(|f| h.remove(*f).is_some()).count() as i64;
                    Ok(())
                })?;
                Ok(Reply::Int(n))
            }
            "HINCRBY" => {
                let by = parse_i64(&a[2])?;
                let mut out = 0;
                self.with_hash(&a[0], true, |h| {
                    let cur = match h.get(&a[1]) {
                        Some(v) => parse_i64(v).map_err(|_| "ERR hash value is not an integer")?,
                        None => 0,
                    };
                    out = cur.checked_add(by).ok_or(OVERFLOW)?;
                    h.insert(a[1].clone(), out.to_string().into_bytes());
                    Ok(())
                })?;
                Ok(Reply::Int(out))
            }
            "LPUSH" | "RPUSH" => {
                let mut n = 0;
                self.with_list(&a[0], true, |l| {
                    for v in &a[1..] {
                        if name == "LPUSH" {
                            l.push_front(v.clone());
                        } else {
                            l.push_back(v.clone());
                        }
                    }
                    n = l.len() as i64;
                    Ok(())
                })?;
                self.events.push(KvEvent::Pushed { key: a[0].clone() });
                Ok(Reply::Int(n))
            }
            "LPOP" | "RPOP" => self.pop(name == "LPOP", a),
            "LSET" => {
                let i = parse_i64(&a[1])?;
                if self.ks.get(&a[0], self.now).is_none() {
                    return Err("ERR no such key".into());
                }
                self.with_list(&a[0], false, |l| {
                    let i = if i < 0 { l.len() as i64 + i } else { i };
                    match (i >= 0).then(|| l.get_mut(i as usize)).flatten() {
                        Some(slot) => {
                            *slot = a[2].clone();
                            Ok(())
                        }
                        None => Err("ERR index out of range".into()),
                    }
                })?;
                Ok(Reply::ok())
            }
            "LREM" => {
                let count = parse_i64(&a[1])?;
                let mut removed = 0i64;
                self.with_list(&a[0], false, |l| {
                    let limit = if count == 0 { i64::MAX } else { count.abs() };
                    let mut keep: Vec<bool> = vec![true; l.len()];
                    let idx: Box<dyn Iterator<Item = usize>> = if count < 0 {
                        Box::new((0..l.len()).rev())
                    } else {
                        Box::new(0..l.len())
                    };
                    for i in idx {
                        if removed < limit && l[i] == a[2] {
                            keep[i] = false;
                            removed += 1;
                        }
                    }
                    let mut i = 0;
                    l.retain(|_| {
                        i += 1;
                        keep[i - 1]
                    });
                    Ok(())
                })?;
                Ok(Reply::Int(removed))
            }
            "LTRIM" => {
                let (s, e) = (parse_i64(&a[1])?, parse_i64(&a[2])?);
                self.with_list(&a[0], false, |l| {
                    match range(s, e, l.len()) {
                        Some((s, e)) => {
                            l.truncate(e + 1);
                            l.drain(..s);
                        }
                        None => l.clear(),
                    }
                    Ok(())
                })?;
                Ok(Reply::ok())
            }
            "ZADD" => self.zadd(a),
            "ZINCRBY" => {
                let by = parse_f64(&a[1])?;
                let mut out = 0.0;
                self.with_zset(&a[0], true, |z| {
                    let cur = z.by_member.get(&a[2]).map_or(0.0, |s| s.0);
                    out = cur + by;
                    if out.is_nan() {
                        return Err("ERR resulting score is not a number (NaN)".into());
                    }
                    z.insert(a[2].clone(), Score(out));
                    Ok(())
                })?;
                Ok(Reply::Double(fmt_f64(out)))
            }
            "ZREM" => {
                let mut n = 0;
                self.with_zset(&a[0], false, |z| {
                    n = a[1..].iter().filter(|m| z.remove(m)).count() as i64;
                    Ok(())
                })?;
                Ok(Reply::Int(n))
            }
            "ZREMRANGEBYSCORE" => {
                let (min, max) = (parse_bound(&a[1])?, parse_bound(&a[2])?);
                let mut n = 0;
                self.with_zset(&a[0], false, |z| {
                    let gone: Vec<Bytes> = z
                        .by_score
                        .iter()
                        .filter(|(s, _)| above(s.0, min) && below(s.0, max))
                        .map(|(_, m)| m.clone())
                        .collect();
                    for m in &gone {
                        z.remove(m);
                    }
                    n = gone.len() as i64;
                    Ok(())
                })?;
                Ok(Reply::Int(n))
            }
            "EVAL" | "EVALSHA" => {
                if self.in_script {
                    return Err("ERR This Redis command is not allowed from script".into());
                }
                self.eval(name == "EVALSHA", a)
            }
            "SCRIPT" => {
                if self.in_script {
                    return Err("ERR This Redis command is not allowed from script".into());
                }
                let sub = upper(&a[0]);
                match sub.as_str() {
                    "LOAD" if a.len() == 2 => {
                        let src = std::str::from_utf8(&a[1])
                            .map_err(|_| "ERR script is not valid UTF-8".to_string())?;
                        let sha = super::lua::sha1hex(src.as_bytes());
                        super::lua::compile_check(src)?;
                        if !self.ks.scripts.contains_key(&sha) && self.ks.scripts.len() >= MAX_SCRIPTS
                        {
                            return Err(format!("ERR script cache is full ({MAX_SCRIPTS} scripts)"));
                        }
                        self.ks.scripts.insert(sha.clone(), src.to_owned());
                        Ok(Reply::bulk(sha))
                    }
                    "FLUSH" if a.len() <= 2 => {
                        self.ks.scripts.clear();
                        self.ks.lua.clear();
                        Ok(Reply::ok())
                    }
                    _ => Err(format!(
                        "ERR unknown subcommand or wrong number of arguments for '{}'. Try SCRIPT HELP.",
                        String::from_utf8_lossy(&a[0])
                    )),
                }
            }
            "PUBLISH" => {
                self.events.push(KvEvent::Published {
                    channel: a[0].clone(),
                    message: a[1].clone(),
                });
                // The number of receivers is filled in by the node that took the command.
                Ok(Reply::Int(0))
            }
            "FENCE.SET" => {
                let token = parse_i64(&a[2])
                    .ok()
                    .filter(|t| *t >= 0)
                    .ok_or("ERR token is not a non-negative integer")?
                    as u64;
                let high = self.ks.fence(&a[0]);
                if token < high {
                    return Err(format!("STALE token {token} is older than {high}"));
                }
                check_len(&a[1])?;
                self.ks.fences.insert(a[0].clone(), token);
                self.ks
                    .put(self.revision, &a[0], Value::Str(a[1].clone()), None, false);
                Ok(Reply::ok())
            }
            other => Err(format!(
                "ERR unknown command '{}'",
                other.to_ascii_lowercase()
            )),
        }
    }

    fn set(&mut self, a: &[Bytes]) -> R {
        let (key, val) = (&a[0], &a[1]);
        let (mut nx, mut xx, mut get, mut keep) = (false, false, false, false);
        let mut exp: Option<Millis> = None;
        let mut i = 2;
        while i < a.len() {
            let opt = upper(&a[i]);
            match opt.as_str() {
                "NX" if !xx => nx = true,
                "XX" if !nx => xx = true,
                "GET" => get = true,
                "KEEPTTL" if exp.is_none() => keep = true,
                "EX" | "PX" | "EXAT" | "PXAT" if exp.is_none() && !keep && i + 1 < a.len() => {
                    let n = parse_i64(&a[i + 1])?;
                    exp = Some(match opt.as_str() {
                        "EX" => rel_expiry(self.now, n, 1000, "set")?,
                        "PX" => rel_expiry(self.now, n, 1, "set")?,
                        "EXAT" => abs_expiry(n, 1000, "set")?,
                        _ => abs_expiry(n, 1, "set")?,
                    });
                    i += 1;
                }
                _ => return Err(SYNTAX.into()),
            }
            i += 1;
        }
        check_len(val)?;
        let old = self.ks.get(key, self.now);
        let old_val = match (get, old) {
            (true, Some(e)) => Reply::Bulk(as_str(e)?.clone()),
            _ => Reply::Nil,
        };
        let exists = old.is_some();
        if (nx && exists) || (xx && !exists) {
            return Ok(if get { old_val } else { Reply::Nil });
        }
        // An absolute expiry in the past deletes the key (like Redis).
        if exp.is_some_and(|t| t <= self.now) {
            self.ks.remove(key);
        } else {
            self.ks
                .put(self.revision, key, Value::Str(val.clone()), exp, keep);
        }
        Ok(if get { old_val } else { Reply::ok() })
    }

    fn incr(&mut self, key: &[u8], by: i64) -> R {
        let cur = match self.ks.get(key, self.now) {
            Some(e) => parse_i64(as_str(e)?)?,
            None => 0,
        };
        let n = cur.checked_add(by).ok_or(OVERFLOW)?;
        self.ks.put(
            self.revision,
            key,
            Value::Str(n.to_string().into_bytes()),
            None,
            true,
        );
        Ok(Reply::Int(n))
    }

    fn expire(&mut self, name: &str, a: &[Bytes]) -> R {
        let n = parse_i64(&a[1])?;
        let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
        for o in &a[2..] {
            match upper(o).as_str() {
                "NX" => nx = true,
                "XX" => xx = true,
                "GT" => gt = true,
                "LT" => lt = true,
                other => return Err(format!("ERR Unsupported option {other}")),
            }
        }
        if nx && (xx || gt || lt) {
            return Err(
                "ERR NX and XX, GT or LT options at the same time are not compatible".into(),
            );
        }
        if gt && lt {
            return Err("ERR GT and LT options at the same time are not compatible".into());
        }
        let lower = name.to_ascii_lowercase();
        let bad = || format!("ERR invalid expire time in '{lower}' command");
        let at: i64 = match name {
            "EXPIRE" => n
                .checked_mul(1000)
                .and_then(|ms| ms.checked_add(self.now as i64)),
            "PEXPIRE" => n.checked_add(self.now as i64),
            "EXPIREAT" => n.checked_mul(1000),
            _ => Some(n),
        }
        .ok_or_else(bad)?;
        let Some(e) = self.ks.get(&a[0], self.now) else {
            return Ok(Reply::Int(0));
        };
        let cur = e.expire_at;
        let allowed = match cur {
            Some(c) => !nx && (!gt || at > c as i64) && (!lt || at < c as i64),
            // No expiry counts as infinite for GT/LT.
            None => !xx && !gt,
        };
        if !allowed {
            return Ok(Reply::Int(0));
        }
        if at <= self.now as i64 {
            self.ks.remove(&a[0]);
        } else {
            self.ks.set_expiry(&a[0], self.revision, Some(at as Millis));
        }
        Ok(Reply::Int(1))
    }

    fn pop(&mut self, left: bool, a: &[Bytes]) -> R {
        let count = match a.get(1) {
            Some(c) => Some(
                parse_i64(c)
                    .ok()
                    .filter(|n| *n >= 0)
                    .ok_or("ERR value is out of range, must be positive")?,
            ),
            None => None,
        };
        if a.len() > 2 {
            return Err(SYNTAX.into());
        }
        if self.ks.get(&a[0], self.now).is_none() {
            return Ok(if count.is_some() {
                Reply::NilArray
            } else {
                Reply::Nil
            });
        }
        let mut out = Vec::new();
        self.with_list(&a[0], false, |l| {
            for _ in 0..count.unwrap_or(1) {
                match if left { l.pop_front() } else { l.pop_back() } {
                    Some(v) => out.push(Reply::Bulk(v)),
                    None => break,
                }
            }
            Ok(())
        })?;
        Ok(match count {
            Some(_) => Reply::Array(out),
            None => out.pop().unwrap_or(Reply::Nil),
        })
    }

    /// One attempt of `BLPOP`/`BRPOP k1 k2 … timeout`: pop from the first non-empty list, or
    /// nil array (the front end then waits for a push and tries again).
    fn blocking_pop(&mut self, name: &str, a: &[Bytes]) -> R {
        let timeout = a
            .last()
            .map(|t| parse_f64(t))
            .transpose()
            .map_err(|_| "ERR timeout is not a float or out of range".to_string())?;
        if timeout.is_some_and(|t| t < 0.0) {
            return Err("ERR timeout is negative".into());
        }
        for key in &a[..a.len() - 1] {
            match self.ks.get(key, self.now) {
                Some(e) => {
                    as_list(e)?;
                }
                None => continue,
            }
            let r = self.pop(name == "BLPOP", std::slice::from_ref(key))?;
            return Ok(Reply::Array(vec![Reply::Bulk(key.clone()), r]));
        }
        Ok(Reply::NilArray)
    }

    fn zadd(&mut self, a: &[Bytes]) -> R {
        let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
            (false, false, false, false, false, false);
        let mut i = 1;
        while i < a.len() {
            match upper(&a[i]).as_str() {
                "NX" => nx = true,
                "XX" => xx = true,
                "GT" => gt = true,
                "LT" => lt = true,
                "CH" => ch = true,
                "INCR" => incr = true,
                _ => break,
            }
            i += 1;
        }
        let pairs = &a[i..];
        if pairs.is_empty() || pairs.len() & 1 == 1 {
            return Err(SYNTAX.into());
        }
        if nx && xx {
            return Err("ERR XX and NX options at the same time are not compatible".into());
        }
        if (gt && lt) || (nx && (gt || lt)) {
            return Err("ERR GT, LT, and/or NX options at the same time are not compatible".into());
        }
        if incr && pairs.len() != 2 {
            return Err("ERR INCR option supports a single increment-element pair".into());
        }
        let parsed: Vec<(f64, &Bytes)> = pairs
            .chunks(2)
            .map(|p| Ok((parse_f64(&p[0])?, &p[1])))
            .collect::<Result<_, String>>()?;
        let (mut added, mut changed) = (0i64, 0i64);
        let mut incr_result: Option<f64> = None;
        self.with_zset(&a[0], true, |z| {
            for (score, member) in &parsed {
                let cur = z.by_member.get(*member).map(|s| s.0);
                let new = if incr {
                    cur.unwrap_or(0.0) + score
                } else {
                    *score
                };
                if new.is_nan() {
                    return Err("ERR resulting score is not a number (NaN)".into());
                }
                let ok = match cur {
                    None => !xx,
                    Some(c) => !nx && (!gt || new > c) && (!lt || new < c),
                };
                if !ok {
                    continue;
                }
                match cur {
                    None => added += 1,
                    Some(c) if c != new => changed += 1,
                    _ => {}
                }
                z.insert((*member).clone(), Score(new));
                incr_result = Some(new);
            }
            Ok(())
        })?;
        if incr {
            return Ok(incr_result.map_or(Reply::Nil, |v| Reply::Double(fmt_f64(v))));
        }
        Ok(Reply::Int(if ch { added + changed } else { added }))
    }

    fn with_container<T>(
        &mut self,
        key: &[u8],
        create: bool,
        make: impl FnOnce() -> Value,
        f: impl FnOnce(&mut Value) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        if self.ks.entry_mut(key).is_none() {
            if !create {
                return Ok(None);
            }
            self.ks.put(self.revision, key, make(), None, false);
        }
        let Some(e) = self.ks.entry_mut(key) else {
            return Ok(None);
        };
        let r = f(&mut e.value);
        self.ks.touched(key, self.revision);
        r.map(Some)
    }

    fn with_hash(
        &mut self,
        key: &[u8],
        create: bool,
        f: impl FnOnce(&mut BTreeMap<Bytes, Bytes>) -> Result<(), String>,
    ) -> Result<(), String> {
        self.type_check(key, "hash")?;
        self.with_container(
            key,
            create,
            || Value::Hash(BTreeMap::new()),
            |v| match v {
                Value::Hash(h) => f(h),
                _ => Err(WRONGTYPE.into()),
            },
        )
        .map(|_| ())
    }

    fn with_list(
        &mut self,
        key: &[u8],
        create: bool,
        f: impl FnOnce(&mut VecDeque<Bytes>) -> Result<(), String>,
    ) -> Result<(), String> {
        self.type_check(key, "list")?;
        self.with_container(
            key,
            create,
            || Value::List(VecDeque::new()),
            |v| match v {
                Value::List(l) => f(l),
                _ => Err(WRONGTYPE.into()),
            },
        )
        .map(|_| ())
    }

    fn with_zset(
        &mut self,
        key: &[u8],
        create: bool,
        f: impl FnOnce(&mut ZSet) -> Result<(), String>,
    ) -> Result<(), String> {
        self.type_check(key, "zset")?;
        self.with_container(
            key,
            create,
            || Value::ZSet(ZSet::default()),
            |v| match v {
                Value::ZSet(z) => f(z),
                _ => Err(WRONGTYPE.into()),
            },
        )
        .map(|_| ())
    }

    /// WRONGTYPE before touching anything (so a failed command changes no revision).
    fn type_check(&self, key: &[u8], want: &str) -> Result<(), String> {
        match self.ks.get(key, self.now) {
            Some(e) if e.value.type_name() != want => Err(WRONGTYPE.into()),
            _ => Ok(()),
        }
    }

    fn eval(&mut self, by_sha: bool, a: &[Bytes]) -> R {
        let numkeys = parse_i64(&a[1])?;
        if numkeys < 0 {
            return Err("ERR Number of keys can't be negative".into());
        }
        if numkeys as usize > a.len() - 2 {
            return Err("ERR Number of keys can't be greater than number of args".into());
        }
        let keys = &a[2..2 + numkeys as usize];
        let args = &a[2 + numkeys as usize..];
        let (sha, src) = if by_sha {
            let sha = String::from_utf8_lossy(&a[0]).to_ascii_lowercase();
            match self.ks.scripts.get(&sha) {
                Some(src) => (sha, src.clone()),
                None => return Err("NOSCRIPT No matching script. Please use EVAL.".into()),
            }
        } else {
            let src = String::from_utf8(a[0].clone())
                .map_err(|_| "ERR script is not valid UTF-8".to_string())?;
            let sha = super::lua::sha1hex(src.as_bytes());
            // EVAL caches the script too (so EVALSHA works after it), up to the cache size.
            if !self.ks.scripts.contains_key(&sha) && self.ks.scripts.len() < MAX_SCRIPTS {
                self.ks.scripts.insert(sha.clone(), src.clone());
            }
            (sha, src)
        };
        Ok(super::lua::run(self, &sha, &src, keys, args))
    }
}
