//! Keys of any type: `DEL`, `EXISTS`, `TYPE`, `KEYS`/`SCAN`, expiry, `DBSIZE`, `FLUSHDB`, and
//! the server's `TIME` (log time).

use super::prelude::*;

pub(super) const COMMANDS: &[CommandSpec] = &[
    CommandSpec::write("DEL", -2, WRITE | KEYSPACE, del).keys(KeySpec::All),
    CommandSpec::write("UNLINK", -2, WRITE | KEYSPACE, del).keys(KeySpec::All),
    CommandSpec::read("EXISTS", -2, READ | KEYSPACE, |ks, now, a| {
        Ok(Reply::Int(
            a.iter().filter(|k| ks.get(k, now).is_some()).count() as i64,
        ))
    })
    .keys(KeySpec::All),
    CommandSpec::read("TYPE", 2, READ | KEYSPACE, |ks, now, a| {
        let name = ks.get(&a[0], now).map_or("none", |e| e.value.type_name());
        Ok(Reply::Status(name.into()))
    }),
    CommandSpec::read("KEYS", 2, READ | KEYSPACE | DANGEROUS, |ks, now, a| {
        Ok(Reply::Array(
            ks.keys
                .keys()
                .filter(|k| ks.get(k, now).is_some() && glob_match(&a[0], k))
                .map(|k| Reply::Bulk(k.clone()))
                .collect(),
        ))
    })
    .keys(KeySpec::Whole),
    CommandSpec::read("SCAN", -2, READ | KEYSPACE, scan).keys(KeySpec::Whole),
    CommandSpec::write("EXPIRE", -3, WRITE | KEYSPACE, |ctx, a| {
        expire(ctx, a, "EXPIRE")
    }),
    CommandSpec::write("PEXPIRE", -3, WRITE | KEYSPACE, |ctx, a| {
        expire(ctx, a, "PEXPIRE")
    }),
    CommandSpec::write("EXPIREAT", -3, WRITE | KEYSPACE, |ctx, a| {
        expire(ctx, a, "EXPIREAT")
    }),
    CommandSpec::write("PEXPIREAT", -3, WRITE | KEYSPACE, |ctx, a| {
        expire(ctx, a, "PEXPIREAT")
    }),
    CommandSpec::read("TTL", 2, READ | KEYSPACE, |ks, now, a| {
        Ok(expiry(ks, now, &a[0], |t| {
            (t.saturating_sub(now) + 500) / 1000
        }))
    }),
    CommandSpec::read("PTTL", 2, READ | KEYSPACE, |ks, now, a| {
        Ok(expiry(ks, now, &a[0], |t| t.saturating_sub(now)))
    }),
    CommandSpec::read("EXPIRETIME", 2, READ | KEYSPACE, |ks, now, a| {
        Ok(expiry(ks, now, &a[0], |t| t / 1000))
    }),
    CommandSpec::read("PEXPIRETIME", 2, READ | KEYSPACE, |ks, now, a| {
        Ok(expiry(ks, now, &a[0], |t| t))
    }),
    CommandSpec::write("PERSIST", 2, WRITE | KEYSPACE, |ctx, a| {
        match ctx.ks.get(&a[0], ctx.now) {
            Some(e) if e.expire_at.is_some() => {
                ctx.ks.set_expiry(&a[0], ctx.revision, None);
                Ok(Reply::Int(1))
            }
            _ => Ok(Reply::Int(0)),
        }
    }),
    CommandSpec::read("DBSIZE", 1, READ | KEYSPACE, |ks, now, _| {
        Ok(Reply::Int(ks.len(now) as i64))
    })
    .keys(KeySpec::Whole),
    CommandSpec::write("FLUSHDB", -1, WRITE | KEYSPACE | DANGEROUS, flush).keys(KeySpec::Whole),
    CommandSpec::write("FLUSHALL", -1, WRITE | KEYSPACE | DANGEROUS, flush).keys(KeySpec::Whole),
    // Log time, not a clock: what every replica agrees on.
    CommandSpec::read("TIME", 1, 0, |_, now, _| {
        Ok(Reply::Array(vec![
            Reply::bulk((now / 1000).to_string()),
            Reply::bulk(((now % 1000) * 1000).to_string()),
        ]))
    })
    .keys(KeySpec::None),
];

