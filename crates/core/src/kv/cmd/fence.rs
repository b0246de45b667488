//! Fencing: `FENCE.SET` (a write that carries a fencing token and is refused if the token is
//! older than the key's mark), `FENCE.TOKEN` (a key's token), and the native lock commands
//! (`LOCK.*`), which the front end sends to the lock table rather than the keyspace.

use super::prelude::*;

/// A lock-family row: the lock name at `argv[1]` unless `.keys(..)` says otherwise.
const fn lock(name: &'static str, arity: i32, acl: u32) -> CommandSpec {
    CommandSpec::other(name, arity, acl | FENCING, Run::Lock).keys(KeySpec::First)
}

pub(super) const COMMANDS: &[CommandSpec] = &[
    // `FENCE.SET key value token`.
    CommandSpec::write("FENCE.SET", 4, WRITE | FENCING, |ctx, a| {
        let token = parse_i64(&a[2])
            .ok()
            .and_then(|t| u64::try_from(t).ok())
            .ok_or_else(|| KvError::invalid("token is not a non-negative integer"))?;
        ctx.ks.fence_set(ctx.revision, &a[0], &a[1], token)?;
        Ok(Reply::ok())
    }),
    // `FENCE.TOKEN key [value]`: with `value`, only while the key still holds exactly that
    // value — so a client whose `SET NX` lease ran out cannot read the next holder's token.
    CommandSpec::read("FENCE.TOKEN", -2, READ | FENCING, |ks, now, a| {
        if a.len() > 2 {
            return Err(KvError::Syntax);
        }
        let Some(e) = ks.get(&a[0], now) else {
            return Ok(Reply::Nil);
        };
        let token = Reply::Int(e.create_revision as i64);
        Ok(match a.get(1) {
            None => token,
            Some(want) => match &e.value {
                Value::Str(v) if v == want => token,
                Value::Str(_) => Reply::Nil,
                _ => return Err(KvError::WrongType),
            },
        })
    }),
    // The lock family: served by the front end on the lock table (crates/resp/src/conn/
    // lock.rs), never inside MULTI or a script. Options (`WAIT`, `SESSION`, `DELAY`, `REQID`)
    // follow the positional arguments, hence the negative arities.
    lock("LOCK.ACQUIRE", -4, WRITE | BLOCKING),
    lock("LOCK.READ", -4, WRITE | BLOCKING),
    lock("LOCK.WRITE", -4, WRITE | BLOCKING),
    lock("LOCK.PERMIT", -5, WRITE | BLOCKING),
    lock("LOCK.MACQUIRE", -5, WRITE | BLOCKING).keys(KeySpec::Counted(3)),
    lock("LOCK.RELEASE", -4, WRITE),
    lock("LOCK.MRELEASE", -5, WRITE).keys(KeySpec::Counted(3)),
    lock("LOCK.RENEW", -5, WRITE),
    lock("LOCK.INFO", 2, READ),
    // Administrative: not in `@fencing`, so `+@fencing` does not grant it.
    CommandSpec::other("LOCK.FORCEUNLOCK", -2, WRITE | ADMIN | DANGEROUS, Run::Lock)
        .keys(KeySpec::First),
    lock("SESSION.OPEN", -2, WRITE).keys(KeySpec::None),
    lock("SESSION.KEEPALIVE", -2, WRITE).keys(KeySpec::None),
    lock("SESSION.CLOSE", -2, WRITE).keys(KeySpec::None),
    lock("SESSION.INFO", 2, READ).keys(KeySpec::None),
];
