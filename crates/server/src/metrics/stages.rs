//! Where a proposal's time goes: the latency breakdown of sampled proposals on the leader.
//!
//! Every log index gets timestamps as it passes this node's stages — written into the log,
//! its segment fsynced, the hard state recorded, each follower's acknowledgement (from the
//! network observer), apply begun (the entry is committed), applied — in a ring of recent
//! indexes, stamped by the storage and network observers (atomics, no lock). One proposal in
//! [`SAMPLE_EVERY`] also carries a [`Trace`] from the moment it reaches the proposer: the node
//! stamps when its batch closed and when the Raft core answered, reads its entry's stamps
//! from the ring by the index the core gave it, and adds when its caller got the answer.
//! Each stage's time since the proposal was queued goes into a histogram, served as JSON by
//! the metrics listener at `/debug/stages` (`?reset=1` empties it after reading), which
//! `bench/run.sh` summarises per cell.
//!
//! A diagnostic, not a promise: a stamp can be missing (its ring slot reused by a later
//! index under load, a follower that acknowledged with a later append) and the sample then
//! lacks that stage; it never fails a proposal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use fenced_raft_types::NodeId;
use hdrhistogram::Histogram;
use serde::Serialize;

/// One proposal in this many is traced.
pub const SAMPLE_EVERY: u64 = 8;
/// Recent log indexes kept.
const RING: u64 = 1024;
/// Followers told apart (by node id modulo this); more share slots.
const PEERS: usize = 8;

/// What the ring records of one index on this node.
#[derive(Clone, Copy)]
enum At {
    Written = 0,
    Synced = 1,
    Recorded = 2,
    Applying = 3,
    Applied = 4,
}
const AT: usize = 5;

#[derive(Default)]
struct Slot {
    index: AtomicU64,
    /// Nanoseconds since the epoch (+1, so 0 is "not yet"), per [`At`].
    at: [AtomicU64; AT],
    acks: [AtomicU64; PEERS],
}

/// The stages, in the order a proposal passes them; their times are since it was queued.
const STAGES: [&str; 11] = [
    "batched",  // its batch closed: the proposer took it (propose_entry began)
    "written",  // the entry written into the leader's log (page cache)
    "synced",   // the leader's segment fdatasync done: the leader's own acknowledgement
    "recorded", // the leader's hard state records it (after its own acknowledgement)
    "ack1",     // the first follower's acknowledgement arrived
    "ack2",     // the second follower's
    "applying", // the leader applies it: committed (and the apply task woke)
    "applied",  // applied
    "answered", // the Raft core's answer reached the proposer
    "returned", // the caller has its answer (then only encoding and the socket write remain)
    "total",    // = returned, for the summary's last line
];

/// The follower's stages of one `AppendEntries`, since its handler received it.
const FOLLOWER_STAGES: [&str; 3] = [
    "written",  // the entries written into this follower's log (its Raft core took them)
    "synced",   // its segment fdatasync done
    "answered", // its Raft core answered: the acknowledgement leaves (encoding and sending left)
];

/// The stage tracer of one node. Cheap to share (`Arc`).
pub struct Stages {
    epoch: Instant,
    ring: Box<[Slot]>,
    /// The highest index stamped per [`At`] that is stamped by "up to" reports, and per peer.
    synced: AtomicU64,
    recorded: AtomicU64,
    acked: [AtomicU64; PEERS],
    sampled: AtomicU64,
    hist: Mutex<Hists>,
    /// Appends answered as a follower, and their stages.
    appends: AtomicU64,
    follower: Mutex<Hists>,
}

struct Hists {
    samples: u64,
    by_stage: Vec<Histogram<u64>>,
}

impl Hists {
    fn new(stages: usize) -> Hists {
        Hists {
            samples: 0,
            by_stage: (0..stages)
                .map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds"))
                .collect(),
        }
    }

    fn record(&mut self, values: Vec<Option<u64>>) {
        self.samples += 1;
        for (hist, v) in self.by_stage.iter_mut().zip(values) {
            if let Some(v) = v {
                let _ = hist.record(v.max(1));
            }
        }
    }

    fn summary(&self, names: &[&'static str]) -> Vec<StageSummary> {
        names
            .iter()
            .zip(&self.by_stage)
            .map(|(stage, hist)| StageSummary {
                stage,
                count: hist.len(),
                p50_us: hist.value_at_quantile(0.5),
                p99_us: hist.value_at_quantile(0.99),
            })
            .collect()
    }
}

/// A sampled proposal on its way ([`Stages::sample`]).
#[derive(Debug)]
pub struct Trace {
    queued: Instant,
    inner: Mutex<TraceInner>,
}

#[derive(Debug, Default)]
struct TraceInner {
    batched: Option<Instant>,
    answered: Option<Instant>,
    index: Option<u64>,
}

impl Trace {
    /// Its batch closed.
    pub fn batched(&self) {
        self.lock().batched.get_or_insert_with(Instant::now);
    }

