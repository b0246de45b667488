//! Fixed window and sliding window (counter approximation).
//!
//! Windows are aligned to multiples of `window_ms` of log time: the window of `now` starts at
//! `now − now mod window_ms`. Changing a key's `window_ms` is refused (its counts would mean
//! something else); `LIMIT.RESET` it first.
//!
//! **Fixed window**: admitted iff `count + q ≤ limit`; retry and reset at the window's end,
//! which is also the key's expiry.
//!
//! **Sliding window**: with `e = now − start` and `W = window_ms`, the estimate of units in
//! the last `W` ms is `previous · (W − e)/W + count`; admitted iff
//! `previous · (W − e) + (count + q) · W ≤ limit · W` (exact integers, no rounding in the
//! decision). `remaining` is the floor of what is left; `retry_after_ms` the first ms at which
//! the same request would pass with no other traffic; the state is fresh (both counts 0) two
//! windows after `start`, which is its expiry and `reset_after_ms`.

use super::{ms, Decision, LimitError, Limiter, Outcome};
use crate::Millis;

fn changed(existing_ms: u64, requested_ms: u64) -> LimitError {
    LimitError::WindowChanged {
        existing_ms,
        requested_ms,
    }
}

pub(super) fn fixed(
    limit: u64,
    window_ms: u64,
    state: Option<&Limiter>,
    now: Millis,
    quantity: u64,
) -> Result<Outcome, LimitError> {
    let start = now - now % window_ms;
    let count = match state {
        Some(Limiter::FixedWindow { window_ms: w, .. }) if *w != window_ms => {
            return Err(changed(*w, window_ms))
        }
        Some(Limiter::FixedWindow {
            start_ms, count, ..
        }) if *start_ms == start => *count,
        _ => 0,
    };
    let end = start.saturating_add(window_ms);
    let allowed = count.saturating_add(quantity) <= limit;
    let after = if allowed { count + quantity } else { count };
    let decision = Decision {
        allowed,
        limit,
        remaining: limit.saturating_sub(after),
        retry_after_ms: (!allowed && quantity <= limit).then(|| end - now),
        reset_after_ms: if after > 0 { end - now } else { 0 },
        violated: None,
    };
    Ok(Outcome {
        decision,
        store: Some((
            Limiter::FixedWindow {
                window_ms,
                start_ms: start,
                count: after,
            },
            end,
        )),
    })
}

pub(super) fn sliding(
    limit: u64,
    window_ms: u64,
    state: Option<&Limiter>,
    now: Millis,
    quantity: u64,
) -> Result<Outcome, LimitError> {
    let start = now - now % window_ms;
    let (cur, prev) = match state {
        Some(Limiter::SlidingWindow { window_ms: w, .. }) if *w != window_ms => {
            return Err(changed(*w, window_ms))
        }
        Some(Limiter::SlidingWindow {
            start_ms,
            count,
            previous,
            ..
        }) => {
            if *start_ms == start {
                (*count as u128, *previous as u128)
            } else if start_ms.saturating_add(window_ms) == start {
                (0, *count as u128)
            } else {
                (0, 0)
            }
        }
        _ => (0, 0),
    };
    let (w, n, q) = (window_ms as u128, limit as u128, quantity as u128);
    let e = (now - start) as u128;
    let used = |cur: u128| prev * (w - e) + cur * w;
    let allowed = used(cur + q) <= n * w;
    let after = if allowed { cur + q } else { cur };
    let retry_after_ms = if allowed || q > n {
        None
    } else if cur + q <= n {
        // Later in this window, once enough of the previous one has slid out.
        let e2 = w - ((n - cur - q) * w / prev).min(w);
        Some(ms(e2 - e))
    } else {
        // In the next window, where this window's count is the previous one.
        let e2 = w - ((n - q) * w / cur).min(w);
        Some(ms(w - e + e2))
    };
    let fresh_at = if after > 0 {
        start as u128 + 2 * w
    } else if prev > 0 {
        start as u128 + w
    } else {
        now as u128
    };
    let decision = Decision {
        allowed,
        limit,
        remaining: ms((n * w).saturating_sub(used(after)) / w),
        retry_after_ms,
        reset_after_ms: ms(fresh_at - now as u128),
        violated: None,
    };
    Ok(Outcome {
        decision,
        store: Some((
            Limiter::SlidingWindow {
                window_ms,
                start_ms: start,
                count: ms(after),
                previous: ms(prev),
            },
            ms(fresh_at),
        )),
    })
}
