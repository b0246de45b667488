//! The faults of a run, drawn from its seed: partitions (symmetric, one-way, majority and
//! minority, a bridge), message loss, duplication and delay, crashes with restarts after any
//! delay (at once included), process pauses, and clock faults (wall-clock jumps; monotonic
//! rate drift within the documented bound), and disk faults ([`crate::disk`]: power losses,
//! fsync failures, a full disk, a rotten byte). Several may overlap. Each is written to the trace
//! when it starts and ends; [`heal`] ends them all.

use std::rc::Rc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::net::Noise;
use crate::world::Cluster;

/// Which faults a run may draw.
#[derive(Clone, Debug)]
pub struct Faults {
    pub partitions: bool,
    pub noise: bool,
    pub crashes: bool,
    pub pauses: bool,
    pub clocks: bool,
    pub disk: bool,
    /// A node's power flickers: lost in the middle of its writes, again among its first
    /// writes after the restart ([`crate::flicker`]). Not in `all` yet.
    pub flicker: bool,
    /// A new leader's blank reaches one follower only with the requests after it, the
    /// power going in that append ([`crate::holdback`]). Not in `all`.
    pub holdback: bool,
    /// Membership changes: a member (maybe the leader) replaced by a new one (`membership`).
    pub membership: bool,
    /// A member's data dir wiped and the node restarted unchanged, then replaced
    /// (`membership`); with `restore`, rarely a majority.
    pub wipes: bool,
    /// A backup taken during the faults; at their end, sometimes (always after a majority
    /// was wiped), every member restored from it (`membership`).
    pub restore: bool,
    /// Mean gap between two faults starting, ms.
    pub every_ms: u64,
    /// Clock-rate drift bound, ppm (the README's "lease bound" assumes ≤ 100).
    pub drift_ppm: i64,
    /// Longest a fault lasts, ms (at least 201). Past `PROPOSE_TIMEOUT` (5 s) an outage
    /// outlasts a node's own retries, so its clients see refusals and unknown outcomes.
    pub max_ms: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            partitions: true,
            noise: true,
            crashes: true,
            pauses: true,
            clocks: true,
            disk: true,
            flicker: false,
            holdback: false,
            membership: false,
            wipes: false,
            restore: false,
            every_ms: 1_500,
            drift_ppm: 100,
            max_ms: 4_000,
        }
    }
}

impl Faults {
    /// Every fault, the operator's included (`--faults all`). [`Faults::default`] leaves the
    /// operator's out: the test suite's seeds run with it.
    pub fn all() -> Faults {
        Faults {
            membership: true,
            wipes: true,
            restore: true,
            ..Faults::default()
        }
    }

