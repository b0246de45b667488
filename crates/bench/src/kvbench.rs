//! The etcd-API comparison (`fenced-bench --kv ...`): the KV workloads of [`crate::kv`] at
//! each client count and the watch fan-out of [`crate::watch`], against every backend (each a
//! list of etcd-API endpoints: fenced's gRPC port or etcd's client port), in interleaved rounds
//! (round r rotates the backends' order), with the backends' server CPU per operation from
//! /proc. Renders one markdown table for KV and one for watch, ratios to the first backend.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use crate::cpu::{process_cpu_us, total_cpu_us};
use crate::kv::{channel, preload, run_kv, KvMeasured, KvOp, KvSummary, KvWorkload};
use crate::memory::{run_memory, MemoryResult, MemoryWorkload};
use crate::watch::{run_watch, WatchMeasured, WatchSummary, WatchWorkload};

/// One backend: its name and etcd-API endpoints.
#[derive(Clone, Debug)]
pub struct Target {
    pub name: String,
    pub endpoints: Vec<String>,
    /// Server processes whose CPU time is charged to it.
    pub pids: Option<Vec<String>>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct KvConfig {
    pub targets: Vec<Target>,
    pub ops: Vec<KvOp>,
    pub watch: bool,
    pub clients: Vec<usize>,
    pub duration: Duration,
    pub rounds: usize,
    pub value_size: usize,
    pub keyspace: usize,
    pub put_percent: u32,
    pub watchers: usize,
    pub watch_streams: usize,
    /// Writer rates of the fan-out, puts/s (each a cell; 0: as fast as one writer goes).
    pub watch_rates: Vec<f64>,
    /// Writers of the fan-out (the rate is theirs together).
    pub watch_writers: usize,
    /// The memory run, once per backend after the rounds (`None`: not run).
    pub memory: Option<MemoryWorkload>,
    pub run_id: String,
}

/// Server and load-generator CPU spent in a cell's windows, summed over rounds.
#[derive(Default, Clone, Copy)]
struct Spent {
    server_us: Option<f64>,
    bench_us: f64,
}

fn add(s: &mut Spent, server: Option<f64>, bench: f64) {
    s.server_us = match (s.server_us, server) {
        (Some(a), Some(b)) => Some(a + b),
        _ => None,
    };
    s.bench_us += bench;
}

/// CPU of the target's servers and of this process around `f`.
async fn measured<F: std::future::Future>(t: &Target, f: F) -> (F::Output, Option<f64>, f64) {
    let me = std::process::id().to_string();
    let server_before = t.pids.as_deref().and_then(total_cpu_us);
    let bench_before = process_cpu_us(&me).unwrap_or(0.0);
    let out = f.await;
    let server_after = t.pids.as_deref().and_then(total_cpu_us);
    let bench_after = process_cpu_us(&me).unwrap_or(0.0);
    let server = match (server_before, server_after) {
        (Some(b), Some(a)) => Some(a - b),
        _ => None,
    };
    (out, server, bench_after - bench_before)
}

#[derive(Serialize)]
struct KvRow<'a> {
    workload: &'static str,
    backend: &'a str,
    clients: usize,
    rounds: usize,
    value_size: usize,
    server_cpu_us_per_op: Option<f64>,
    bench_cpu_us_per_op: Option<f64>,
    #[serde(flatten)]
    summary: &'a KvSummary,
}

#[derive(Serialize)]
struct WatchRow<'a> {
    workload: &'static str,
    backend: &'a str,
    watchers: usize,
    streams: usize,
    writer_rate: f64,
    writers: usize,
    rounds: usize,
    server_cpu_us_per_event: Option<f64>,
    bench_cpu_us_per_event: Option<f64>,
    #[serde(flatten)]
    summary: &'a WatchSummary,
}

/// Results of a whole run: the markdown tables and the JSON rows.
pub struct KvReport {
    pub markdown: String,
    pub json: serde_json::Value,
}

type KvKey = (KvOp, usize, usize); // (workload, clients, backend)

fn per(us: Option<f64>, n: u64) -> Option<f64> {
    us.filter(|_| n > 0).map(|us| us / n as f64)
}

