//! Rate limiters: `CL.THROTTLE` (redis-cell's GCRA, its exact reply) and the `LIMIT.*`
//! commands, each a row over the one implementation in `kv/limit` ([`Keyspace::limit`]) that
//! the typed `Command::Limit` uses too. A peek (`CL.THROTTLE … 0`, `LIMIT.* … PEEK`) is a
//! read; everything else is a write through the log, decided at the entry's log time.
//!
//! `LIMIT.*` replies are five integers: `[allowed, remaining, retry_after_ms,
//! reset_after_ms, violated]` (`retry_after_ms` -1 when admitted; `violated` the index of the
//! first violated `LIMIT.LOG` policy, else -1).

use super::prelude::*;
use crate::kv::limit::{
    Decision, LimitError, LimitMode, LogPolicy, Policy, MAX_COUNT, MAX_LOG_LIMIT, MAX_PERIOD_MS,
};

/// A parsed limiter request.
struct Req {
    policy: Policy,
    quantity: u64,
    peek: bool,
}

type Parse = fn(&[Bytes]) -> KvResult<Req>;

pub(super) const COMMANDS: &[CommandSpec] = &[
    // `CL.THROTTLE key max_burst count period [quantity]` (period in seconds).
    CommandSpec::other(
        "CL.THROTTLE",
        -5,
        WRITE | RATELIMIT,
        Run::Mixed {
            reads: |a| a.get(4).is_some_and(|q| q.as_slice() == b"0"),
            read: |ks, now, a| peek(ks, now, a, throttle).map(cell_reply),
            write: |ctx, a| check(ctx, a, throttle).map(cell_reply),
        },
    )
    .keys(KeySpec::First),
    row(
        "LIMIT.GCRA",
        -5,
        Run::Mixed {
            reads: peeks,
            read: |ks, now, a| peek(ks, now, a, gcra).map(reply),
            write: |ctx, a| check(ctx, a, gcra).map(reply),
        },
    ),
    row(
        "LIMIT.TOKENBUCKET",
        -5,
        Run::Mixed {
            reads: peeks,
            read: |ks, now, a| peek(ks, now, a, token_bucket).map(reply),
            write: |ctx, a| check(ctx, a, token_bucket).map(reply),
        },
    ),
    row(
        "LIMIT.LEAKYBUCKET",
        -5,
        Run::Mixed {
            reads: peeks,
            read: |ks, now, a| peek(ks, now, a, leaky_bucket).map(reply),
            write: |ctx, a| check(ctx, a, leaky_bucket).map(reply),
        },
    ),
    row(
        "LIMIT.FIXEDWINDOW",
        -4,
        Run::Mixed {
            reads: peeks,
            read: |ks, now, a| peek(ks, now, a, fixed_window).map(reply),
            write: |ctx, a| check(ctx, a, fixed_window).map(reply),
        },
    ),
    row(
        "LIMIT.SLIDINGWINDOW",
        -4,
        Run::Mixed {
            reads: peeks,
            read: |ks, now, a| peek(ks, now, a, sliding_window).map(reply),
            write: |ctx, a| check(ctx, a, sliding_window).map(reply),
        },
    ),
    row(
        "LIMIT.LOG",
        -4,
        Run::Mixed {
            reads: peeks,
            read: |ks, now, a| peek(ks, now, a, sliding_log).map(reply),
            write: |ctx, a| check(ctx, a, sliding_log).map(reply),
        },
    ),
    // `LIMIT.RESET key`: 1 if a limiter's state was removed, 0 if there was none.
    CommandSpec::write("LIMIT.RESET", 2, WRITE | RATELIMIT, |ctx, a| {
        Ok(Reply::Int(ctx.ks.limit_reset(&a[0], ctx.now)? as i64))
    }),
];

const fn row(name: &'static str, arity: i32, run: Run) -> CommandSpec {
    CommandSpec::other(name, arity, WRITE | RATELIMIT, run).keys(KeySpec::First)
}