    pub fn none() -> Faults {
        Faults {
            partitions: false,
            noise: false,
            crashes: false,
            pauses: false,
            clocks: false,
            disk: false,
            flicker: false,
            holdback: false,
            membership: false,
            wipes: false,
            restore: false,
            ..Faults::default()
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Partition,
    Noise,
    Crash,
    Pause,
    Clock,
    Disk,
    Flicker,
    Holdback,
    Membership,
    Wipe,
}

/// Inject faults until `until` (simulated), each fault ending by itself.
pub async fn run(cluster: Cluster, faults: Faults, seed: u64, until: tokio::time::Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kinds = Vec::new();
    for (on, k) in [
        (faults.partitions, Kind::Partition),
        (faults.noise, Kind::Noise),
        (faults.crashes, Kind::Crash),
        (faults.pauses, Kind::Pause),
        (faults.clocks, Kind::Clock),
        (faults.disk, Kind::Disk),
        (faults.flicker, Kind::Flicker),
        (faults.holdback, Kind::Holdback),
        (faults.membership, Kind::Membership),
        (faults.wipes, Kind::Wipe),
    ] {
        if on {
            kinds.push(k);
        }
    }
    if kinds.is_empty() {
        return;
    }
    let faults = Rc::new(faults);
    loop {
        let gap = rng.gen_range(faults.every_ms / 4..=faults.every_ms * 7 / 4);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        if tokio::time::Instant::now() >= until {
            return;
        }
        let kind = *kinds.choose(&mut rng).unwrap_or(&Kind::Noise);
        let sub = StdRng::seed_from_u64(rng.gen());
        tokio::task::spawn_local(one(cluster.clone(), faults.clone(), kind, sub));
    }
}

async fn one(cluster: Cluster, faults: Rc<Faults>, kind: Kind, mut rng: StdRng) {
    let ids = cluster.ids();
    let trace = cluster.trace().clone();
    let net = cluster.net().clone();
    let lasting = Duration::from_millis(rng.gen_range(200..faults.max_ms.max(201)));
    match kind {
        Kind::Membership => crate::membership::change(cluster, rng).await,
        Kind::Wipe => {
            let majority = faults.restore && rng.gen_bool(0.25);
            crate::membership::wipe(cluster, rng, majority).await
        }
        Kind::Partition => {
            let mut shuffled = ids.clone();
            shuffled.shuffle(&mut rng);
            let shape = rng.gen_range(0..4);
            let minority = rng.gen_range(1..=((ids.len() - 1) / 2).max(1));
            let (a, b) = shuffled.split_at(minority);
            let mut links = Vec::new();
            let what = match shape {
                // One-way: a's messages to b are lost, b's to a arrive.
                0 => {
                    for x in a {
                        for y in b {
                            links.push((*x, *y));
                        }
                    }
                    format!("one-way cut {a:?} -> {b:?}")
                }
                // A bridge (five nodes or more): two halves that only one node hears both of.
                1 if ids.len() >= 5 => {
                    let bridge = shuffled[0];
                    let (l, r) = shuffled[1..].split_at((ids.len() - 1) / 2);
                    for x in l {
                        for y in r {
                            links.push((*x, *y));
                            links.push((*y, *x));
                        }
                    }
                    format!("bridge n{bridge} between {l:?} and {r:?}")
                }
                _ => {
                    for x in a {
                        for y in b {
                            links.push((*x, *y));
                            links.push((*y, *x));
                        }
                    }
                    format!("partition {a:?} | {b:?}")
                }
            };
            trace.line("nemesis", format!("{what} for {lasting:?}"));
            net.cut(&links);
            tokio::time::sleep(lasting).await;
            net.uncut(&links);
            trace.line("nemesis", format!("healed {what}"));
        }
        Kind::Noise => {
            let noise = Noise {
                loss: rng.gen_range(0.0..0.3),
                dup: rng.gen_range(0.0..0.2),
                delay_ms: (0.05, rng.gen_range(0.5..60.0)),
            };
            trace.line("nemesis", format!("noise {noise:?} for {lasting:?}"));
            net.set_noise(noise);
            tokio::time::sleep(lasting).await;
            net.set_noise(Noise::QUIET);
            trace.line("nemesis", "noise over");
        }
        Kind::Crash => {
            let id = *ids.choose(&mut rng).unwrap_or(&1);
            if !cluster.is_up(id) {
                return;
            }
            cluster.crash(id).await;
            // At once, soon, or after a while.
            let down = match rng.gen_range(0..3) {
                0 => Duration::ZERO,
                1 => Duration::from_millis(rng.gen_range(1..300)),
                _ => lasting,
            };
            tokio::time::sleep(down).await;
            cluster.start(id).await;
        }
        Kind::Pause => {
            let id = *ids.choose(&mut rng).unwrap_or(&1);
            if cluster.net().is_paused(id) {
                return;
            }
            cluster.pause(id, true);
            tokio::time::sleep(lasting).await;
            cluster.pause(id, false);
        }
        Kind::Disk => crate::disk::one(cluster, rng, lasting).await,
        Kind::Flicker => crate::flicker::one(cluster, rng, lasting).await,
        Kind::Holdback => crate::holdback::one(cluster, rng, lasting).await,
        Kind::Clock => {
            let id = *ids.choose(&mut rng).unwrap_or(&1);
            let Some(clock) = cluster.clock(id) else {
                return;
            };
            if rng.gen_bool(0.5) {
                let jump = rng.gen_range(-3_600_000i64..3_600_000);
                trace.line("nemesis", format!("n{id} wall clock jumps {jump} ms"));
                clock.jump_wall(jump);
            } else {
                let ppm = rng.gen_range(-faults.drift_ppm..=faults.drift_ppm);
                trace.line("nemesis", format!("n{id} clock rate drifts {ppm} ppm"));
                clock.set_drift_ppm(ppm);
            }
        }
    }
}

/// End every fault: heal the network, resume paused nodes, restart crashed ones.
pub async fn heal(cluster: &Cluster) {
    cluster.net().heal();
    crate::disk::heal(cluster).await;
    for id in cluster.all_ids() {
        if cluster.net().is_paused(id) {
            cluster.pause(id, false);
        }
        if !cluster.is_up(id) {
            cluster.start(id).await;
        }
    }
    cluster.trace().line("nemesis", "healed everything");
}
