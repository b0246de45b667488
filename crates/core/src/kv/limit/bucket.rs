//! Token bucket (refilled in whole steps) and leaky bucket (a meter that drains
//! continuously).
//!
//! **Token bucket** `capacity C, refill R every P ms`: a fresh bucket is full. Every `P` ms
//! after the last refill step, `R` tokens come back (at most up to `C`); when the bucket is
//! full the step clock restarts at the next consumption, so a full bucket is exactly a fresh
//! one. A request of `q` is admitted iff `q ≤ tokens`. `retry_after_ms` is the time to the
//! refill step that makes `q` tokens available, `reset_after_ms` the time to the step that
//! fills the bucket, which is also the key's expiry.
//!
//! **Leaky bucket (meter)** `capacity C, leak L every P ms`: a level that each admitted unit
//! raises by one and that drains continuously by `L/P` per ms (kept in units of `1/P` token,
//! so draining is exact). A request of `q` is admitted iff `level + q ≤ C`. `remaining` is
//! `⌊C − level⌋`, `retry_after_ms` the time until `level + q ≤ C` (rounded up to the ms),
//! `reset_after_ms` (and the expiry) the time until the level is 0. It admits the same
//! *amounts* as a token bucket refilled continuously; unlike the token bucket above, capacity
//! comes back smoothly rather than in steps. (A leaky bucket as a *queue*, delaying requests,
//! is not offered: fenced answers now or never.)

use super::{div_ceil, ms, Decision, Limiter, Outcome};
use crate::Millis;

pub(super) fn token(
    capacity: u64,
    refill: u64,
    period_ms: u64,
    state: Option<&Limiter>,
    now: Millis,
    quantity: u64,
) -> Outcome {
    let (c, r, p) = (capacity as u128, refill as u128, period_ms as u128);
    let (mut tokens, mut last) = match state {
        Some(Limiter::TokenBucket { tokens, last_ms }) => (*tokens as u128, *last_ms as u128),
        _ => (c, now as u128),
    };
    tokens = tokens.min(c);
    let now_ms = now as u128;
    if tokens < c {
        let steps = now_ms.saturating_sub(last) / p;
        tokens = (tokens + steps * r).min(c);
        last += steps * p;
    }
    if tokens == c {
        last = now_ms;
    }
    let q = quantity as u128;
    let allowed = q <= tokens;
    let left = if allowed { tokens - q } else { tokens };
    // The time of the refill step that brings the bucket to at least `want` tokens.
    let step_for = |want: u128| {
        if want <= left {
            now_ms
        } else {
            last + div_ceil(want - left, r) * p
        }
    };
    let retry_after_ms = (!allowed && q <= c).then(|| ms(step_for(q) - now_ms));
    let full_at = step_for(c);
    let decision = Decision {
        allowed,
        limit: capacity,
        remaining: ms(left),
        retry_after_ms,
        reset_after_ms: ms(full_at - now_ms),
        violated: None,
    };
    Outcome {
        decision,
        store: Some((
            Limiter::TokenBucket {
                tokens: ms(left),
                last_ms: ms(last),
            },
            ms(full_at),
        )),
    }
}

pub(super) fn leaky(
    capacity: u64,
    leak: u64,
    period_ms: u64,
    state: Option<&Limiter>,
    now: Millis,
    quantity: u64,
) -> Outcome {
    let den = period_ms as u128;
    let (l, cap) = (leak as u128, capacity as u128 * den);
    let level = match state {
        Some(Limiter::LeakyBucket {
            level,
            den: old,
            at_ms,
        }) => {
            // A different period rescales the level, rounding up.
            let level = if *old as u128 == den {
                *level
            } else {
                div_ceil(level * den, *old as u128)
            };
            level.saturating_sub(now.saturating_sub(*at_ms) as u128 * l)
        }
        _ => 0,
    };
    let q = quantity as u128 * den;
    let allowed = level + q <= cap;
    let after = if allowed { level + q } else { level };
    let retry_after_ms = (!allowed && q <= cap).then(|| ms(div_ceil(level + q - cap, l)));
    let reset_after_ms = ms(div_ceil(after, l));
    let decision = Decision {
        allowed,
        limit: capacity,
        remaining: ms((cap - after.min(cap)) / den),
        retry_after_ms,
        reset_after_ms,
        violated: None,
    };
    Outcome {
        decision,
        store: Some((
            Limiter::LeakyBucket {
                level: after,
                den: period_ms,
                at_ms: now,
            },
            now.saturating_add(reset_after_ms),
        )),
    }
}
