//! `fenced-jepsen`: run fault-injection tests (`test`), re-check a history (`check`), print
//! the results table (`table`), remove what a crashed run left behind (`cleanup`). `client` and `probe` are the harness' own
//! helper processes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use fenced_jepsen::client::ClientSpec;
use fenced_jepsen::env::{self, NetMode};
use fenced_jepsen::run::{self, TestOpts};
use fenced_jepsen::system::System;
use fenced_jepsen::tables::WatchRow;
use fenced_jepsen::{history, nemesis, report};

#[derive(Parser)]
#[command(
    name = "fenced-jepsen",
    about = "Jepsen-style fault injection: fenced (gRPC, RESP) vs Redis vs Redlock"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a test (or --runs N of them) and write history.jsonl, results.json, report.html.
    Test(TestArgs),
    /// Re-run the checkers over an existing history.jsonl (writes results.json, report.html
    /// next to it). System and workload default to the run's own (results.json), else
    /// fenced / lock.
    Check {
        history: PathBuf,
        #[arg(long)]
        system: Option<String>,
        #[arg(long)]
        workload: Option<String>,
        #[arg(long, default_value_t = 5)]
        clients: u64,
    },
    /// Print a Markdown table (system × workload × nemesis) over the `--runs` folders under
    /// DIR (each with run-*/results.json, or one run's results.json), e.g. the output of
    /// jepsen/matrix.sh.
    Table { dir: PathBuf },
    /// Failover time: SIGKILL the leader of a 3-node loopback cluster ROUNDS times and
    /// measure kill → new leader and kill → next grant (writes OUT/failover.json).
    Failover {
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Extra `fenced serve` flags, e.g. "--election-timeout-ms 300..450".
        #[arg(long, default_value = "", allow_hyphen_values = true)]
        serve_args: String,
        #[arg(long, default_value = "jepsen/store/failover")]
        out: PathBuf,
        /// Where `fenced` is (default: next to this binary, else PATH).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Third octet of the loopback addresses used (127.0.X.1-3).
        #[arg(long, default_value_t = 77)]
        subnet: u8,
    },
    /// Delete namespaces (and kill the processes in them) left by runs with this prefix.
    Cleanup {
        #[arg(long, default_value = "fj")]
        prefix: String,
    },
    #[command(hide = true)]
    Client {
        #[arg(long)]
        spec: PathBuf,
    },
    #[command(hide = true)]
    Probe {
        #[arg(long)]
        spec: PathBuf,
    },
}

