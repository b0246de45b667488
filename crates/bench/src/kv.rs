//! etcd's v3 KV API as a workload (issue 25's benchmark), the same against fenced's etcd API and
//! against etcd: C clients, each with its own connection (client i on endpoint i mod N), each
//! looping one call for a fixed duration:
//!
//! * [`KvOp::Put`]: a put of a fresh key (`PFX/p/<client>/<n>`), value of `value_size` bytes;
//! * [`KvOp::Txn`]: compare-and-swap on the client's own key (`PFX/t/<client>`): `Txn if
//!   mod_revision(key) == last then put(key) else range(key)`; `last` is the revision the
//!   previous success answered (or the failure's range), so every Txn succeeds unless another
//!   writer got in between (counted as `cas_failed`);
//! * [`KvOp::Range`]: a linearizable point get of a random key of a preloaded keyspace
//!   ([`preload`]: `keyspace` keys `PFX/r/<k>`); an empty answer counts as an error;
//! * [`KvOp::Mixed`]: `put_percent` % puts (overwriting a random preloaded key), the rest
//!   point gets of a random preloaded key.
//!
//! Latency is per call (hdrhistogram, µs). Every call has a 10 s deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use fenced_backends::etcd::pb;
use hdrhistogram::Histogram;
use pb::kv_client::KvClient;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use crate::load::Lat;

/// Deadline of one call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The KV workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KvOp {
    Put,
    Txn,
    Range,
    Mixed,
}

impl KvOp {
    /// Parse `put`, `txn`, `range`, `mixed`.
    pub fn parse(s: &str) -> Option<KvOp> {
        Some(match s {
            "put" => KvOp::Put,
            "txn" | "txn-cas" | "cas" => KvOp::Txn,
            "range" | "get" => KvOp::Range,
            "mixed" => KvOp::Mixed,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            KvOp::Put => "put",
            KvOp::Txn => "txn-cas",
            KvOp::Range => "range",
            KvOp::Mixed => "mixed",
        }
    }

    /// Whether the workload reads the preloaded keyspace.
    pub fn needs_preload(self) -> bool {
        matches!(self, KvOp::Range | KvOp::Mixed)
    }
}

/// Parameters of one KV run.
#[derive(Clone, Debug)]
pub struct KvWorkload {
    pub op: KvOp,
    pub duration: Duration,
    pub value_size: usize,
    /// Keys of the preloaded keyspace (range, mixed).
    pub keyspace: usize,
    /// Share of puts in the mixed workload, in percent.
    pub put_percent: u32,
    /// Prefix of the keys this run writes (unique per run and cell); the preloaded keyspace
    /// is under `preload_prefix`.
    pub prefix: String,
    pub preload_prefix: String,
}

/// A lazily connecting channel to `endpoint` (`host:port` or a URL).
pub fn channel(endpoint: &str) -> anyhow::Result<Channel> {
    let uri = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    };
    Ok(Endpoint::from_shared(uri)
        .with_context(|| format!("endpoint {endpoint:?}"))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .connect_lazy())
}

pub(crate) fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(CALL_TIMEOUT);
    r
}

pub(crate) fn status_text(s: &tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// 1 µs .. 10 min, 3 significant digits.
pub fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, 600_000_000)
}

/// A value of `size` bytes that starts with `n` (so values differ).
pub fn value(n: u64, size: usize) -> Vec<u8> {
    let mut v = format!("{n:016x}").into_bytes();
    v.resize(size.max(16), b'v');
    v.truncate(size);
    v
}

/// Raw outcome of one or more runs of the same cell (mergeable).
pub struct KvMeasured {
    pub ops: u64,
    pub errors: u64,
    pub cas_failed: u64,
    pub elapsed: Duration,
    pub latency: Histogram<u64>,
    pub first_error: Option<String>,
}

impl Default for KvMeasured {
    fn default() -> Self {
        KvMeasured {
            ops: 0,
            errors: 0,
            cas_failed: 0,
            elapsed: Duration::ZERO,
            latency: hist(),
            first_error: None,
        }
    }
}

