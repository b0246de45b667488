//! A node's clocks ([`NodeClock`]) and the leader's log clock ([`LeaderClock`],
//! docs/architecture.md, "Rules of the core": log time).
//!
//! Log time is stamped by the leader as *the log time when it took office + its monotonic
//! clock's elapsed time since then*, never its wall clock. A wall-clock jump on any node can
//! then neither shorten nor lengthen a lease, and the time an election takes is not counted
//! (leases stretch by the failover time: the safe direction). The very first leader of a new
//! cluster anchors log time to Unix time, so log time reads as Unix milliseconds.
//!
//! A leader continues from the *committed* log time it applied when it took office, never
//! from times it stamped in an earlier term. Those may never have been committed: a leader
//! cut off in a minority keeps stamping while the majority, leaderless for a while, holds log
//! time still. Continuing from them would run log time ahead of what the majority's leases were
//! granted at, and expire them early (found by the simulator, docs/simulation.md). The state
//! machine keeps the time it applies from going back (`now = max(previous now, entry time)`),
//! so a lower stamp is harmless.
//!
//! A node reads time only through tokio's clock or its [`NodeClock`] (docs/architecture.md,
//! "Seams for the simulator"): production passes [`NodeClock::real`], a simulator a
//! [`SimClock`] per node, whose wall clock it can step and whose rate it can drift.
//!
//! **Test-only hook**: if the environment variable `FENCED_TEST_CLOCK_OFFSET_FILE`
//! ([`crate::config::TEST_CLOCK_OFFSET_ENV`], read when the node is configured) names a file
//! holding a signed integer, this node's wall clock reads that many milliseconds off
//! (re-read at every reading). The fault-injection harness (`jepsen/`, clock nemesis) steps
//! it exactly like it steps Redis' clock. Since only the first leader of a new cluster reads
//! the wall clock, a step changes nothing else — which is the point the harness checks.
//! Never set it in production.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// A node's clocks: a monotonic reading (for elapsed times, such as the leader's time in
/// office) and a wall reading (Unix ms). Cheap to clone; clones read the same clock.
#[derive(Clone, Debug)]
pub struct NodeClock {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    Real(Arc<Real>),
    Sim(SimClock),
}

#[derive(Debug)]
struct Real {
    /// Where the monotonic reading counts from.
    origin: Instant,
    /// The test-only wall-clock offset file (module docs).
    offset_file: Option<PathBuf>,
}

impl NodeClock {
    /// The real clocks: tokio's monotonic clock (the OS's, or a paused runtime's) and the
    /// system's wall clock, read `offset_file`'s milliseconds off if there is one (the
    /// test-only hook of the module docs; `None` in production).
    pub fn real(offset_file: Option<PathBuf>) -> NodeClock {
        NodeClock {
            source: Source::Real(Arc::new(Real {
                origin: Instant::now(),
                offset_file,
            })),
        }
    }

    /// Monotonic time since this clock was made, as this node counts it: never goes back.
    pub fn monotonic(&self) -> Duration {
        match &self.source {
            Source::Real(r) => Instant::now().saturating_duration_since(r.origin),
            Source::Sim(s) => s.lock().monotonic(Instant::now()),
        }
    }

    /// The wall clock in Unix milliseconds (may jump either way).
    pub fn unix_ms(&self) -> u64 {
        match &self.source {
            Source::Real(r) => {
                let real = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                real.saturating_add_signed(r.offset_file.as_ref().map_or(0, test_offset_ms))
            }
            Source::Sim(s) => s.lock().unix_ms(Instant::now()),
        }
    }
}

/// The test-only wall-clock offset in ms: 0 unless `file` is readable and holds a signed
/// integer. Re-read at every reading: the harness steps it while the node runs.
fn test_offset_ms(file: &PathBuf) -> i64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or(0)
}

/// A simulated node clock, driven by tokio's (paused) clock and controlled by a simulator:
/// its oscillator runs `1 + ppm / 1e6` times as fast as tokio's clock (the rate can change at
/// any time; the reading never goes back), and its wall clock is the oscillator's reading
/// plus a start time plus an offset the simulator can jump either way. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SimClock {
    inner: Arc<Mutex<SimState>>,
}

#[derive(Debug)]
struct SimState {
    start_unix_ms: u64,
    wall_offset_ms: i64,
    ppm: i64,
    /// The monotonic reading was `anchor_reading` at tokio time `anchor`; since then it
    /// advances at the current rate.
    anchor: Instant,
    anchor_reading: Duration,
}

impl SimState {
    fn monotonic(&self, now: Instant) -> Duration {
        let real = now.saturating_duration_since(self.anchor).as_nanos();
        // ppm >= -1e6: the rate is never negative.
        let scaled = real * (1_000_000 + self.ppm) as u128 / 1_000_000;
        self.anchor_reading + Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
    }