#[derive(clap::Args)]
struct TestArgs {
    /// fenced (gRPC; limiter: RESP CL.THROTTLE) | fenced-resp (RESP LOCK.*) | fenced-setnx
    /// (RESP SET NX PX + Lua, FENCE.TOKEN key value) | fenced-lua (limiter only: the
    /// token-bucket Lua script over RESP) | redis | redlock. The fenced systems share one
    /// cluster setup.
    #[arg(long)]
    system: String,
    /// lock | counter | counter-unfenced | register | limiter (fenced, fenced-lua, redis) |
    /// kv, watch (fenced: etcd's API)
    #[arg(long, default_value = "lock")]
    workload: String,
    /// Comma-separated: partition,kill,pause,clock,restart-empty,restart-delayed,membership
    /// (membership: fenced systems only), or none.
    #[arg(long, default_value = "none")]
    nemesis: String,
    #[arg(long, default_value_t = 60)]
    time_limit: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output folder (default jepsen/store/<system>-<unix time>/). With --runs N, run i
    /// goes to DIR/run-i with seed + i.
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    runs: u64,
    #[arg(long, default_value_t = 5)]
    clients: u64,
    /// fenced cluster size (3 or 5), for every fenced system. Redis is 1 node, Redlock 5
    /// masters.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    #[arg(long, default_value_t = 3_000)]
    ttl_ms: u64,
    #[arg(long, default_value_t = 1_000)]
    wait_ms: u64,
    /// Longest in-client pause while holding the lock.
    #[arg(long, default_value_t = 1_000)]
    hold_ms: u64,
    #[arg(long, default_value_t = 3_000)]
    op_timeout_ms: u64,
    /// netns (root: namespaces, bridge, iptables) or loopback (no partitions). Default: netns
    /// when root.
    #[arg(long)]
    net: Option<String>,
    /// Prefix of the namespaces this run creates.
    #[arg(long, default_value = "fj")]
    prefix: String,
    /// Where `fenced` and `fenced-fence-check` are (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

fn test(a: TestArgs) -> anyhow::Result<bool> {
    let Some(system) = System::parse(&a.system) else {
        bail!("unknown system {:?} ({})", a.system, System::names());
    };
    const WORKLOADS: [&str; 9] = [
        "lock",
        "rwlock",
        "semaphore",
        "counter",
        "counter-unfenced",
        "register",
        "limiter",
        "kv",
        "watch",
    ];
    if !WORKLOADS.contains(&a.workload.as_str()) {
        bail!(
            "unknown workload {:?} ({})",
            a.workload,
            WORKLOADS.join(", ")
        );
    }
    if let Some(why) = system.unsupported(&a.workload) {
        bail!("{why}");
    }
    if a.clients == 0 || a.clients > 40 || !(1..=7).contains(&a.nodes) {
        bail!("--clients must be 1..=40 and --nodes 1..=7");
    }
    let nemeses = nemesis::parse(&a.nemesis, system)?;
    let net = match a.net.as_deref() {
        Some("netns") => NetMode::Namespaces,
        Some("loopback") => NetMode::Loopback,
        None if env::is_root() => NetMode::Namespaces,
        None => NetMode::Loopback,
        Some(o) => bail!("--net {o}: netns or loopback"),
    };
    let bin_dir = match a.bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?
            .parent()
            .context("binary has no folder")?
            .to_owned(),
    };
    // Under `cargo run -p fenced-jepsen`, build the servers the harness starts if missing.
    if !bin_dir.join("fenced").exists() || !bin_dir.join("fenced-fence-check").exists() {
        if let Some(cargo) = std::env::var_os("CARGO") {
            let mut cmd = std::process::Command::new(cargo);
            cmd.args(["build", "-p", "fenced-server", "-p", "fenced-fence-check"]);
            if bin_dir.ends_with("release") {
                cmd.arg("--release");
            }
            eprintln!("fenced-jepsen: building fenced and fenced-fence-check");
            let st = cmd.status().context("running cargo build")?;
            if !st.success() {
                bail!("cargo build -p fenced-server -p fenced-fence-check failed ({st})");
            }
        }
    }
    let base = a.out.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("jepsen/store/{}-{t}", a.system))
    });
    let mut summaries = vec![];
    let mut all_valid = true;
    let mut errors = 0;
    for i in 0..a.runs.max(1) {
        let out = if a.runs > 1 {
            base.join(format!("run-{i}"))
        } else {
            base.clone()
        };
        let opts = TestOpts {
            system,
            workload: a.workload.clone(),
            nemeses: nemeses.clone(),
            time_limit_s: a.time_limit,
            seed: a.seed + i,
            out: out.clone(),
            clients: a.clients,
            nodes: a.nodes,
            ttl_ms: a.ttl_ms,
            wait_ms: a.wait_ms,
            hold_ms: a.hold_ms,
            op_timeout_ms: a.op_timeout_ms,
            net,
            prefix: a.prefix.clone(),
            bin_dir: bin_dir.clone(),
        };
        eprintln!(
            "fenced-jepsen: run {}/{} {} {} nemesis={} seed={} → {}",
            i + 1,
            a.runs.max(1),
            a.system,
            a.workload,
            a.nemesis,
            opts.seed,
            out.display()
        );
        let s = match run::run_test(&opts) {
            Ok(s) => s,
            Err(e) if a.runs > 1 && !run::INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) => {
                // Keep going: one run that could not start must not lose the others.
                eprintln!("  run failed: {e:#}");
                errors += 1;
                summaries.push(run::RunSummary {
                    out: out.clone(),
                    seed: opts.seed,
                    results: serde_json::json!({ "valid": null, "error": format!("{e:#}") }),
                });
                continue;
            }
            Err(e) => return Err(e),
        };
        let r = &s.results;
        eprintln!(
            "  valid={} anomalies={} ops={}",
            r["valid"], r["anomalies"], r["ops"]
        );
        all_valid &= r["valid"].as_bool() == Some(true);
        summaries.push(s);
        if run::INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            bail!("interrupted");
        }
    }
    if a.runs > 1 {
        let mut summary = summarize(&summaries);
        summary["failed_to_run"] = serde_json::json!(errors);
        std::fs::create_dir_all(&base)?;
        std::fs::write(
            base.join("summary.json"),
            serde_json::to_vec_pretty(&summary)?,
        )?;
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else if let Some(s) = summaries.first() {
        println!("{}", serde_json::to_string(&s.results["anomalies"])?);
    }
    if errors > 0 {
        bail!("{errors} of {} runs failed to run", a.runs);
    }
    Ok(all_valid)
}

