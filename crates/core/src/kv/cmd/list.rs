//! Lists: pushes and pops (`BLPOP`/`BRPOP` too), ranges, `LSET`, `LREM`, `LTRIM`.

use super::prelude::*;

pub(super) const COMMANDS: &[CommandSpec] = &[
    CommandSpec::write("LPUSH", -3, WRITE | LIST, |ctx, a| push(ctx, a, true)),
    CommandSpec::write("RPUSH", -3, WRITE | LIST, |ctx, a| push(ctx, a, false)),
    CommandSpec::write("LPOP", -2, WRITE | LIST, |ctx, a| pop(ctx, a, true)),
    CommandSpec::write("RPOP", -2, WRITE | LIST, |ctx, a| pop(ctx, a, false)),
    CommandSpec::read("LLEN", 2, READ | LIST, |ks, now, a| {
        let l = ks.get_as::<List>(&a[0], now)?;
        Ok(Reply::Int(l.map_or(0, |l| l.len()) as i64))
    }),
    CommandSpec::read("LRANGE", 4, READ | LIST, |ks, now, a| {
        let (s, e) = (parse_i64(&a[1])?, parse_i64(&a[2])?);
        let Some(l) = ks.get_as::<List>(&a[0], now)? else {
            return Ok(Reply::Array(vec![]));
        };
        Ok(Reply::Array(match range(s, e, l.len()) {
            Some((s, e)) => l.range(s..=e).map(|v| Reply::Bulk(v.clone())).collect(),
            None => vec![],
        }))
    }),
    CommandSpec::read("LINDEX", 3, READ | LIST, |ks, now, a| {
        let i = parse_i64(&a[1])?;
        let Some(l) = ks.get_as::<List>(&a[0], now)? else {
            return Ok(Reply::Nil);
        };
        let i = if i < 0 { l.len() as i64 + i } else { i };
        Ok(match usize::try_from(i) {
            Ok(i) => bulk_or_nil(l.get(i)),
            Err(_) => Reply::Nil,
        })
    }),
    CommandSpec::write("LSET", 4, WRITE | LIST, |ctx, a| {
        let i = parse_i64(&a[1])?;
        if ctx.ks.get(&a[0], ctx.now).is_none() {
            return Err(KvError::invalid("no such key"));
        }
        ctx.with::<List, _>(&a[0], false, |l| {
            let i = if i < 0 { l.len() as i64 + i } else { i };
            match usize::try_from(i).ok().and_then(|i| l.get_mut(i)) {
                Some(slot) => {
                    *slot = a[2].clone();
                    Ok(())
                }
                None => Err(KvError::invalid("index out of range")),
            }
        })?;
        Ok(Reply::ok())
    }),
    CommandSpec::write("LREM", 4, WRITE | LIST, |ctx, a| {
        let count = parse_i64(&a[1])?;
        let removed = ctx.with::<List, _>(&a[0], false, |l| Ok(lrem(l, count, &a[2])))?;
        Ok(Reply::Int(removed.unwrap_or(0)))
    }),
    CommandSpec::write("LTRIM", 4, WRITE | LIST, |ctx, a| {
        let (s, e) = (parse_i64(&a[1])?, parse_i64(&a[2])?);
        ctx.with::<List, _>(&a[0], false, |l| {
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
    }),
    CommandSpec::blocking("BLPOP", -3, WRITE | LIST | BLOCKING, |ctx, a| {
        blocking_pop(ctx, a, true)
    })
    .keys(KeySpec::AllButLast),
    CommandSpec::blocking("BRPOP", -3, WRITE | LIST | BLOCKING, |ctx, a| {
        blocking_pop(ctx, a, false)
    })
    .keys(KeySpec::AllButLast),
];

fn push(ctx: &mut Ctx<'_>, a: &[Bytes], left: bool) -> KvResult<Reply> {
    let n = ctx.with::<List, _>(&a[0], true, |l| {
        for v in &a[1..] {
            if left {
                l.push_front(v.clone());
            } else {
                l.push_back(v.clone());
            }
        }
        Ok(l.len() as i64)
    })?;
    ctx.events.push(KvEvent::Pushed { key: a[0].clone() });
    Ok(Reply::Int(n.unwrap_or(0)))
}

/// `LPOP`/`RPOP key [count]`.
fn pop(ctx: &mut Ctx<'_>, a: &[Bytes], left: bool) -> KvResult<Reply> {
    let count = match a.get(1) {
        Some(c) => Some(
            parse_i64(c)
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| KvError::invalid("value is out of range, must be positive"))?,
        ),
        None => None,
    };
    if a.len() > 2 {
        return Err(KvError::Syntax);
    }
    if ctx.ks.get(&a[0], ctx.now).is_none() {
        return Ok(if count.is_some() {
            Reply::NilArray
        } else {
            Reply::Nil
        });
    }
    let mut out = ctx
        .with::<List, _>(&a[0], false, |l| {
            let mut out = Vec::new();
            for _ in 0..count.unwrap_or(1) {
                match if left { l.pop_front() } else { l.pop_back() } {
                    Some(v) => out.push(Reply::Bulk(v)),
                    None => break,
                }
            }
            Ok(out)
        })?
        .unwrap_or_default();
    Ok(match count {
        Some(_) => Reply::Array(out),
        None => out.pop().unwrap_or(Reply::Nil),
    })
}

/// Remove up to `|count|` elements equal to `value` (all if 0; from the tail if negative).
fn lrem(l: &mut List, count: i64, value: &[u8]) -> i64 {
    let limit = if count == 0 { i64::MAX } else { count.abs() };
    let mut removed = 0i64;
    let mut keep: Vec<bool> = vec![true; l.len()];
    let idx: Box<dyn Iterator<Item = usize>> = if count < 0 {
        Box::new((0..l.len()).rev())
    } else {
        Box::new(0..l.len())
    };
    for i in idx {
        if removed < limit && l[i] == value {
            keep[i] = false;
            removed += 1;
        }
    }
    let mut i = 0;
    l.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    removed
}

/// One attempt of `BLPOP`/`BRPOP k1 k2 … timeout`: pop from the first non-empty list, or
/// nil array (the front end then waits for a push and tries again).
fn blocking_pop(ctx: &mut Ctx<'_>, a: &[Bytes], left: bool) -> KvResult<Reply> {
    let timeout = a
        .last()
        .map(|t| parse_f64(t))
        .transpose()
        .map_err(|_| KvError::invalid("timeout is not a float or out of range"))?;
    if timeout.is_some_and(|t| t < 0.0) {
        return Err(KvError::invalid("timeout is negative"));
    }
    for key in &a[..a.len() - 1] {
        if ctx.ks.get_as::<List>(key, ctx.now)?.is_none() {
            continue;
        }
        let r = pop(ctx, std::slice::from_ref(key), left)?;
        return Ok(Reply::Array(vec![Reply::Bulk(key.clone()), r]));
    }
    Ok(Reply::NilArray)
}
