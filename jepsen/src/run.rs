//! One test run: set up the hosts, start the system, the guard and the clients, drive the
//! nemesis schedule, stop everything, merge the histories, check them and write the report.
//!
//! How each process is started lives in `run/spawn.rs`; applying faults and the watchdog in
//! `run/faults.rs`.
//!
//! All process control happens on the calling thread (children's PR_SET_PDEATHSIG is tied
//! to the thread that forked them). Every wait is bounded.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use crate::env::{Env, NetMode, Spec};
use crate::history::{self, monotonic_ns, Event, HistoryWriter, Kind, Process, RunClock};
use crate::membership::Members;
use crate::nemesis::{self, Fault, Scheduled, Topology};
use crate::proxy::Proxies;
use crate::report;
use crate::system::System;

mod faults;
mod spawn;

pub(crate) use faults::watchdog;
use faults::{apply, write_clock};
pub(crate) use spawn::node_spec;
use spawn::{client_spec, clock_shim, o_bin, run_helper};
pub use spawn::{fenced_join_args, fenced_serve_args, find_program};

/// Set by SIGINT/SIGTERM: the run stops at the next check and cleans up.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_signal as *const () as libc::sighandler_t);
    }
}

pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

#[derive(Clone, Debug)]
pub struct TestOpts {
    pub system: System,
    pub workload: String,
    pub nemeses: Vec<String>,
    pub time_limit_s: u64,
    pub seed: u64,
    pub out: PathBuf,
    pub clients: u64,
    pub nodes: usize,
    pub ttl_ms: u64,
    pub wait_ms: u64,
    pub hold_ms: u64,
    pub op_timeout_ms: u64,
    pub net: NetMode,
    pub prefix: String,
    pub bin_dir: PathBuf,
}

pub const GRPC_PORT: u16 = 7380;
const RESP_PORT: u16 = 7379;
const REDIS_PORT: u16 = 6379;
const GUARD_PORT: u16 = 7390;
const ETCD_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;

pub(crate) struct Layout {
    /// Every server node with a host: the initial members, then (membership nemesis) every
    /// node the schedule adds, in id order — `nodes[i]` is member id `i + 1`.
    pub(crate) nodes: Vec<String>,
    /// How many of `nodes` the cluster starts with.
    pub(crate) initial: usize,
    lock_endpoints: Vec<String>,
    resp_endpoints: Vec<String>,
    guard: String,
    pub(crate) clock_dir: PathBuf,
    pub(crate) data_dir: PathBuf,
    shim: Option<PathBuf>,
}

/// The result of one run, for summaries.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    pub out: PathBuf,
    pub seed: u64,
    pub results: serde_json::Value,
}

/// What the watchdog keeps track of across a run.
#[derive(Default)]
pub(crate) struct Exits {
    /// Server exits the nemesis did not cause (for results.json).
    unexpected: Vec<String>,
    /// fenced nodes the nemesis restarted with an empty data dir.
    wiped: Vec<String>,
    /// Those of them that retired: left down for good.
    retired: Vec<String>,
    /// fenced nodes the membership nemesis is removing or removed (left down for good; an
    /// exit of theirs is not restarted).
    pub(crate) removed: Vec<String>,
}

impl Exits {
    /// Nodes that left for good: no kill, restart or pause applies to them any more.
    fn gone(&self) -> Vec<String> {
        self.retired.iter().chain(&self.removed).cloned().collect()
    }
}