/// Totals over runs: anomalies per checker, runs with any anomaly, mean availability.
fn summarize(runs: &[run::RunSummary]) -> serde_json::Value {
    let mut totals = serde_json::Map::new();
    let mut invalid = 0;
    let mut avail = vec![];
    let mut changes = 0;
    for s in runs {
        changes += s.results["meta"]["membership_changes"]
            .as_u64()
            .unwrap_or(0);
        if s.results["valid"].as_bool() == Some(false) {
            invalid += 1;
        }
        if let Some(m) = s.results["anomalies"].as_object() {
            for (k, v) in m {
                let e = totals.entry(k.clone()).or_insert(serde_json::json!(0));
                *e = serde_json::json!(e.as_u64().unwrap_or(0) + v.as_u64().unwrap_or(0));
            }
        }
        if let Some(cs) = s.results["checkers"].as_array() {
            for c in cs.iter().filter(|c| c["checker"] == "availability") {
                if let Some(f) = c["stats"]["overall"]["ok_fraction"].as_f64() {
                    avail.push(f);
                }
            }
        }
    }
    let mean = if avail.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::json!(
            (avail.iter().sum::<f64>() / avail.len() as f64 * 1000.0).round() / 1000.0
        )
    };
    serde_json::json!({
        "runs": runs.len(),
        "invalid_runs": invalid,
        "anomalies": totals,
        "mean_ok_fraction": mean,
        "membership_changes": changes,
        "outs": runs.iter().map(|s| s.out.display().to_string()).collect::<Vec<_>>(),
    })
}