impl KvMeasured {
    pub fn merge(&mut self, o: &KvMeasured) {
        self.ops += o.ops;
        self.errors += o.errors;
        self.cas_failed += o.cas_failed;
        self.elapsed += o.elapsed;
        let _ = self.latency.add(&o.latency);
        if self.first_error.is_none() {
            self.first_error.clone_from(&o.first_error);
        }
    }

    pub fn summary(&self) -> KvSummary {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        KvSummary {
            ops: self.ops,
            ops_per_s: self.ops as f64 / secs,
            errors: self.errors,
            cas_failed: self.cas_failed,
            seconds: self.elapsed.as_secs_f64(),
            latency_us: Lat::of(&self.latency),
            first_error: self.first_error.clone(),
        }
    }
}

/// What a report shows of a KV cell.
#[derive(Clone, Debug, Serialize)]
pub struct KvSummary {
    pub ops: u64,
    pub ops_per_s: f64,
    pub errors: u64,
    /// Txn-CAS only: compares that failed (another writer in between; 0 expected).
    pub cas_failed: u64,
    pub seconds: f64,
    pub latency_us: Lat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// A small xorshift generator: key choice only, no need for quality.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn put_op(key: Vec<u8>, value: Vec<u8>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key,
            value,
            ..Default::default()
        })),
    }
}

/// Write the keyspace `PFX/r/0 .. PFX/r/<n-1>` with Txns of 100 puts, 8 at a time.
pub async fn preload(
    channels: &[Channel],
    prefix: &str,
    n: usize,
    value_size: usize,
) -> anyhow::Result<()> {
    const PER_TXN: usize = 100;
    let batches: Vec<(usize, usize)> = (0..n)
        .step_by(PER_TXN)
        .map(|s| (s, (s + PER_TXN).min(n)))
        .collect();
    for (j, group) in batches.chunks(8).enumerate() {
        let calls = group.iter().enumerate().map(|(g, &(from, to))| {
            let ch = channels[(j + g) % channels.len().max(1)].clone();
            let txn = pb::TxnRequest {
                success: (from..to)
                    .map(|k| {
                        put_op(
                            format!("{prefix}/r/{k}").into_bytes(),
                            value(k as u64, value_size),
                        )
                    })
                    .collect(),
                ..Default::default()
            };
            async move { KvClient::new(ch).txn(req(txn)).await }
        });
        for r in futures::future::join_all(calls).await {
            r.map_err(|s| anyhow::anyhow!("preload: {}", status_text(&s)))?;
        }
    }
    Ok(())
}

struct ClientOut {
    ops: u64,
    errors: u64,
    cas_failed: u64,
    latency: Histogram<u64>,
    first_error: Option<String>,
}

/// One client's state for its workload.
struct Client {
    kv: KvClient<Channel>,
    i: usize,
    n: u64,
    rng: Rng,
    /// Txn-CAS: the mod revision the client's key had after its last write.
    last_rev: i64,
}

impl Client {
    /// One call of workload `w`: `Ok(true)` done, `Ok(false)` a failed compare.
    async fn call(&mut self, w: &KvWorkload) -> Result<bool, String> {
        self.n += 1;
        let op = match w.op {
            KvOp::Mixed if (self.rng.below(100) as u32) < w.put_percent => KvOp::Put,
            KvOp::Mixed => KvOp::Range,
            op => op,
        };
        let err = |s: tonic::Status| status_text(&s);
        match op {
            KvOp::Put => {
                let key = if w.op == KvOp::Mixed {
                    let k = self.rng.below(w.keyspace as u64);
                    format!("{}/r/{k}", w.preload_prefix)
                } else {
                    format!("{}/p/{}/{}", w.prefix, self.i, self.n)
                };
                self.kv
                    .put(req(pb::PutRequest {
                        key: key.into_bytes(),
                        value: value(self.n, w.value_size),
                        ..Default::default()
                    }))
                    .await
                    .map_err(err)?;
                Ok(true)
            }
            KvOp::Range => {
                let k = self.rng.below(w.keyspace as u64);
                let r = self
                    .kv
                    .range(req(pb::RangeRequest {
                        key: format!("{}/r/{k}", w.preload_prefix).into_bytes(),
                        ..Default::default()
                    }))
                    .await
                    .map_err(err)?
                    .into_inner();
                if r.kvs.is_empty() {
                    return Err(format!("range: preloaded key {k} missing"));
                }
                Ok(true)
            }
            KvOp::Txn | KvOp::Mixed => self.cas(w).await,
        }
    }