/// Run one test; returns its results (also written to `o.out`).
pub fn run_test(o: &TestOpts) -> anyhow::Result<RunSummary> {
    if let Some(why) = o.system.unsupported(&o.workload) {
        bail!("{why}");
    }
    let out = &o.out;
    std::fs::create_dir_all(out.join("hist"))?;
    let l_data = out.join("data");
    let l_clock = out.join("clock");
    for d in [&l_data, &l_clock] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d)?;
    }
    for entry in std::fs::read_dir(out.join("hist"))? {
        let _ = std::fs::remove_file(entry?.path());
    }
    // fenced nodes take clock faults through their test hook; Redis needs the shim.
    let shim = if o.system.has_peers() {
        None
    } else {
        clock_shim(out)
    };
    if shim.is_none() && !o.system.is_fenced_cluster() && o.nemeses.iter().any(|n| n == "clock") {
        bail!("the clock nemesis on Redis needs a C compiler (cc) to build its clock shim");
    }
    // Private copies of the binaries: a rebuild of the tree during the run must not change
    // what a restarted node runs.
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin)?;
    let mut o = o.clone();
    for name in ["fenced", "fenced-fence-check"] {
        if let Ok(src) = find_program(name, &o.bin_dir) {
            std::fs::copy(&src, bin.join(name))
                .with_context(|| format!("copying {}", src.display()))?;
        }
    }
    // The harness itself too (via /proc/self/exe, which works even if cargo has replaced
    // the file since): client and probe processes run this copy.
    let me = bin.join("fenced-jepsen");
    std::fs::copy("/proc/self/exe", &me)
        .or_else(|_| std::fs::copy(std::env::current_exe()?, &me))
        .context("copying the harness binary")?;
    o.bin_dir = bin;
    let o = &o;
    let subnet = 100 + (std::process::id() % 100) as u8;
    let n_nodes = match o.system {
        s if s.has_peers() => o.nodes,
        System::Redis => 1,
        _ => 5,
    };
    let initial: Vec<String> = (1..=n_nodes).map(|i| format!("n{i}")).collect();
    let clients: Vec<String> = (0..o.clients).map(|k| format!("c{k}")).collect();

    // The schedule, drawn from the seed (before the hosts: a membership change names the
    // nodes it adds, and every one of them gets its host and addresses up front).
    let topo = Topology {
        system: o.system,
        nodes: initial.clone(),
        clients: clients.clone(),
        ttl_ms: o.ttl_ms,
        client_partitions: o.net == NetMode::Loopback,
        client_clocks: o.workload == "limiter",
    };
    let limit_ms = o.time_limit_s * 1000;
    let schedule = nemesis::generate(o.seed, &o.nemeses, &topo, limit_ms);
    std::fs::write(
        out.join("schedule.json"),
        serde_json::to_vec_pretty(&schedule)?,
    )?;
    let mut nodes = initial.clone();
    for s in &schedule {
        if let Fault::Membership { join, .. } = &s.fault {
            nodes.push(join.clone());
        }
    }
    let changes_members = nodes.len() > initial.len();

    let mut env = Env::new(o.net, &o.prefix, &out.join("logs"), subnet)?;
    for (i, n) in nodes.iter().enumerate() {
        env.add_host(n, 11 + i as u8)?;
    }
    env.add_host("g", 5)?;
    if changes_members {
        // Where the nemesis runs `fenced member …` from.
        env.add_host("m", 6)?;
    }
    for k in 0..o.clients {
        env.add_host(&format!("c{k}"), 101 + k as u8)?;
    }
    // What the lock clients talk to: fenced's gRPC or RESP port on every node, or the Redis
    // servers.
    let port = match o.system {
        System::Fenced | System::FencedEtcdLock | System::FencedEtcdMix => GRPC_PORT,
        System::Etcd | System::EtcdLock | System::EtcdMix => ETCD_PORT,
        s if s.is_fenced_resp() || s == System::FencedLua => RESP_PORT,
        _ => REDIS_PORT,
    };
    let lock_endpoints: Vec<String> = nodes
        .iter()
        .map(|n| env.host(n).map(|h| format!("{}:{port}", h.ip)))
        .collect::<Result<_, _>>()?;
    let resp_endpoints: Vec<String> = match o.system {
        s if s.is_fenced_cluster() => nodes
            .iter()
            .map(|n| env.host(n).map(|h| format!("{}:{RESP_PORT}", h.ip)))
            .collect::<Result<_, _>>()?,
        // Redlock's register runs on its first master: it has no replicated register.
        _ => lock_endpoints[..1].to_vec(),
    };
    let layout = Layout {
        guard: format!("{}:{GUARD_PORT}", env.host("g")?.ip),
        nodes: nodes.clone(),
        initial: initial.len(),
        lock_endpoints,
        resp_endpoints,
        clock_dir: l_clock.clone(),
        data_dir: l_data.clone(),
        shim,
    };
    for n in &nodes {
        write_clock(&l_clock, n, 0)?;
    }
    for (i, name) in initial.iter().enumerate() {
        let spec = node_spec(o, &layout, &env, i, &[])?;
        env.spawn(name, spec)?;
    }
    // The members that serve now, published for the clients (membership nemesis).
    let mut members = if changes_members {
        let m = Members::new(o, &layout, &env, out.join("members"))?;
        m.publish()?;
        Some(m)
    } else {
        None
    };
    if o.workload.starts_with("counter") {
        let guard_ip = env.host("g")?.ip.clone();
        env.spawn(
            "guard",
            Spec {
                host: "g".into(),
                program: find_program("fenced-fence-check", &o.bin_dir)?,
                args: vec![
                    "--listen".into(),
                    format!("{guard_ip}:{GUARD_PORT}"),
                    "--data-dir".into(),
                    l_data.join("guard").display().to_string(),
                ],
                env: vec![],
            },
        )?;
    }
    // Wait for the system to come up (bounded: 90 s on a slow machine): the initial members.
    let mut probe = client_spec(o, &layout, monotonic_ns(), 0, &o.workload);
    probe.lock_endpoints.truncate(layout.initial);
    probe.resp_endpoints.truncate(layout.initial);
    probe.deadline = 90_000_000_000;
    probe.op_timeout_ms = 2_000;
    if o.workload.starts_with("counter") {
        probe.guard = layout.guard.clone();
    }
    let ready = run_helper(
        &mut env,
        "probe",
        "c0",
        "probe",
        &probe,
        out,
        Duration::from_secs(100),
    )?;
    if !ready {
        let why = std::fs::read_to_string(out.join("logs/probe.log")).unwrap_or_default();
        if o.workload == "limiter" && why.contains("unknown command") {
            bail!(
                "limiter workload: {} does not implement CL.THROTTLE at this build (it answered \
                 \"ERR unknown command\"); the fenced limiter rows cannot run ({})",
                o.system,
                why.trim()
            );
        }
        if (o.workload == "watch" || o.workload == "kv") && why.contains("unknown command") {
            bail!(
                "{} workload: {} does not serve etcd's {} at this build ({})",
                o.workload,
                o.system,
                if o.workload == "watch" { "Watch" } else { "KV" },
                why.trim()
            );
        }
        if o.system.is_etcd_lock_service() && why.contains("not served here") {
            bail!(
                "{} does not serve etcd's Lock service (v3lockpb.Lock) at this build ({}): the \
                 {} rows cannot run",
                o.system,
                why.trim(),
                o.system
            );
        }
        if o.workload == "register" && why.contains("RESP") {
            bail!(
                "register workload pending: the RESP endpoints of {} do not answer ({})",
                o.system,
                why.trim()
            );
        }
        bail!("{} did not come up: {}", o.system, why.trim());
    }
    if interrupted() {
        bail!("interrupted");
    }

    // Loopback mode: clients reach servers through cuttable proxies.
    let proxies = match o.net {
        NetMode::Loopback => Some(Proxies::new()?),
        NetMode::Namespaces => None,
    };

    // Go.
    let run_start = monotonic_ns();
    let clock = RunClock { start: run_start };
    for k in 0..o.clients {
        let mut spec = client_spec(o, &layout, run_start, k, &o.workload);
        spec.members_file = members.as_ref().map(|m| m.file().to_owned());
        if let Some(p) = &proxies {
            // Client k reaches server j through its own proxies on its own address.
            let me = env.host(&format!("c{k}"))?.ip.clone();
            let mut lock_eps = vec![];
            let mut resp_eps = vec![];
            for (j, n) in nodes.iter().enumerate() {
                let a = format!("{me}:{}", 21_000 + j);
                p.add(&format!("c{k}"), n, &a, &layout.lock_endpoints[j])?;
                lock_eps.push(a);
                if let Some(up) = layout.resp_endpoints.get(j) {
                    let a = format!("{me}:{}", 22_000 + j);
                    p.add(&format!("c{k}"), n, &a, up)?;
                    resp_eps.push(a);
                }
            }
            spec.lock_endpoints = lock_eps;
            spec.resp_endpoints = resp_eps;
        }
        let path = out.join(format!("c{k}.spec.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
        env.spawn(
            &format!("c{k}"),
            Spec {
                host: format!("c{k}"),
                program: o_bin(out),
                args: vec!["client".into(), "--spec".into(), path.display().to_string()],
                env: vec![],
            },
        )?;
    }
    let nem_path = out.join("hist").join("nemesis.jsonl");
    let mut nem = HistoryWriter::create(&nem_path)?;
    let mut steps: Vec<(u64, bool, &Scheduled)> = schedule
        .iter()
        .flat_map(|s| [(s.start_ms, true, s), (s.end_ms, false, s)])
        .collect();
    steps.sort_by_key(|(t, start, _)| (*t, *start));
    let mut active: Vec<&Scheduled> = vec![];
    let mut exits = Exits::default();
    let mut errors = Vec::new();
    for (at, start, s) in steps {
        while clock.now() < at * 1_000_000 && !interrupted() {
            watchdog(&mut env, &nodes, &mut nem, &clock, &mut exits)?;
            std::thread::sleep(Duration::from_millis(20));
        }
        if interrupted() {
            break;
        }
        let f = if start { "start-" } else { "stop-" };
        let ev = Event::new(
            Process::nemesis(),
            Kind::Info,
            &format!("{f}{}", s.fault.kind()),
            clock.now(),
        )
        .value(json!(s.fault.describe()));
        if let (Fault::Membership { .. }, Some(m)) = (&s.fault, members.as_mut()) {
            // A change takes a while (catch-up, retries): log its start first, and keep the
            // watchdog running meanwhile; its window ends when the change is done.
            if start {
                nem.write(&ev)?;
            }
            let mut cx = crate::membership::Cx {
                env: &mut env,
                nem: &mut nem,
                clock: &clock,
                exits: &mut exits,
                nodes: &nodes,
            };
            let r = if start {
                m.start(&mut cx, o, &layout, &s.fault)
            } else {
                m.stop(&mut cx)
            };
            if let Err(e) = r {
                errors.push(format!("{}: {e:#}", s.fault.describe()));
            }
            if start {
                active.push(s);
            } else {
                active.retain(|a| !std::ptr::eq(*a, s));
                nem.write(
                    &Event::new(
                        Process::nemesis(),
                        Kind::Info,
                        "stop-membership",
                        clock.now(),
                    )
                    .value(json!(s.fault.describe())),
                )?;
            }
            continue;
        }
        if let Err(e) = apply(
            &mut env,
            proxies.as_ref(),
            &layout,
            &s.fault,
            start,
            &exits.gone(),
        ) {
            errors.push(format!("{}: {e:#}", s.fault.describe()));
        }
        if let Fault::RestartEmpty { targets, .. } = &s.fault {
            if !start && o.system.is_fenced_cluster() {
                exits.wiped.extend(targets.iter().cloned());
            }
        }
        nem.write(&ev)?;
        if start {
            active.push(s);
        } else {
            active.retain(|a| !std::ptr::eq(*a, s));
        }
    }
    // Undo whatever is still active (interrupted runs), then let the clients finish.
    for s in active {
        // An unfinished membership change is left as it is: the run is over.
        if !matches!(s.fault, Fault::Membership { .. }) {
            let _ = apply(
                &mut env,
                proxies.as_ref(),
                &layout,
                &s.fault,
                false,
                &exits.gone(),
            );
        }
        let _ = nem.write(
            &Event::new(
                Process::nemesis(),
                Kind::Info,
                &format!("stop-{}", s.fault.kind()),
                clock.now(),
            )
            .value(json!(s.fault.describe())),
        );
    }
    while clock.now() < limit_ms * 1_000_000 && !interrupted() {
        watchdog(&mut env, &nodes, &mut nem, &clock, &mut exits)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    // One shared grace period for the clients to finish their last op (none if interrupted).
    let grace = if interrupted() {
        Duration::ZERO
    } else {
        Duration::from_millis(o.op_timeout_ms + o.wait_ms + 5_000)
    };
    let until = Instant::now() + grace;
    for c in &clients {
        let _ = env.resume(c);
        env.wait_or_kill(c, until.saturating_duration_since(Instant::now()));
    }
    if interrupted() {
        bail!("interrupted");
    }
    if o.workload.starts_with("counter") {
        let mut spec = client_spec(o, &layout, run_start, 0, "final-read");
        spec.index = 9_000_000;
        spec.history = out.join("hist").join("final.jsonl");
        run_helper(
            &mut env,
            "final",
            "c0",
            "client",
            &spec,
            out,
            Duration::from_secs(30),
        )?;
    }
    env.teardown();
    drop(env);
    // Every node is stopped: do the replicas agree (fenced clusters)?
    let agreement = o
        .system
        .is_fenced_cluster()
        .then(|| replica_agreement(o, &nodes, &exits, &l_data));

    // Merge, check, report.
    let mut parts = vec![];
    for entry in std::fs::read_dir(out.join("hist"))? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "jsonl") {
            parts.push(history::read(&p)?);
        }
    }
    let events = history::merge(parts);
    history::write_all(&out.join("history.jsonl"), &events)?;
    let meta = json!({
        "system": o.system.name(),
        "workload": o.workload,
        "nemesis": o.nemeses,
        "seed": o.seed,
        "time_limit_s": o.time_limit_s,
        "clients": o.clients,
        "nodes": initial.len(),
        "ttl_ms": o.ttl_ms,
        "net": format!("{:?}", o.net),
        "nemesis_errors": errors,
        "unexpected_exits": exits.unexpected,
        "retired": exits.retired,
        "schedule": schedule,
    });
    let mut meta = meta;
    if let Some(v) = agreement {
        meta["replica_agreement"] = serde_json::to_value(v)?;
    }
    if let Some(m) = &members {
        meta["membership"] = json!(m.records());
        meta["membership_changes"] = json!(m.completed());
        meta["members_at_end"] = json!(m.live());
    }
    let results = report::write(out, &events, o.system.name(), &o.workload, meta)?;
    // The private binary copies are ~275 MB (debug builds): keep them only as evidence of an
    // invalid run.
    if results["valid"] == true {
        let _ = std::fs::remove_dir_all(out.join("bin"));
    }
    Ok(RunSummary {
        out: out.clone(),
        seed: o.seed,
        results,
    })
}

/// The replica-agreement verdict over the members that are still members (not retired, not
/// removed) and ever started (a data dir with a log).
fn replica_agreement(
    o: &TestOpts,
    nodes: &[String],
    exits: &Exits,
    data: &Path,
) -> crate::checker::Verdict {
    let gone = exits.gone();
    let (mut members, mut skipped) = (Vec::new(), gone.clone());
    for n in nodes {
        let dir = data.join(n);
        if gone.contains(n) {
            continue;
        }
        if dir.join("wal").is_dir() {
            members.push((n.clone(), dir));
        } else {
            skipped.push(n.clone());
        }
    }
    match find_program("fenced", &o.bin_dir) {
        Ok(fenced) => crate::replicas::check(&fenced, &members, &skipped),
        Err(e) => crate::checker::agreement::unchecked(&e.to_string(), json!({})),
    }
}
