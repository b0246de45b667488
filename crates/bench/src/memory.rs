//! Memory of an etcd-API store (issue 25's goal: ≤ 1.5 GiB RSS per node for 1 M keys of
//! 100-byte values plus 5 minutes of history at 5k puts/s): fill `keys` keys, then overwrite
//! random ones of them at `rate` puts/s for `seconds` (no compaction: every overwrite stays in
//! the history), and read each server process's resident set (`VmRSS`) after each phase.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_backends::etcd::pb;
use pb::kv_client::KvClient;
use serde::Serialize;
use tonic::transport::Channel;

use crate::kv::{req, status_text, value};

/// Resident set size of process `pid` in bytes (`VmRSS` of /proc/PID/status).
pub fn rss_bytes(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Parameters of the memory run.
#[derive(Clone, Debug)]
pub struct MemoryWorkload {
    pub keys: usize,
    pub value_size: usize,
    /// Overwrites per second during the history phase, of all clients together.
    pub rate: f64,
    pub seconds: f64,
    /// Concurrent writers (fill: Txns of 100 puts; history: paced puts).
    pub clients: usize,
    pub prefix: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemoryResult {
    pub keys: usize,
    pub value_size: usize,
    pub fill_seconds: f64,
    pub puts: u64,
    pub puts_per_s: f64,
    pub history_seconds: f64,
    pub errors: u64,
    /// RSS of each server process (bytes) after the fill and after the history phase.
    pub rss_after_fill: Vec<Option<u64>>,
    pub rss_after_history: Vec<Option<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// Fill, then overwrite at the rate, then read the RSS of `pids`. Progress goes to stderr.
pub async fn run_memory(
    channels: &[Channel],
    pids: &[String],
    w: &MemoryWorkload,
) -> anyhow::Result<MemoryResult> {
    anyhow::ensure!(!channels.is_empty(), "no endpoints");
    let errors = Arc::new(AtomicU64::new(0));
    // Fill: Txns of 100 puts, `clients` in flight.
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..w.clients.max(1) {
        let kv = KvClient::new(channels[c % channels.len()].clone());
        let next = next.clone();
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let from = next.fetch_add(100, Ordering::Relaxed) as usize;
                if from >= w.keys {
                    return Ok::<(), String>(());
                }
                let to = (from + 100).min(w.keys);
                let txn = pb::TxnRequest {
                    success: (from..to)
                        .map(|k| pb::RequestOp {
                            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                                key: format!("{}/{k}", w.prefix).into_bytes(),
                                value: value(k as u64, w.value_size),
                                ..Default::default()
                            })),
                        })
                        .collect(),
                    ..Default::default()
                };
                kv.clone()
                    .txn(req(txn))
                    .await
                    .map_err(|s| format!("fill: {}", status_text(&s)))?;
                if from.is_multiple_of(100_000) && from > 0 {
                    eprintln!("    filled {from} keys");
                }
            }
        }));
    }
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!(e),
            Err(e) => anyhow::bail!("fill task: {e}"),
        }
    }
    let fill_seconds = start.elapsed().as_secs_f64();
    let rss_after_fill: Vec<Option<u64>> = pids.iter().map(|p| rss_bytes(p)).collect();
    eprintln!("    filled {} keys in {fill_seconds:.0} s", w.keys);

    // History: paced overwrites of random keys.
    let clients = w.clients.max(1);
    let every = Duration::from_secs_f64(clients as f64 / w.rate.max(1e-3));
    let duration = Duration::from_secs_f64(w.seconds);
    let puts = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let kv = KvClient::new(channels[c % channels.len()].clone());
        let (puts, errors, w) = (puts.clone(), errors.clone(), w.clone());
        tasks.push(tokio::spawn(async move {
            let mut first = None;
            let mut x = 0x2545_f491_4f6c_dd1d_u64 ^ ((c as u64 + 1) << 20);
            let offset = every.mul_f64(c as f64 / clients as f64);
            let mut n = 0u32;
            while start.elapsed() < duration {
                tokio::time::sleep_until((start + offset + every * n).into()).await;
                n += 1;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = x % w.keys.max(1) as u64;
                let r = kv
                    .clone()
                    .put(req(pb::PutRequest {
                        key: format!("{}/{k}", w.prefix).into_bytes(),
                        value: value(u64::from(n), w.value_size),
                        ..Default::default()
                    }))
                    .await;
                match r {
                    Ok(_) => {
                        puts.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(s) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        first.get_or_insert_with(|| status_text(&s));
                    }
                }
            }
            first
        }));
    }
    let progress = async {
        loop {
            tokio::time::sleep(Duration::from_secs(30)).await;
            let p = puts.load(Ordering::Relaxed);
            eprintln!(
                "    {:.0} s: {p} overwrites ({:.0}/s)",
                start.elapsed().as_secs_f64(),
                p as f64 / start.elapsed().as_secs_f64()
            );
        }
    };
    let joined = async {
        let mut firsts = Vec::new();
        for t in tasks {
            firsts.push(t.await.ok().flatten());
        }
        firsts
    };
    let firsts = tokio::select! {
        f = joined => f,
        _ = progress => Vec::new(),
    };
    let first_error = firsts.into_iter().flatten().next();
    let history_seconds = start.elapsed().as_secs_f64();
    let puts = puts.load(Ordering::Relaxed);
    Ok(MemoryResult {
        keys: w.keys,
        value_size: w.value_size,
        fill_seconds,
        puts,
        puts_per_s: puts as f64 / history_seconds.max(1e-9),
        history_seconds,
        errors: errors.load(Ordering::Relaxed),
        rss_after_fill,
        rss_after_history: pids.iter().map(|p| rss_bytes(p)).collect(),
        first_error,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_rss_is_readable() {
        let me = std::process::id().to_string();
        assert!(super::rss_bytes(&me).is_some_and(|b| b > 0));
        assert!(super::rss_bytes("999999999").is_none());
    }
}
