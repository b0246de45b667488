//! Fencing: tokens strictly increase per lock, a token identifies one grant (no two processes
//! are handed the same token), and protected storage never accepts a token lower than one it
//! has already accepted. Plus the question fencing exists to answer:
//! did storage accept a write from a holder whose grant had been superseded (a *stale write*)?
//!
//! Ops used: `acquire` oks (granted `token`), and writes to storage: `fenced-write` (an
//! increment carrying `token`), `fence` (a write of the unchanged value that registers the
//! token with storage) and `write` (an unfenced increment, no token).

use std::collections::BTreeMap;

use serde_json::json;

use super::{ms, Op, Verdict, MAX_EXAMPLES};

fn is_write(op: &Op) -> bool {
    matches!(op.f.as_str(), "fenced-write" | "write" | "fence")
}

/// For each op in `items` (sorted by invoke), the largest token among items completed before
/// its invoke. `items`: (invoke, complete, token).
fn max_completed_before(items: &[(u64, u64, u64)]) -> Vec<Option<(u64, u64)>> {
    let mut by_complete: Vec<(u64, u64)> = items.iter().map(|(_, c, t)| (*c, *t)).collect();
    by_complete.sort();
    let mut j = 0;
    let mut best: Option<(u64, u64)> = None; // (token, completed at)
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| items[i].0);
    let mut res = vec![None; items.len()];
    for i in order {
        let inv = items[i].0;
        while j < by_complete.len() && by_complete[j].0 < inv {
            let (c, t) = by_complete[j];
            if best.is_none_or(|(bt, _)| t > bt) {
                best = Some((t, c));
            }
            j += 1;
        }
        res[i] = best;
    }
    res
}

/// Tokens strictly increase per lock; no token is granted to two processes; storage never
/// goes back to a lower token.
///
/// The second rule catches what the first cannot when the grants overlap in time: a client
/// that reads its token in a second round trip (`SET NX`, then `FENCE.TOKEN`) after its lease
/// ran out and someone else took the lock is handed the new holder's token; both then pass
/// storage's check. Shared grants (`read`, `permit`: rwlock and semaphore workloads) are the
/// exception: fenced admits queued readers, or queued permits, together in one command, whose
/// revision is then the token of each — so two shared grants may carry one token (the first
/// rule still requires them to have been in flight at the same time). A writer's or an
/// exclusive holder's token is its own.
pub fn check(ops: &[Op], issues_tokens: bool) -> Verdict {
    if !issues_tokens {
        return Verdict::not_applicable("fencing", "the lock issues no fencing tokens");
    }
    let mut anomalies = 0u64;
    let mut examples = Vec::new();
    // 1. Grants per lock: (invoke, ok, token, process, shared).
    type Grants<'a> = BTreeMap<&'a str, Vec<(u64, u64, u64, u64, bool)>>;
    let mut grants: Grants = BTreeMap::new();
    let mut missing = 0u64;
    for op in ops.iter().filter(|o| o.f == "acquire" && o.is_ok()) {
        let shared = matches!(op.mode.as_deref(), Some("read" | "permit"));
        match (op.key.as_deref(), op.complete, op.token) {
            (Some(k), Some(c), Some(t)) => grants
                .entry(k)
                .or_default()
                .push((op.invoke, c, t, op.process, shared)),
            _ => missing += 1,
        }
    }
    anomalies += missing;
    if missing > 0 {
        examples.push(format!("{missing} acknowledged grants carried no token"));
    }
    let mut n_grants = 0;
    for (key, items) in &grants {
        n_grants += items.len();
        // The first acknowledged grant of each token: (ok, process, shared).
        let mut first: BTreeMap<u64, (u64, u64, bool)> = BTreeMap::new();
        for &(_, c, t, p, sh) in items {
            let e = first.entry(t).or_insert((c, p, sh));
            if c < e.0 {
                *e = (c, p, sh);
            }
        }
        let triples: Vec<(u64, u64, u64)> =
            items.iter().map(|&(i, c, t, _, _)| (i, c, t)).collect();
        for (i, prev) in max_completed_before(&triples).into_iter().enumerate() {
            let (inv, c, t, p, shared) = items[i];
            // A reentrant acquire (the holder asking again, e.g. after its release was
            // refused) is handed the token it holds: not a new grant.
            let reentrant = |pt: u64| t == pt && first.get(&t).is_some_and(|(_, fp, _)| *fp == p);
            if let Some((pt, pc)) = prev.filter(|(pt, _)| t <= *pt && !reentrant(*pt)) {
                anomalies += 1;
                if examples.len() < MAX_EXAMPLES {
                    examples.push(format!(
                        "lock {key}: grant with token {t} (invoked at {} ms) after a grant \
                         with token {pt} had been acknowledged at {} ms",
                        ms(inv),
                        ms(pc)
                    ));
                }
            } else if let Some(&(fc, fp, _)) = first
                .get(&t)
                .filter(|(_, fp, fsh)| *fp != p && !(shared && *fsh))
            {
                anomalies += 1;
                if examples.len() < MAX_EXAMPLES {
                    examples.push(format!(
                        "lock {key}: token {t} granted to process {p} (acknowledged at {} ms) \
                         and to process {fp} (acknowledged at {} ms)",
                        ms(c),
                        ms(fc)
                    ));
                }
            }
        }
    }
    // 2. Storage acceptance order per key.
    let mut writes: BTreeMap<&str, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for op in ops.iter().filter(|o| is_write(o) && o.is_ok()) {
        if let (Some(k), Some(c), Some(t)) = (op.key.as_deref(), op.complete, op.token) {
            writes.entry(k).or_default().push((op.invoke, c, t));
        }
    }
    let mut n_writes = 0;
    for (key, items) in &writes {
        n_writes += items.len();
        for (i, prev) in max_completed_before(items).into_iter().enumerate() {
            if let Some((pt, pc)) = prev {
                let (inv, _, t) = items[i];
                if t < pt {
                    anomalies += 1;
                    if examples.len() < MAX_EXAMPLES {
                        examples.push(format!(
                            "storage {key}: accepted token {t} (write invoked at {} ms) after \
                             accepting token {pt} at {} ms",
                            ms(inv),
                            ms(pc)
                        ));
                    }
                }
            }
        }
    }
    Verdict::new(
        "fencing",
        anomalies,
        examples,
        json!({ "grants": n_grants, "token_writes_accepted": n_writes }),
    )
}

