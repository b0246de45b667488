//! Strings: `GET`, `SET` and its variants, counters, `APPEND`, `MGET`/`MSET`.

use super::prelude::*;

pub(super) const COMMANDS: &[CommandSpec] = &[
    CommandSpec::read("GET", 2, READ | STRING, |ks, now, a| {
        Ok(ks
            .get_as::<Bytes>(&a[0], now)?
            .map_or(Reply::Nil, |s| Reply::Bulk(s.clone())))
    }),
    CommandSpec::write("SET", -3, WRITE | STRING, set),
    CommandSpec::write("SETNX", 3, WRITE | STRING, |ctx, a| {
        if ctx.ks.entry_mut(&a[0]).is_some() {
            return Ok(Reply::Int(0));
        }
        check_len(&a[1])?;
        ctx.ks
            .put(ctx.revision, &a[0], Value::Str(a[1].clone()), None, false);
        Ok(Reply::Int(1))
    }),
    CommandSpec::write("SETEX", 4, WRITE | STRING, |ctx, a| {
        setex(ctx, a, 1000, "setex")
    }),
    CommandSpec::write("PSETEX", 4, WRITE | STRING, |ctx, a| {
        setex(ctx, a, 1, "psetex")
    }),
    CommandSpec::write("GETDEL", 2, WRITE | STRING, |ctx, a| {
        let Some(old) = ctx.ks.get_as::<Bytes>(&a[0], ctx.now)?.cloned() else {
            return Ok(Reply::Nil);
        };
        ctx.ks.remove(&a[0]);
        Ok(Reply::Bulk(old))
    }),
    CommandSpec::write("GETSET", 3, WRITE | STRING, |ctx, a| {
        let old = ctx.ks.get_as::<Bytes>(&a[0], ctx.now)?;
        let old = old.map_or(Reply::Nil, |s| Reply::Bulk(s.clone()));
        check_len(&a[1])?;
        ctx.ks
            .put(ctx.revision, &a[0], Value::Str(a[1].clone()), None, false);
        Ok(old)
    }),
    CommandSpec::write("INCR", 2, WRITE | STRING, |ctx, a| incr(ctx, &a[0], 1)),
    CommandSpec::write("INCRBY", 3, WRITE | STRING, |ctx, a| {
        incr(ctx, &a[0], parse_i64(&a[1])?)
    }),
    CommandSpec::write("DECR", 2, WRITE | STRING, |ctx, a| incr(ctx, &a[0], -1)),
    CommandSpec::write("DECRBY", 3, WRITE | STRING, |ctx, a| {
        let by = parse_i64(&a[1])?;
        incr(ctx, &a[0], by.checked_neg().ok_or(KvError::Overflow)?)
    }),
    CommandSpec::write("APPEND", 3, WRITE | STRING, |ctx, a| {
        let mut v = ctx
            .ks
            .get_as::<Bytes>(&a[0], ctx.now)?
            .cloned()
            .unwrap_or_default();
        v.extend_from_slice(&a[1]);
        check_len(&v)?;
        let n = v.len();
        ctx.ks.put(ctx.revision, &a[0], Value::Str(v), None, true);
        Ok(Reply::Int(n as i64))
    }),
    CommandSpec::read("STRLEN", 2, READ | STRING, |ks, now, a| {
        Ok(Reply::Int(
            ks.get_as::<Bytes>(&a[0], now)?.map_or(0, |s| s.len()) as i64,
        ))
    }),
    CommandSpec::read("MGET", -2, READ | STRING, |ks, now, a| {
        Ok(Reply::Array(
            a.iter()
                .map(|k| match ks.get(k, now).map(|e| &e.value) {
                    Some(Value::Str(s)) => Reply::Bulk(s.clone()),
                    _ => Reply::Nil,
                })
                .collect(),
        ))
    })
    .keys(KeySpec::All),
    CommandSpec::write("MSET", -3, WRITE | STRING, |ctx, a| {
        if a.len() & 1 == 1 {
            return Err(KvError::Arity("mset".into()));
        }
        for kv in a.chunks(2) {
            check_len(&kv[1])?;
        }
        for kv in a.chunks(2) {
            ctx.ks
                .put(ctx.revision, &kv[0], Value::Str(kv[1].clone()), None, false);
        }
        Ok(Reply::ok())
    })
    .keys(KeySpec::EveryOther),
];

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`.
fn set(ctx: &mut Ctx<'_>, a: &[Bytes]) -> KvResult<Reply> {
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
                    "EX" => rel_expiry(ctx.now, n, 1000, "set")?,
                    "PX" => rel_expiry(ctx.now, n, 1, "set")?,
                    "EXAT" => abs_expiry(n, 1000, "set")?,
                    _ => abs_expiry(n, 1, "set")?,
                });
                i += 1;
            }
            _ => return Err(KvError::Syntax),
        }
        i += 1;
    }
    check_len(val)?;
    let old = ctx.ks.get(key, ctx.now);
    let old_val = match (get, old) {
        (true, Some(e)) => Reply::Bulk(e.as_kind::<Bytes>()?.clone()),
        _ => Reply::Nil,
    };
    let exists = old.is_some();
    if (nx && exists) || (xx && !exists) {
        return Ok(if get { old_val } else { Reply::Nil });
    }
    // An absolute expiry in the past deletes the key (like Redis).
    if exp.is_some_and(|t| t <= ctx.now) {
        ctx.ks.remove(key);
    } else {
        ctx.ks
            .put(ctx.revision, key, Value::Str(val.clone()), exp, keep);
    }
    Ok(if get { old_val } else { Reply::ok() })
}

/// `SETEX`/`PSETEX key amount value`, `amount` in units of `unit_ms`.
fn setex(ctx: &mut Ctx<'_>, a: &[Bytes], unit_ms: i64, cmd: &str) -> KvResult<Reply> {
    let exp = rel_expiry(ctx.now, parse_i64(&a[1])?, unit_ms, cmd)?;
    check_len(&a[2])?;
    ctx.ks.put(
        ctx.revision,
        &a[0],
        Value::Str(a[2].clone()),
        Some(exp),
        false,
    );
    Ok(Reply::ok())
}

fn incr(ctx: &mut Ctx<'_>, key: &[u8], by: i64) -> KvResult<Reply> {
    let cur = match ctx.ks.get_as::<Bytes>(key, ctx.now)? {
        Some(s) => parse_i64(s)?,
        None => 0,
    };
    let n = cur.checked_add(by).ok_or(KvError::Overflow)?;
    ctx.ks.put(
        ctx.revision,
        key,
        Value::Str(n.to_string().into_bytes()),
        None,
        true,
    );
    Ok(Reply::Int(n))
}