/// One row per test folder: anomalies summed over its runs, availability averaged.
fn table(dir: &std::path::Path) -> anyhow::Result<String> {
    let mut folders: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && (p.join("run-0").exists() || p.join("results.json").exists()))
        .collect();
    folders.sort();
    let order = |s: &str| System::parse(s).map_or(System::ALL.len(), System::order);
    let mut rows = vec![];
    let mut member_rows = vec![];
    let mut limiter_rows = vec![];
    let mut watch_rows = vec![];
    for f in folders {
        // Watch workload: the watch checker's figures over the runs.
        let mut wr = WatchRow::default();
        // Limiter workload: over-admission figures over the runs.
        let mut lim = Limiter::default();
        // Membership nemesis: changes completed, of them with the leader or a dead node
        // removed, and changes that failed.
        let mut ch = [0u64; 4];
        let mut runs = 0;
        let mut errors = 0;
        let mut invalid = 0;
        let mut sums = std::collections::BTreeMap::<String, u64>::new();
        let (mut ok, mut answered, mut n_av) = (0.0, 0.0, 0);
        let mut meta = serde_json::Value::Null;
        // replica-agreement: runs where the replicas agreed, disagreed, went unchecked.
        let mut replicas = [0u64; 3];
        // `--runs N` folders hold run-0, run-1, …; a single run's folder is the run itself.
        let single = !f.join("run-0").exists();
        for i in 0..100 {
            let p = if single {
                f.clone()
            } else {
                f.join(format!("run-{i}"))
            };
            if !p.exists() || (single && i > 0) {
                break;
            }
            let Ok(b) = std::fs::read(p.join("results.json")) else {
                errors += 1;
                continue;
            };
            let r: serde_json::Value = serde_json::from_slice(&b)?;
            runs += 1;
            if r["valid"] == false {
                invalid += 1;
            }
            if let Some(m) = r["anomalies"].as_object() {
                for (k, v) in m {
                    *sums.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                }
            }
            for c in r["checkers"].as_array().into_iter().flatten() {
                if c["checker"] == "replica-agreement" {
                    replicas[match c["valid"].as_bool() {
                        Some(true) => 0,
                        Some(false) => 1,
                        None => 2,
                    }] += 1;
                }
                if c["checker"] == "availability" {
                    if let (Some(a), Some(b)) = (
                        c["stats"]["overall"]["ok_fraction"].as_f64(),
                        c["stats"]["overall"]["answered_fraction"].as_f64(),
                    ) {
                        ok += a;
                        answered += b;
                        n_av += 1;
                    }
                }
            }
            lim.add(&r);
            wr.add(&r);
            meta = r["meta"].clone();
            for c in meta["membership"].as_array().into_iter().flatten() {
                if c["completed"] == true {
                    ch[0] += 1;
                    ch[1] += u64::from(c["removed_leader"] == true);
                    ch[2] += u64::from(c["dead"] == true);
                } else {
                    ch[3] += 1;
                }
            }
        }
        if runs == 0 {
            continue;
        }
        let nem = meta["nemesis"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "none".into());
        let cell = |k: &str| sums.get(k).map_or("–".to_owned(), |v| v.to_string());
        let agree = match replicas {
            [0, 0, 0] => "–".to_owned(),
            [a, 0, 0] => format!("{a}/{a}"),
            [a, d, u] => format!(
                "{a}/{}{}{}",
                a + d + u,
                if d > 0 {
                    format!(", {d} DISAGREE")
                } else {
                    String::new()
                },
                if u > 0 {
                    format!(", {u} unchecked")
                } else {
                    String::new()
                },
            ),
        };
        let pct = |x: f64| {
            if n_av == 0 {
                "–".to_owned()
            } else {
                format!("{:.0}%", x / n_av as f64 * 100.0)
            }
        };
        let mut system = meta["system"].as_str().unwrap_or("?").to_owned();
        if System::parse(&system).is_some_and(System::is_fenced_cluster)
            && meta["nodes"].as_u64().is_some_and(|n| n != 3)
        {
            system = format!("{system} ({} nodes)", meta["nodes"]);
        }
        let workload = meta["workload"].as_str().unwrap_or("?").to_owned();
        if workload == "limiter" {
            limiter_rows.push((
                order(&system),
                nem.clone(),
                format!(
                    "| {system} | {nem} | {runs}{} | {invalid} | {} | {} | {} | {} | {} / {} |\n",
                    if errors > 0 {
                        format!(" (+{errors} failed)")
                    } else {
                        String::new()
                    },
                    cell("over-admission"),
                    lim.period(),
                    lim.worst(),
                    lim.rate(),
                    pct(ok),
                    pct(answered),
                ),
            ));
            continue;
        }
        if meta["membership"].is_array() {
            member_rows.push(format!(
                "| {system} | {workload} | {nem} | {runs} | {} | {} | {} | {} |\n",
                ch[0], ch[1], ch[2], ch[3]
            ));
        }
        if workload == "watch" {
            watch_rows.push((
                order(&system),
                nem.clone(),
                format!(
                    "| {system} | {nem} | {runs}{} | {invalid} | {} | {} | {agree} | {} / {} |\n",
                    if errors > 0 {
                        format!(" (+{errors} failed)")
                    } else {
                        String::new()
                    },
                    cell("watch"),
                    wr.cells(),
                    pct(ok),
                    pct(answered),
                ),
            ));
            continue;
        }
        rows.push((
            order(system.split(' ').next().unwrap_or("")),
            workload.clone(),
            format!(
                "| {system} | {workload} | {nem} | {runs}{} | {invalid} | {} | {} | {} | {} | {} | {agree} | {} / {} |\n",
                if errors > 0 { format!(" (+{errors} failed)") } else { String::new() },
                // rwlock / semaphore: the holders-per-mode checker in this column.
                if sums.contains_key("mode-exclusion") {
                    cell("mode-exclusion")
                } else {
                    cell("mutual-exclusion")
                },
                cell("stale-writes"),
                cell("lost-updates"),
                cell("fencing"),
                cell("linearizability"),
                pct(ok),
                pct(answered),
            ),
        ));
    }
    rows.sort_by_key(|r| (r.1.clone(), r.0));
    let has_rows = !rows.is_empty();
    let mut out = String::from(
        "| system | workload | nemesis | runs | invalid runs | mutual-exclusion violations | \
         stale writes accepted | lost updates | fencing violations | non-linearizable keys | \
         replicas agree | ok / answered (acquires; register: all ops) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&r.2);
    }
    if !has_rows {
        // Only limiter rows: no lock/register table.
        out.clear();
    }
    if !limiter_rows.is_empty() {
        limiter_rows.sort_by(|a, b| (&a.1, a.0).cmp(&(&b.1, b.0)));
        out.push_str(
            "\n| system | nemesis | runs | invalid runs | over-admitted ops | most admitted in \
             one period / bound | worst window: admitted / bound (len) | admitted / allowed \
             over the run (with info) | throttle ok / answered |\n|---|---|---|---|---|---|---|\
             ---|---|\n",
        );
        for r in limiter_rows {
            out.push_str(&r.2);
        }
    }
    if !watch_rows.is_empty() {
        watch_rows.sort_by(|a, b| (&a.1, a.0).cmp(&(&b.1, b.0)));
        out.push_str(
            "\n| system | nemesis | runs | invalid runs | watch anomalies | of them lost / \
             duplicate / reorder / other | acknowledged puts watched | revisions delivered | \
             watch resumes | compacted cancels (explained) | tail undelivered at the end | \
             replicas agree | puts ok / answered |\n|---|---|---|---|---|---|---|---|---|---|\
             ---|---|---|\n",
        );
        for r in watch_rows {
            out.push_str(&r.2);
        }
    }
    if !member_rows.is_empty() {
        out.push_str(
            "\n| system | workload | nemesis | runs | membership changes | of them removing the \
             leader | replacing a dead node | changes that failed |\n|---|---|---|---|---|---|---|---|\n",
        );
        for r in member_rows {
            out.push_str(&r);
        }
    }
    Ok(out)
}

