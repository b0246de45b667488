//! GCRA, as redis-cell's `CL.THROTTLE`.
//!
//! Time is counted in units of `1/count` ms, so the emission interval `period_ms / count` is
//! the integer `period_ms` and every quantity is exact (redis-cell truncates the interval to
//! whole nanoseconds; here nothing is truncated). With `T` the emission interval and
//! `τ = T · (max_burst + 1)` the delay variation tolerance, a request of `q` units at `now`
//! with theoretical arrival time `tat` (≥ now; a fresh key's is `now`) is admitted iff
//! `max(tat, now) + T·q − τ ≤ now`, and then `tat` becomes `max(tat, now) + T·q`.
//!
//! Reported: `remaining = ⌊(τ − ttl) / T⌋` (0 when negative) with `ttl` the time to the new
//! `tat` (admitted) or to the old one (denied); `reset_after_ms = ⌈ttl⌉`;
//! `retry_after_ms = ⌈tat + T·q − τ − now⌉` when denied, `None` if `T·q > τ` (never).
//! The state expires at `⌈tat⌉`: from then on the key is the same as a fresh one.

use super::{div_ceil, ms, Decision, Limiter, Outcome};
use crate::Millis;

pub(super) fn decide(
    max_burst: u64,
    count: u64,
    period_ms: u64,
    state: Option<&Limiter>,
    now: Millis,
    quantity: u64,
) -> Outcome {
    let den = count as u128;
    let now_s = now as u128 * den;
    let t = period_ms as u128;
    let dvt = t * (max_burst as u128 + 1);
    let inc = t * quantity as u128;
    let tat = match state {
        // A different `count` rescales the stored time, rounding up (never later admission).
        Some(Limiter::Gcra { tat, den: old }) if *old as u128 == den => *tat,
        Some(Limiter::Gcra { tat, den: old }) => div_ceil(tat * den, *old as u128),
        _ => now_s,
    }
    .max(now_s);
    let new_tat = tat + inc;
    let allowed = new_tat <= now_s + dvt;
    let ttl = if allowed {
        new_tat - now_s
    } else {
        tat - now_s
    };
    let remaining = if ttl < dvt { (dvt - ttl) / t } else { 0 };
    let retry_after_ms = if allowed || inc > dvt {
        None
    } else {
        Some(ms(div_ceil(new_tat - dvt - now_s, den)))
    };
    let decision = Decision {
        allowed,
        limit: max_burst + 1,
        remaining: ms(remaining),
        retry_after_ms,
        reset_after_ms: ms(div_ceil(ttl, den)),
        violated: None,
    };
    let expire_at = ms(div_ceil(new_tat, den));
    Outcome {
        decision,
        store: Some((
            Limiter::Gcra {
                tat: new_tat,
                den: count,
            },
            expire_at,
        )),
    }
}
