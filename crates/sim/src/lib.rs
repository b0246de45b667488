//! Deterministic simulation of a whole fenced cluster (docs/simulation.md).
//!
//! One run = one seed: N real nodes (`fenced_server::run::start_with` — core, openraft,
//! storage, batcher, forwarder, read path, expiry ticker, divergence alarm), simulated clients
//! and faults, all on one thread of a tokio current-thread runtime whose time is paused (it
//! jumps to the next timer whenever every task waits) and whose RNG — the branch order of
//! `tokio::select!` — is seeded, like the nodes' randomness (`fenced_raft_types::rng`). The
//! nodes' storage runs production's flusher and recorder as tasks, each sync after a latency
//! drawn from the seed (`fenced_storage::Io::Tasks`; `Io::Inline` with [`world::DiskIo::Inline`],
//! the mode of the seeds recorded before), their messages travel through
//! [`net::Net`], their clocks are [`fenced_server::clock::SimClock`]s. So the same seed gives
//! the same run, which [`Report::fingerprint`] (a hash of the trace, the history and the
//! final state digests) lets anyone check, in this process or another.
//!
//! After the faults stop every run is judged: linearizable registers, mutual exclusion with
//! the lease promise, fencing (tokens unique and increasing per lock, storage never taking a
//! smaller one), expiry as reads tell it ([`expiry`]), replicas agree, no divergence alarm, no node refusing its own data dir, and
//! liveness (every node serves again within a bound once the faults end).

pub mod disk;
pub mod expiry;
pub mod faults;
pub mod flicker;
pub mod history;
pub mod holdback;
pub mod knobs;
pub mod membership;
pub mod net;
pub mod resp;
pub mod resp_ops;
pub mod throttle;
pub mod trace;
pub mod walcheck;
pub mod workload;
pub mod world;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use fenced_core::kv::KvCommand;
use fenced_core::{Command, RequestId};
use fenced_jepsen::checker::{self, fencing, linear, mutex, Verdict};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::faults::Faults;
use crate::history::History;
use crate::net::Net;
use crate::trace::Trace;
use crate::workload::{Shared, Storage, Workload};
use crate::world::{Cluster, ClusterSpec};

/// Everything a run is made of, besides its seed.
#[derive(Clone, Debug)]
pub struct Options {
    pub cluster: ClusterSpec,
    pub workload: Workload,
    pub faults: Faults,
    /// Simulated time the clients run (faults run meanwhile).
    pub duration: Duration,
    /// After the faults end, every node must serve within this (simulated).
    pub liveness_bound: Duration,
    /// Keep the trace's lines (to print them).
    pub keep_trace: bool,
    /// Print the trace's lines as they happen.
    pub echo: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cluster: ClusterSpec::default(),
            workload: Workload::default(),
            faults: Faults::default(),
            duration: Duration::from_secs(20),
            liveness_bound: Duration::from_secs(15),
            keep_trace: false,
            echo: false,
        }
    }
}

/// The outcome of one run.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub verdicts: Vec<Verdict>,
    /// Hash of the trace, the history and the final digests: equal seeds, equal fingerprints.
    pub fingerprint: u64,
    pub ops: usize,
    /// Simulated seconds the run covered.
    pub simulated_s: f64,
    /// (delivered, dropped, duplicated) node-to-node messages.
    pub messages: (u64, u64, u64),
    pub trace: Vec<String>,
}

impl Report {
    pub fn valid(&self) -> bool {
        self.verdicts.iter().all(|v| v.valid != Some(false))
    }

    /// One line per failed checker, with its first examples.
    pub fn failures(&self) -> Vec<String> {
        self.verdicts
            .iter()
            .filter(|v| v.valid == Some(false))
            .map(|v| {
                format!(
                    "{}: {} anomalies, e.g. {}",
                    v.checker,
                    v.anomalies,
                    v.examples
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(" | ")
                )
            })
            .collect()
    }
}