impl From<LimitError> for KvError {
    fn from(e: LimitError) -> KvError {
        match e {
            LimitError::WrongType => KvError::WrongType,
            other => KvError::Invalid(other.to_string()),
        }
    }
}

/// Whether a `LIMIT.*` command ends with `PEEK`.
fn peeks(a: &[Bytes]) -> bool {
    a.len() > 1 && a.last().is_some_and(|w| is(w, "PEEK"))
}

fn peek(ks: &Keyspace, now: Millis, a: &[Bytes], parse: Parse) -> KvResult<Decision> {
    let r = parse(a)?;
    Ok(ks.limit_peek(now, &a[0], &r.policy, r.quantity)?)
}

fn check(ctx: &mut Ctx<'_>, a: &[Bytes], parse: Parse) -> KvResult<Decision> {
    let r = parse(a)?;
    let mode = if r.peek {
        LimitMode::Peek
    } else {
        LimitMode::Check
    };
    Ok(ctx
        .ks
        .limit(ctx.revision, ctx.now, &a[0], &r.policy, r.quantity, mode)?)
}

/// An integer argument in `min..=max`.
fn num(b: &[u8], param: &str, min: u64, max: u64) -> KvResult<u64> {
    let v = parse_i64(b)?;
    match u64::try_from(v) {
        Ok(u) if (min..=max).contains(&u) => Ok(u),
        _ => Err(LimitError::OutOfRange {
            param: param.into(),
            value: v,
            min: min as i64,
            max: max as i64,
        }
        .into()),
    }
}

/// redis-cell's reply: `[limited, limit, remaining, retry_after_s, reset_after_s]`, times
/// rounded up to whole seconds, `retry_after` -1 when admitted (or never admissible).
fn cell_reply(d: Decision) -> Reply {
    let secs = |ms: u64| ms.div_ceil(1000) as i64;
    Reply::Array(vec![
        Reply::Int(i64::from(!d.allowed)),
        Reply::Int(d.limit as i64),
        Reply::Int(d.remaining as i64),
        Reply::Int(d.retry_after_ms.map_or(-1, secs)),
        Reply::Int(secs(d.reset_after_ms)),
    ])
}

/// `[allowed, remaining, retry_after_ms, reset_after_ms, violated]`.
fn reply(d: Decision) -> Reply {
    Reply::Array(vec![
        Reply::Int(i64::from(d.allowed)),
        Reply::Int(d.remaining as i64),
        Reply::Int(d.retry_after_ms.map_or(-1, |ms| ms as i64)),
        Reply::Int(d.reset_after_ms as i64),
        Reply::Int(d.violated.map_or(-1, i64::from)),
    ])
}

/// `CL.THROTTLE key max_burst count period [quantity]`: quantity 0 peeks; a quantity above
/// the limit is denied with retry_after -1 (redis-cell).
fn throttle(a: &[Bytes]) -> KvResult<Req> {
    if a.len() > 5 {
        return Err(KvError::Arity("cl.throttle".into()));
    }
    let max_burst = num(&a[1], "max_burst", 0, MAX_COUNT)?;
    let count = num(&a[2], "count", 1, MAX_COUNT)?;
    let period = num(&a[3], "period", 1, MAX_PERIOD_MS / 1000)?;
    let quantity = match a.get(4) {
        Some(q) => num(q, "quantity", 0, i64::MAX as u64)?,
        None => 1,
    };
    Ok(Req {
        policy: Policy::gcra(max_burst, count, period * 1000),
        quantity,
        peek: quantity == 0,
    })
}

/// The `LIMIT.*` tail after `fixed` parameters: `[quantity] [PEEK]`, quantity in
/// `1..=policy.max_quantity()`.
fn tail(a: &[Bytes], fixed: usize, policy: Policy, name: &str) -> KvResult<Req> {
    let peek = peeks(a) && a.len() > fixed + 1;
    let rest = &a[fixed + 1..a.len() - usize::from(peek)];
    let quantity = match rest {
        [] => 1,
        [q] => num(q, "quantity", 1, policy.max_quantity())?,
        _ => return Err(KvError::Arity(name.into())),
    };
    Ok(Req {
        policy,
        quantity,
        peek,
    })
}

