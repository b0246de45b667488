//! The `watch` workload's checker: every watcher sees every revision of its range in
//! revision order, exactly once, across reconnects.
//!
//! What the history holds (see `etcd/watch.rs`): writers' `put` ops (`ok` carries the
//! revision etcd acknowledged: `{"revision": r}`) and `compact` ops; each watcher (one process
//! id for the whole run) records a `watch` op per (re)connect (`invoke` with
//! `{"start_revision": s}`), then, without invokes, the responses it received in order:
//! `watch-events` (`value`: `[[revision, key, value, "PUT"|"DELETE"], …]`),
//! `watch-canceled` (`{"compact_revision": c}`), `watch-end` (the stream broke) and
//! `watch-target` (after the run: the newest revision under the prefix, `{"revision": t}`).
//!
//! A watcher *covers* revision `r` when `r` is at least the first session's start and not in
//! a hole: a resume whose start is above "last revision seen + 1" leaves `[last + 1, start)`
//! uncovered — legitimately only after a `compacted` cancel whose compact revision is that
//! start. Anomalies, each a real violation given what clients observed:
//!
//! * **lost**: a revision the watcher covers, below the newest revision it saw, that it never
//!   saw — acknowledged to a writer, or seen by another watcher (so it certainly happened);
//! * **duplicate**: the same (revision, key) delivered twice to one watcher;
//! * **reorder**: a revision delivered after a larger one;
//! * **early**: an event below the start revision of the watch that delivered it;
//! * **out-of-range**: an event for a key outside the watched prefix;
//! * **phantom**: an event that is no write's: not an acknowledged put at that revision, nor a
//!   put whose outcome is unknown (`info`, or never completed: allowed, the write may have
//!   happened); a definitely failed put, a delete (no client deletes), or a key/value that
//!   an acknowledged put wrote at another revision;
//! * **disagree**: two watchers saw different writes at one revision, or two acknowledged puts
//!   share a revision;
//! * **spurious-compaction**: a watch cancelled as compacted at revision `c` although no
//!   `compact` to `c` (ok or unknown) had been invoked before, or its start was `≥ c`.
//!
//! Not anomalies, reported in `stats`: acknowledged revisions above the newest one a watcher
//! saw but at most its `watch-target` (`tail_undelivered`: the run ended first), compacted
//! cancels that were explained, and holes the client itself left (`unexplained_holes`, a
//! harness bug if ever non-zero).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{json, Value};

use super::{ms, Op, Verdict, MAX_EXAMPLES};
use crate::history::{Event, Kind, Process};

/// What a `put` in the history says about one write.
#[derive(Clone, Debug)]
struct Write {
    kind: Kind,
    revision: Option<i64>,
}

/// One delivered event: `[revision, key, value, type]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivered {
    pub revision: i64,
    pub key: String,
    pub value: String,
    pub kind: String,
}

/// Parse a `watch-events` value.
pub fn delivered(v: &Value) -> Vec<Delivered> {
    let Some(a) = v.as_array() else {
        return vec![];
    };
    a.iter()
        .filter_map(|e| {
            let e = e.as_array()?;
            Some(Delivered {
                revision: e.first()?.as_i64()?,
                key: e.get(1)?.as_str()?.to_owned(),
                value: e.get(2)?.as_str().unwrap_or_default().to_owned(),
                kind: e.get(3)?.as_str().unwrap_or("PUT").to_owned(),
            })
        })
        .collect()
}

/// Tally of anomalies per category, with examples.
#[derive(Default)]
struct Found {
    counts: BTreeMap<&'static str, u64>,
    examples: Vec<String>,
}

impl Found {
    fn add(&mut self, what: &'static str, example: impl FnOnce() -> String) {
        *self.counts.entry(what).or_default() += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(format!("{what}: {}", example()));
        }
    }

    fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// One watcher's view, built from its records.