/// Errors that stop a run before it can be judged.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("building the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("creating the data dirs: {0}")]
    Dir(std::io::Error),
    #[error("this build lacks --cfg tokio_unstable (see .cargo/config.toml): the runtime's RNG cannot be seeded")]
    NotSeedable,
}

/// Run seed `seed` with `opts`, on a fresh runtime on this thread.
pub fn run(seed: u64, opts: &Options) -> Result<Report, SimError> {
    let root = tempfile::Builder::new()
        .prefix("fenced-sim-")
        .tempdir_in(data_root())
        .map_err(SimError::Dir)?;
    let rt = runtime(seed)?;
    fenced_raft_types::rng::seed_thread(seed);
    let local = tokio::task::LocalSet::new();
    let report = local.block_on(&rt, simulate(seed, opts, root.path()));
    // Leftover tasks of crashed nodes die with the runtime, doing nothing more.
    drop(local);
    rt.shutdown_background();
    Ok(report)
}

/// Where the runs' data dirs go: `FENCED_SIM_DIR` if set, else `/dev/shm` (a RAM disk: the
/// nodes' `fdatasync`s still run, at memory speed — on a disk they would make the simulator
/// 20 times slower), else the system's temporary dir. The simulated crash keeps what was
/// written either way; losing unsynced writes is the simulated disk's job, not the real one's.
fn data_root() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("FENCED_SIM_DIR") {
        return d.into();
    }
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() && tempfile::tempdir_in(shm).is_ok() {
        return shm.to_owned();
    }
    std::env::temp_dir()
}

#[cfg(tokio_unstable)]
fn runtime(seed: u64) -> Result<tokio::runtime::Runtime, SimError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()))
        .build()
        .map_err(SimError::Runtime)
}

#[cfg(not(tokio_unstable))]
fn runtime(_seed: u64) -> Result<tokio::runtime::Runtime, SimError> {
    Err(SimError::NotSeedable)
}

