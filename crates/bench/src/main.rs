//! `fenced-bench`: one lock workload against fenced, Redis, Redis (AOF always), Redlock and
//! etcd; C clients each loop acquire → optional work → release.
//!
//! ```text
//! fenced-bench --backend fenced --fenced 127.0.0.1:7380 --clients 16 --keys 16 --duration 10
//! fenced-bench --compare fenced,redis,etcd --clients 1,16,64 --keys 1,c --rounds 3 ...
//! ```
//! `--clients` and `--keys` take lists (`c` = as many keys as clients, i.e. uncontended);
//! every combination is a cell. Backends run in interleaved rounds (round r runs each cell on
//! every backend, in an order rotated by r), so machine drift affects all alike. Prints a table
//! per cell, then one markdown table with throughput ratios to the first backend.
//!
//! The lock family (issue 26): `fenced-resp-read`, `fenced-resp-permit` (`LOCK.READ`,
//! `LOCK.PERMIT name owner --permits ttl`), `fenced-read`, `fenced-permit` (gRPC) and
//! `redis-aof-read`, `redis-aof-permit` (Redisson's read-lock and permit-semaphore Lua
//! scripts, `fenced_backends::Redisson`, on the Redis of `--redis-aof`): each pair is one read
//! lock or one permit, acquired and released.
//!
//! `--kv put,txn,range,mixed,watch` runs etcd's v3 KV and Watch API instead of the lock
//! workload (`fenced_bench::kvbench`), against `fenced` (its gRPC port, `--fenced`) and/or
//! `etcd` (`--etcd`):
//!
//! ```text
//! fenced-bench --kv put,txn,range,mixed,watch --compare fenced,etcd --clients 1,16,64 ...
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use fenced_backends::{
    random_id, DistLock, EtcdLock, EtcdLockService, FencedGrpc, FencedResp, LockMode, RedisConfig,
    RedisLock, Redisson, Redlock, RedlockConfig, RetryPolicy, Throttle, WithMode,
};
use fenced_bench::load::{run, Measured, Summary, Workload};
use serde::Serialize;

const BACKENDS: [&str; 20] = [
    "fenced",
    "fenced-resp",
    "fenced-setnx",
    "redis",
    "redis-aof",
    "redlock",
    "etcd",
    // Rate-limit decisions (`fenced_backends::throttle`): one decision is one "pair".
    "fenced-throttle",
    "fenced-tokenbucket",
    "fenced-lua",
    "redis-lua",
    "redis-aof-lua",
    // The lock family (issue 26): a read lock or one semaphore permit per pair, fenced over
    // RESP (LOCK.READ / LOCK.PERMIT) and gRPC, and Redisson's Lua scripts on Redis (AOF).
    "fenced-resp-read",
    "fenced-resp-permit",
    "fenced-read",
    "fenced-permit",
    "redis-aof-read",
    "redis-aof-permit",
    // etcd's server-side lock service v3lockpb.Lock (issue 27): on a real etcd, and on
    // fenced's gRPC port.
    "etcd-lock",
    "fenced-etcdlock",
];

/// Backends of the throttle workload: each "pair" is one rate-limit decision.
fn is_throttle(backend: &str) -> bool {
    matches!(
        backend,
        "fenced-throttle" | "fenced-tokenbucket" | "fenced-lua" | "redis-lua" | "redis-aof-lua"
    )
}

