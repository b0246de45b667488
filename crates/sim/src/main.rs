//! `fenced-sim`: run seeds of the deterministic cluster simulation (docs/simulation.md).
//!
//! ```text
//! fenced-sim --seeds 0..200                 # each seed once; a failure prints its replay command
//! fenced-sim --seed 17 --trace              # replay one seed with its readable trace
//! fenced-sim --seeds 1000.. --hours 2       # seeds from 1000 on until 2 real hours have passed
//! fenced-sim --seed 45 --disk-io inline     # a seed recorded before issue 40, as it ran then
//! ```

use std::ops::Range;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use fenced_sim::{Options, Report};

#[derive(Parser, Debug)]
#[command(
    name = "fenced-sim",
    about = "Deterministic simulation of a fenced cluster"
)]
struct Args {
    /// Seeds to run, `A..B` (B excluded) or `A..` (with --hours).
    #[arg(long, default_value = "0..20")]
    seeds: String,
    /// Run this one seed (overrides --seeds).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the run's trace (with --seed: as it happens).
    #[arg(long)]
    trace: bool,
    /// Keep running seeds until this many real hours have passed.
    #[arg(long)]
    hours: Option<f64>,
    /// Nodes in the cluster (3 or 5).
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Simulated clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Simulated seconds each run's clients and faults last.
    #[arg(long, default_value_t = 20)]
    duration_s: u64,
    /// Faults to inject: all, none, or a comma list of partitions,noise,crashes,pauses,clocks,
    /// disk,flicker,holdback,membership,wipes,restore (`all`: every one but flicker and
    /// holdback).
    #[arg(long, default_value = "all")]
    faults: String,
    /// Nodes a client tries one request on before giving up (1: a refusal is final).
    #[arg(long, default_value_t = 3)]
    client_tries: usize,
    /// Longest a fault lasts, ms (past 5,000 an outage outlasts a node's own retries).
    #[arg(long, default_value_t = 4_000)]
    fault_max_ms: u64,
    /// Clients that speak RESP to the nodes' front ends (0: none).
    #[arg(long, default_value_t = 1)]
    resp_clients: usize,
    /// Longest pipeline a RESP client sends (at least 2).
    #[arg(long, default_value_t = 8)]
    pipeline_max: usize,
    /// Longest pause between two operations of a RESP client, ms.
    #[arg(long, default_value_t = 250)]
    resp_think_ms: u64,
    /// What the RESP clients do: all (every kind but family), or a comma list of
    /// incr,lock,watch,eval,throttle,family.
    #[arg(long, default_value = "all")]
    resp_mix: String,
    /// Most requests in one forwarded batch (default: production's 1,024).
    #[arg(long)]
    forward_batch: Option<usize>,
    /// Most log entries in one replication message (default: production's, openraft's 300).
    #[arg(long)]
    raft_max_payload: Option<u64>,
    /// Clients only write registers, every write a SET of one size: values of this many
    /// bytes (at least 17; 17 without a number). See `uniform.rs`.
    #[arg(long, num_args = 0..=1, default_missing_value = "17")]
    uniform_writes: Option<usize>,
    /// Where the nodes' disk work runs: `tasks` (production's flusher and recorder, each sync
    /// after a latency drawn from the seed) or `inline` (the mode of every seed recorded
    /// before issue 40: replay those with it).
    #[arg(long, default_value = "tasks")]
    disk_io: String,
    /// After each seed's line, the numbers of these checkers (a comma list, e.g. log-terms).
    #[arg(long)]
    stats: Option<String>,
    /// Print only each run's fingerprint (the reproducibility check compares them).
    #[arg(long)]
    fingerprint: bool,
    /// Plant a bug (a build with `--features planted` only): `recorder-epoch`, the recorder
    /// ignoring its epoch check (docs/simulation.md, "Planted bugs").
    #[cfg(feature = "planted")]
    #[arg(long)]
    plant: Option<String>,
}

fn seeds(spec: &str, open_ended: bool) -> anyhow::Result<Range<u64>> {
    let (a, b) = spec
        .split_once("..")
        .with_context(|| format!("--seeds wants A..B, got {spec:?}"))?;
    let a: u64 = a.trim().parse().context("--seeds start")?;
    let b: u64 = match b.trim() {
        "" if open_ended => u64::MAX,
        "" => bail!("--seeds A.. (no end) needs --hours"),
        b => b.parse().context("--seeds end")?,
    };
    if b <= a {
        bail!("--seeds {spec}: empty range");
    }
    Ok(a..b)
}