async fn simulate(seed: u64, opts: &Options, root: &std::path::Path) -> Report {
    let trace = Trace::new(opts.keep_trace, opts.echo);
    let mut rng = StdRng::seed_from_u64(seed);
    let net = Net::new(rng.gen());
    let cluster = Cluster::new(
        opts.cluster.clone(),
        root,
        net.clone(),
        trace.clone(),
        // Not drawn from `rng`: the disks' seed leaves every other draw as it was.
        seed.rotate_left(17) ^ 0xD15C,
    );
    // What decides the run, not how it is shown: a replay with --trace has the same trace.
    let shown = Options {
        keep_trace: false,
        echo: false,
        ..opts.clone()
    };
    trace.line("sim", format!("seed {seed}, {}", knobs::shown(&shown)));
    for id in cluster.ids() {
        cluster.start(id).await;
    }
    let first = cluster.settle(Duration::from_secs(10)).await;
    trace.line("sim", format!("leader {first:?}"));

    // Clients and faults, for `duration`.
    let history = History::new(trace.clone());
    let shared = Rc::new(Shared {
        cluster: cluster.clone(),
        history: history.clone(),
        storage: RefCell::new(Storage::default()),
        next_process: Cell::new(0),
        spec: opts.workload.clone(),
        stop: Cell::new(false),
    });
    let until = tokio::time::Instant::now() + opts.duration;
    let mut clients = Vec::new();
    for _ in 0..opts.workload.clients {
        let rng = StdRng::seed_from_u64(rng.gen());
        clients.push(tokio::task::spawn_local(workload::run(shared.clone(), rng)));
    }
    let nemesis = tokio::task::spawn_local(faults::run(
        cluster.clone(),
        opts.faults.clone(),
        rng.gen(),
        until,
    ));
    // The operator's own choices, drawn only when its faults are on (the other runs stay
    // as they were).
    let f = &opts.faults;
    let mut operator =
        (f.membership || f.wipes || f.restore).then(|| StdRng::seed_from_u64(rng.gen()));
    if let (true, Some(op)) = (f.restore, operator.as_mut()) {
        let at = tokio::time::Instant::now() + opts.duration.mul_f64(op.gen_range(0.2..0.5));
        let sub = StdRng::seed_from_u64(op.gen());
        tokio::task::spawn_local(membership::take_backup(cluster.clone(), sub, at));
    }
    let resp = resp::Resp::default();
    for i in 0..opts.workload.resp.clients {
        let rng = StdRng::seed_from_u64(rng.gen());
        let spec = opts.workload.resp.clone();
        clients.push(tokio::task::spawn_local(resp::run(
            shared.clone(),
            resp.clone(),
            spec,
            i,
            rng,
        )));
    }
    tokio::time::sleep_until(until).await;
    let _ = nemesis.await;
    // Let faults already drawn take hold before they are all ended.
    tokio::time::sleep(Duration::from_millis(1)).await;
    if let Some(op) = operator.as_mut() {
        membership::finish(&cluster, op).await;
    }
    faults::heal(&cluster).await;
    let mut clients = Some(clients);
    let restore = match operator.as_mut() {
        Some(op) => cluster.operator().majority_wiped() || op.gen_bool(0.5),
        None => false,
    };
    let restored = match cluster.operator().backup() {
        Some(b) if restore => {
            // The clients stop first: what they saw before the restore is the history.
            shared.stop.set(true);
            for c in clients.take().unwrap_or_default() {
                let _ = c.await;
            }
            let errors = membership::restore(&cluster, &b).await;
            Some((b, errors))
        }
        _ => None,
    };

    // Liveness: every node serves a write within the bound once the faults are over.
    let healed = tokio::time::Instant::now();
    let mut verdicts = vec![liveness(&cluster, opts.liveness_bound, healed).await];
    shared.stop.set(true);
    for c in clients.take().unwrap_or_default() {
        let _ = c.await;
    }

    // Replicas agree once they applied the same log; no alarm; no start refused.
    verdicts.push(agreement(&cluster).await);
    verdicts.push(refusals(&cluster));
    verdicts.push(cluster.log_terms().verdict());

    let events = history.events();
    let ops = checker::pair(&events);
    verdicts.push(linear::check(&ops, linear::DEFAULT_BUDGET));
    verdicts.push(mutex::check(&ops));
    verdicts.push(fencing::check(&ops, true));
    let quiet = expiry::Quiet {
        leadership: cluster.leadership(),
        // Every node the run had: a node not yet added or already removed has no view, so
        // the quiet rule holds only while the membership is the same (conservative).
        nodes: cluster.all_ids(),
        drift_ppm: opts.faults.drift_ppm.unsigned_abs(),
    };
    verdicts.push(expiry::check_with(&ops, Some(&quiet)));
    if let (Some((backup, errors)), Some(op)) = (restored, operator.as_mut()) {
        let spec = &opts.workload;
        let probe = membership::probe(&cluster, op, spec.keys, spec.locks).await;
        let mut v = membership::check(&ops, &backup, &probe);
        v.anomalies += errors.len() as u64;
        v.examples.extend(errors);
        if v.anomalies > 0 {
            v.valid = Some(false);
        }
        verdicts.push(v);
    }
    verdicts.extend(resp.verdicts());
    trace.fold(&resp.digest());
    for e in &events {
        trace.fold(serde_json::to_string(e).unwrap_or_default().as_bytes());
    }
    for v in &verdicts {
        trace.line(
            "check",
            format!("{}: {:?} ({} anomalies)", v.checker, v.valid, v.anomalies),
        );
    }
    let simulated_s = trace.now_ns() as f64 / 1e9;
    cluster.stop_all().await;
    Report {
        seed,
        fingerprint: trace.hash(),
        verdicts,
        ops: ops.len(),
        simulated_s,
        messages: net.counts(),
        trace: trace.lines(),
    }
}