    fn unix_ms(&self, now: Instant) -> u64 {
        let elapsed = self.monotonic(now).as_millis() as u64;
        self.start_unix_ms
            .saturating_add(elapsed)
            .saturating_add_signed(self.wall_offset_ms)
    }
}

impl SimClock {
    /// A clock whose wall reads `start_unix_ms` now, with no drift and no offset.
    pub fn new(start_unix_ms: u64) -> SimClock {
        SimClock {
            inner: Arc::new(Mutex::new(SimState {
                start_unix_ms,
                wall_offset_ms: 0,
                ppm: 0,
                anchor: Instant::now(),
                anchor_reading: Duration::ZERO,
            })),
        }
    }

    /// The node clock to give the node (reads this simulated clock).
    pub fn node_clock(&self) -> NodeClock {
        NodeClock {
            source: Source::Sim(self.clone()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Step the wall clock by `delta_ms` (either way); the monotonic reading is unaffected.
    pub fn jump_wall(&self, delta_ms: i64) {
        let mut s = self.lock();
        s.wall_offset_ms = s.wall_offset_ms.saturating_add(delta_ms);
    }

    /// The wall clock's offset from the oscillator (the sum of the jumps).
    pub fn wall_offset_ms(&self) -> i64 {
        self.lock().wall_offset_ms
    }

    /// Run the oscillator at `1 + ppm / 1e6` times tokio's rate from now on (`ppm` below
    /// -1,000,000 counts as -1,000,000: a stopped clock). The reading continues from where it
    /// is: it never goes back.
    pub fn set_drift_ppm(&self, ppm: i64) {
        let now = Instant::now();
        let mut s = self.lock();
        s.anchor_reading = s.monotonic(now);
        s.anchor = now;
        s.ppm = ppm.max(-1_000_000);
    }

    /// The oscillator's current drift in parts per million.
    pub fn drift_ppm(&self) -> i64 {
        self.lock().ppm
    }
}

#[derive(Debug)]
struct Office {
    term: u64,
    base_ms: u64,
    /// The node clock's monotonic reading when this node took office.
    since: Duration,
}

/// The leader's log clock (module docs), over its node's [`NodeClock`].
#[derive(Debug)]
pub struct LeaderClock {
    clock: NodeClock,
    inner: Mutex<(Option<Office>, u64)>,
}

impl LeaderClock {
    pub fn new(clock: NodeClock) -> Self {
        LeaderClock {
            clock,
            inner: Mutex::default(),
        }
    }

    /// The node clock this log clock reads.
    pub fn node_clock(&self) -> &NodeClock {
        &self.clock
    }

    /// The log time for an entry proposed now by the leader of `term`. `applied_now` is the
    /// state machine's log time, read only when the term changes (taking office). Never
    /// smaller than a time this node stamped before in the same term; a new term starts
    /// from `applied_now` (module docs).
    pub fn stamp(&self, term: u64, applied_now: impl FnOnce() -> u64) -> u64 {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (office, last) = &mut *guard;
        let t = self.read(office, last, term, applied_now);
        *last = (*last).max(t);
        *last
    }

    /// Whether the clock has anchored for `term` (stamped or peeked in it).
    pub fn anchored(&self, term: u64) -> bool {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.as_ref().is_some_and(|o| o.term == term)
    }

    /// The log time now, without recording it.
    pub fn peek(&self, term: u64, applied_now: impl FnOnce() -> u64) -> u64 {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (office, last) = &mut *guard;
        self.read(office, last, term, applied_now).max(*last)
    }

    /// The log time now in `term`; taking office (a new term) forgets `last`, the largest
    /// time stamped in the previous one.
    fn read(
        &self,
        office: &mut Option<Office>,
        last: &mut u64,
        term: u64,
        applied_now: impl FnOnce() -> u64,
    ) -> u64 {
        let current = match office {
            Some(o) if o.term == term => o,
            _ => {
                *last = 0;
                let base = match applied_now() {
                    0 => self.clock.unix_ms(),
                    t => t,
                };
                office.insert(Office {
                    term,
                    base_ms: base,
                    since: self.clock.monotonic(),
                })
            }
        };
        let in_office = self.clock.monotonic().saturating_sub(current.since);
        current.base_ms + in_office.as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> NodeClock {
        NodeClock::real(None)
    }

    fn now_unix_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    fn sleep_ms(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[test]
    fn a_new_term_continues_from_the_applied_time_not_from_old_stamps() {
        let c = LeaderClock::new(real());
        let a = c.stamp(1, || 10_000);
        assert!((10_000..10_100).contains(&a));
        // Term 1's stamps may never have been committed (a leader cut off in a minority):
        // term 2 continues from the committed time it applied, below them.
        let b = c.stamp(2, || 5_000);
        assert!((5_000..5_100).contains(&b), "{b}");
        assert!(c.peek(2, || panic!("re-read")) < a);
        // The same term does not re-read the applied time, and never goes back.
        let d = c.stamp(2, || panic!("re-read"));
        assert!(d >= b);
        assert!(c.anchored(2) && !c.anchored(3));
    }

    #[test]
    fn test_offset_file_steps_the_wall_clock_only() {
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("offset");
        std::fs::write(&f, "-86400000\n").expect("write");
        // The file belongs to this node's clock alone (no process-wide setting).
        let clock = NodeClock::real(Some(f.clone()));
        let skewed = clock.unix_ms();
        assert!(now_unix_ms() - skewed >= 86_399_000, "{skewed}");
        assert!(real().unix_ms() + 1_000 > now_unix_ms());
        // A fresh cluster's first leader anchors to the skewed wall clock ...
        let c = LeaderClock::new(clock.clone());
        let a = c.stamp(1, || 0);
        assert!(a + 1_000 > skewed && a < skewed + 1_000, "{a} {skewed}");
        // ... and, once in office, keeps counting monotonic time whatever the file says,
        // which is still re-read at every wall reading.
        std::fs::write(&f, "99999999").expect("write");
        assert!(clock.unix_ms() > now_unix_ms() + 99_000_000);
        assert!(c.stamp(1, || 0) - a < 1_000);
    }

    #[test]
    fn fresh_cluster_anchors_to_unix_time() {
        let c = LeaderClock::new(real());
        assert!(c.stamp(1, || 0) > 1_600_000_000_000);
    }

    #[test]
    fn a_drifting_clock_stretches_or_shrinks_log_time_and_never_goes_back() {
        let sim = SimClock::new(1_700_000_000_000);
        let c = LeaderClock::new(sim.node_clock());
        // Twice as fast: 100 ms of tokio time count at least 200 in office.
        sim.set_drift_ppm(1_000_000);
        let outer = std::time::Instant::now();
        let a = c.stamp(1, || 10_000);
        let inner = std::time::Instant::now();
        sleep_ms(100);
        let b = c.stamp(1, || panic!("re-read"));
        let (short, long) = (inner.elapsed(), outer.elapsed());
        let in_office = b - a;
        assert!(
            in_office + 1 >= 2 * short.as_millis() as u64,
            "{in_office} {short:?}"
        );
        assert!(
            in_office <= 2 * long.as_millis() as u64 + 1,
            "{in_office} {long:?}"
        );
        // Stopped (ppm -1e6): the reading holds where it was, not a millisecond back.
        sim.set_drift_ppm(-1_000_000);
        let held = c.peek(1, || panic!("re-read"));
        assert!(held >= b);
        sleep_ms(20);
        assert_eq!(c.peek(1, || panic!("re-read")), held);
        // Half speed from there on: 100 ms count about 50.
        sim.set_drift_ppm(-500_000);
        assert_eq!(sim.drift_ppm(), -500_000);
        let started = std::time::Instant::now();
        sleep_ms(100);
        let d = c.stamp(1, || panic!("re-read"));
        let took = started.elapsed().as_millis() as u64;
        assert!(
            d - held + 1 >= 50 && d - held <= took / 2 + 1,
            "{} {took}",
            d - held
        );
    }

    #[test]
    fn a_wall_jump_moves_the_wall_clock_not_log_time() {
        let sim = SimClock::new(1_700_000_000_000);
        let clock = sim.node_clock();
        let wall = clock.unix_ms();
        assert!((1_700_000_000_000..1_700_000_001_000).contains(&wall));
        // A fresh cluster anchors to the wall clock.
        let c = LeaderClock::new(clock.clone());
        let a = c.stamp(1, || 0);
        assert!(a >= wall && a < wall + 1_000);
        // The wall jumps a day ahead, then two back: log time keeps counting in office.
        sim.jump_wall(86_400_000);
        assert!(clock.unix_ms() >= wall + 86_400_000);
        let b = c.stamp(1, || 0);
        assert!(b >= a && b - a < 1_000, "{a} {b}");
        sim.jump_wall(-2 * 86_400_000);
        assert_eq!(sim.wall_offset_ms(), -86_400_000);
        assert!(clock.unix_ms() < wall);
        let d = c.stamp(1, || 0);
        assert!(d >= b && d - a < 1_000, "{a} {d}");
        // The monotonic reading never saw the jumps.
        assert!(clock.monotonic() < Duration::from_secs(60));
    }
}