/// Run every cell of `cfg` and render the tables.
pub async fn run(cfg: &KvConfig) -> anyhow::Result<KvReport> {
    if cfg.targets.is_empty() || cfg.clients.contains(&0) || cfg.rounds == 0 {
        anyhow::bail!("give at least one backend, clients ≥ 1 and rounds ≥ 1");
    }
    let nb = cfg.targets.len();
    let mut kv: BTreeMap<KvKey, KvMeasured> = BTreeMap::new();
    let mut kv_cpu: BTreeMap<KvKey, Spent> = BTreeMap::new();
    // Keyed by (rate index, backend).
    let mut watch: BTreeMap<(usize, usize), WatchMeasured> = BTreeMap::new();
    let mut watch_cpu: BTreeMap<(usize, usize), Spent> = BTreeMap::new();
    let mut preloaded = vec![false; nb];
    let preload_prefix = format!("kvbench-{}/pre", cfg.run_id);
    let watch_rates: &[f64] = if cfg.watch { &cfg.watch_rates } else { &[] };
    let cells = cfg.ops.len() * cfg.clients.len() + watch_rates.len();
    let total = cfg.rounds * cells * nb;
    let mut done = 0;
    for round in 0..cfg.rounds {
        for &op in &cfg.ops {
            for &clients in &cfg.clients {
                for k in 0..nb {
                    let bi = (k + round) % nb;
                    let t = &cfg.targets[bi];
                    let channels = (0..clients)
                        .map(|i| channel(&t.endpoints[i % t.endpoints.len().max(1)]))
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    if op.needs_preload() && !preloaded[bi] {
                        preload(&channels, &preload_prefix, cfg.keyspace, cfg.value_size)
                            .await
                            .with_context(|| format!("{}: preloading", t.name))?;
                        preloaded[bi] = true;
                    }
                    done += 1;
                    eprintln!(
                        "[{done}/{total}] round {} {}: {} × {clients} clients ...",
                        round + 1,
                        t.name,
                        op.name()
                    );
                    let w = KvWorkload {
                        op,
                        duration: cfg.duration,
                        value_size: cfg.value_size,
                        keyspace: cfg.keyspace,
                        put_percent: cfg.put_percent,
                        prefix: format!("kvbench-{}/r{round}c{clients}", cfg.run_id),
                        preload_prefix: preload_prefix.clone(),
                    };
                    let (m, server, bench) = measured(t, run_kv(channels, &w)).await;
                    let s = m.summary();
                    eprintln!(
                        "    {:.0} ops/s, p50 {} p99 {} µs, errors {}{}",
                        s.ops_per_s,
                        s.latency_us.p50,
                        s.latency_us.p99,
                        s.errors,
                        s.first_error
                            .as_deref()
                            .map(|e| format!(" (first: {e})"))
                            .unwrap_or_default()
                    );
                    add(
                        kv_cpu.entry((op, clients, bi)).or_insert(Spent {
                            server_us: Some(0.0),
                            bench_us: 0.0,
                        }),
                        server,
                        bench,
                    );
                    kv.entry((op, clients, bi)).or_default().merge(&m);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
        for (ri, &rate) in watch_rates.iter().enumerate() {
            for k in 0..nb {
                let bi = (k + round) % nb;
                let t = &cfg.targets[bi];
                let n = t.endpoints.len().max(1);
                let streams = (0..cfg.watch_streams.max(1))
                    .map(|s| channel(&t.endpoints[s % n]))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let writers = (0..cfg.watch_writers.max(1))
                    .map(|j| channel(&t.endpoints[j % n]))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                done += 1;
                eprintln!(
                    "[{done}/{total}] round {} {}: watch, {} watchers on {} streams, {} writers at {} puts/s ...",
                    round + 1,
                    t.name,
                    cfg.watchers,
                    streams.len(),
                    cfg.watch_writers.max(1),
                    rate
                );
                let w = WatchWorkload {
                    watchers: cfg.watchers,
                    streams: streams.len(),
                    rate,
                    duration: cfg.duration,
                    grace: Duration::from_secs(5),
                    value_size: cfg.value_size,
                    prefix: format!("kvbench-{}/w{round}-{ri}/", cfg.run_id),
                };
                let (m, server, bench) = measured(t, run_watch(streams, writers, &w)).await;
                let s = m.summary();
                eprintln!(
                    "    {} puts, {:.0} events/s, lag p50 {} p99 {} µs, missing {}, errors {}{}",
                    s.puts,
                    s.events_per_s,
                    s.lag_us.p50,
                    s.lag_us.p99,
                    s.missing,
                    s.errors,
                    s.first_error
                        .as_deref()
                        .map(|e| format!(" (first: {e})"))
                        .unwrap_or_default()
                );
                add(
                    watch_cpu.entry((ri, bi)).or_insert(Spent {
                        server_us: Some(0.0),
                        bench_us: 0.0,
                    }),
                    server,
                    bench,
                );
                watch.entry((ri, bi)).or_default().merge(&m);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    let mut mem = Vec::new();
    if let Some(mw) = &cfg.memory {
        for t in &cfg.targets {
            eprintln!(
                "memory {}: {} keys of {} bytes, then {} overwrites/s for {} s ...",
                t.name, mw.keys, mw.value_size, mw.rate, mw.seconds
            );
            let channels = (0..mw.clients.max(1))
                .map(|i| channel(&t.endpoints[i % t.endpoints.len().max(1)]))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mw = MemoryWorkload {
                prefix: format!("kvbench-{}/mem", cfg.run_id),
                ..mw.clone()
            };
            let pids = t.pids.clone().unwrap_or_default();
            let r = run_memory(&channels, &pids, &mw)
                .await
                .with_context(|| format!("{}: memory run", t.name))?;
            mem.push((t.name.clone(), r));
        }
    }
    let mut r = report(cfg, &kv, &kv_cpu, &watch, &watch_cpu)?;
    if !mem.is_empty() {
        memory_table(&mut r, &mem)?;
    }
    Ok(r)
}

fn mib(v: &[Option<u64>]) -> String {
    v.iter()
        .map(|b| b.map_or("n/a".to_owned(), |b| format!("{:.0}", b as f64 / 1048576.0)))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn memory_table(r: &mut KvReport, mem: &[(String, MemoryResult)]) -> anyhow::Result<()> {
    if !r.markdown.is_empty() {
        r.markdown.push('\n');
    }
    r.markdown.push_str(
        "| memory | backend | fill (s) | overwrites/s | history (s) | RSS per node after fill (MiB) | RSS per node after history (MiB) | max ÷ 1.5 GiB | errors |\n",
    );
    r.markdown
        .push_str("|---|---|---:|---:|---:|---|---|---:|---:|\n");
    for (name, m) in mem {
        let max = m.rss_after_history.iter().flatten().max().copied();
        r.markdown.push_str(&format!(
            "| {} keys × {} B | {name} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |\n",
            m.keys,
            m.value_size,
            m.fill_seconds,
            m.puts_per_s,
            m.history_seconds,
            mib(&m.rss_after_fill),
            mib(&m.rss_after_history),
            max.map_or("n/a".to_owned(), |b| format!(
                "{:.2}",
                b as f64 / (1.5 * 1073741824.0)
            )),
            m.errors,
        ));
        if let serde_json::Value::Array(rows) = &mut r.json {
            let mut v = serde_json::to_value(m)?;
            if let serde_json::Value::Object(o) = &mut v {
                o.insert("workload".into(), "memory".into());
                o.insert("backend".into(), name.clone().into());
            }
            rows.push(v);
        }
    }
    Ok(())
}

fn ms(us: u64) -> String {
    if us >= 100_000 {
        format!("{:.0}", us as f64 / 1000.0)
    } else {
        format!("{:.2}", us as f64 / 1000.0)
    }
}

/// `a ÷ b` as `1.23×`; `n/a` when either is missing or b is 0.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a > 0.0 => format!("{:.2}×", a / b),
        _ => "n/a".to_owned(),
    }
}

/// µs: whole above 10, one decimal below (watch events cost about 1 µs).
fn us(v: Option<f64>) -> String {
    match v {
        None => "n/a".to_owned(),
        Some(v) if v < 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
    }
}

fn report(
    cfg: &KvConfig,
    kv: &BTreeMap<KvKey, KvMeasured>,
    kv_cpu: &BTreeMap<KvKey, Spent>,
    watch: &BTreeMap<(usize, usize), WatchMeasured>,
    watch_cpu: &BTreeMap<(usize, usize), Spent>,
) -> anyhow::Result<KvReport> {
    let base = &cfg.targets[0].name;
    let mut rows = Vec::new();
    let mut md = String::new();
    if !kv.is_empty() {
        md.push_str(&format!(
            "| workload | clients | backend | ops/s | {base} ÷ this | p50 / p99 (ms) | p99 {base} ÷ this | server CPU µs/op | CPU {base} ÷ this | bench CPU µs/op | errors |\n"
        ));
        md.push_str("|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|\n");
    }
    let summaries: BTreeMap<KvKey, KvSummary> = kv.iter().map(|(k, m)| (*k, m.summary())).collect();
    let cpu_of = |k: &KvKey, s: &KvSummary| {
        let spent = kv_cpu.get(k).copied().unwrap_or_default();
        (
            per(spent.server_us, s.ops),
            per(Some(spent.bench_us), s.ops),
        )
    };
    for &op in &cfg.ops {
        for &clients in &cfg.clients {
            let b = summaries.get(&(op, clients, 0));
            let b_cpu = b.and_then(|s| cpu_of(&(op, clients, 0), s).0);
            for (bi, t) in cfg.targets.iter().enumerate() {
                let key = (op, clients, bi);
                let Some(s) = summaries.get(&key) else {
                    continue;
                };
                let (server, bench) = cpu_of(&key, s);
                let label = if op == KvOp::Mixed {
                    format!(
                        "mixed {}/{}",
                        cfg.put_percent,
                        100 - cfg.put_percent.min(100)
                    )
                } else {
                    op.name().to_owned()
                };
                md.push_str(&format!(
                    "| {label} | {clients} | {} | {:.0} | {} | {} / {} | {} | {} | {} | {} | {} |\n",
                    t.name,
                    s.ops_per_s,
                    ratio(b.map(|b| b.ops_per_s), Some(s.ops_per_s)),
                    ms(s.latency_us.p50),
                    ms(s.latency_us.p99),
                    ratio(b.map(|b| b.latency_us.p99 as f64), Some(s.latency_us.p99 as f64)),
                    us(server),
                    ratio(b_cpu, server),
                    us(bench),
                    s.errors + s.cas_failed,
                ));
                rows.push(serde_json::to_value(KvRow {
                    workload: op.name(),
                    backend: &t.name,
                    clients,
                    rounds: cfg.rounds,
                    value_size: cfg.value_size,
                    server_cpu_us_per_op: server,
                    bench_cpu_us_per_op: bench,
                    summary: s,
                })?);
            }
        }
    }
    if !watch.is_empty() {
        if !md.is_empty() {
            md.push('\n');
        }
        md.push_str(&format!(
            "| watch fan-out | backend | writer puts/s | events/s delivered | {base} ÷ this | lag after ack p50 / p99 (ms) | p99 {base} ÷ this | lag from send p50 / p99 (ms) | server CPU µs/event | CPU {base} ÷ this | bench CPU µs/event | missing | errors |\n"
        ));
        md.push_str("|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|\n");
        let ws: BTreeMap<(usize, usize), WatchSummary> =
            watch.iter().map(|(k, m)| (*k, m.summary())).collect();
        let cpu_of = |k: (usize, usize), s: &WatchSummary| {
            let spent = watch_cpu.get(&k).copied().unwrap_or_default();
            (
                per(spent.server_us, s.events),
                per(Some(spent.bench_us), s.events),
            )
        };
        for (ri, &rate) in cfg.watch_rates.iter().enumerate() {
            let b = ws.get(&(ri, 0));
            let b_cpu = b.and_then(|s| cpu_of((ri, 0), s).0);
            let writers = match cfg.watch_writers.max(1) {
                1 => "1 writer".to_owned(),
                n => format!("{n} writers"),
            };
            let label = if rate > 0.0 {
                format!(
                    "{} watchers / {} streams, {writers} at {rate} puts/s",
                    cfg.watchers, cfg.watch_streams
                )
            } else {
                format!(
                    "{} watchers / {} streams, {writers} unpaced",
                    cfg.watchers, cfg.watch_streams
                )
            };
            for (bi, t) in cfg.targets.iter().enumerate() {
                let Some(s) = ws.get(&(ri, bi)) else {
                    continue;
                };
                let (server, bench) = cpu_of((ri, bi), s);
                md.push_str(&format!(
                    "| {label} | {} | {:.0} | {:.0} | {} | {} / {} | {} | {} / {} | {} | {} | {} | {} | {} |\n",
                    t.name,
                    s.puts_per_s,
                    s.events_per_s,
                    ratio(b.map(|b| b.events_per_s), Some(s.events_per_s)),
                    ms(s.lag_us.p50),
                    ms(s.lag_us.p99),
                    ratio(b.map(|b| b.lag_us.p99 as f64), Some(s.lag_us.p99 as f64)),
                    ms(s.lag_from_send_us.p50),
                    ms(s.lag_from_send_us.p99),
                    us(server),
                    ratio(b_cpu, server),
                    us(bench),
                    s.missing,
                    s.errors,
                ));
                rows.push(serde_json::to_value(WatchRow {
                    workload: "watch",
                    backend: &t.name,
                    watchers: cfg.watchers,
                    streams: cfg.watch_streams,
                    writer_rate: rate,
                    writers: cfg.watch_writers.max(1),
                    rounds: cfg.rounds,
                    server_cpu_us_per_event: server,
                    bench_cpu_us_per_event: bench,
                    summary: s,
                })?);
            }
        }
    }
    Ok(KvReport {
        markdown: md,
        json: serde_json::Value::Array(rows),
    })
}
