//! Sliding log with several policies checked together (like the "multiple strategies" Lua
//! limiter): the admitted units and their times; a request of `q` is admitted iff for every
//! policy `(W, N)` the units admitted in `(now − W, now]` plus `q` are at most `N`. The first
//! violated policy's index (in the order given) is reported. Exact: no approximation.
//!
//! Entries older than the longest window are dropped on every write; at most one entry per
//! distinct ms (same-ms requests add up), so a key holds at most `N` entries of the policy
//! with the longest window — 16 bytes each. The key expires when its newest entry leaves the
//! longest window.

use std::collections::VecDeque;

use super::{Decision, Limiter, LogPolicy, Outcome};
use crate::Millis;

pub(super) fn decide(
    policies: &[LogPolicy],
    state: Option<&Limiter>,
    now: Millis,
    quantity: u64,
) -> Outcome {
    let longest = policies.iter().map(|p| p.window_ms).max().unwrap_or(0);
    let mut entries: VecDeque<(Millis, u64)> = match state {
        Some(Limiter::SlidingLog { entries }) => entries
            .iter()
            .copied()
            .filter(|(t, _)| t.saturating_add(longest) > now)
            .collect(),
        _ => VecDeque::new(),
    };
    let in_window = |entries: &VecDeque<(Millis, u64)>, w: u64| -> u64 {
        entries
            .iter()
            .rev()
            .take_while(|(t, _)| t.saturating_add(w) > now)
            .map(|(_, n)| *n)
            .sum()
    };
    let violated = policies
        .iter()
        .position(|p| in_window(&entries, p.window_ms).saturating_add(quantity) > p.limit);
    let allowed = violated.is_none();
    let retry_after_ms = if allowed {
        None
    } else {
        // For every violated policy, the time its oldest entries must slide out for `q` to
        // fit; the latest of those.
        let mut wait: Option<u64> = Some(0);
        for p in policies {
            let mut sum = in_window(&entries, p.window_ms);
            if sum + quantity <= p.limit {
                continue;
            }
            if quantity > p.limit {
                wait = None;
                break;
            }
            let mut until = now;
            for (t, n) in entries
                .iter()
                .filter(|(t, _)| t.saturating_add(p.window_ms) > now)
            {
                sum -= n;
                until = t.saturating_add(p.window_ms);
                if sum + quantity <= p.limit {
                    break;
                }
            }
            wait = wait.map(|w| w.max(until - now));
        }
        wait
    };
    if allowed && quantity > 0 {
        match entries.back_mut() {
            Some((t, n)) if *t == now => *n += quantity,
            _ => entries.push_back((now, quantity)),
        }
    }
    let (limit, remaining) = policies
        .iter()
        .map(|p| {
            (
                p.limit,
                p.limit.saturating_sub(in_window(&entries, p.window_ms)),
            )
        })
        .min_by_key(|(_, left)| *left)
        .unwrap_or((0, 0));
    let empty_at = entries
        .back()
        .map_or(now, |(t, _)| t.saturating_add(longest));
    let decision = Decision {
        allowed,
        limit,
        remaining,
        retry_after_ms,
        reset_after_ms: empty_at - now,
        violated: violated.map(|i| i as u32),
    };
    Outcome {
        decision,
        store: Some((Limiter::SlidingLog { entries }, empty_at)),
    }
}