    async fn cas(&mut self, w: &KvWorkload) -> Result<bool, String> {
        let key = format!("{}/t/{}", w.prefix, self.i).into_bytes();
        let txn = pb::TxnRequest {
            compare: vec![pb::Compare {
                result: pb::compare::CompareResult::Equal as i32,
                target: pb::compare::CompareTarget::Mod as i32,
                key: key.clone(),
                target_union: Some(pb::compare::TargetUnion::ModRevision(self.last_rev)),
                ..Default::default()
            }],
            success: vec![put_op(key.clone(), value(self.n, w.value_size))],
            failure: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                    key,
                    ..Default::default()
                })),
            }],
        };
        let r = self
            .kv
            .txn(req(txn))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        if r.succeeded {
            self.last_rev = r.header.map(|h| h.revision).unwrap_or(0);
            return Ok(true);
        }
        // Someone else wrote the key (or the revision was not the key's): take its revision.
        self.last_rev = r
            .responses
            .first()
            .and_then(|o| match o.response.as_ref()? {
                pb::response_op::Response::ResponseRange(rr) => rr.kvs.first(),
                _ => None,
            })
            .map(|kv| kv.mod_revision)
            .unwrap_or(0);
        Ok(false)
    }

    /// Unmeasured first call: connect, and for Txn-CAS create the key and learn its revision.
    async fn warm(&mut self, w: &KvWorkload) -> Result<(), String> {
        if w.op != KvOp::Txn {
            return self.call(w).await.map(|_| ());
        }
        let r = self
            .kv
            .put(req(pb::PutRequest {
                key: format!("{}/t/{}", w.prefix, self.i).into_bytes(),
                value: value(0, w.value_size),
                ..Default::default()
            }))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        self.last_rev = r.header.map(|h| h.revision).unwrap_or(0);
        Ok(())
    }
}

/// Run `w` with one client per channel (channels are made beforehand; each client does one
/// unmeasured call first). The keyspace must be preloaded for range and mixed.
pub async fn run_kv(channels: Vec<Channel>, w: &KvWorkload) -> KvMeasured {
    let barrier = Arc::new(tokio::sync::Barrier::new(channels.len() + 1));
    let mut tasks = Vec::new();
    for (i, ch) in channels.into_iter().enumerate() {
        let barrier = barrier.clone();
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Client {
                kv: KvClient::new(ch),
                i,
                n: 0,
                rng: Rng(0x9e37_79b9_7f4a_7c15 ^ ((i as u64 + 1) << 17)),
                last_rev: 0,
            };
            let mut out = ClientOut {
                ops: 0,
                errors: 0,
                cas_failed: 0,
                latency: hist(),
                first_error: None,
            };
            if let Err(e) = c.warm(&w).await {
                out.errors += 1;
                out.first_error = Some(e);
            }
            barrier.wait().await;
            let deadline = Instant::now() + w.duration;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                match c.call(&w).await {
                    Ok(ok) => {
                        let _ = out.latency.record(micros(t0.elapsed()));
                        out.ops += 1;
                        if !ok {
                            out.cas_failed += 1;
                        }
                    }
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert(e);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            out
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut m = KvMeasured::default();
    for t in tasks {
        match t.await {
            Ok(o) => {
                m.ops += o.ops;
                m.errors += o.errors;
                m.cas_failed += o.cas_failed;
                let _ = m.latency.add(&o.latency);
                if m.first_error.is_none() {
                    m.first_error = o.first_error;
                }
            }
            Err(e) => {
                m.errors += 1;
                m.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    m.elapsed = start.elapsed();
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_have_the_asked_size_and_differ() {
        assert_eq!(value(7, 100).len(), 100);
        assert_eq!(value(7, 4).len(), 4);
        assert_ne!(value(1, 100), value(2, 100));
        assert_eq!(KvOp::parse("txn"), Some(KvOp::Txn));
        assert_eq!(KvOp::parse("nope"), None);
    }
}