#[derive(Default)]
struct Watcher {
    /// Revision → (key, value) of what it saw, and when.
    seen: BTreeMap<i64, Vec<(String, String)>>,
    max_seen: i64,
    /// The first session's start (`None`: never opened a watch).
    cover_from: Option<i64>,
    /// Uncovered `[from, to)` ranges (legitimate: after a compacted cancel).
    holes: Vec<(i64, i64)>,
    sessions: u64,
    created: u64,
    events: u64,
    compacted: u64,
    ends: u64,
    unexplained_holes: u64,
    target: Option<i64>,
}

impl Watcher {
    fn covers(&self, r: i64) -> bool {
        self.cover_from.is_some_and(|f| r >= f) && !self.holes.iter().any(|&(a, b)| a <= r && r < b)
    }
}

fn int(v: &Option<Value>, field: &str) -> Option<i64> {
    v.as_ref().and_then(|v| v[field].as_i64())
}

/// Check a `watch` history. `prefix`: the watched range (every `watch` invoke's `key`).
pub fn check(events: &[Event], ops: &[Op]) -> Verdict {
    let mut found = Found::default();
    // Writes: by revision (acknowledged) and by (key, value).
    let mut acked: BTreeMap<i64, (String, String)> = BTreeMap::new();
    let mut writes: HashMap<(String, String), Write> = HashMap::new();
    let mut compacts: Vec<(i64, u64)> = vec![]; // (revision, invoke) of ok/unknown compacts
    for op in ops {
        match op.f.as_str() {
            "put" => {
                let (Some(key), Some(value)) = (
                    op.key.clone(),
                    op.value_in.as_ref().and_then(|v| v.as_str()),
                ) else {
                    continue;
                };
                let revision = if op.kind == Kind::Ok {
                    int(&op.value_out, "revision")
                } else {
                    None
                };
                if let Some(r) = revision {
                    if let Some(prev) = acked.insert(r, (key.clone(), value.to_owned())) {
                        found.add("disagree", || {
                            format!(
                                "two acknowledged puts at revision {r}: {}={} and {key}={value}",
                                prev.0, prev.1
                            )
                        });
                    }
                }
                writes.insert(
                    (key, value.to_owned()),
                    Write {
                        kind: op.kind,
                        revision,
                    },
                );
            }
            "compact" if op.kind != Kind::Fail => {
                if let Some(r) = int(&op.value_in, "revision") {
                    compacts.push((r, op.invoke));
                }
            }
            _ => {}
        }
    }
    let mut prefix: Option<String> = None;
    let mut watchers: BTreeMap<u64, Watcher> = BTreeMap::new();
    // Revision → what some watcher saw there (for cross-watcher checks).
    let mut observed: BTreeMap<i64, (String, String, u64)> = BTreeMap::new();
    let mut revealed = BTreeSet::new();
    let mut legit_compactions = 0u64;
    // Per watcher, while scanning: the current session's start, and a pending compacted
    // resume point.
    let mut cur: HashMap<u64, (i64, Option<i64>)> = HashMap::new();
    for e in events {
        let Process::Client(p) = e.process else {
            continue;
        };
        if !e.f.starts_with("watch") {
            continue;
        }
        let w = watchers.entry(p).or_default();
        let t = ms(e.time);
        match (e.f.as_str(), e.kind) {
            ("watch", Kind::Invoke) => {
                if prefix.is_none() {
                    prefix = e.key.clone();
                }
                let start = int(&e.value, "start_revision").unwrap_or(0).max(1);
                w.sessions += 1;
                let pending = cur.get(&p).and_then(|c| c.1);
                match w.cover_from {
                    None => w.cover_from = Some(start),
                    Some(_) => {
                        let bound = w.max_seen + 1;
                        if start > bound {
                            w.holes.push((bound, start));
                            if pending != Some(start) {
                                w.unexplained_holes += 1;
                            }
                        }
                    }
                }
                // A compacted resume point holds until a session starts there.
                let pending = pending.filter(|c| *c != start);
                cur.insert(p, (start, pending));
            }
            ("watch", Kind::Ok) => w.created += 1,
            ("watch-events", _) => {
                let start = cur.get(&p).map_or(1, |c| c.0);
                for d in delivered(e.value.as_ref().unwrap_or(&Value::Null)) {
                    w.events += 1;
                    let r = d.revision;
                    let dup = w
                        .seen
                        .get(&r)
                        .is_some_and(|v| v.iter().any(|(k, _)| *k == d.key));
                    if dup {
                        found.add("duplicate", || {
                            format!("watcher p{p} got revision {r} ({}) again at {t} ms", d.key)
                        });
                        continue;
                    }
                    if r < w.max_seen {
                        found.add("reorder", || {
                            format!(
                                "watcher p{p} got revision {r} ({}) at {t} ms after revision {}",
                                d.key, w.max_seen
                            )
                        });
                    }
                    if r < start {
                        found.add("early", || {
                            format!(
                                "watcher p{p} got revision {r} at {t} ms from a watch started at {start}"
                            )
                        });
                    }
                    w.seen
                        .entry(r)
                        .or_default()
                        .push((d.key.clone(), d.value.clone()));
                    w.max_seen = w.max_seen.max(r);
                    if prefix.as_ref().is_some_and(|pf| !d.key.starts_with(pf)) {
                        found.add("out-of-range", || {
                            format!("watcher p{p} got {}={} at revision {r}", d.key, d.value)
                        });
                    }
                    // Whose write is it?
                    let kv = (d.key.clone(), d.value.clone());
                    match acked.get(&r) {
                        Some(a) if *a == kv && d.kind == "PUT" => {}
                        Some(a) => found.add("phantom", || {
                            format!(
                                "watcher p{p}: revision {r} is {} {}={}, but the put \
                                 acknowledged at {r} wrote {}={}",
                                d.kind, d.key, d.value, a.0, a.1
                            )
                        }),
                        None => match writes.get(&kv) {
                            Some(wr) if d.kind == "PUT" && wr.kind == Kind::Info => {
                                revealed.insert(r);
                            }
                            Some(wr) => found.add("phantom", || match wr.revision {
                                Some(at) => format!(
                                    "watcher p{p}: {}={} at revision {r}, acknowledged at {at}",
                                    d.key, d.value
                                ),
                                None => format!(
                                    "watcher p{p}: {} {}={} at revision {r}, a put that {}",
                                    d.kind,
                                    d.key,
                                    d.value,
                                    if wr.kind == Kind::Fail {
                                        "failed"
                                    } else {
                                        "was acknowledged without a revision"
                                    }
                                ),
                            }),
                            None => found.add("phantom", || {
                                format!(
                                    "watcher p{p}: {} {}={} at revision {r}: no client wrote it",
                                    d.kind, d.key, d.value
                                )
                            }),
                        },
                    }
                    match observed.get(&r) {
                        Some((k, v, q)) if (k, v) != (&d.key, &d.value) => {
                            found.add("disagree", || {
                                format!(
                                    "revision {r}: watcher p{q} saw {k}={v}, watcher p{p} {}={}",
                                    d.key, d.value
                                )
                            })
                        }
                        Some(_) => {}
                        None => {
                            observed.insert(r, (d.key.clone(), d.value.clone(), p));
                        }
                    }
                }
            }
            ("watch-canceled", _) => {
                let Some(c) = int(&e.value, "compact_revision").filter(|c| *c > 0) else {
                    w.ends += 1;
                    continue;
                };
                w.compacted += 1;
                let start = cur.get(&p).map_or(1, |c| c.0);
                // The client resumes at `c` as told: that hole is the cancel's doing, whether
                // the cancel was right or not.
                if let Some(s) = cur.get_mut(&p) {
                    s.1 = Some(c);
                }
                let asked = compacts.iter().any(|&(r, inv)| r == c && inv <= e.time);
                if asked && start < c {
                    legit_compactions += 1;
                } else {
                    found.add("spurious-compaction", || {
                        format!(
                            "watcher p{p}: watch from {start} cancelled as compacted at {c} \
                             ({t} ms){}",
                            if asked {
                                ""
                            } else {
                                "; no compaction to that revision was requested"
                            }
                        )
                    });
                }
            }
            ("watch-end", _) => w.ends += 1,
            ("watch-target", Kind::Ok) => w.target = int(&e.value, "revision"),
            _ => {}
        }
    }
    let Some(prefix) = prefix else {
        return Verdict::not_applicable("watch", "no watch ops");
    };
    // Lost: covered revisions below the newest seen that this watcher missed.
    let in_range = |k: &str| k.starts_with(prefix.as_str());
    let mut expected: BTreeMap<i64, (String, String, &'static str)> = BTreeMap::new();
    for (r, (k, v)) in &acked {
        if in_range(k) {
            expected.insert(*r, (k.clone(), v.clone(), "acknowledged"));
        }
    }
    for (r, (k, v, _)) in &observed {
        if in_range(k) {
            expected
                .entry(*r)
                .or_insert((k.clone(), v.clone(), "seen by another watcher"));
        }
    }
    let mut per_watcher = serde_json::Map::new();
    let mut tail_total = 0u64;
    let mut unexplained = 0u64;
    for (p, w) in &watchers {
        let mut tail = 0u64;
        for (r, (k, v, why)) in &expected {
            if !w.covers(*r) || w.seen.contains_key(r) {
                continue;
            }
            if *r < w.max_seen {
                found.add("lost", || {
                    format!(
                        "watcher p{p} never got revision {r} ({k}={v}, {why}) but got up to {}",
                        w.max_seen
                    )
                });
            } else if w.target.is_some_and(|t| *r <= t) {
                tail += 1;
            }
        }
        tail_total += tail;
        unexplained += w.unexplained_holes;
        per_watcher.insert(
            format!("p{p}"),
            json!({
                "sessions": w.sessions, "created": w.created, "events": w.events,
                "max_revision_seen": w.max_seen, "target": w.target,
                "stream_ends": w.ends, "compacted_cancels": w.compacted,
                "holes": w.holes, "tail_undelivered": tail,
            }),
        );
    }
    let acked_in_range = acked.values().filter(|(k, _)| in_range(k)).count();
    Verdict::new(
        "watch",
        found.total(),
        found.examples,
        json!({
            "prefix": prefix,
            "anomalies_by_kind": found.counts,
            "acknowledged_puts_in_range": acked_in_range,
            "unknown_outcome_puts_seen": revealed.len(),
            "revisions_delivered": observed.len(),
            "compactions_requested": compacts.len(),
            "compacted_cancels_explained": legit_compactions,
            "tail_undelivered": tail_total,
            "unexplained_holes": unexplained,
            "watchers": per_watcher,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::build::H;
    use crate::checker::pair;

    /// A run: writer p0 puts `w/a` = v1..vn at revisions 10, 20, …; watchers build on it.
    struct Run {
        h: H,
        t: u64,
    }

    impl Run {
        fn new(puts: usize) -> Run {
            let mut r = Run { h: H::new(), t: 1 };
            for i in 1..=puts {
                r.put(0, "w/a", &format!("v{i}"), Some(i as i64 * 10));
            }
            r
        }

        fn tick(&mut self) -> u64 {
            self.t += 1;
            self.t
        }

        /// A put; `rev` None: its outcome is unknown.
        fn put(&mut self, p: u64, key: &str, value: &str, rev: Option<i64>) {
            let t = self.tick();
            self.h.ev(p, Kind::Invoke, "put", key, t).value = Some(json!(value));
            let t = self.tick();
            match rev {
                Some(r) => {
                    self.h.ev(p, Kind::Ok, "put", key, t).value = Some(json!({"revision": r}))
                }
                None => self.h.ev(p, Kind::Info, "put", key, t).error = Some("timeout".into()),
            }
        }

        fn watch(&mut self, p: u64, start: i64) {
            let t = self.tick();
            self.h.ev(p, Kind::Invoke, "watch", "w/", t).value =
                Some(json!({"start_revision": start}));
            let t = self.tick();
            self.h.ev(p, Kind::Ok, "watch", "w/", t);
        }

        /// Events `(revision, key, value)`.
        fn events(&mut self, p: u64, evs: &[(i64, &str, &str)]) {
            let t = self.tick();
            let v: Vec<Value> = evs
                .iter()
                .map(|(r, k, v)| json!([r, k, v, "PUT"]))
                .collect();
            self.h.ev(p, Kind::Ok, "watch-events", "w/", t).value = Some(json!(v));
        }

        /// The events of the acknowledged puts `from..=to` (v-numbers).
        fn puts(&mut self, p: u64, from: usize, to: usize) {
            let v: Vec<(i64, String)> = (from..=to)
                .map(|i| (i as i64 * 10, format!("v{i}")))
                .collect();
            let evs: Vec<(i64, &str, &str)> =
                v.iter().map(|(r, s)| (*r, "w/a", s.as_str())).collect();
            self.events(p, &evs);
        }

        fn end(&mut self, p: u64) {
            let t = self.tick();
            self.h.ev(p, Kind::Info, "watch-end", "w/", t).error = Some("stream broke".into());
        }

        fn check(&self) -> Verdict {
            let ev = self.h.sorted();
            check(&ev, &pair(&ev))
        }
    }

    fn kinds(v: &Verdict) -> Value {
        v.stats["anomalies_by_kind"].clone()
    }

    #[test]
    fn a_clean_run_with_a_resume_passes() {
        let mut r = Run::new(6);
        r.put(0, "x/other", "o1", Some(25)); // outside the prefix: nobody expects it
        r.put(0, "w/a", "u1", None); // unknown outcome, seen at 65
        for p in [1, 2] {
            r.watch(p, 1);
            r.puts(p, 1, 3);
            r.end(p);
            r.watch(p, 31);
            r.puts(p, 4, 6);
            r.events(p, &[(65, "w/a", "u1")]);
        }
        let v = r.check();
        assert_eq!(v.valid, Some(true), "{v:?}");
        assert_eq!(v.stats["unknown_outcome_puts_seen"], 1);
        assert_eq!(v.stats["watchers"]["p1"]["sessions"], 2);
    }

    #[test]
    fn fails_on_a_gap() {
        let mut r = Run::new(4);
        r.watch(1, 1);
        r.puts(1, 1, 2);
        r.puts(1, 4, 4); // 30 missing
        let v = r.check();
        assert_eq!(v.anomalies, 1, "{v:?}");
        assert_eq!(kinds(&v)["lost"], 1);
        assert!(v.examples[0].contains("revision 30"), "{v:?}");
    }

    #[test]
    fn fails_on_a_gap_across_a_resume() {
        // The server resumed from 31 but the watcher asked for 21 (it had seen 20).
        let mut r = Run::new(4);
        r.watch(1, 1);
        r.puts(1, 1, 2);
        r.end(1);
        r.watch(1, 21);
        r.puts(1, 4, 4);
        let v = r.check();
        assert_eq!(kinds(&v)["lost"], 1, "{v:?}");
    }

    #[test]
    fn fails_on_a_duplicate() {
        // A resume that delivers the last revision again (start = last instead of last + 1
        // on the server's side).
        let mut r = Run::new(3);
        r.watch(1, 1);
        r.puts(1, 1, 2);
        r.end(1);
        r.watch(1, 21);
        r.puts(1, 2, 3);
        let v = r.check();
        assert_eq!(kinds(&v)["duplicate"], 1, "{v:?}");
        assert_eq!(kinds(&v)["early"], serde_json::Value::Null);
        assert_eq!(v.valid, Some(false));
    }

    #[test]
    fn fails_on_a_reorder() {
        let mut r = Run::new(3);
        r.watch(1, 1);
        r.puts(1, 1, 1);
        r.puts(1, 3, 3);
        r.puts(1, 2, 2);
        let v = r.check();
        assert_eq!(kinds(&v)["reorder"], 1, "{v:?}");
        assert_eq!(v.anomalies, 1);
    }

    #[test]
    fn fails_on_a_lost_acknowledged_write_another_watcher_saw() {
        // p1 misses an acknowledged write; p2 misses an unknown-outcome write p1 saw.
        let mut r = Run::new(3);
        r.put(0, "w/b", "u", None);
        r.watch(1, 1);
        r.events(1, &[(10, "w/a", "v1"), (15, "w/b", "u"), (30, "w/a", "v3")]);
        r.watch(2, 1);
        r.puts(2, 1, 3);
        let v = r.check();
        assert_eq!(kinds(&v)["lost"], 2, "{v:?}");
        let text = v.examples.join("\n");
        assert!(text.contains("p1 never got revision 20"), "{text}");
        assert!(text.contains("p2 never got revision 15"), "{text}");
        assert!(text.contains("seen by another watcher"), "{text}");
    }

    #[test]
    fn the_tail_after_the_last_event_seen_is_not_a_gap() {
        let mut r = Run::new(3);
        r.watch(1, 1);
        r.puts(1, 1, 2);
        let t = r.tick();
        r.h.ev(1, Kind::Ok, "watch-target", "w/", t).value = Some(json!({"revision": 30}));
        let v = r.check();
        assert_eq!(v.valid, Some(true), "{v:?}");
        assert_eq!(v.stats["tail_undelivered"], 1);
    }

    #[test]
    fn a_watch_from_the_compact_revision_must_not_be_cancelled() {
        // etcd keeps revision c at a compaction to c: a watch from c gets its events. A
        // server that cancels it again sends an etcd client resuming at c round in circles.
        let mut r = Run::new(5);
        let t = r.tick();
        r.h.ev(0, Kind::Invoke, "compact", "", t).value = Some(json!({"revision": 30}));
        let t = r.tick();
        r.h.ev(0, Kind::Ok, "compact", "", t);
        r.watch(1, 1);
        r.puts(1, 1, 1);
        r.end(1);
        for start in [11, 30, 30] {
            r.watch(1, start);
            let t = r.tick();
            r.h.ev(1, Kind::Fail, "watch-canceled", "w/", t).value =
                Some(json!({"compact_revision": 30}));
        }
        let v = r.check();
        assert_eq!(v.stats["compacted_cancels_explained"], 1, "{v:?}");
        assert_eq!(kinds(&v)["spurious-compaction"], 2, "{v:?}");
        assert_eq!(v.stats["unexplained_holes"], 0);
    }

    #[test]
    fn phantoms_out_of_range_and_disagreement() {
        let mut r = Run::new(2);
        r.put(0, "w/f", "failed", None);
        // Make that last put a definite failure.
        if let Some(e) = r.h.events.last_mut() {
            e.kind = Kind::Fail;
        }
        r.put(0, "x/k", "o", Some(40));
        r.watch(1, 1);
        r.events(
            1,
            &[
                (10, "w/a", "v1"),
                (20, "w/a", "v9"), // acked 20 wrote v2
                (30, "w/f", "failed"),
                (40, "x/k", "o"),
                (50, "w/z", "nobody"),
            ],
        );
        r.watch(2, 1);
        r.puts(2, 1, 2);
        let v = r.check();
        let k = kinds(&v);
        assert_eq!(k["phantom"], 3, "{v:?}");
        assert_eq!(k["out-of-range"], 1, "{v:?}");
        assert_eq!(k["disagree"], 1, "{v:?}");
    }

    #[test]
    fn a_compacted_cancel_needs_a_compaction() {
        let build = |compact: bool| {
            let mut r = Run::new(5);
            if compact {
                let t = r.tick();
                r.h.ev(0, Kind::Invoke, "compact", "", t).value = Some(json!({"revision": 40}));
                let t = r.tick();
                r.h.ev(0, Kind::Ok, "compact", "", t);
            }
            r.watch(1, 1);
            r.puts(1, 1, 1);
            r.end(1);
            r.watch(1, 11);
            let t = r.tick();
            r.h.ev(1, Kind::Fail, "watch-canceled", "w/", t).value =
                Some(json!({"compact_revision": 40}));
            r.watch(1, 40);
            r.puts(1, 4, 5);
            r.check()
        };
        let v = build(true);
        assert_eq!(v.valid, Some(true), "{v:?}");
        assert_eq!(v.stats["compacted_cancels_explained"], 1);
        assert_eq!(v.stats["unexplained_holes"], 0);
        let v = build(false);
        assert_eq!(kinds(&v)["spurious-compaction"], 1, "{v:?}");
        assert_eq!(v.stats["unexplained_holes"], 0);
    }
}