fn options(args: &Args) -> anyhow::Result<Options> {
    let mut o = Options::default();
    if !(args.nodes == 3 || args.nodes == 5) {
        bail!("--nodes must be 3 or 5");
    }
    o.cluster.nodes = args.nodes;
    o.workload.clients = args.clients.max(1);
    o.duration = Duration::from_secs(args.duration_s.max(1));
    o.workload.tries = args.client_tries.max(1);
    o.workload.resp.clients = args.resp_clients;
    o.workload.resp.pipeline_max = args.pipeline_max.max(2);
    o.workload.resp.think_ms = args.resp_think_ms;
    o.cluster.forward_max_items = args.forward_batch;
    o.cluster.raft_max_payload = args.raft_max_payload.map(|n| n.max(1));
    o.cluster.disk_io = match args.disk_io.as_str() {
        "tasks" => fenced_sim::world::DiskIo::Tasks,
        "inline" => fenced_sim::world::DiskIo::Inline,
        other => bail!("--disk-io wants tasks or inline, got {other:?}"),
    };
    o.workload.uniform_writes = args
        .uniform_writes
        .map(|n| n.max(fenced_sim::workload::uniform::MIN_VALUE_BYTES));
    if args.resp_mix != "all" {
        let mut mix = [0; 6];
        for k in args.resp_mix.split(',') {
            match k.trim() {
                "incr" => mix[0] = 1,
                "lock" => mix[1] = 1,
                "watch" => mix[2] = 1,
                "eval" => mix[3] = 1,
                "throttle" => mix[4] = 1,
                "family" => mix[5] = 1,
                other => bail!("unknown RESP operation {other:?}"),
            }
        }
        o.workload.resp.mix = mix;
    }
    o.faults = match args.faults.as_str() {
        "all" => fenced_sim::faults::Faults::all(),
        "none" => fenced_sim::faults::Faults::none(),
        list => {
            let mut f = fenced_sim::faults::Faults::none();
            for k in list.split(',') {
                match k.trim() {
                    "partitions" => f.partitions = true,
                    "noise" => f.noise = true,
                    "crashes" => f.crashes = true,
                    "pauses" => f.pauses = true,
                    "clocks" => f.clocks = true,
                    "disk" => f.disk = true,
                    "flicker" => f.flicker = true,
                    "holdback" => f.holdback = true,
                    "membership" => f.membership = true,
                    "wipes" => f.wipes = true,
                    "restore" => f.restore = true,
                    other => bail!("unknown fault {other:?}"),
                }
            }
            f
        }
    };
    o.faults.max_ms = args.fault_max_ms.max(201);
    Ok(o)
}

fn replay(args: &Args, seed: u64) -> String {
    format!(
        "cargo run --release -p fenced-sim -- --seed {seed} --trace --nodes {} --clients {} --duration-s {} --faults {} --client-tries {} --fault-max-ms {} --resp-clients {} --pipeline-max {} --resp-think-ms {} --resp-mix {} --disk-io {}{}{}{}",
        args.nodes,
        args.clients,
        args.duration_s,
        args.faults,
        args.client_tries,
        args.fault_max_ms,
        args.resp_clients,
        args.pipeline_max,
        args.resp_think_ms,
        args.resp_mix,
        args.disk_io,
        args.forward_batch
            .map_or(String::new(), |n| format!(" --forward-batch {n}")),
        args.raft_max_payload
            .map_or(String::new(), |n| format!(" --raft-max-payload {n}")),
        args.uniform_writes
            .map_or(String::new(), |n| format!(" --uniform-writes {n}"))
    )
}

fn main() -> anyhow::Result<ExitCode> {
    // The nodes' own logs, for a replay (`SIM_LOG=info fenced-sim --seed N`); off by default.
    if std::env::var_os("SIM_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("SIM_LOG"))
            .with_writer(std::io::stderr)
            .init();
    }
    let args = Args::parse();
    #[cfg(feature = "planted")]
    if let Some(p) = &args.plant {
        let bug = match p.as_str() {
            "recorder-epoch" => fenced_storage::planted::Planted::RecorderEpoch,
            other => bail!("unknown planted bug {other:?}"),
        };
        fenced_storage::planted::plant(Some(bug));
    }
    let mut opts = options(&args)?;
    let range = match args.seed {
        Some(s) => s..s + 1,
        None => seeds(&args.seeds, args.hours.is_some())?,
    };
    if args.seed.is_some() && args.trace {
        opts.echo = true;
    }
    let deadline = args
        .hours
        .map(|h| Instant::now() + Duration::from_secs_f64(h * 3600.0));
    let started = Instant::now();
    let (mut runs, mut failed, mut simulated) = (0u64, Vec::new(), 0.0f64);
    for seed in range {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let t = Instant::now();
        let report: Report = fenced_sim::run(seed, &opts)?;
        let real = t.elapsed().as_secs_f64();
        runs += 1;
        simulated += report.simulated_s;
        if args.fingerprint {
            println!("{seed} {:016x}", report.fingerprint);
        } else {
            println!(
                "seed {seed}: {} — {} ops, {:.1} simulated s in {:.2} real s ({:.0}×), messages {:?}, fingerprint {:016x}",
                if report.valid() { "ok" } else { "FAILED" },
                report.ops,
                report.simulated_s,
                real,
                report.simulated_s / real.max(1e-9),
                report.messages,
                report.fingerprint,
            );
        }
        if let Some(names) = &args.stats {
            for v in &report.verdicts {
                if names.split(',').any(|n| n.trim() == v.checker) {
                    println!("    {}: {}", v.checker, v.stats);
                }
            }
        }
        if !report.valid() {
            for f in report.failures() {
                println!("    {f}");
            }
            println!("    replay: {}", replay(&args, seed));
            failed.push(seed);
        }
    }
    let real = started.elapsed().as_secs_f64();
    if !args.fingerprint {
        println!(
            "{runs} runs, {} failed {failed:?}; {simulated:.0} simulated s in {real:.0} real s: {:.1} simulated s per real s ({} nodes, {} clients)",
            failed.len(),
            simulated / real.max(1e-9),
            args.nodes,
            args.clients
        );
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
