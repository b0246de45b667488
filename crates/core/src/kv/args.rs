//! Argument parsing and formatting shared by the commands (and the Lua bridge): Redis's
//! integer, float, expiry, range and score-bound rules.

use super::error::{KvError, KvResult};
use super::types::MAX_VALUE_LEN;
use crate::Millis;

/// A Redis integer argument: no sign `+`, no leading zeros.
pub(crate) fn parse_i64(b: &[u8]) -> KvResult<i64> {
    let s = std::str::from_utf8(b).map_err(|_| KvError::NotInteger)?;
    if s.is_empty()
        || s.starts_with('+')
        || (s.len() > 1 && s.starts_with('0'))
        || s.starts_with("-0")
    {
        return Err(KvError::NotInteger);
    }
    s.parse::<i64>().map_err(|_| KvError::NotInteger)
}

/// A Redis float argument: `inf`, `+inf`, `-inf` or a finite number, never NaN.
pub(crate) fn parse_f64(b: &[u8]) -> KvResult<f64> {
    let s = std::str::from_utf8(b).map_err(|_| KvError::NotFloat)?;
    let v = match s.to_ascii_lowercase().as_str() {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        l if l.contains("inf") || l.contains("nan") || l.is_empty() || l.trim() != l => {
            return Err(KvError::NotFloat)
        }
        _ => s.parse::<f64>().map_err(|_| KvError::NotFloat)?,
    };
    if v.is_nan() {
        return Err(KvError::NotFloat);
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

pub(crate) fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

/// Whether argument `b` is the option `word` (any case).
pub(crate) fn is(b: &[u8], word: &str) -> bool {
    b.eq_ignore_ascii_case(word.as_bytes())
}

/// A value a command may store ([`MAX_VALUE_LEN`]).
pub(crate) fn check_len(b: &[u8]) -> KvResult<()> {
    if b.len() > MAX_VALUE_LEN {
        return Err(KvError::TooLarge);
    }
    Ok(())
}

/// A relative expiry of `amount` in `unit_ms` units → absolute log time.
pub(crate) fn rel_expiry(now: Millis, amount: i64, unit_ms: i64, cmd: &str) -> KvResult<Millis> {
    let bad = || KvError::InvalidExpire(cmd.into());
    if amount <= 0 {
        return Err(bad());
    }
    let ms = amount.checked_mul(unit_ms).ok_or_else(bad)?;
    (now as i64)
        .checked_add(ms)
        .map(|t| t as Millis)
        .ok_or_else(bad)
}

/// An absolute expiry of `amount` in `unit_ms` units → log time.
pub(crate) fn abs_expiry(amount: i64, unit_ms: i64, cmd: &str) -> KvResult<Millis> {
    let bad = || KvError::InvalidExpire(cmd.into());
    if amount <= 0 {
        return Err(bad());
    }
    amount
        .checked_mul(unit_ms)
        .map(|t| t as Millis)
        .ok_or_else(bad)
}

/// Normalise Redis's inclusive `start..=stop` (negative from the end) over `len` items.
pub(crate) fn range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
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

/// A score bound of `ZRANGEBYSCORE` and friends: `1.5`, `(1.5` (exclusive), `-inf`, `+inf`.
#[derive(Clone, Copy)]
pub(crate) struct Bound {
    v: f64,
    excl: bool,
}

impl Bound {
    pub(crate) fn parse(b: &[u8]) -> KvResult<Bound> {
        let (excl, rest) = match b.first() {
            Some(b'(') => (true, &b[1..]),
            _ => (false, b),
        };
        let v = parse_f64(rest).map_err(|_| KvError::invalid("min or max is not a float"))?;
        Ok(Bound { v, excl })
    }

    /// Whether `x` lies within `[min, max]`, each bound inclusive or not.
    pub(crate) fn within(x: f64, min: Bound, max: Bound) -> bool {
        let above = if min.excl { x > min.v } else { x >= min.v };
        let below = if max.excl { x < max.v } else { x <= max.v };
        above && below
    }
}