    /// The Raft core answered: its entry is `index`.
    pub fn answered(&self, index: u64) {
        let mut t = self.lock();
        t.answered = Some(Instant::now());
        t.index = Some(index);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TraceInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One stage's summary, as `/debug/stages` serves it.
#[derive(Debug, Serialize)]
pub struct StageSummary {
    pub stage: &'static str,
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// What `/debug/stages` serves.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub samples: u64,
    pub sample_every: u64,
    /// The leader's stages of traced proposals, since each was queued.
    pub stages: Vec<StageSummary>,
    /// Appends this node answered as a follower (one in `sample_every`), since each arrived.
    pub follower_samples: u64,
    pub follower_stages: Vec<StageSummary>,
}

impl Default for Stages {
    fn default() -> Self {
        Stages::new()
    }
}

impl Stages {
    pub fn new() -> Stages {
        Stages {
            epoch: Instant::now(),
            ring: (0..RING).map(|_| Slot::default()).collect(),
            synced: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            acked: Default::default(),
            sampled: AtomicU64::new(0),
            hist: Mutex::new(Hists::new(STAGES.len())),
            appends: AtomicU64::new(0),
            follower: Mutex::new(Hists::new(FOLLOWER_STAGES.len())),
        }
    }

    /// The ring's stamp of an instant: nanoseconds since the epoch, + 1 (0 is "not yet").
    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
    }

    fn now(&self) -> u64 {
        self.ns(Instant::now())
    }

    /// Microseconds from `from` to ring stamp `stamp`; `None` if there is none (0).
    fn us_after(&self, from: Instant, stamp: u64) -> Option<u64> {
        (stamp != 0).then(|| stamp.saturating_sub(self.ns(from)) / 1000)
    }

    /// `first..=last`, cut to the indexes the ring holds.
    fn recent(first: u64, last: u64) -> std::ops::RangeInclusive<u64> {
        first.max(last.saturating_sub(RING - 1))..=last
    }

    /// The indexes after the last one reported through `upto` (which becomes `last`), up to
    /// `last`; just `last` if the reports went backwards (a truncated log).
    fn newly(upto: &AtomicU64, last: u64) -> std::ops::RangeInclusive<u64> {
        let prev = upto.swap(last, Ordering::Relaxed);
        Self::recent(if prev < last { prev + 1 } else { last }, last)
    }

    fn slot(&self, index: u64) -> Option<&Slot> {
        let slot = &self.ring[(index % RING) as usize];
        (slot.index.load(Ordering::Relaxed) == index).then_some(slot)
    }

    fn stamp(&self, index: u64, at: At, now: u64) {
        if let Some(slot) = self.slot(index) {
            let _ =
                slot.at[at as usize].compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Stamp `at` on every index after the last one so stamped (`upto`) through `last`.
    fn stamp_upto(&self, upto: &AtomicU64, last: u64, at: At) {
        let now = self.now();
        for index in Self::newly(upto, last) {
            self.stamp(index, at, now);
        }
    }

    /// Entries `first..=last` were written into this node's log.
    pub fn written(&self, first: u64, last: u64) {
        let now = self.now();
        for index in Self::recent(first, last) {
            let slot = &self.ring[(index % RING) as usize];
            slot.index.store(index, Ordering::Relaxed);
            for (i, a) in slot.at.iter().enumerate() {
                a.store(
                    if i == At::Written as usize { now } else { 0 },
                    Ordering::Relaxed,
                );
            }
            for a in &slot.acks {
                a.store(0, Ordering::Relaxed);
            }
        }
    }

    pub fn synced(&self, last: u64) {
        self.stamp_upto(&self.synced, last, At::Synced);
    }

    pub fn recorded(&self, last: u64) {
        self.stamp_upto(&self.recorded, last, At::Recorded);
    }

    pub fn applying(&self, index: u64) {
        self.stamp(index, At::Applying, self.now());
    }

    pub fn applied(&self, index: u64) {
        self.stamp(index, At::Applied, self.now());
    }

    /// `peer` acknowledged the entries through `last`.
    pub fn acked(&self, peer: NodeId, last: u64) {
        let p = (peer % PEERS as u64) as usize;
        let now = self.now();
        for index in Self::newly(&self.acked[p], last) {
            if let Some(slot) = self.slot(index) {
                let _ = slot.acks[p].compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
    }

    /// A trace for one proposal in [`SAMPLE_EVERY`], starting now (it was just queued).
    pub fn sample(&self) -> Option<Arc<Trace>> {
        let n = self.sampled.fetch_add(1, Ordering::Relaxed);
        n.is_multiple_of(SAMPLE_EVERY).then(|| {
            Arc::new(Trace {
                queued: Instant::now(),
                inner: Mutex::new(TraceInner::default()),
            })
        })
    }

    /// The caller got its answer: put the trace's stages into the histograms. A trace whose
    /// proposal got no entry (refused, failed) is dropped.
    pub fn finish(&self, trace: &Trace) {
        let returned = Instant::now();
        let t = trace.lock();
        let Some(index) = t.index else { return };
        let since = |i: Instant| i.saturating_duration_since(trace.queued).as_micros() as u64;
        let ring_us = |ns: u64| self.us_after(trace.queued, ns);
        let mut values: Vec<Option<u64>> = vec![None; STAGES.len()];
        values[0] = t.batched.map(since);
        if let Some(slot) = self.slot(index) {
            for (i, at) in [
                (1, At::Written),
                (2, At::Synced),
                (3, At::Recorded),
                (6, At::Applying),
                (7, At::Applied),
            ] {
                values[i] = ring_us(slot.at[at as usize].load(Ordering::Relaxed));
            }
            let mut acks: Vec<u64> = slot
                .acks
                .iter()
                .filter_map(|a| ring_us(a.load(Ordering::Relaxed)))
                .collect();
            acks.sort_unstable();
            values[4] = acks.first().copied();
            values[5] = acks.get(1).copied();
        }
        values[8] = t.answered.map(since);
        values[9] = Some(since(returned));
        values[10] = values[9];
        drop(t);
        self.hist
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(values);
    }

    /// As a follower, the append of entries `first..=last` that arrived at `received` is
    /// answered: one in [`SAMPLE_EVERY`] goes into the follower's histograms.
    pub fn follower_answered(&self, first: u64, last: u64, received: Instant) {
        let n = self.appends.fetch_add(1, Ordering::Relaxed);
        if !n.is_multiple_of(SAMPLE_EVERY) {
            return;
        }
        let answered = received.elapsed().as_micros() as u64;
        let stage = |index: u64, at: At| {
            let slot = self.slot(index)?;
            self.us_after(received, slot.at[at as usize].load(Ordering::Relaxed))
        };
        // Written: when the first of them was; synced: when the last of them was.
        let written = stage(first, At::Written);
        let synced = stage(last, At::Synced);
        self.follower
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(vec![written, synced, Some(answered)]);
    }

    /// The stages' p50 and p99 since the last reset; `reset`: start over after reading.
    pub fn summary(&self, reset: bool) -> Summary {
        let mut h = self.hist.lock().unwrap_or_else(PoisonError::into_inner);
        let mut f = self.follower.lock().unwrap_or_else(PoisonError::into_inner);
        let summary = Summary {
            samples: h.samples,
            sample_every: SAMPLE_EVERY,
            stages: h.summary(&STAGES),
            follower_samples: f.samples,
            follower_stages: f.summary(&FOLLOWER_STAGES),
        };
        if reset {
            *h = Hists::new(STAGES.len());
            *f = Hists::new(FOLLOWER_STAGES.len());
        }
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next proposal that is traced.
    fn traced(s: &Stages) -> Arc<Trace> {
        std::iter::repeat_with(|| s.sample())
            .flatten()
            .next()
            .expect("a sample")
    }

    #[test]
    fn a_traced_proposal_gets_every_stage_its_index_passed() {
        let s = Stages::new();
        let trace = traced(&s);
        trace.batched();
        s.written(40, 42);
        s.synced(42);
        s.recorded(42);
        s.acked(2, 41);
        s.acked(3, 42);
        s.applying(41);
        s.applied(41);
        trace.answered(41);
        s.finish(&trace);
        let sum = s.summary(true);
        assert_eq!(sum.samples, 1);
        for st in &sum.stages {
            assert_eq!(st.count, 1, "stage {}", st.stage);
        }
        assert_eq!(s.summary(false).samples, 0, "reset");
    }

    #[test]
    fn a_followers_append_gets_its_stages() {
        let s = Stages::new();
        let received = Instant::now();
        s.written(7, 9);
        s.synced(9);
        s.follower_answered(7, 9, received);
        // Only one in SAMPLE_EVERY is recorded.
        for _ in 1..SAMPLE_EVERY {
            s.follower_answered(7, 9, received);
        }
        let sum = s.summary(false);
        assert_eq!(sum.follower_samples, 1);
        assert!(sum.follower_stages.iter().all(|st| st.count == 1));
        assert_eq!(sum.samples, 0);
    }

    #[test]
    fn a_reused_slot_leaves_the_stage_out() {
        let s = Stages::new();
        let trace = traced(&s);
        s.written(5, 5);
        s.written(5 + RING, 5 + RING);
        trace.answered(5);
        s.finish(&trace);
        let sum = s.summary(false);
        let count = |name: &str| {
            sum.stages
                .iter()
                .find(|x| x.stage == name)
                .map(|x| x.count)
                .expect(name)
        };
        assert_eq!(count("written"), 0);
        assert_eq!(count("total"), 1);
    }
}