fn del(ctx: &mut Ctx<'_>, a: &[Bytes]) -> KvResult<Reply> {
    Ok(Reply::Int(
        a.iter().filter(|k| ctx.ks.remove(k).is_some()).count() as i64,
    ))
}

fn flush(ctx: &mut Ctx<'_>, a: &[Bytes]) -> KvResult<Reply> {
    if a.len() > 1 || a.first().is_some_and(|m| !is(m, "SYNC") && !is(m, "ASYNC")) {
        return Err(KvError::Syntax);
    }
    ctx.ks.flush();
    Ok(Reply::ok())
}

/// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME`: -2 if the key is absent, -1 if it has no
/// expiry, else `f(expire_at)`.
fn expiry(ks: &Keyspace, now: Millis, key: &[u8], f: impl Fn(Millis) -> u64) -> Reply {
    match ks.get(key, now) {
        None => Reply::Int(-2),
        Some(Entry {
            expire_at: None, ..
        }) => Reply::Int(-1),
        Some(Entry {
            expire_at: Some(t), ..
        }) => Reply::Int(f(*t) as i64),
    }
}

/// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`: the whole keyspace in one call
/// (cursor 0 back) — valid SCAN semantics, and simple.
fn scan(ks: &Keyspace, now: Millis, a: &[Bytes]) -> KvResult<Reply> {
    let _cursor = parse_i64(&a[0]).map_err(|_| KvError::invalid("invalid cursor"))?;
    let mut pattern: Option<&[u8]> = None;
    let mut typ: Option<String> = None;
    let mut i = 1;
    while i < a.len() {
        if is(&a[i], "MATCH") && i + 1 < a.len() {
            pattern = Some(&a[i + 1]);
        } else if is(&a[i], "COUNT") && i + 1 < a.len() {
            if parse_i64(&a[i + 1])? < 1 {
                return Err(KvError::Syntax);
            }
        } else if is(&a[i], "TYPE") && i + 1 < a.len() {
            typ = Some(String::from_utf8_lossy(&a[i + 1]).to_ascii_lowercase());
        } else {
            return Err(KvError::Syntax);
        }
        i += 2;
    }
    let keys = ks
        .keys
        .iter()
        .filter(|(k, _)| ks.get(k, now).is_some())
        .filter(|(k, _)| pattern.is_none_or(|p| glob_match(p, k)))
        .filter(|(_, e)| typ.as_deref().is_none_or(|t| t == e.value.type_name()))
        .map(|(k, _)| Reply::Bulk(k.clone()))
        .collect();
    Ok(Reply::Array(vec![Reply::bulk("0"), Reply::Array(keys)]))
}

/// `EXPIRE`/`PEXPIRE`/`EXPIREAT`/`PEXPIREAT key amount [NX|XX|GT|LT]` (`name` upper case).
fn expire(ctx: &mut Ctx<'_>, a: &[Bytes], name: &str) -> KvResult<Reply> {
    let n = parse_i64(&a[1])?;
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for o in &a[2..] {
        match upper(o).as_str() {
            "NX" => nx = true,
            "XX" => xx = true,
            "GT" => gt = true,
            "LT" => lt = true,
            other => return Err(KvError::invalid(format!("Unsupported option {other}"))),
        }
    }
    if nx && (xx || gt || lt) {
        return Err(KvError::invalid(
            "NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if gt && lt {
        return Err(KvError::invalid(
            "GT and LT options at the same time are not compatible",
        ));
    }
    let now = ctx.now as i64;
    let at: i64 = match name {
        "EXPIRE" => n.checked_mul(1000).and_then(|ms| ms.checked_add(now)),
        "PEXPIRE" => n.checked_add(now),
        "EXPIREAT" => n.checked_mul(1000),
        _ => Some(n),
    }
    .ok_or_else(|| KvError::InvalidExpire(name.to_ascii_lowercase()))?;
    let Some(e) = ctx.ks.get(&a[0], ctx.now) else {
        return Ok(Reply::Int(0));
    };
    let allowed = match e.expire_at {
        Some(c) => !nx && (!gt || at > c as i64) && (!lt || at < c as i64),
        // No expiry counts as infinite for GT/LT.
        None => !xx && !gt,
    };
    if !allowed {
        return Ok(Reply::Int(0));
    }
    if at <= now {
        ctx.ks.remove(&a[0]);
    } else {
        ctx.ks.set_expiry(&a[0], ctx.revision, Some(at as Millis));
    }
    Ok(Reply::Int(1))
}
