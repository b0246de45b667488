//! One client, run as its own process (so the pause nemesis can SIGSTOP it: a real stall, the
//! GC pause of Kleppmann's argument). It performs one workload and appends every op to its own
//! history file as invoke → ok | fail | info. After an `info` its process id is retired and it
//! goes on under a fresh id (and fresh connections and lock identity).
//!
//! RESP clients of fenced (`fenced-resp`, `fenced-setnx`, and the `register` workload) talk to
//! one node at a time, as Redis clients do: client `k` starts on node `k mod n` and moves to
//! the next node whenever an op ends `info` (timeout, dropped or refused connection, `-TIMEOUT`
//! or `-TRYAGAIN`) — the reconnect a Redis client makes after a broken connection, on the next
//! address. One op is never retried on another node: its outcome is already unknown.

use std::path::PathBuf;
use std::time::Duration;

use fenced_backends::{
    DistLock, EtcdLockService, LockError, LockMode, RedisConfig, RedisLock, Redisson, Redlock,
    RedlockConfig, RetryPolicy,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::history::{Event, HistoryError, HistoryWriter, Kind, Process, RunClock};
use crate::system::System;

mod limiter;
mod probe;

use limiter::{limiter_op, wall_ms};
pub use limiter::{LIMIT_COUNT, LIMIT_KEY, LIMIT_MAX_BURST, LIMIT_PERIOD_S, TOKEN_BUCKET_LUA};
pub use probe::probe;

/// The lock every lock/counter client contends for, and the storage key of the counter.
pub const LOCK: &str = "L";
pub const COUNTER: &str = "counter";
/// `rwlock` workload: the share of acquires that ask for the read side (the rest write).
pub const READ_PERCENT: u32 = 70;
/// `semaphore` workload: the semaphore's permits (with the default 5 clients, 2 wait).
pub const PERMITS: u32 = 3;

/// The grant a lock cycle of `workload` asks for: `rwlock` reads 70 % of the time and writes
/// otherwise, `semaphore` takes one of [`PERMITS`] permits, the others the exclusive lock.
pub(crate) fn pick_mode(workload: &str, rng: &mut StdRng) -> LockMode {
    match workload {
        "rwlock" if rng.gen_range(0..100) < READ_PERCENT => LockMode::Read,
        "rwlock" => LockMode::Write,
        "semaphore" => LockMode::Permit { permits: PERMITS },
        _ => LockMode::Exclusive,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientSpec {
    pub system: String,
    pub workload: String,
    /// This client's number; its process ids are `index + k * stride`.
    pub index: u64,
    pub stride: u64,
    /// CLOCK_MONOTONIC ns at the run's start.
    pub run_start: u64,
    /// Run time (ns) after which no new op starts.
    pub deadline: u64,
    pub history: PathBuf,
    /// Lock service: fenced gRPC addresses, fenced RESP addresses (fenced-resp,
    /// fenced-setnx) or Redis addresses.
    pub lock_endpoints: Vec<String>,
    /// RESP addresses for the register workload.
    pub resp_endpoints: Vec<String>,
    /// fenced-fence-check address (counter workloads).
    pub guard: String,
    pub ttl_ms: u64,
    pub wait_ms: u64,
    /// Longest in-client pause while holding the lock (between read and write, or before
    /// release).
    pub hold_ms: u64,
    pub op_timeout_ms: u64,
    pub seed: u64,
    /// Membership nemesis: the nodes that serve now, as indices into `lock_endpoints` and
    /// `resp_endpoints` (which then list every node of the run), rewritten by the harness as
    /// members come and go. Read at every (re)connect; `None`: every endpoint serves.
    #[serde(default)]
    pub members_file: Option<PathBuf>,
    /// Clock nemesis for clients (limiter workload): a signed integer of milliseconds that
    /// this client adds to the wall clock it hands the Lua limiter as "now". Re-read before
    /// every op; absent or unreadable: 0.
    #[serde(default)]
    pub clock_file: Option<PathBuf>,
}

impl ClientSpec {
    /// Indices of the endpoints that serve now (see `members_file`). Every endpoint when there
    /// is no file, or it cannot be read or lists none.
    pub fn serving(&self) -> Vec<usize> {
        let n = self.lock_endpoints.len().max(self.resp_endpoints.len());
        let all = || (0..n).collect();
        let Some(p) = &self.members_file else {
            return all();
        };
        let Ok(text) = std::fs::read_to_string(p) else {
            return all();
        };
        let v: Vec<usize> = text
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .filter(|i| *i < n)
            .collect();
        if v.is_empty() {
            all()
        } else {
            v
        }
    }

    /// The serving endpoints of `list` (`lock_endpoints` or `resp_endpoints`), starting at
    /// position `start` (modulo their number) and wrapping around.
    pub fn endpoints_from(&self, list: &[String], start: usize) -> Vec<String> {
        let s: Vec<&String> = self
            .serving()
            .into_iter()
            .filter_map(|i| list.get(i))
            .collect();
        let n = s.len().max(1);
        (0..s.len()).map(|k| s[(start + k) % n].clone()).collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("backend: {0}")]
    Backend(#[from] LockError),
    #[error("{0}")]
    Other(String),
}

/// Outcome of one op.
pub(crate) enum Res {
    Ok(Option<Value>, Option<u64>),
    Fail(String),
    Info(String),
}

pub(crate) struct Recorder {
    pub(crate) w: HistoryWriter,
    pub(crate) clock: RunClock,
    pub(crate) process: u64,
    pub(crate) retired: bool,
}

impl Recorder {
    pub(crate) fn invoke(&mut self, e: Event) -> Result<(), ClientError> {
        Ok(self.w.write(&e)?)
    }

    /// Record the completion of the op invoked as `inv`.
    pub(crate) fn complete(&mut self, inv: &Event, r: &Res) -> Result<(), ClientError> {
        self.complete_admitted(inv, r, None)
    }

    /// [`Recorder::complete`] for a `throttle`, with the limiter's decision on the `ok`.
    fn complete_admitted(
        &mut self,
        inv: &Event,
        r: &Res,
        admitted: Option<bool>,
    ) -> Result<(), ClientError> {
        let mut e = Event::new(inv.process.clone(), Kind::Ok, &inv.f, self.clock.now());
        e.key = inv.key.clone();
        match r {
            Res::Ok(v, t) => {
                e.value = v.clone();
                e.token = *t;
                e.admitted = admitted;
            }
            Res::Fail(err) => {
                e.kind = Kind::Fail;
                e.error = Some(err.clone());
            }
            Res::Info(err) => {
                e.kind = Kind::Info;
                e.error = Some(err.clone());
                self.retired = true;
            }
        }
        Ok(self.w.write(&e)?)
    }

    pub(crate) fn ev(&self, f: &str) -> Event {
        Event::new(
            Process::Client(self.process),
            Kind::Invoke,
            f,
            self.clock.now(),
        )
    }
}

/// "Connection refused": the request never left the client, so it certainly had no effect.
fn refused(message: &str) -> bool {
    message.contains("Connection refused") || message.contains("connection refused")
}

/// fenced's RESP replies that leave the outcome unknown: `-TIMEOUT outcome unknown` (the
/// entry may still commit) and `-TRYAGAIN cluster unavailable` (which can follow an attempt
/// inside the node whose outcome it could not learn). `RedisLock` reports them as
/// `LockError::Backend` with redis-rs's rendering (`"TIMEOUT": …`, `TryAgain: …`).
fn resp_outcome_unknown(message: &str) -> bool {
    ["TIMEOUT", "TryAgain", "TRYAGAIN", "outcome unknown"]
        .iter()
        .any(|m| message.contains(m))
}

/// How a lock call ended, as a history outcome: `fail` only when the call certainly had no
/// effect. For every fenced client any `Unavailable` (a refused connection included) is
/// `info`: fenced forwards and retries writes inside the cluster, and `fenced-setnx`'s
/// acquire is two commands (`SET NX`, then `FENCE.TOKEN`), so which step failed is not known.
fn lock_res<T>(
    system: System,
    r: Result<Result<T, LockError>, tokio::time::error::Elapsed>,
) -> Result<T, Res> {
    match r {
        Err(_) => Err(Res::Info("timeout".into())),
        Ok(Err(LockError::Unavailable { message, .. }))
            if !system.is_fenced_cluster() && refused(&message) =>
        {
            Err(Res::Fail(message))
        }
        Ok(Err(LockError::Unavailable { message, .. })) => Err(Res::Info(message)),
        Ok(Err(LockError::Backend { message, .. }))
            if system.is_fenced_resp() && resp_outcome_unknown(&message) =>
        {
            Err(Res::Info(message))
        }
        Ok(Err(e)) => Err(Res::Fail(e.to_string())),
        Ok(Ok(v)) => Ok(v),
    }
}

/// [`lock_res`] for an acquire. `fenced-setnx`: any error after the request left the client
/// is `info` — the `SET NX` may have succeeded and only the `FENCE.TOKEN` that follows it
/// failed (unreachable node, or the key already gone: the lock was taken, its token unknown).
fn acquire_res<T>(
    system: System,
    r: Result<Result<T, LockError>, tokio::time::error::Elapsed>,
) -> Result<T, Res> {
    match r {
        Ok(Err(LockError::Backend { message, .. })) if system == System::FencedSetnx => {
            Err(Res::Info(message))
        }
        r => lock_res(system, r),
    }
}

fn system_of(spec: &ClientSpec) -> Result<System, ClientError> {
    System::parse(&spec.system)
        .ok_or_else(|| ClientError::Other(format!("unknown system {}", spec.system)))
}

/// The lock client. `node`: which of the serving `spec.lock_endpoints` a RESP client connects
/// to (taken modulo their number); the gRPC client gets them all and finds the leader itself
/// (with a members file, starting its list at that node: a client whose first endpoint is
/// gone for good must not start every fresh connection there).
fn make_lock(spec: &ClientSpec, node: usize) -> Result<Box<dyn DistLock>, ClientError> {
    let retry = RetryPolicy {
        delay: Duration::from_millis(20),
        jitter: Duration::from_millis(20),
    };
    let op_timeout = Duration::from_millis(spec.op_timeout_ms);
    let serving = spec.endpoints_from(&spec.lock_endpoints, node);
    let node_addr = || {
        serving
            .first()
            .ok_or_else(|| ClientError::Other("no lock endpoints".into()))
    };
    Ok(match system_of(spec)? {
        System::Fenced if spec.members_file.is_some() => {
            Box::new(fenced_backends::FencedGrpc::connect(&serving)?)
        }
        System::Fenced => Box::new(fenced_backends::FencedGrpc::connect(&spec.lock_endpoints)?),
        System::FencedResp => Box::new(fenced_backends::FencedResp::new(node_addr()?, op_timeout)?),
        System::FencedSetnx => Box::new(RedisLock::fenced_setnx(
            node_addr()?,
            RedisConfig {
                // A write goes through Raft (and maybe an election): give it the op timeout,
                // not the 500 ms that suits a single Redis.
                timeout: op_timeout,
                retry,
            },
        )?),
        System::Redis => {
            let addr = spec
                .lock_endpoints
                .first()
                .ok_or_else(|| ClientError::Other("no redis address".into()))?;
            let cfg = RedisConfig {
                timeout: Duration::from_millis(500),
                retry,
            };
            if matches!(spec.workload.as_str(), "rwlock" | "semaphore") {
                // Redisson's read-write lock and permit semaphore scripts.
                return Ok(Box::new(Redisson::new("redis", addr, cfg)?));
            }
            Box::new(RedisLock::new("redis", addr, cfg)?)
        }
        System::FencedLua => {
            return Err(ClientError::Other(
                "fenced-lua runs only the limiter workload".into(),
            ))
        }
        System::Etcd => {
            return Err(ClientError::Other(
                "etcd runs only the kv and watch workloads".into(),
            ))
        }
        // etcd's Lock service, one node per client incarnation (the next one after an info).
        System::FencedEtcdLock => Box::new(EtcdLockService::fenced(node_addr()?)?),
        System::EtcdLock => Box::new(EtcdLockService::etcd(node_addr()?)?),
        // Even clients through the client-side recipe on KV, odd ones through the Lock RPC.
        System::FencedEtcdMix | System::EtcdMix if spec.index.is_multiple_of(2) => {
            Box::new(fenced_backends::EtcdLock::connect(node_addr()?)?)
        }
        System::FencedEtcdMix => Box::new(EtcdLockService::fenced(node_addr()?)?),
        System::EtcdMix => Box::new(EtcdLockService::etcd(node_addr()?)?),
        System::Redlock => Box::new(Redlock::new(
            &spec.lock_endpoints,
            RedlockConfig {
                instance_timeout: Duration::from_millis(100),
                retry,
            },
        )?),
    })
}

/// A connection to fenced-fence-check's line protocol.
struct Guard {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
    timeout: Duration,
}

impl Guard {
    async fn request(&mut self, line: &str) -> Result<String, String> {
        let fut = async {
            if self.conn.is_none() {
                let s = TcpStream::connect(&self.addr)
                    .await
                    .map_err(|e| format!("connect {}: {e}", self.addr))?;
                self.conn = Some(BufReader::new(s));
            }
            let c = self.conn.as_mut().ok_or("no connection")?;
            c.get_mut()
                .write_all(format!("{line}\n").as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let mut reply = String::new();
            let n = c.read_line(&mut reply).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".to_owned());
            }
            Ok(reply.trim_end().to_owned())
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                self.conn = None;
                Err(e)
            }
            Err(_) => {
                self.conn = None;
                Err("timeout".into())
            }
        }
    }

    /// `GET counter` → the counter (0 when absent).
    async fn read(&mut self) -> Res {
        match self.request(&format!("GET {COUNTER}")).await {
            Ok(r) if r == "NIL" => Res::Ok(Some(json!(0)), None),
            Ok(r) => {
                let mut p = r.splitn(3, ' ');
                match (
                    p.next(),
                    p.next(),
                    p.next().map(|v| v.trim().parse::<i64>()),
                ) {
                    (Some("VALUE"), Some(_), Some(Ok(v))) => Res::Ok(Some(json!(v)), None),
                    _ => Res::Fail(format!("unexpected reply {r:?}")),
                }
            }
            Err(e) => Res::Info(e),
        }
    }

    async fn write(&mut self, token: Option<u64>, value: i64) -> Res {
        let line = match token {
            Some(t) => format!("PUT {COUNTER} {t} {value}"),
            None => format!("PUTU {COUNTER} {value}"),
        };
        match self.request(&line).await {
            Ok(r) if r == "OK" => Res::Ok(None, None),
            Ok(r) if r.starts_with("STALE") => Res::Fail(r),
            Ok(r) => Res::Info(format!("unexpected reply {r:?}")),
            Err(e) => Res::Info(e),
        }
    }
}

const CAS_SCRIPT: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
  redis.call("set", KEYS[1], ARGV[2]); return 1 else return 0 end"#;

/// Run the client until its deadline.
pub async fn run(spec: ClientSpec) -> Result<(), ClientError> {
    let clock = RunClock {
        start: spec.run_start,
    };
    let mut rec = Recorder {
        w: HistoryWriter::create(&spec.history)?,
        clock,
        process: spec.index,
        retired: false,
    };
    let mut rng = StdRng::seed_from_u64(spec.seed.wrapping_mul(1_000_003) ^ spec.index);
    let op_timeout = Duration::from_millis(spec.op_timeout_ms);
    let mut guard = Guard {
        addr: spec.guard.clone(),
        conn: None,
        timeout: op_timeout,
    };
    if spec.workload == "final-read" {
        return final_read(&mut rec, &mut guard).await;
    }
    let system = system_of(&spec)?;
    if spec.workload == "watch" {
        return crate::etcd::watch::run(&spec, &mut rec, &mut rng).await;
    }
    // kv workload: a channel to one node's etcd API, and this client's value counter.
    let mut etcd: Option<tonic::transport::Channel> = None;
    let mut kv_seq = 0u64;
    let mut lock: Option<Box<dyn DistLock>> = None;
    let mut resp: Option<(usize, redis::aio::ConnectionManager)> = None;
    let mut incarnation = 0u64;
    // Bounded: the deadline, and at most this many ops.
    for _ in 0..1_000_000u32 {
        if clock.now() >= spec.deadline {
            break;
        }
        if rec.retired {
            // Back off a little: a down server must not turn into a storm of info ops.
            tokio::time::sleep(Duration::from_millis(rng.gen_range(100..300))).await;
            incarnation += 1;
            rec.process = spec.index + incarnation * spec.stride;
            rec.retired = false;
            lock = None;
            resp = None;
            etcd = None;
            guard.conn = None;
        }
        match spec.workload.as_str() {
            "register" | "limiter" => {
                if resp.is_none() {
                    let i = spec.index as usize + incarnation as usize;
                    let eps = spec.endpoints_from(&spec.resp_endpoints, i);
                    let addr = eps
                        .first()
                        .ok_or_else(|| ClientError::Other("no RESP endpoints".into()))?;
                    resp = Some((
                        i,
                        fenced_backends::redis::connect(addr, Some(op_timeout), op_timeout)?,
                    ));
                }
                if let Some((_, c)) = resp.as_mut() {
                    if spec.workload == "limiter" {
                        limiter_op(&spec, system, &mut rec, c, op_timeout).await?;
                    } else {
                        register_op(&spec, &mut rec, &mut rng, c, op_timeout).await?;
                    }
                }
                let pause = rng.gen_range(5..30);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            "kv" => {
                if etcd.is_none() {
                    let node = spec.index as usize + incarnation as usize;
                    etcd = Some(crate::etcd::channel(&crate::etcd::endpoint(&spec, node)?)?);
                }
                if let Some(ch) = &etcd {
                    crate::etcd::kv::op(&mut rec, &mut rng, ch, &mut kv_seq, op_timeout).await?;
                }
                let pause = rng.gen_range(5..30);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            "lock" | "counter" | "counter-unfenced" | "rwlock" | "semaphore" => {
                if lock.is_none() {
                    // RESP clients: a fresh process id starts on the next node.
                    let node = spec.index as usize + incarnation as usize;
                    if system.is_fenced_resp() {
                        eprintln!(
                            "process {}: {system} client on {}",
                            rec.process,
                            spec.endpoints_from(&spec.lock_endpoints, node)
                                .first()
                                .map_or("?", |s| s.as_str())
                        );
                    }
                    lock = Some(make_lock(&spec, node)?);
                }
                if let Some(l) = lock.as_deref() {
                    let cx = Cx {
                        spec: &spec,
                        system,
                        op_timeout,
                    };
                    lock_cycle(&cx, &mut rec, &mut rng, l, &mut guard).await?;
                }
            }
            other => return Err(ClientError::Other(format!("unknown workload {other}"))),
        }
    }
    Ok(())
}

/// What a lock cycle needs to know about the run.
struct Cx<'a> {
    spec: &'a ClientSpec,
    system: System,
    op_timeout: Duration,
}

async fn lock_cycle(
    cx: &Cx<'_>,
    rec: &mut Recorder,
    rng: &mut StdRng,
    lock: &dyn DistLock,
    guard: &mut Guard,
) -> Result<(), ClientError> {
    let (spec, op_timeout) = (cx.spec, cx.op_timeout);
    let ttl = Duration::from_millis(spec.ttl_ms);
    let wait = Duration::from_millis(spec.wait_ms);
    let mode = pick_mode(&spec.workload, rng);
    let mut inv = rec.ev("acquire").key(LOCK).ttl_ms(spec.ttl_ms);
    match mode {
        LockMode::Exclusive => {}
        LockMode::Permit { permits } => inv = inv.mode(mode.name(), Some(permits)),
        m => inv = inv.mode(m.name(), None),
    }
    rec.invoke(inv.clone())?;
    let r = tokio::time::timeout(op_timeout + wait, lock.acquire_mode(LOCK, mode, ttl, wait)).await;
    let grant = match acquire_res(cx.system, r) {
        Ok(Some(g)) => {
            rec.complete(&inv, &Res::Ok(None, g.token))?;
            g
        }
        Ok(None) => {
            rec.complete(&inv, &Res::Fail("not granted".into()))?;
            tokio::time::sleep(Duration::from_millis(rng.gen_range(5..50))).await;
            return Ok(());
        }
        Err(res) => {
            rec.complete(&inv, &res)?;
            if matches!(res, Res::Fail(_)) {
                // Refused: the server is down; do not spin.
                tokio::time::sleep(Duration::from_millis(rng.gen_range(100..300))).await;
            }
            return Ok(());
        }
    };
    let fenced = spec.workload == "counter" && grant.token.is_some();
    if !spec.workload.starts_with("counter") {
        let hold = rng.gen_range(0..=spec.hold_ms);
        tokio::time::sleep(Duration::from_millis(hold)).await;
    } else {
        // Read the counter.
        let inv = rec.ev("read-counter").key(COUNTER);
        rec.invoke(inv.clone())?;
        let r = guard.read().await;
        rec.complete(&inv, &r)?;
        let Res::Ok(Some(v), _) = r else {
            return Ok(());
        };
        let v = v.as_i64().unwrap_or(0);
        if fenced {
            // Register our token with storage before the pause: from here on, a superseded
            // holder's write is rejected.
            let t = grant.token;
            let mut inv = rec.ev("fence").key(COUNTER).value(json!(v));
            inv.token = t;
            rec.invoke(inv.clone())?;
            let r = guard.write(t, v).await;
            rec.complete(&inv, &r)?;
            if !matches!(r, Res::Ok(..)) {
                return release(cx, rec, lock, &grant).await;
            }
        }
        let pause = rng.gen_range(0..=spec.hold_ms);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let (f, t) = if fenced {
            ("fenced-write", grant.token)
        } else {
            ("write", None)
        };
        let mut inv = rec.ev(f).key(COUNTER).value(json!(v + 1));
        inv.token = t;
        rec.invoke(inv.clone())?;
        let r = guard.write(t, v + 1).await;
        rec.complete(&inv, &r)?;
        if rec.retired {
            return Ok(());
        }
    }
    release(cx, rec, lock, &grant).await
}

async fn release(
    cx: &Cx<'_>,
    rec: &mut Recorder,
    lock: &dyn DistLock,
    grant: &fenced_backends::Grant,
) -> Result<(), ClientError> {
    let mut inv = rec.ev("release").key(LOCK);
    inv.token = grant.token;
    rec.invoke(inv.clone())?;
    let r = tokio::time::timeout(cx.op_timeout, lock.release(grant)).await;
    let res = match lock_res(cx.system, r) {
        Ok(true) => Res::Ok(None, None),
        Ok(false) => Res::Fail("not held".into()),
        Err(res) => res,
    };
    rec.complete(&inv, &res)
}

fn redis_res<T>(
    r: Result<Result<T, redis::RedisError>, tokio::time::error::Elapsed>,
) -> Result<T, Res> {
    match r {
        Err(_) => Err(Res::Info("timeout".into())),
        Ok(Err(e)) if e.is_connection_refusal() => Err(Res::Fail(e.to_string())),
        // fenced's "the entry may or may not commit" and "no leader in time" replies.
        Ok(Err(e)) if matches!(e.code(), Some("TIMEOUT" | "TRYAGAIN")) => {
            Err(Res::Info(e.to_string()))
        }
        Ok(Err(e)) if e.is_timeout() || e.is_io_error() || e.is_connection_dropped() => {
            Err(Res::Info(e.to_string()))
        }
        Ok(Err(e)) => Err(Res::Fail(e.to_string())),
        Ok(Ok(v)) => Ok(v),
    }
}

async fn register_op(
    spec: &ClientSpec,
    rec: &mut Recorder,
    rng: &mut StdRng,
    c: &mut redis::aio::ConnectionManager,
    op_timeout: Duration,
) -> Result<(), ClientError> {
    // Keys rotate every 3 s (two at a time) so that each key's history stays small enough for
    // an exhaustive linearizability search.
    let slot = rec.clock.now() / 3_000_000_000;
    let key = format!("r{slot}-{}", rng.gen_range(0..2));
    let _ = spec;
    let dice = rng.gen_range(0..4);
    let (inv, res) = match dice {
        0 | 1 => {
            let inv = rec.ev("get").key(&key);
            rec.invoke(inv.clone())?;
            let r = tokio::time::timeout(
                op_timeout,
                redis::cmd("GET").arg(&key).query_async::<Option<String>>(c),
            )
            .await;
            let res = match redis_res(r) {
                Ok(v) => Res::Ok(Some(v.map_or(Value::Null, Value::String)), None),
                Err(r) => r,
            };
            (inv, res)
        }
        2 => {
            let v = rng.gen_range(0..5).to_string();
            let inv = rec.ev("put").key(&key).value(json!(v));
            rec.invoke(inv.clone())?;
            let r = tokio::time::timeout(
                op_timeout,
                redis::cmd("SET").arg(&key).arg(&v).query_async::<()>(c),
            )
            .await;
            (
                inv,
                redis_res(r).map_or_else(|r| r, |()| Res::Ok(None, None)),
            )
        }
        _ => {
            let old = rng.gen_range(0..5).to_string();
            let new = rng.gen_range(0..5).to_string();
            let inv = rec.ev("cas").key(&key).value(json!([old, new]));
            rec.invoke(inv.clone())?;
            let r = tokio::time::timeout(
                op_timeout,
                redis::cmd("EVAL")
                    .arg(CAS_SCRIPT)
                    .arg(1)
                    .arg(&key)
                    .arg(&old)
                    .arg(&new)
                    .query_async::<i64>(c),
            )
            .await;
            let res = match redis_res(r) {
                Ok(1) => Res::Ok(None, None),
                Ok(_) => Res::Fail("compare failed".into()),
                Err(r) => r,
            };
            (inv, res)
        }
    };
    rec.complete(&inv, &res)
}

/// After the run: read the counter once (retrying a bounded number of times).
async fn final_read(rec: &mut Recorder, guard: &mut Guard) -> Result<(), ClientError> {
    for _ in 0..10 {
        let inv = rec.ev("final-read").key(COUNTER);
        rec.invoke(inv.clone())?;
        let r = guard.read().await;
        rec.complete(&inv, &r)?;
        if matches!(r, Res::Ok(..)) {
            return Ok(());
        }
        rec.process += 1_000_000;
        rec.retired = false;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(ClientError::Other("final read failed 10 times".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(message: &str) -> Result<Result<(), LockError>, tokio::time::error::Elapsed> {
        Ok(Err(LockError::Unavailable {
            backend: "x",
            message: message.into(),
        }))
    }

    fn backend(message: &str) -> Result<Result<(), LockError>, tokio::time::error::Elapsed> {
        Ok(Err(LockError::Backend {
            backend: "x",
            message: message.into(),
        }))
    }

    fn kind(r: Result<(), Res>) -> &'static str {
        match r {
            Ok(()) => "ok",
            Err(Res::Ok(..)) => "ok",
            Err(Res::Fail(_)) => "fail",
            Err(Res::Info(_)) => "info",
        }
    }

    #[test]
    fn clients_pick_from_the_published_members() {
        let dir = tempfile::tempdir().expect("tempdir");
        let eps: Vec<String> = (1..=5).map(|i| format!("n{i}:7380")).collect();
        let mut spec = ClientSpec {
            system: "fenced".into(),
            workload: "lock".into(),
            index: 0,
            stride: 5,
            run_start: 0,
            deadline: 0,
            history: dir.path().join("h.jsonl"),
            lock_endpoints: eps.clone(),
            resp_endpoints: eps.clone(),
            guard: String::new(),
            ttl_ms: 1,
            wait_ms: 1,
            hold_ms: 1,
            op_timeout_ms: 1,
            seed: 1,
            members_file: None,
            clock_file: None,
        };
        // No file: every endpoint, rotated to the client's start, as before the file existed.
        assert_eq!(spec.endpoints_from(&eps, 6)[0], "n2:7380");
        assert_eq!(spec.serving(), [0, 1, 2, 3, 4]);
        let f = dir.path().join("members");
        spec.members_file = Some(f.clone());
        assert_eq!(
            spec.serving().len(),
            5,
            "an unreadable file means every endpoint"
        );
        std::fs::write(&f, "1 3 4\n").expect("write");
        assert_eq!(
            spec.endpoints_from(&eps, 1),
            ["n4:7380", "n5:7380", "n2:7380"]
        );
        std::fs::write(&f, "9 x\n").expect("write");
        assert_eq!(
            spec.serving().len(),
            5,
            "nothing usable listed: every endpoint"
        );
    }

    #[test]
    fn unknown_outcomes_are_info_for_every_fenced_client() {
        let refused = "Connection refused (os error 111)";
        assert_eq!(kind(lock_res(System::Redis, unavailable(refused))), "fail");
        assert_eq!(
            kind(lock_res(System::Redlock, unavailable(refused))),
            "fail"
        );
        for s in [System::Fenced, System::FencedResp, System::FencedSetnx] {
            assert_eq!(kind(lock_res(s, unavailable(refused))), "info", "{s}");
            assert_eq!(
                kind(acquire_res(s, unavailable("timed out"))),
                "info",
                "{s}"
            );
        }
        // RedisLock (fenced-setnx) renders fenced's replies through redis-rs as Backend.
        for m in [
            "\"TIMEOUT\": outcome unknown: raft write timed out",
            "TryAgain: cluster unavailable: not the leader (leader: unknown)",
        ] {
            assert_eq!(
                kind(lock_res(System::FencedSetnx, backend(m))),
                "info",
                "{m}"
            );
            assert_eq!(kind(lock_res(System::Redis, backend(m))), "fail", "{m}");
        }
        // A definite refusal stays a fail, except after a fenced-setnx SET NX may have
        // succeeded (the token read that follows it failed).
        let busy = "ResponseError: too many waiters";
        assert_eq!(kind(lock_res(System::FencedResp, backend(busy))), "fail");
        assert_eq!(kind(acquire_res(System::FencedResp, backend(busy))), "fail");
        let gone = "FENCE.TOKEN L: the lease ran out right after SET NX";
        assert_eq!(
            kind(acquire_res(System::FencedSetnx, backend(gone))),
            "info"
        );
        assert_eq!(kind(lock_res(System::FencedSetnx, backend(busy))), "fail");
        let invalid: Result<Result<(), LockError>, _> = Ok(Err(LockError::Invalid("ttl".into())));
        assert_eq!(kind(acquire_res(System::FencedSetnx, invalid)), "fail");
    }
}