/// `LIMIT.GCRA key max_burst count period_ms [quantity] [PEEK]`.
fn gcra(a: &[Bytes]) -> KvResult<Req> {
    let p = Policy::gcra(
        num(&a[1], "max_burst", 0, MAX_COUNT)?,
        num(&a[2], "count", 1, MAX_COUNT)?,
        num(&a[3], "period_ms", 1, MAX_PERIOD_MS)?,
    );
    tail(a, 3, p, "limit.gcra")
}

/// `LIMIT.TOKENBUCKET key capacity refill_tokens refill_period_ms [quantity] [PEEK]`.
fn token_bucket(a: &[Bytes]) -> KvResult<Req> {
    let p = Policy::token_bucket(
        num(&a[1], "capacity", 1, MAX_COUNT)?,
        num(&a[2], "refill_tokens", 1, MAX_COUNT)?,
        num(&a[3], "refill_period_ms", 1, MAX_PERIOD_MS)?,
    );
    tail(a, 3, p, "limit.tokenbucket")
}

/// `LIMIT.LEAKYBUCKET key capacity leak_tokens leak_period_ms [quantity] [PEEK]`.
fn leaky_bucket(a: &[Bytes]) -> KvResult<Req> {
    let p = Policy::leaky_bucket(
        num(&a[1], "capacity", 1, MAX_COUNT)?,
        num(&a[2], "leak_tokens", 1, MAX_COUNT)?,
        num(&a[3], "leak_period_ms", 1, MAX_PERIOD_MS)?,
    );
    tail(a, 3, p, "limit.leakybucket")
}

/// `LIMIT.FIXEDWINDOW key limit window_ms [quantity] [PEEK]`.
fn fixed_window(a: &[Bytes]) -> KvResult<Req> {
    let p = Policy::fixed_window(
        num(&a[1], "limit", 1, MAX_COUNT)?,
        num(&a[2], "window_ms", 1, MAX_PERIOD_MS)?,
    );
    tail(a, 2, p, "limit.fixedwindow")
}

/// `LIMIT.SLIDINGWINDOW key limit window_ms [quantity] [PEEK]`.
fn sliding_window(a: &[Bytes]) -> KvResult<Req> {
    let p = Policy::sliding_window(
        num(&a[1], "limit", 1, MAX_COUNT)?,
        num(&a[2], "window_ms", 1, MAX_PERIOD_MS)?,
    );
    tail(a, 2, p, "limit.slidingwindow")
}

/// `LIMIT.LOG key window_ms limit [window_ms limit …] [quantity] [PEEK]`: an odd number of
/// numbers after the key ends with the quantity.
fn sliding_log(a: &[Bytes]) -> KvResult<Req> {
    let peek = peeks(a) && a.len() > 3;
    let nums = &a[1..a.len() - usize::from(peek)];
    let pairs = &nums[..nums.len() & !1];
    if pairs.is_empty() {
        return Err(KvError::Arity("limit.log".into()));
    }
    let policies = pairs
        .chunks(2)
        .map(|p| {
            Ok(LogPolicy {
                window_ms: num(&p[0], "window_ms", 1, MAX_PERIOD_MS)?,
                limit: num(&p[1], "limit", 1, MAX_LOG_LIMIT)?,
            })
        })
        .collect::<KvResult<Vec<_>>>()?;
    let policy = Policy::SlidingLog { policies };
    policy.validate()?;
    let quantity = match nums.get(pairs.len()) {
        Some(q) => num(q, "quantity", 1, policy.max_quantity())?,
        None => 1,
    };
    Ok(Req {
        policy,
        quantity,
        peek,
    })
}