#[derive(Parser, Debug)]
#[command(
    name = "fenced-bench",
    version,
    about = "Side-by-side lock load generator"
)]
struct Cli {
    /// One backend: fenced (gRPC) | fenced-resp (RESP LOCK.*) | fenced-setnx (RESP SET NX +
    /// Lua + FENCE.TOKEN) | redis | redis-aof | redlock | etcd.
    #[arg(long, conflicts_with = "compare")]
    backend: Option<String>,
    /// Several backends, run in interleaved rounds; ratios are to the first.
    #[arg(long, value_delimiter = ',')]
    compare: Vec<String>,
    /// Concurrent clients (a list makes a matrix).
    #[arg(long, value_delimiter = ',', default_value = "16")]
    clients: Vec<usize>,
    /// Distinct lock keys; client i uses key i mod K. `c` = as many as clients. A list makes
    /// a matrix: `1,c` = contended and uncontended.
    #[arg(long, value_delimiter = ',', default_value = "c")]
    keys: Vec<String>,
    /// Seconds per backend per cell per round.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// Simulated work while holding the lock (µs).
    #[arg(long, default_value_t = 0)]
    work_us: u64,
    /// Target acquire+release pairs per second of all clients together (each client paces
    /// its share); default: as fast as they go.
    #[arg(long)]
    rate: Option<f64>,
    /// How long one acquire may wait: server-side (fenced, etcd) or by retrying (Redis,
    /// Redlock).
    #[arg(long, default_value_t = 10_000)]
    wait_ms: u64,
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// fenced gRPC endpoints (client i prefers the i-th, round robin).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7380")]
    fenced: Vec<String>,
    /// fenced RESP endpoints (client i uses the i-th, round robin).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7379")]
    fenced_resp: Vec<String>,
    #[arg(long, default_value = "127.0.0.1:6379")]
    redis: String,
    #[arg(long, default_value = "127.0.0.1:6380")]
    redis_aof: String,
    /// The Redlock masters.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "127.0.0.1:6381,127.0.0.1:6382,127.0.0.1:6383,127.0.0.1:6384,127.0.0.1:6385"
    )]
    redlock: Vec<String>,
    /// etcd client endpoints (client i uses the i-th, round robin).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:2379")]
    etcd: Vec<String>,
    /// Redis/Redlock retry pause on a busy lock: base plus random jitter (µs).
    #[arg(long, default_value_t = 0)]
    retry_delay_us: u64,
    #[arg(long, default_value_t = 1000)]
    retry_jitter_us: u64,
    /// Redlock per-instance timeout.
    #[arg(long, default_value_t = 50)]
    redlock_timeout_ms: u64,
    /// Throttle backends: `CL.THROTTLE key BURST RATE 1` (RATE decisions per second), and the
    /// Lua token bucket with capacity BURST and RATE tokens/s. Keep BURST / RATE ≥ 0.5 s: the
    /// Lua script stores nothing (and so decides nothing) when its refill time rounds to a
    /// TTL of 0 s.
    #[arg(long, default_value_t = 100_000)]
    throttle_burst: u64,
    #[arg(long, default_value_t = 10_000)]
    throttle_rate: u64,
    /// `*-permit` backends: the semaphore's permits (`--keys 1`: every client contends for
    /// them; `--keys c`: one semaphore per client).
    #[arg(long, default_value_t = 4)]
    permits: u32,
    /// Write every cell's results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Write the markdown comparison table here (it is printed too).
    #[arg(long)]
    markdown: Option<std::path::PathBuf>,
    /// Worker threads of the load generator's runtime (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Server processes of a backend, `NAME=PID,PID,...` (repeatable): their CPU time
    /// (user + system, from /proc) during each measured window is reported per lock pair.
    #[arg(long)]
    pids: Vec<String>,
    /// etcd-API workloads instead of locks: put, txn (CAS), range, mixed, watch (fan-out),
    /// memory (RSS after --mem-keys keys and --mem-seconds of overwrites at --mem-rate);
    /// backends fenced and/or etcd. `--keys` is not used.
    #[arg(long, value_delimiter = ',')]
    kv: Vec<String>,
    /// Value size of every put (bytes).
    #[arg(long, default_value_t = 100)]
    kv_value_size: usize,
    /// Keys preloaded for range and mixed (point gets pick one at random).
    #[arg(long, default_value_t = 10_000)]
    kv_keyspace: usize,
    /// Share of puts in the mixed workload (%); the rest are point gets.
    #[arg(long, default_value_t = 30)]
    kv_put_percent: u32,
    /// Watch fan-out: watchers on the one prefix.
    #[arg(long, default_value_t = 1000)]
    watchers: usize,
    /// Watch fan-out: streams (one connection each, spread over the endpoints).
    #[arg(long, default_value_t = 20)]
    watch_streams: usize,
    /// Watch fan-out: the writer's puts per second, a list (each a cell; 0: as fast as one
    /// client goes).
    #[arg(long, value_delimiter = ',', default_value = "100")]
    watch_rate: Vec<f64>,
    /// Watch fan-out: writers (each on its own connection); the rate is theirs together.
    #[arg(long, default_value_t = 1)]
    watch_writers: usize,
    /// Workload `memory`: keys filled (values of --kv-value-size bytes).
    #[arg(long, default_value_t = 1_000_000)]
    mem_keys: usize,
    /// Workload `memory`: overwrites per second after the fill (history kept, no compaction).
    #[arg(long, default_value_t = 5000.0)]
    mem_rate: f64,
    /// Workload `memory`: seconds of overwrites.
    #[arg(long, default_value_t = 300.0)]
    mem_seconds: f64,
    /// Workload `memory`: concurrent writers.
    #[arg(long, default_value_t = 64)]
    mem_clients: usize,
    /// Keep-alive load instead of locks (`fenced_bench::leases`): this many etcd leases kept
    /// alive every TTL/3 by backends fenced and/or etcd for --duration per round; needs
    /// --pids and --metrics of each backend's nodes (same order) to find and measure the
    /// leader.
    #[arg(long)]
    leases: Option<usize>,
    /// Keep-alive load: the leases' TTL (s); each is kept alive every TTL/3.
    #[arg(long, default_value_t = 10)]
    lease_ttl_s: i64,
    /// Keep-alive load: LeaseKeepAlive streams (one connection each, like one Go client
    /// each), the leases spread over them.
    #[arg(long, default_value_t = 20)]
    lease_streams: usize,
    /// Each node's Prometheus address `NAME=HOST:PORT,...` (repeatable), in --pids order.
    #[arg(long)]
    metrics: Vec<String>,
}

