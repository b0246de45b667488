//! Fencing: `FENCE.SET` (a write that carries a fencing token and is refused if the token is
//! older than the key's mark), `FENCE.TOKEN` (a key's token), and the native lock commands
//! (`LOCK.*`), which the front end sends to the lock table rather than the keyspace.

use super::prelude::*;

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
    CommandSpec::other("LOCK.ACQUIRE", -4, WRITE | BLOCKING | FENCING, Run::Lock)
        .keys(KeySpec::First),
    CommandSpec::other("LOCK.RELEASE", 4, WRITE | FENCING, Run::Lock).keys(KeySpec::First),
    CommandSpec::other("LOCK.RENEW", 5, WRITE | FENCING, Run::Lock).keys(KeySpec::First),
    CommandSpec::other("LOCK.INFO", 2, READ | FENCING, Run::Lock).keys(KeySpec::First),
];
