//! Hashes: `HSET`, `HGET`, `HINCRBY`, `HINCRBYFLOAT`, `HGETALL` and the rest.

use super::prelude::*;

pub(super) const COMMANDS: &[CommandSpec] = &[
    CommandSpec::write("HSET", -4, WRITE | HASH, |ctx, a| {
        hset(ctx, a, "hset").map(Reply::Int)
    }),
    CommandSpec::write("HMSET", -4, WRITE | HASH, |ctx, a| {
        hset(ctx, a, "hmset").map(|_| Reply::ok())
    }),
    CommandSpec::write("HSETNX", 4, WRITE | HASH, |ctx, a| {
        let set = ctx.with::<Hash, _>(&a[0], true, |h| {
            if h.contains_key(&a[1]) {
                return Ok(0);
            }
            h.insert(a[1].clone(), a[2].clone());
            Ok(1)
        })?;
        Ok(Reply::Int(set.unwrap_or(0)))
    }),
    CommandSpec::read("HGET", 3, READ | HASH, |ks, now, a| {
        let h = ks.get_as::<Hash>(&a[0], now)?;
        Ok(bulk_or_nil(h.and_then(|h| h.get(&a[1]))))
    }),
    CommandSpec::read("HMGET", -3, READ | HASH, |ks, now, a| {
        let h = ks.get_as::<Hash>(&a[0], now)?;
        Ok(Reply::Array(
            a[1..]
                .iter()
                .map(|f| bulk_or_nil(h.and_then(|h| h.get(f))))
                .collect(),
        ))
    }),
    CommandSpec::write("HDEL", -3, WRITE | HASH, |ctx, a| {
        let n = ctx.with::<Hash, _>(&a[0], false, |h| {
            Ok(a[1..].iter().filter(|f| h.remove(*f).is_some()).count() as i64)
        })?;
        Ok(Reply::Int(n.unwrap_or(0)))
    }),
    CommandSpec::read("HEXISTS", 3, READ | HASH, |ks, now, a| {
        let h = ks.get_as::<Hash>(&a[0], now)?;
        Ok(Reply::Int(h.is_some_and(|h| h.contains_key(&a[1])) as i64))
    }),
    CommandSpec::write("HINCRBY", 4, WRITE | HASH, |ctx, a| {
        let by = parse_i64(&a[2])?;
        let n = ctx.with::<Hash, _>(&a[0], true, |h| {
            let cur = match h.get(&a[1]) {
                Some(v) => {
                    parse_i64(v).map_err(|_| KvError::invalid("hash value is not an integer"))?
                }
                None => 0,
            };
            let n = cur.checked_add(by).ok_or(KvError::Overflow)?;
            h.insert(a[1].clone(), n.to_string().into_bytes());
            Ok(n)
        })?;
        Ok(Reply::Int(n.unwrap_or(0)))
    }),
    // `HINCRBYFLOAT key field increment`: the new value as a string (what limiter scripts
    // keep fractional tokens in).
    CommandSpec::write("HINCRBYFLOAT", 4, WRITE | HASH, |ctx, a| {
        let by = parse_f64(&a[2])?;
        let n = ctx.with::<Hash, _>(&a[0], true, |h| {
            let cur = match h.get(&a[1]) {
                Some(v) => {
                    parse_f64(v).map_err(|_| KvError::invalid("hash value is not a float"))?
                }
                None => 0.0,
            };
            let n = cur + by;
            if !n.is_finite() {
                return Err(KvError::invalid("increment would produce NaN or Infinity"));
            }
            let text = fmt_f64(n);
            h.insert(a[1].clone(), text.clone().into_bytes());
            Ok(text)
        })?;
        Ok(Reply::bulk(n.unwrap_or_default()))
    }),
    CommandSpec::read("HGETALL", 2, READ | HASH, |ks, now, a| {
        let h = ks.get_as::<Hash>(&a[0], now)?;
        Ok(Reply::Map(h.map_or_else(Vec::new, |h| {
            h.iter()
                .map(|(k, v)| (Reply::Bulk(k.clone()), Reply::Bulk(v.clone())))
                .collect()
        })))
    }),
    CommandSpec::read("HLEN", 2, READ | HASH, |ks, now, a| {
        let h = ks.get_as::<Hash>(&a[0], now)?;
        Ok(Reply::Int(h.map_or(0, |h| h.len()) as i64))
    }),
    CommandSpec::read("HKEYS", 2, READ | HASH, |ks, now, a| {
        let h = ks.get_as::<Hash>(&a[0], now)?;
        Ok(Reply::Array(h.map_or_else(Vec::new, |h| {
            h.keys().map(|k| Reply::Bulk(k.clone())).collect()
        })))
    }),
    CommandSpec::read("HVALS", 2, READ | HASH, |ks, now, a| {
        let h = ks.get_as::<Hash>(&a[0], now)?;
        Ok(Reply::Array(h.map_or_else(Vec::new, |h| {
            h.values().map(|v| Reply::Bulk(v.clone())).collect()
        })))
    }),
];

/// `HSET`/`HMSET key field value [field value …]` (`cmd` lower case, for the arity error):
/// the number of fields added.
fn hset(ctx: &mut Ctx<'_>, a: &[Bytes], cmd: &str) -> KvResult<i64> {
    if a.len() % 2 != 1 {
        return Err(KvError::Arity(cmd.into()));
    }
    let added = ctx.with::<Hash, _>(&a[0], true, |h| {
        Ok(a[1..]
            .chunks(2)
            .filter(|fv| h.insert(fv[0].clone(), fv[1].clone()).is_none())
            .count() as i64)
    })?;
    Ok(added.unwrap_or(0))
}
