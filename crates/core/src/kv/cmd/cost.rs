//! What a command's own work costs where it depends on the data, in the steps of a script's
//! budget: charged to the budget before a script's `redis.call` runs the command under
//! [`crate::Semantics::CHARGED_COMMANDS`] (`kv/cmd/script.rs`), so a script that loops
//! `KEYS *` over a big keyspace, or `LREM` over a long list, stops `BUSY` at the same call
//! on every replica instead of doing that work ~30,000 times. A pure function of the
//! replicated state and the arguments; a command whose work is constant, or bounded by its
//! arguments (already charged by their bytes), costs 0 here.
//!
//! A step is ~3 ns of this machine's time (an instruction of a loop, docs/operations.md,
//! "Scripts"), and the budget is meant to pause apply ≲ 50 ms, ~16 ns a step; the rates
//! below come from release runs of `commands_tests.rs`' loops on the loaded 2-core machine:
//! a key `KEYS` visits (a map step, a lookup, a glob match) took ~200 ns, so 16 steps
//! (~12 ns a step: a script's `KEYS` loop to its `BUSY` took 20–36 ms); an element `LREM`
//! compares ~5 ns, so 4 steps (~1 ns a step).

use super::prelude::*;

/// Steps per key `KEYS`/`SCAN`/`FLUSHDB` visit (live or expired and not yet removed).
pub(crate) const KEY_STEPS: u64 = 16;
/// Steps per element a command walks, reads or drops in a list, hash or sorted set.
pub(crate) const ELEMENT_STEPS: u64 = 4;
/// Bytes compared per step (glob matching, `LREM`'s comparisons).
pub(crate) const BYTES_PER_STEP: u64 = 64;

/// What a script pays before `argv` runs in `ctx`: its [`work`], or 0 if the command fails
/// before doing any (an unknown command, a wrong arity, refused by the entry's ACL — so a
/// refused command reveals nothing of the data it names through the budget).
pub(crate) fn charge(ctx: &Ctx<'_>, argv: &[Bytes]) -> u64 {
    if super::command_spec(argv).is_err() || ctx.limits.iter().any(|l| l.check(argv).is_err()) {
        return 0;
    }
    work(ctx.ks, ctx.now, argv)
}

/// The data-dependent work of running `argv` on `ks` at `now`, in steps (0 for commands
/// whose work does not depend on the data, and for malformed ones, which fail first).
pub(crate) fn work(ks: &Keyspace, now: Millis, argv: &[Bytes]) -> u64 {
    let Some(name) = argv.first() else {
        return 0;
    };
    let a = &argv[1..];
    let key = |i: usize| a.get(i).and_then(|k| ks.get(k, now));
    let size = |i: usize| key(i).map_or(0, |e| elements(&e.value));
    match upper(name).as_str() {
        "KEYS" => keys(ks, a.first().map(|p| p.as_slice())),
        "SCAN" => {
            let pattern = a
                .iter()
                .position(|o| is(o, "MATCH"))
                .and_then(|i| a.get(i + 1));
            keys(ks, pattern.map(|p| p.as_slice()))
        }
        "FLUSHDB" | "FLUSHALL" => (ks.keys.len() as u64).saturating_mul(KEY_STEPS),
        // Deletes and overwrites drop the containers they replace.
        "DEL" | "UNLINK" => dropped(ks, now, a.iter()),
        "MSET" => dropped(ks, now, a.iter().step_by(2)),
        "SET" | "GETSET" | "GETDEL" | "SETEX" | "PSETEX" | "LTRIM" | "ZREMRANGEBYSCORE"
        | "ZCOUNT" | "ZRANGEBYSCORE" | "ZRANGE" => size(0).saturating_mul(ELEMENT_STEPS),
        // An expiry in the past removes the key at once; a later one drops nothing now.
        "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" => {
            let removes = a.get(1).and_then(|n| parse_i64(n).ok()).is_some_and(|n| {
                match upper(name).as_str() {
                    "EXPIRE" | "PEXPIRE" => n <= 0,
                    "EXPIREAT" => n.saturating_mul(1000) <= now as i64,
                    _ => n <= now as i64,
                }
            });
            if removes {
                size(0).saturating_mul(ELEMENT_STEPS)
            } else {
                0
            }
        }
        "LREM" => match (key(0).map(|e| &e.value), a.get(2)) {
            (Some(Value::List(l)), Some(v)) => l.iter().fold(0u64, |n, x| {
                n.saturating_add(ELEMENT_STEPS)
                    .saturating_add(x.len().min(v.len()) as u64 / BYTES_PER_STEP)
            }),
            _ => 0,
        },
        "LRANGE" => match (key(0).map(|e| &e.value), a.get(1), a.get(2)) {
            (Some(Value::List(l)), Some(s), Some(e)) => match (parse_i64(s), parse_i64(e)) {
                (Ok(s), Ok(e)) => {
                    range(s, e, l.len()).map_or(0, |(s, e)| (e - s + 1) as u64 * ELEMENT_STEPS)
                }
                _ => 0,
            },
            _ => 0,
        },
        "HGETALL" | "HKEYS" | "HVALS" => size(0).saturating_mul(ELEMENT_STEPS),
        _ => 0,
    }
}

/// Elements of a container value (a string or a limiter: 0, dropped at once).
fn elements(v: &Value) -> u64 {
    match v {
        Value::Hash(h) => h.len() as u64,
        Value::List(l) => l.len() as u64,
        Value::ZSet(z) => z.len() as u64,
        Value::Str(_) | Value::Limiter(_) => 0,
    }
}

/// What dropping the values of `keys` costs.
fn dropped<'a>(ks: &Keyspace, now: Millis, keys: impl Iterator<Item = &'a Bytes>) -> u64 {
    keys.filter_map(|k| ks.get(k, now)).fold(0u64, |n, e| {
        n.saturating_add(elements(&e.value).saturating_mul(ELEMENT_STEPS))
    })
}

/// A walk of every key, each matched against `pattern`: [`KEY_STEPS`] a key, and the glob's
/// comparisons (at most the pattern's length per byte of key) a step per
/// [`BYTES_PER_STEP`].
fn keys(ks: &Keyspace, pattern: Option<&[u8]>) -> u64 {
    let p = pattern.map_or(0, |p| p.len() as u64);
    let bytes: u64 = ks.keys.keys().map(|k| k.len() as u64).sum();
    (ks.keys.len() as u64)
        .saturating_mul(KEY_STEPS)
        .saturating_add(bytes.saturating_mul(p.saturating_add(1)) / BYTES_PER_STEP)
}