/// The limiter workload's figures over a row's runs (from the over-admission verdicts).
#[derive(Default)]
struct Limiter {
    /// Largest excess over the bound in one window: (excess, admitted, bound, len ms).
    worst: Option<(u64, u64, u64, f64)>,
    /// Most admitted in any window of one period, and the bound for it.
    period: Option<(u64, u64, u64)>,
    admitted: u64,
    allowed: u64,
    with_info: u64,
}

impl Limiter {
    fn add(&mut self, r: &serde_json::Value) {
        for c in r["checkers"].as_array().into_iter().flatten() {
            if c["checker"] != "over-admission" {
                continue;
            }
            for k in c["stats"]["keys"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
            {
                let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
                self.admitted += n(&k["admitted"]);
                self.with_info += n(&k["admitted"]) + n(&k["info_possibly_admitted"]);
                self.allowed += n(&k["rate"]["allowed_over_span"]);
                let period = n(&k["policy"]["period_ms"]);
                for w in k["windows"].as_array().into_iter().flatten() {
                    if n(&w["len_ms"]) == period
                        && self.period.is_none_or(|(m, ..)| n(&w["max_admitted"]) > m)
                    {
                        self.period = Some((n(&w["max_admitted"]), n(&w["bound"]), period));
                    }
                }
                let w = &k["worst_window"];
                if w.is_object() {
                    let e = n(&w["excess"]);
                    if self.worst.is_none_or(|(x, ..)| e > x) {
                        self.worst = Some((
                            e,
                            n(&w["admitted"]),
                            n(&w["bound"]),
                            w["len_ms"].as_f64().unwrap_or(0.0),
                        ));
                    }
                }
            }
        }
    }

    fn worst(&self) -> String {
        match self.worst {
            Some((_, a, b, l)) => format!("{a} / {b} ({l:.0} ms)"),
            None => "–".into(),
        }
    }

    fn period(&self) -> String {
        match self.period {
            Some((m, b, p)) => format!("{m} / {b} ({:.0} s)", p as f64 / 1000.0),
            None => "–".into(),
        }
    }

    fn rate(&self) -> String {
        if self.allowed == 0 {
            return "–".into();
        }
        let pct = |x: u64| x as f64 / self.allowed as f64 * 100.0;
        format!(
            "{} / {} = {:.0}% ({:.0}%)",
            self.admitted,
            self.allowed,
            pct(self.admitted),
            pct(self.with_info)
        )
    }
}

fn read_spec(p: &PathBuf) -> anyhow::Result<ClientSpec> {
    let b = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    Ok(serde_json::from_slice(&b)?)
}

fn helper(spec: ClientSpec, probe: bool) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        if probe {
            fenced_jepsen::client::probe(spec).await
        } else {
            fenced_jepsen::client::run(spec).await
        }
    })?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Test(a) => {
            run::install_signal_handlers();
            test(a)
        }
        Cmd::Check {
            history: h,
            system,
            workload,
            clients,
        } => (|| {
            let events = history::read(&h)?;
            let dir = h.parent().map(PathBuf::from).unwrap_or_else(|| ".".into());
            // Keep the run's metadata when re-checking a run folder.
            let meta = std::fs::read(dir.join("results.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .map(|r| r["meta"].clone())
                .filter(|m| m.is_object());
            let of_run = |k: &str| meta.as_ref().and_then(|m| m[k].as_str()).map(str::to_owned);
            let system = system
                .or_else(|| of_run("system"))
                .unwrap_or("fenced".into());
            let workload = workload
                .or_else(|| of_run("workload"))
                .unwrap_or("lock".into());
            let meta = meta.unwrap_or_else(|| {
                serde_json::json!({"system": system, "workload": workload,
                    "clients": clients, "nemesis": "?", "seed": null})
            });
            let r = report::write(&dir, &events, &system, &workload, meta)?;
            println!("{}", serde_json::to_string_pretty(&r["anomalies"])?);
            Ok(r["valid"].as_bool() == Some(true))
        })(),
        Cmd::Table { dir } => table(&dir).map(|t| {
            print!("{t}");
            true
        }),
        Cmd::Failover {
            rounds,
            serve_args,
            out,
            bin_dir,
            subnet,
        } => (|| {
            let bin_dir = match bin_dir {
                Some(d) => d,
                None => std::env::current_exe()?
                    .parent()
                    .context("binary has no folder")?
                    .to_owned(),
            };
            let report = fenced_jepsen::failover::run(&fenced_jepsen::failover::FailoverOpts {
                fenced: run::find_program("fenced", &bin_dir)?,
                rounds,
                serve_args: serve_args.split_whitespace().map(str::to_owned).collect(),
                out,
                subnet,
            })?;
            println!(
                "median over {} rounds: new leader after {:.0} ms, next grant after {:.0} ms (max {:.0} ms)",
                report.rounds.len(),
                report.elected_median_ms,
                report.next_grant_median_ms,
                report.next_grant_max_ms
            );
            Ok(true)
        })(),
        Cmd::Cleanup { prefix } => {
            let n = env::cleanup_prefix(&prefix);
            eprintln!("removed {n} namespaces with prefix {prefix}");
            Ok(true)
        }
        Cmd::Client { spec } => read_spec(&spec)
            .and_then(|s| helper(s, false))
            .map(|()| true),
        Cmd::Probe { spec } => read_spec(&spec)
            .and_then(|s| helper(s, true))
            .map(|()| true),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("fenced-jepsen: {e:#}");
            ExitCode::from(2)
        }
    }
}