fn rotate(v: &[String], i: usize) -> Vec<String> {
    let n = v.len().max(1);
    (0..v.len()).map(|k| v[(i + k) % n].clone()).collect()
}

fn pick(v: &[String], i: usize) -> anyhow::Result<&str> {
    v.get(i % v.len().max(1))
        .map(String::as_str)
        .context("no endpoints given for this backend")
}

fn make(cli: &Cli, backend: &str, i: usize) -> anyhow::Result<Box<dyn DistLock>> {
    let retry = RetryPolicy {
        delay: Duration::from_micros(cli.retry_delay_us),
        jitter: Duration::from_micros(cli.retry_jitter_us),
    };
    let rcfg = RedisConfig {
        timeout: Duration::from_secs(2),
        retry,
    };
    Ok(match backend {
        "fenced" => Box::new(FencedGrpc::connect(rotate(&cli.fenced, i))?),
        "fenced-resp" => Box::new(FencedResp::new(
            pick(&cli.fenced_resp, i)?,
            Duration::from_secs(10),
        )?),
        "fenced-setnx" => Box::new(RedisLock::fenced_setnx(pick(&cli.fenced_resp, i)?, rcfg)?),
        "redis" => Box::new(RedisLock::new("redis", &cli.redis, rcfg)?),
        "redis-aof" => Box::new(RedisLock::new("redis-aof", &cli.redis_aof, rcfg)?),
        "redlock" => Box::new(Redlock::new(
            &cli.redlock,
            RedlockConfig {
                instance_timeout: Duration::from_millis(cli.redlock_timeout_ms),
                retry,
            },
        )?),
        "etcd" => {
            let ep = cli
                .etcd
                .get(i % cli.etcd.len().max(1))
                .context("no --etcd")?;
            Box::new(EtcdLock::connect(ep)?)
        }
        "etcd-lock" => Box::new(EtcdLockService::etcd(pick(&cli.etcd, i)?)?),
        "fenced-etcdlock" => Box::new(EtcdLockService::fenced(pick(&cli.fenced, i)?)?),
        "fenced-resp-read" | "fenced-resp-permit" | "fenced-read" | "fenced-permit"
        | "redis-aof-read" | "redis-aof-permit" => {
            let mode = if backend.ends_with("-read") {
                LockMode::Read
            } else {
                LockMode::Permit {
                    permits: cli.permits,
                }
            };
            let inner: Box<dyn DistLock> = if backend.starts_with("fenced-resp") {
                Box::new(FencedResp::new(
                    pick(&cli.fenced_resp, i)?,
                    Duration::from_secs(10),
                )?)
            } else if backend.starts_with("fenced") {
                Box::new(FencedGrpc::connect(rotate(&cli.fenced, i))?)
            } else {
                Box::new(Redisson::new("redis-aof", &cli.redis_aof, rcfg)?)
            };
            Box::new(WithMode { inner, mode })
        }
        "fenced-throttle" => Box::new(Throttle::cl_throttle(
            "fenced-throttle",
            pick(&cli.fenced_resp, i)?,
            cli.throttle_burst,
            cli.throttle_rate,
            1,
        )?),
        "fenced-tokenbucket" => Box::new(Throttle::token_bucket(
            "fenced-tokenbucket",
            pick(&cli.fenced_resp, i)?,
            cli.throttle_burst,
            cli.throttle_rate,
        )?),
        "fenced-lua" => Box::new(Throttle::lua_token_bucket(
            "fenced-lua",
            pick(&cli.fenced_resp, i)?,
            cli.throttle_rate,
            cli.throttle_burst,
        )?),
        "redis-lua" => Box::new(Throttle::lua_token_bucket(
            "redis-lua",
            &cli.redis,
            cli.throttle_rate,
            cli.throttle_burst,
        )?),
        "redis-aof-lua" => Box::new(Throttle::lua_token_bucket(
            "redis-aof-lua",
            &cli.redis_aof,
            cli.throttle_rate,
            cli.throttle_burst,
        )?),
        other => bail!("unknown backend {other:?} (known: {})", BACKENDS.join(", ")),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cell {
    clients: usize,
    keys: usize,
}

impl Cell {
    fn label(&self) -> &'static str {
        if self.keys == 1 && self.clients > 1 {
            "contended"
        } else if self.keys >= self.clients {
            "uncontended"
        } else {
            "mixed"
        }
    }
}

/// Server and load-generator CPU µs per pair of each (cell, backend).
type PerPair = BTreeMap<(Cell, usize), (Option<f64>, Option<f64>)>;

/// CPU time spent during a cell's windows, summed over rounds.
#[derive(Default, Clone, Copy)]
struct CpuSpent {
    /// The backend's server processes (`None`: not given, or one was unreadable).
    server_us: Option<f64>,
    /// The load generator itself.
    bench_us: f64,
}

#[derive(Serialize)]
struct Row<'a> {
    backend: &'a str,
    clients: usize,
    keys: usize,
    contention: &'static str,
    ttl_ms: u64,
    work_us: u64,
    wait_ms: u64,
    rounds: usize,
    tokens: bool,
    /// Server CPU (µs, all of the backend's processes) per lock pair.
    server_cpu_us_per_pair: Option<f64>,
    /// The load generator's own CPU (µs) per lock pair.
    bench_cpu_us_per_pair: Option<f64>,
    #[serde(flatten)]
    summary: &'a Summary,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(t) = cli.threads {
        rt.worker_threads(t.max(1));
    }
    let rt = rt.build().context("starting the runtime")?;
    rt.block_on(bench(cli))
}