/// Stale writes accepted: an increment (`fenced-write` or `write`) that storage acknowledged,
/// invoked after *another* process's grant of the same lock had been acknowledged following
/// the writer's own grant, that other grant being still valid when acknowledged
/// (`ok < invoke + ttl`). Such a grant was made after the writer's, or while the writer's
/// lease ran (a mutual-exclusion violation): either way the writer's grant was superseded
/// before it wrote, yet storage took the write. A grant acknowledged only after its own lease
/// had run out (its reply waited in a paused client) supersedes nothing.
pub fn stale_writes(ops: &[Op]) -> Verdict {
    // Acknowledged grants per lock: (ok time, process, lease end), by ok time.
    let mut grants: BTreeMap<&str, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for op in ops.iter().filter(|o| o.f == "acquire" && o.is_ok()) {
        if let (Some(k), Some(c)) = (op.key.as_deref(), op.complete) {
            let valid_until = op
                .invoke
                .saturating_add(op.ttl_ms.unwrap_or(0).saturating_mul(1_000_000));
            grants
                .entry(k)
                .or_default()
                .push((c, op.process, valid_until));
        }
    }
    for g in grants.values_mut() {
        g.sort();
    }
    // Each process's ops in order: the lease a write happened under is its latest acquire ok.
    let mut by_process: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_process.entry(op.process).or_default().push(op);
    }
    let mut anomalies = 0u64;
    let mut examples = Vec::new();
    let mut accepted = 0u64;
    let mut rejected = 0u64;
    for list in by_process.values() {
        let mut lease: Option<&Op> = None;
        for op in list {
            if op.f == "acquire" {
                lease = op.is_ok().then_some(*op);
                continue;
            }
            if !matches!(op.f.as_str(), "fenced-write" | "write") {
                continue;
            }
            match op.kind {
                crate::history::Kind::Fail => rejected += 1,
                crate::history::Kind::Ok => accepted += 1,
                _ => {}
            }
            let (Some(l), true) = (lease, op.is_ok()) else {
                continue;
            };
            let (Some(lock), Some(since)) = (l.key.as_deref(), l.complete) else {
                continue;
            };
            let Some(gs) = grants.get(lock) else { continue };
            let lo = gs.partition_point(|(c, _, _)| *c <= since);
            let hi = gs.partition_point(|(c, _, _)| *c < op.invoke);
            if let Some((c, p, _)) = gs[lo..hi.max(lo)]
                .iter()
                .find(|(c, p, until)| *p != op.process && *c < *until)
            {
                anomalies += 1;
                if examples.len() < MAX_EXAMPLES {
                    examples.push(format!(
                        "process {} wrote {} (token {:?}) at {} ms under its grant of {lock} \
                         acknowledged at {} ms, but process {p} had been granted {lock} at {} \
                         ms; storage accepted it",
                        op.process,
                        op.value_in.clone().unwrap_or_default(),
                        op.token,
                        ms(op.invoke),
                        ms(since),
                        ms(*c)
                    ));
                }
            }
        }
    }
    Verdict::new(
        "stale-writes",
        anomalies,
        examples,
        json!({ "writes_accepted": accepted, "writes_rejected": rejected }),
    )
}

#[cfg(test)]
mod tests {
    use super::super::build::*;
    use super::super::pair;
    use super::*;
    use crate::history::Kind;
    use serde_json::json;

