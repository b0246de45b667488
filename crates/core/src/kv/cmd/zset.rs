//! Sorted sets: `ZADD`, `ZINCRBY`, `ZREM`, ranges by rank and by score, `ZCOUNT`.

use super::prelude::*;

pub(super) const COMMANDS: &[CommandSpec] = &[
    CommandSpec::write("ZADD", -4, WRITE | SORTEDSET, zadd),
    CommandSpec::write("ZINCRBY", 4, WRITE | SORTEDSET, |ctx, a| {
        let by = parse_f64(&a[1])?;
        let out = ctx.with::<ZSet, _>(&a[0], true, |z| {
            let out = z.by_member.get(&a[2]).map_or(0.0, |s| s.0) + by;
            if out.is_nan() {
                return Err(nan());
            }
            z.insert(a[2].clone(), Score(out));
            Ok(out)
        })?;
        Ok(Reply::Double(fmt_f64(out.unwrap_or(0.0))))
    }),
    CommandSpec::write("ZREM", -3, WRITE | SORTEDSET, |ctx, a| {
        let n = ctx.with::<ZSet, _>(&a[0], false, |z| {
            Ok(a[1..].iter().filter(|m| z.remove(m)).count() as i64)
        })?;
        Ok(Reply::Int(n.unwrap_or(0)))
    }),
    CommandSpec::read("ZCARD", 2, READ | SORTEDSET, |ks, now, a| {
        let z = ks.get_as::<ZSet>(&a[0], now)?;
        Ok(Reply::Int(z.map_or(0, |z| z.len()) as i64))
    }),
    CommandSpec::read("ZSCORE", 3, READ | SORTEDSET, |ks, now, a| {
        let z = ks.get_as::<ZSet>(&a[0], now)?;
        Ok(z.and_then(|z| z.by_member.get(&a[1]))
            .map_or(Reply::Nil, |s| Reply::Double(fmt_f64(s.0))))
    }),
    CommandSpec::read("ZRANGE", -4, READ | SORTEDSET, |ks, now, a| {
        zrange(ks.get(&a[0], now), &a[1..], false)
    }),
    CommandSpec::read("ZRANGEBYSCORE", -4, READ | SORTEDSET, |ks, now, a| {
        zrange(ks.get(&a[0], now), &a[1..], true)
    }),
    CommandSpec::write("ZREMRANGEBYSCORE", 4, WRITE | SORTEDSET, |ctx, a| {
        let (min, max) = (Bound::parse(&a[1])?, Bound::parse(&a[2])?);
        let n = ctx.with::<ZSet, _>(&a[0], false, |z| {
            let gone: Vec<Bytes> = z
                .by_score
                .iter()
                .filter(|(s, _)| Bound::within(s.0, min, max))
                .map(|(_, m)| m.clone())
                .collect();
            for m in &gone {
                z.remove(m);
            }
            Ok(gone.len() as i64)
        })?;
        Ok(Reply::Int(n.unwrap_or(0)))
    }),
    CommandSpec::read("ZCOUNT", 4, READ | SORTEDSET, |ks, now, a| {
        let (min, max) = (Bound::parse(&a[1])?, Bound::parse(&a[2])?);
        let z = ks.get_as::<ZSet>(&a[0], now)?;
        Ok(Reply::Int(z.map_or(0, |z| {
            z.by_score
                .iter()
                .filter(|(s, _)| Bound::within(s.0, min, max))
                .count()
        }) as i64))
    }),
];

fn nan() -> KvError {
    KvError::invalid("resulting score is not a number (NaN)")
}

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member …]`.
fn zadd(ctx: &mut Ctx<'_>, a: &[Bytes]) -> KvResult<Reply> {
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
        return Err(KvError::Syntax);
    }
    if nx && xx {
        return Err(KvError::invalid(
            "XX and NX options at the same time are not compatible",
        ));
    }
    if (gt && lt) || (nx && (gt || lt)) {
        return Err(KvError::invalid(
            "GT, LT, and/or NX options at the same time are not compatible",
        ));
    }
    if incr && pairs.len() != 2 {
        return Err(KvError::invalid(
            "INCR option supports a single increment-element pair",
        ));
    }
    let parsed: Vec<(f64, &Bytes)> = pairs
        .chunks(2)
        .map(|p| Ok((parse_f64(&p[0])?, &p[1])))
        .collect::<KvResult<_>>()?;
    let (mut added, mut changed) = (0i64, 0i64);
    let mut incr_result: Option<f64> = None;
    ctx.with::<ZSet, _>(&a[0], true, |z| {
        for (score, member) in &parsed {
            let cur = z.by_member.get(*member).map(|s| s.0);
            let new = if incr {
                cur.unwrap_or(0.0) + score
            } else {
                *score
            };
            if new.is_nan() {
                return Err(nan());
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

/// `ZRANGE key start stop [BYSCORE] [REV] [LIMIT off n] [WITHSCORES]` and
/// `ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT off n]` (`a` starts after the key).
fn zrange(e: Option<&Entry>, a: &[Bytes], by_score_cmd: bool) -> KvResult<Reply> {
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
            return Err(KvError::invalid("BYLEX is not supported by fenced"));
        } else if is(&a[i], "LIMIT") && i + 2 < a.len() {
            limit = Some((parse_i64(&a[i + 1])?, parse_i64(&a[i + 2])?));
            i += 2;
        } else {
            return Err(KvError::Syntax);
        }
        i += 1;
    }
    if limit.is_some() && !by_score {
        return Err(KvError::invalid(
            "syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        ));
    }
    let items: Vec<(Score, Bytes)> = if by_score {
        let (mut min, mut max) = (Bound::parse(&a[0])?, Bound::parse(&a[1])?);
        if rev {
            std::mem::swap(&mut min, &mut max);
        }
        let Some(e) = e else {
            return Ok(Reply::Array(vec![]));
        };
        let z = e.as_kind::<ZSet>()?;
        let it = z
            .by_score
            .iter()
            .filter(|(s, _)| Bound::within(s.0, min, max))
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
        let z = e.as_kind::<ZSet>()?;
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