async fn bench(cli: Cli) -> anyhow::Result<()> {
    if !cli.kv.is_empty() {
        return kv_bench(cli).await;
    }
    if cli.leases.is_some() {
        return lease_bench(cli).await;
    }
    let backends: Vec<String> = match (&cli.backend, cli.compare.is_empty()) {
        (Some(b), _) => vec![b.clone()],
        (None, false) => cli.compare.clone(),
        (None, true) => bail!("give --backend NAME or --compare A,B,..."),
    };
    for b in &backends {
        if !BACKENDS.contains(&b.as_str()) {
            bail!("unknown backend {b:?} (known: {})", BACKENDS.join(", "));
        }
    }
    let mut cells = Vec::new();
    for &c in &cli.clients {
        if c == 0 {
            bail!("--clients must be at least 1");
        }
        for k in &cli.keys {
            let keys = if k.eq_ignore_ascii_case("c") {
                c
            } else {
                k.parse::<usize>()
                    .ok()
                    .filter(|k| *k > 0)
                    .with_context(|| format!("--keys {k:?}: a positive number or c"))?
            };
            let cell = Cell { clients: c, keys };
            if !cells.contains(&cell) {
                cells.push(cell);
            }
        }
    }
    if cli.duration <= 0.0 || cli.rounds == 0 {
        bail!("--duration and --rounds must be positive");
    }
    let run_id = random_id(4);
    let pids = fenced_bench::cpu::parse_pids(&cli.pids)?;
    let me = std::process::id().to_string();
    let mut results: BTreeMap<(Cell, usize), Measured> = BTreeMap::new();
    let mut cpu: BTreeMap<(Cell, usize), CpuSpent> = BTreeMap::new();
    let total = cli.rounds * cells.len() * backends.len();
    let mut done = 0;
    for round in 0..cli.rounds {
        for cell in &cells {
            for k in 0..backends.len() {
                let bi = (k + round) % backends.len();
                let name = &backends[bi];
                let w = Workload {
                    clients: cell.clients,
                    keys: cell.keys,
                    duration: Duration::from_secs_f64(cli.duration),
                    ttl: Duration::from_millis(cli.ttl_ms),
                    wait: Duration::from_millis(cli.wait_ms),
                    work: Duration::from_micros(cli.work_us),
                    rate: cli.rate,
                    prefix: format!("bench-{run_id}-r{round}-c{}k{}", cell.clients, cell.keys),
                };
                let clients = (0..cell.clients)
                    .map(|i| make(&cli, name, i))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                done += 1;
                eprintln!(
                    "[{done}/{total}] round {} {name}: {} clients, {} keys ...",
                    round + 1,
                    cell.clients,
                    cell.keys
                );
                let server_pids = pids.get(name.as_str());
                let server_before = server_pids.and_then(|p| fenced_bench::cpu::total_cpu_us(p));
                let bench_before = fenced_bench::cpu::process_cpu_us(&me).unwrap_or(0.0);
                let m = run(clients, &w).await;
                let server_after = server_pids.and_then(|p| fenced_bench::cpu::total_cpu_us(p));
                let bench_after = fenced_bench::cpu::process_cpu_us(&me).unwrap_or(0.0);
                let spent = cpu.entry((*cell, bi)).or_insert(CpuSpent {
                    server_us: Some(0.0),
                    bench_us: 0.0,
                });
                spent.server_us = match (spent.server_us, server_before, server_after) {
                    (Some(sum), Some(b), Some(a)) => Some(sum + (a - b)),
                    _ => None,
                };
                spent.bench_us += bench_after - bench_before;
                let s = m.summary();
                eprintln!(
                    "    {:.0} pairs/s, {:.0} failed/s, acquire p50 {} p99 {} µs, errors {}{}",
                    s.pairs_per_s,
                    s.failed_per_s,
                    s.acquire_us.p50,
                    s.acquire_us.p99,
                    s.errors,
                    s.first_error
                        .as_deref()
                        .map(|e| format!(" (first: {e})"))
                        .unwrap_or_default()
                );
                results.entry((*cell, bi)).or_default().merge(&m);
                // Let the previous backend's background work (expiry, compaction) settle.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }

    let mut json_rows = Vec::new();
    let mut summaries: BTreeMap<(Cell, usize), Summary> = BTreeMap::new();
    for ((cell, bi), m) in &results {
        summaries.insert((*cell, *bi), m.summary());
    }
    let per_pair: PerPair = summaries
        .iter()
        .map(|(k, s)| {
            let spent = cpu.get(k).copied().unwrap_or_default();
            let per = |us: f64| (s.pairs > 0).then(|| us / s.pairs as f64);
            (*k, (spent.server_us.and_then(per), per(spent.bench_us)))
        })
        .collect();
    for ((cell, bi), s) in &summaries {
        let name = backends[*bi].as_str();
        let (server_cpu, bench_cpu) = per_pair.get(&(*cell, *bi)).copied().unwrap_or_default();
        json_rows.push(serde_json::to_value(Row {
            backend: name,
            clients: cell.clients,
            keys: cell.keys,
            contention: cell.label(),
            ttl_ms: cli.ttl_ms,
            work_us: cli.work_us,
            wait_ms: cli.wait_ms,
            rounds: cli.rounds,
            tokens: matches!(
                name,
                "fenced"
                    | "fenced-resp"
                    | "fenced-setnx"
                    | "etcd"
                    | "etcd-lock"
                    | "fenced-etcdlock"
                    | "fenced-resp-read"
                    | "fenced-resp-permit"
                    | "fenced-read"
                    | "fenced-permit"
            ),
            server_cpu_us_per_pair: server_cpu,
            bench_cpu_us_per_pair: bench_cpu,
            summary: s,
        })?);
    }
    let json = serde_json::to_string_pretty(&json_rows)?;
    if let Some(p) = &cli.json {
        std::fs::write(p, &json).with_context(|| format!("writing {}", p.display()))?;
    } else {
        println!("{json}");
    }

    let md = markdown(&backends, &cells, &summaries, &per_pair);
    println!("{md}");
    if let Some(p) = &cli.markdown {
        let mut f = std::fs::File::create(p).with_context(|| format!("writing {}", p.display()))?;
        f.write_all(md.as_bytes())?;
    }
    Ok(())
}

/// The backends of an etcd-API run (`--backend` or `--compare`: fenced and/or etcd) with their
/// endpoints; `mode` names the flag in errors.
fn etcd_api_backends(cli: &Cli, mode: &str) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let names: Vec<String> = match (&cli.backend, cli.compare.is_empty()) {
        (Some(b), _) => vec![b.clone()],
        (None, false) => cli.compare.clone(),
        (None, true) => bail!("give --backend NAME or --compare A,B,..."),
    };
    names
        .into_iter()
        .map(|n| {
            let endpoints = match n.as_str() {
                "fenced" => cli.fenced.clone(),
                "etcd" => cli.etcd.clone(),
                other => {
                    bail!("{mode}: backend {other:?} does not speak etcd's API (fenced, etcd)")
                }
            };
            Ok((n, endpoints))
        })
        .collect()
}

/// `--kv`: etcd's API against fenced and/or etcd.
async fn kv_bench(cli: Cli) -> anyhow::Result<()> {
    use fenced_bench::kv::KvOp;
    use fenced_bench::kvbench::{KvConfig, Target};
    let pids = fenced_bench::cpu::parse_pids(&cli.pids)?;
    let mut targets = Vec::new();
    for (name, endpoints) in etcd_api_backends(&cli, "--kv")? {
        let pids = pids.get(&name).cloned();
        targets.push(Target {
            name,
            endpoints,
            pids,
        });
    }
    let mut ops = Vec::new();
    let mut watch = false;
    let mut memory = None;
    for w in &cli.kv {
        if w == "watch" {
            watch = true;
        } else if w == "memory" {
            memory = Some(fenced_bench::memory::MemoryWorkload {
                keys: cli.mem_keys,
                value_size: cli.kv_value_size,
                rate: cli.mem_rate,
                seconds: cli.mem_seconds,
                clients: cli.mem_clients,
                prefix: String::new(),
            });
        } else {
            let op = KvOp::parse(w).with_context(|| {
                format!("--kv {w:?}: one of put, txn, range, mixed, watch, memory")
            })?;
            if !ops.contains(&op) {
                ops.push(op);
            }
        }
    }
    if cli.duration <= 0.0 || cli.kv_put_percent > 100 || cli.kv_keyspace == 0 {
        bail!("--duration must be positive, --kv-put-percent ≤ 100, --kv-keyspace ≥ 1");
    }
    let cfg = KvConfig {
        targets,
        ops,
        watch,
        clients: cli.clients.clone(),
        duration: Duration::from_secs_f64(cli.duration),
        rounds: cli.rounds,
        value_size: cli.kv_value_size,
        keyspace: cli.kv_keyspace,
        put_percent: cli.kv_put_percent,
        watchers: cli.watchers,
        watch_streams: cli.watch_streams,
        watch_rates: cli.watch_rate.clone(),
        watch_writers: cli.watch_writers,
        memory,
        run_id: random_id(4),
    };
    let report = fenced_bench::kvbench::run(&cfg).await?;
    let json = serde_json::to_string_pretty(&report.json)?;
    if let Some(p) = &cli.json {
        std::fs::write(p, &json).with_context(|| format!("writing {}", p.display()))?;
    } else {
        println!("{json}");
    }
    println!("{}", report.markdown);
    if let Some(p) = &cli.markdown {
        std::fs::write(p, &report.markdown).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// `--leases`: the keep-alive load against fenced and/or etcd, interleaved rounds.
async fn lease_bench(cli: Cli) -> anyhow::Result<()> {
    use fenced_bench::leases::{markdown, run_leases, LeaseLoad, LeaseResult, LeaseTarget};
    let pids = fenced_bench::cpu::parse_pids(&cli.pids)?;
    let mut targets = Vec::new();
    for (name, endpoints) in etcd_api_backends(&cli, "--leases")? {
        let metrics: Vec<String> = cli
            .metrics
            .iter()
            .filter_map(|m| m.strip_prefix(&format!("{name}=")))
            .flat_map(|m| m.split(',').map(str::to_owned))
            .collect();
        let p = pids.get(&name).cloned().unwrap_or_default();
        if p.is_empty() || p.len() != metrics.len() {
            bail!(
                "--leases: give --pids {name}=... and --metrics {name}=... for each node, same order"
            );
        }
        targets.push(LeaseTarget {
            name,
            endpoints,
            nodes: p.into_iter().zip(metrics).collect(),
        });
    }
    let load = LeaseLoad {
        leases: cli.leases.unwrap_or(0),
        ttl_s: cli.lease_ttl_s,
        streams: cli.lease_streams,
        duration: Duration::from_secs_f64(cli.duration),
        idle: Duration::from_secs(5),
    };
    let mut rows: Vec<LeaseResult> = Vec::new();
    for round in 0..cli.rounds.max(1) {
        for k in 0..targets.len() {
            let t = &targets[(k + round) % targets.len()];
            eprintln!(
                "round {} {}: {} leases, TTL {} s, {} streams ...",
                round + 1,
                t.name,
                load.leases,
                load.ttl_s,
                load.streams
            );
            let r = run_leases(t, &load).await?;
            eprintln!(
                "    leader CPU {:.1} % of a core, {:.1} entries/s, {:.0} keep-alives/s, {} lost",
                r.leader_cpu_percent, r.leader_entries_per_s, r.keepalives_per_s, r.lost
            );
            rows.push(r);
            // Let the revocations settle.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    rows.sort_by(|a, b| a.backend.cmp(&b.backend));
    let json = serde_json::to_string_pretty(&rows)?;
    if let Some(p) = &cli.json {
        std::fs::write(p, &json).with_context(|| format!("writing {}", p.display()))?;
    } else {
        println!("{json}");
    }
    let md = markdown(&rows);
    println!("{md}");
    if let Some(p) = &cli.markdown {
        std::fs::write(p, &md).with_context(|| format!("writing {}", p.display()))?;
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

fn markdown(
    backends: &[String],
    cells: &[Cell],
    s: &BTreeMap<(Cell, usize), Summary>,
    cpu: &PerPair,
) -> String {
    let base = &backends[0];
    let mut out = String::new();
    if backends.iter().all(|b| is_throttle(b)) {
        // One decision per "pair"; the release is no call.
        out.push_str(&format!(
            "| clients | keys | backend | decisions/s | {base} ÷ this | limited/s | decision p50 / p99 / p99.9 (ms) | (no release) | server CPU µs/decision | bench CPU µs/decision | errors |\n"
        ));
    } else {
        out.push_str(&format!(
            "| clients | keys | backend | pairs/s | {base} ÷ this | failed tries/s | acquire p50 / p99 / p99.9 (ms) | release p50 / p99 (ms) | server CPU µs/pair | bench CPU µs/pair | errors |\n"
        ));
    }
    out.push_str("|---:|---:|---|---:|---:|---:|---|---|---:|---:|---:|\n");
    let us = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.0}"));
    for cell in cells {
        let b0 = s.get(&(*cell, 0)).map(|x| x.pairs_per_s).unwrap_or(0.0);
        for (bi, name) in backends.iter().enumerate() {
            let Some(x) = s.get(&(*cell, bi)) else {
                continue;
            };
            let ratio = if x.pairs_per_s > 0.0 {
                format!("{:.2}×", b0 / x.pairs_per_s)
            } else {
                "∞".to_owned()
            };
            let (server_cpu, bench_cpu) = cpu.get(&(*cell, bi)).copied().unwrap_or_default();
            out.push_str(&format!(
                "| {} | {} ({}) | {} | {:.0} | {} | {:.0} | {} / {} / {} | {} / {} | {} | {} | {} |\n",
                cell.clients,
                cell.keys,
                cell.label(),
                name,
                x.pairs_per_s,
                ratio,
                x.failed_per_s,
                ms(x.acquire_us.p50),
                ms(x.acquire_us.p99),
                ms(x.acquire_us.p999),
                ms(x.release_us.p50),
                ms(x.release_us.p99),
                us(server_cpu),
                us(bench_cpu),
                x.errors + x.timeouts,
            ));
        }
    }
    out
}