    fn write(h: &mut H, p: u64, f: &str, inv: u64, done: u64, kind: Kind, token: Option<u64>) {
        let e = h.ev(p, Kind::Invoke, f, "counter", inv);
        e.token = token;
        e.value = Some(json!(1));
        h.ev(p, kind, f, "counter", done);
    }

    #[test]
    fn good_history_passes() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 0, 10, Some(5), 100);
        write(&mut h, 1, "fenced-write", 11, 12, Kind::Ok, Some(5));
        acquire(&mut h, 2, "L", 5, 200, Some(9), 100);
        write(&mut h, 2, "fenced-write", 201, 202, Kind::Ok, Some(9));
        // The old holder's late write is rejected: not an anomaly.
        write(&mut h, 1, "fenced-write", 210, 211, Kind::Fail, Some(5));
        let ops = pair(&h.sorted());
        assert_eq!(check(&ops, true).valid, Some(true));
        let s = stale_writes(&ops);
        assert_eq!(s.valid, Some(true), "{s:?}");
        assert_eq!(s.stats["writes_rejected"], 1);
    }

    #[test]
    fn an_old_grant_acknowledged_late_supersedes_nothing() {
        let mut h = H::new();
        // p2 asked first (token 3) but was paused; its reply is read after p1's grant.
        h.ev(2, Kind::Invoke, "acquire", "L", 0).ttl_ms = Some(100);
        acquire(&mut h, 1, "L", 150, 160, Some(7), 100);
        h.ev(2, Kind::Ok, "acquire", "L", 165).token = Some(3);
        write(&mut h, 1, "fenced-write", 170, 171, Kind::Ok, Some(7));
        let v = stale_writes(&pair(&h.sorted()));
        assert_eq!(v.valid, Some(true), "{v:?}");
    }

    #[test]
    fn fails_on_token_going_backwards() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 0, 10, Some(5), 100);
        acquire(&mut h, 2, "L", 20, 30, Some(5), 100);
        acquire(&mut h, 3, "L", 40, 50, Some(3), 100);
        let v = check(&pair(&h.sorted()), true);
        assert_eq!(v.anomalies, 2, "{v:?}");
    }

    #[test]
    fn a_reentrant_grant_keeps_its_token_but_a_later_holder_may_not_reuse_it() {
        let mut h = H::new();
        // p1 holds token 5, asks again (its release was refused): the same grant, held twice.
        acquire(&mut h, 1, "L", 0, 10, Some(5), 1000);
        acquire(&mut h, 1, "L", 20, 30, Some(5), 1000);
        assert_eq!(check(&pair(&h.sorted()), true).anomalies, 0);
        // p2 handed token 5 after p1's grant was acknowledged: going backwards.
        acquire(&mut h, 2, "L", 2000, 2010, Some(5), 1000);
        assert_eq!(check(&pair(&h.sorted()), true).anomalies, 1);
    }

    #[test]
    fn fails_on_one_token_for_two_processes() {
        let mut h = H::new();
        // p1 sends SET NX at 0 and is stalled before reading its token; its lease ends, p2
        // takes the lock (token 9); p1's FENCE.TOKEN then answers 9 too. Neither grant was
        // acknowledged before the other was invoked: only the shared token gives it away.
        h.ev(1, Kind::Invoke, "acquire", "L", 0).ttl_ms = Some(100);
        acquire(&mut h, 2, "L", 50, 160, Some(9), 100);
        h.ev(1, Kind::Ok, "acquire", "L", 170).token = Some(9);
        let v = check(&pair(&h.sorted()), true);
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert!(
            v.examples[0].contains("token 9 granted to process 1"),
            "{v:?}"
        );
    }

    #[test]
    fn fails_when_storage_accepts_a_lower_token() {
        let mut h = H::new();
        write(&mut h, 1, "fenced-write", 0, 10, Kind::Ok, Some(9));
        write(&mut h, 2, "fenced-write", 20, 30, Kind::Ok, Some(4));
        // Concurrent writes may land in either order.
        write(&mut h, 3, "fenced-write", 25, 40, Kind::Ok, Some(2));
        let v = check(&pair(&h.sorted()), true);
        assert_eq!(v.anomalies, 2, "{v:?}");
        assert!(v.examples[0].contains("accepted token 4"));
    }

    #[test]
    fn fails_on_accepted_stale_write() {
        let mut h = H::new();
        acquire(&mut h, 1, "L", 0, 10, None, 100);
        // Process 1 pauses; its lease runs out; process 2 takes the lock.
        acquire(&mut h, 2, "L", 100, 150, None, 100);
        write(&mut h, 2, "write", 151, 152, Kind::Ok, None);
        write(&mut h, 1, "write", 300, 301, Kind::Ok, None);
        let v = stale_writes(&pair(&h.sorted()));
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert!(v.examples[0].starts_with("process 1"));
        assert_eq!(
            check(&pair(&h.sorted()), false).valid,
            None,
            "no tokens: not applicable"
        );
    }
}
