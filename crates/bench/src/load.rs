//! The workload: C clients, each looping acquire → optional work → release on key
//! `i mod K`, for a fixed duration. Measures pairs, failed attempts and latencies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_backends::DistLock;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Parameters of one run.
#[derive(Clone, Debug)]
pub struct Workload {
    pub clients: usize,
    pub keys: usize,
    pub duration: Duration,
    pub ttl: Duration,
    pub wait: Duration,
    pub work: Duration,
    /// Target pairs/s of all clients together (each client paces its share); `None`: as
    /// fast as they go.
    pub rate: Option<f64>,
    /// Prefix of the lock names (unique per run, so runs never see each other's keys).
    pub prefix: String,
}

/// Raw outcome of one or more runs of the same cell (mergeable).
pub struct Measured {
    pub pairs: u64,
    pub failed: u64,
    pub timeouts: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub acquire: Histogram<u64>,
    pub release: Histogram<u64>,
    pub first_error: Option<String>,
}

impl Measured {
    pub fn new() -> Measured {
        Measured {
            pairs: 0,
            failed: 0,
            timeouts: 0,
            errors: 0,
            elapsed: Duration::ZERO,
            acquire: hist(),
            release: hist(),
            first_error: None,
        }
    }

    pub fn merge(&mut self, o: &Measured) {
        self.pairs += o.pairs;
        self.failed += o.failed;
        self.timeouts += o.timeouts;
        self.errors += o.errors;
        self.elapsed += o.elapsed;
        let _ = self.acquire.add(&o.acquire);
        let _ = self.release.add(&o.release);
        if self.first_error.is_none() {
            self.first_error.clone_from(&o.first_error);
        }
    }

    pub fn summary(&self) -> Summary {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        Summary {
            pairs: self.pairs,
            pairs_per_s: self.pairs as f64 / secs,
            failed_attempts: self.failed,
            failed_per_s: self.failed as f64 / secs,
            timeouts: self.timeouts,
            errors: self.errors,
            seconds: self.elapsed.as_secs_f64(),
            acquire_us: Lat::of(&self.acquire),
            release_us: Lat::of(&self.release),
            first_error: self.first_error.clone(),
        }
    }
}

impl Default for Measured {
    fn default() -> Self {
        Measured::new()
    }
}

fn hist() -> Histogram<u64> {
    // 1 µs .. 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Latency percentiles in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Lat {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
}

impl Lat {
    pub fn of(h: &Histogram<u64>) -> Lat {
        Lat {
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

/// What a report shows of a cell.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub pairs: u64,
    pub pairs_per_s: f64,
    /// Attempts that found the lock busy (client-side retries) or acquires that gave up.
    pub failed_attempts: u64,
    pub failed_per_s: f64,
    /// Acquires that returned "not granted within wait".
    pub timeouts: u64,
    /// Calls that returned an error (outcome unknown).
    pub errors: u64,
    pub seconds: f64,
    pub acquire_us: Lat,
    pub release_us: Lat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

struct ClientOut {
    pairs: u64,
    timeouts: u64,
    errors: u64,
    acquire: Histogram<u64>,
    release: Histogram<u64>,
    first_error: Option<String>,
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, 600_000_000)
}

/// Run `w` with one backend per client (built beforehand, so connection set-up is not
/// measured; each client does one unmeasured acquire/release first to warm its connections).
pub async fn run(backends: Vec<Box<dyn DistLock>>, w: &Workload) -> Measured {
    let backends: Vec<Arc<dyn DistLock>> = backends.into_iter().map(Arc::from).collect();
    // Warm-up: connect, load scripts, open sessions (keys outside the measured set).
    let warm = futures::future::join_all(backends.iter().enumerate().map(|(i, b)| {
        let key = format!("{}-warm-{i}", w.prefix);
        let ttl = w.ttl;
        async move {
            if let Ok(Some(g)) = b.acquire(&key, ttl, Duration::from_secs(5)).await {
                let _ = b.release(&g).await;
            }
        }
    }));
    warm.await;
    let failed_before: u64 = backends.iter().map(|b| b.failed_attempts()).sum();

    let barrier = Arc::new(tokio::sync::Barrier::new(backends.len() + 1));
    let mut tasks = Vec::new();
    for (i, b) in backends.iter().enumerate() {
        let b = b.clone();
        let barrier = barrier.clone();
        let key = format!("{}-k{}", w.prefix, i % w.keys.max(1));
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = ClientOut {
                pairs: 0,
                timeouts: 0,
                errors: 0,
                acquire: hist(),
                release: hist(),
                first_error: None,
            };
            barrier.wait().await;
            let start = Instant::now();
            let deadline = start + w.duration;
            // With a rate, this client's pair n starts no earlier than start + n / share.
            let every = w
                .rate
                .filter(|r| *r > 0.0)
                .map(|r| Duration::from_secs_f64(w.clients.max(1) as f64 / r));
            let mut n = 0u32;
            while Instant::now() < deadline {
                if let Some(every) = every {
                    // Spread the clients' slots over one period.
                    let offset = every.mul_f64(i as f64 / w.clients.max(1) as f64);
                    tokio::time::sleep_until((start + offset + every * n).into()).await;
                    n += 1;
                }
                let t0 = Instant::now();
                match b.acquire(&key, w.ttl, w.wait).await {
                    Ok(Some(g)) => {
                        let _ = out.acquire.record(micros(t0.elapsed()));
                        if !w.work.is_zero() {
                            tokio::time::sleep(w.work).await;
                        }
                        let t1 = Instant::now();
                        match b.release(&g).await {
                            Ok(_) => {
                                let _ = out.release.record(micros(t1.elapsed()));
                                out.pairs += 1;
                            }
                            Err(e) => {
                                out.errors += 1;
                                out.first_error.get_or_insert_with(|| e.to_string());
                            }
                        }
                    }
                    Ok(None) => out.timeouts += 1,
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert_with(|| e.to_string());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            out
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut m = Measured::new();
    for t in tasks {
        if let Ok(o) = t.await {
            m.pairs += o.pairs;
            m.timeouts += o.timeouts;
            m.errors += o.errors;
            let _ = m.acquire.add(&o.acquire);
            let _ = m.release.add(&o.release);
            if m.first_error.is_none() {
                m.first_error = o.first_error;
            }
        } else {
            m.errors += 1;
        }
    }
    m.elapsed = start.elapsed();
    let failed_after: u64 = backends.iter().map(|b| b.failed_attempts()).sum();
    m.failed = failed_after.saturating_sub(failed_before);
    m
}