/// Every node serves a write through itself within `bound` of `since`.
async fn liveness(cluster: &Cluster, bound: Duration, since: tokio::time::Instant) -> Verdict {
    let mut slow = Vec::new();
    let mut worst = Duration::ZERO;
    for id in cluster.serving_ids() {
        let mut seq = 0;
        let served = loop {
            if tokio::time::Instant::now() >= since + bound {
                break false;
            }
            seq += 1;
            let rid = RequestId { client_id: id, seq };
            let argv = vec![
                b"SET".to_vec(),
                format!("live-{id}").into_bytes(),
                b"1".to_vec(),
            ];
            let cmd = Command::Kv(KvCommand::Batch(vec![argv]));
            let r = cluster
                .call(id, move |n| async move { n.propose(Some(rid), cmd).await })
                .await;
            if matches!(r, Ok(Ok(_))) {
                break true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let took = since.elapsed();
        worst = worst.max(took);
        cluster.trace().line(
            "check",
            format!("n{id} serves again after {took:?}: {served}"),
        );
        if !served {
            slow.push(format!(
                "n{id} did not serve a write within {bound:?} of the faults ending"
            ));
        }
    }
    // A voter change an earlier leader left joint is finished by the leader by itself (no
    // operator command needed): within the same bound, no node's voters stay joint.
    for id in cluster.serving_ids() {
        let joint = |c: &Cluster| {
            c.node(id).and_then(|n| {
                let m = n.raft().metrics().borrow().membership_config.clone();
                let joint = m.membership().get_joint_config().clone();
                (joint.len() > 1).then_some(joint)
            })
        };
        while joint(cluster).is_some() && tokio::time::Instant::now() < since + bound {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(joint) = joint(cluster) {
            slow.push(format!(
                "n{id}'s voters were still joint {bound:?} after the faults ended: {joint:?}"
            ));
        }
    }
    Verdict::new(
        "liveness",
        slow.len() as u64,
        slow,
        json!({ "worst_ms": worst.as_millis() as u64 }),
    )
}

/// Once every node applied the same log index, their states' digests are equal; and no
/// node raised its divergence alarm.
async fn agreement(cluster: &Cluster) -> Verdict {
    let mut examples = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    let ids = cluster.serving_ids();
    let applied = |c: &Cluster| -> Vec<u64> {
        ids.iter()
            .copied()
            .map(|id| {
                c.node(id).map_or(0, |n| {
                    n.raft()
                        .metrics()
                        .borrow()
                        .last_applied
                        .map_or(0, |l| l.index)
                })
            })
            .collect()
    };
    let mut at = applied(cluster);
    while at.iter().any(|a| *a != at[0]) && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        at = applied(cluster);
    }
    let mut digests = Vec::new();
    for (i, id) in ids.iter().copied().enumerate() {
        if let Some(n) = cluster.node(id) {
            let d = n.local(|sm| sm.digest());
            cluster
                .trace()
                .line("check", format!("n{id} applied {} digest {d:016x}", at[i]));
            cluster.trace().fold(&d.to_le_bytes());
            digests.push((id, d));
            if let Some(why) = n.alarm() {
                examples.push(format!("n{id} raised its divergence alarm: {why}"));
            }
        }
    }
    if at.iter().any(|a| *a != at[0]) {
        examples.push(format!("the nodes did not reach one applied index: {at:?}"));
    } else if digests.iter().any(|(_, d)| *d != digests[0].1) {
        examples.push(format!("states differ at index {}: {digests:x?}", at[0]));
    }
    Verdict::new(
        "replicas-agree",
        examples.len() as u64,
        examples,
        json!({ "index": at.first().copied().unwrap_or(0) }),
    )
}

/// No node refused to start from its own data dir, or stopped itself, unless its data dir
/// had been wiped (then a refusal or a retirement is what the docs promise).
fn refusals(cluster: &Cluster) -> Verdict {
    for (id, why) in cluster.expected() {
        cluster
            .trace()
            .line("check", format!("n{id} (wiped), as expected: {why}"));
    }
    let r: Vec<String> = cluster
        .refusals()
        .into_iter()
        .map(|(id, why)| format!("n{id} refused to start: {why}"))
        .collect();
    Verdict::new("restarts", r.len() as u64, r, json!({}))
}
