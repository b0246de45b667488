//! Keep-alive load (issue 27): `leases` etcd leases granted, then kept alive the way etcd's Go
//! client keeps its leases alive — one `LeaseKeepAlive` stream per client connection carrying
//! every lease of that client, each lease's keep-alive sent every TTL/3 — spread evenly over
//! `streams` connections and over the period. After one period of warm-up, a window of
//! `duration` measures on the **leader**: its CPU (% of one core, user + system from
//! /proc/PID/stat) and its Raft entries/s, from its Prometheus `/metrics`: fenced's
//! `fenced_raft_applied_index` (a gauge: entries applied), etcd's
//! `etcd_server_proposals_applied_total`. The leader is the node whose `/metrics` says so
//! (`fenced_is_leader 1`, `etcd_server_is_leader 1`). Before the leases are granted the
//! leader is measured idle for `idle` (the baseline: heartbeats, fenced's log-time ticks).
//! Then every lease is revoked, so that
//! their expiry does not load the machine while the next backend is measured.
//!
//! The same code serves fenced (its gRPC port: an etcd lease is a fenced session, keep-alives
//! coalesced into `KeepAliveMany` entries) and etcd (its client port).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fenced_backends::etcd::pb;
use futures::stream::{self, StreamExt};
use pb::lease_client::LeaseClient;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::cpu::process_cpu_us;
use crate::kv::{channel, req, status_text};

/// One backend of the keep-alive load.
#[derive(Clone, Debug)]
pub struct LeaseTarget {
    pub name: String,
    /// etcd-API endpoints (`host:port`), streams spread over them.
    pub endpoints: Vec<String>,
    /// Each node's server pid and metrics address (`host:port`), in the same order.
    pub nodes: Vec<(String, String)>,
}

#[derive(Clone, Debug)]
pub struct LeaseLoad {
    pub leases: usize,
    pub ttl_s: i64,
    pub streams: usize,
    pub duration: Duration,
    /// The leader's idle baseline is measured this long before the leases are granted.
    pub idle: Duration,
}

/// What one backend's window measured.
#[derive(Clone, Debug, Serialize)]
pub struct LeaseResult {
    pub backend: String,
    pub leases: usize,
    pub ttl_s: i64,
    pub streams: usize,
    pub window_s: f64,
    pub grant_s: f64,
    /// Keep-alive answers per second (all streams) during the window.
    pub keepalives_per_s: f64,
    /// Leases answered with TTL 0 (gone) at any time: should be 0.
    pub lost: u64,
    /// Stream errors (each stream reopens).
    pub errors: u64,
    pub leader_pid: String,
    pub leader_cpu_percent: f64,
    /// The leader's CPU before any lease was granted (% of one core).
    pub idle_leader_cpu_percent: f64,
    /// The leader's Raft entries/s before any lease was granted.
    pub idle_entries_per_s: f64,
    /// CPU of the followers together, % of one core.
    pub followers_cpu_percent: f64,
    pub leader_entries_per_s: f64,
    /// The metric the entries are counted from.
    pub entries_metric: String,
}

#[derive(Default)]
struct Counts {
    answered: AtomicU64,
    lost: AtomicU64,
    errors: AtomicU64,
}

/// GET http://addr/metrics (HTTP/1.0, whole body).
pub async fn scrape(addr: &str) -> anyhow::Result<String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        anyhow::Ok(body)
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .with_context(|| format!("scraping {addr}: timeout"))?
        .with_context(|| format!("scraping {addr}"))
}

/// The sum of every sample of `metric` (any labels) in a Prometheus text exposition.
pub fn metric(text: &str, metric: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let value = rest.rsplit(' ').next()?.parse::<f64>().ok()?;
        *found.get_or_insert(0.0) += value;
    }
    found
}

/// The leader's index in `nodes` and the metric its Raft entries are counted from.
async fn leader(target: &LeaseTarget) -> anyhow::Result<(usize, &'static str)> {
    for (i, (_, addr)) in target.nodes.iter().enumerate() {
        let text = scrape(addr).await?;
        if metric(&text, "fenced_is_leader") == Some(1.0) {
            return Ok((i, "fenced_raft_applied_index"));
        }
        if metric(&text, "etcd_server_is_leader") == Some(1.0) {
            return Ok((i, "etcd_server_proposals_applied_total"));
        }
    }
    bail!("{}: no node's /metrics says it is the leader", target.name)
}

/// Grant the leases, keep them alive, measure the leader over the window, revoke them.
pub async fn run_leases(target: &LeaseTarget, load: &LeaseLoad) -> anyhow::Result<LeaseResult> {
    if target.endpoints.is_empty() || load.streams == 0 || load.leases == 0 {
        bail!(
            "{}: endpoints, streams and leases must not be empty",
            target.name
        );
    }
    // The leader idle first (heartbeats, ticks): the baseline the load adds to.
    let (idle_cpu, idle_entries) = {
        let (li, m) = leader(target).await?;
        let (pid, addr) = &target.nodes[li];
        let e0 = metric(&scrape(addr).await?, m).unwrap_or(0.0);
        let c0 = process_cpu_us(pid).context("leader's /proc stat")?;
        let t0 = Instant::now();
        tokio::time::sleep(load.idle).await;
        let secs = t0.elapsed().as_secs_f64();
        let c1 = process_cpu_us(pid).context("leader's /proc stat")?;
        let e1 = metric(&scrape(addr).await?, m).unwrap_or(0.0);
        ((c1 - c0) / 1e6 / secs * 100.0, (e1 - e0) / secs)
    };
    let channels: Vec<_> = (0..load.streams)
        .map(|i| channel(&target.endpoints[i % target.endpoints.len()]))
        .collect::<anyhow::Result<_>>()?;
    // Grant, 64 at a time.
    let t0 = Instant::now();
    let ttl = load.ttl_s;
    let ids: Vec<i64> = stream::iter(0..load.leases)
        .map(|i| {
            let ch = channels[i % channels.len()].clone();
            async move {
                let r = LeaseClient::new(ch)
                    .lease_grant(req(pb::LeaseGrantRequest { ttl, id: 0 }))
                    .await
                    .map_err(|s| anyhow::anyhow!("LeaseGrant: {}", status_text(&s)))?
                    .into_inner();
                if !r.error.is_empty() {
                    bail!("LeaseGrant: {}", r.error);
                }
                Ok(r.id)
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<anyhow::Result<i64>>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let grant_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "    {}: {} leases of {} s granted in {grant_s:.1} s",
        target.name, load.leases, load.ttl_s
    );

    let period = Duration::from_millis(load.ttl_s.max(1) as u64 * 1000 / 3);
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for (k, ch) in channels.iter().enumerate() {
        let mine: Vec<i64> = ids
            .iter()
            .skip(k)
            .step_by(channels.len())
            .copied()
            .collect();
        // Offset each stream's start so the streams' sends interleave.
        let offset = period.mul_f64(k as f64 / channels.len() as f64);
        tasks.push(tokio::spawn(keep_alive_stream(
            ch.clone(),
            mine,
            period,
            offset,
            counts.clone(),
            stop.clone(),
        )));
    }
    // Warm-up: one whole period, every lease renewed once.
    tokio::time::sleep(period + Duration::from_millis(500)).await;
    let (li, entries_metric) = leader(target).await?;
    let (leader_pid, leader_metrics) = &target.nodes[li];
    let followers: Vec<&String> = target
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != li)
        .map(|(_, (p, _))| p)
        .collect();
    let cpu_of = |pids: &[&String]| -> Option<f64> {
        pids.iter().map(|p| process_cpu_us(p)).sum::<Option<f64>>()
    };
    let entries_before = metric(&scrape(leader_metrics).await?, entries_metric)
        .with_context(|| format!("{leader_metrics}: no {entries_metric}"))?;
    let cpu_before = process_cpu_us(leader_pid).context("leader's /proc stat")?;
    let fcpu_before = cpu_of(&followers).unwrap_or(0.0);
    let answered_before = counts.answered.load(Ordering::Relaxed);
    let w0 = Instant::now();
    tokio::time::sleep(load.duration).await;
    let window = w0.elapsed().as_secs_f64();
    let cpu_after = process_cpu_us(leader_pid).context("leader's /proc stat")?;
    let fcpu_after = cpu_of(&followers).unwrap_or(0.0);
    let answered_after = counts.answered.load(Ordering::Relaxed);
    let entries_after = metric(&scrape(leader_metrics).await?, entries_metric)
        .with_context(|| format!("{leader_metrics}: no {entries_metric}"))?;
    stop.notify_waiters();
    for t in tasks {
        t.abort();
    }
    // Revoke every lease (their expiry must not load the next backend's window).
    let revoked = stream::iter(ids.iter().enumerate())
        .map(|(i, id)| {
            let ch = channels[i % channels.len()].clone();
            async move {
                LeaseClient::new(ch)
                    .lease_revoke(req(pb::LeaseRevokeRequest { id: *id }))
                    .await
                    .is_ok()
            }
        })
        .buffer_unordered(64)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    if revoked < ids.len() {
        eprintln!(
            "    {}: {} of {} leases revoked",
            target.name,
            revoked,
            ids.len()
        );
    }
    Ok(LeaseResult {
        backend: target.name.clone(),
        leases: load.leases,
        ttl_s: load.ttl_s,
        streams: load.streams,
        window_s: window,
        grant_s,
        keepalives_per_s: (answered_after - answered_before) as f64 / window,
        lost: counts.lost.load(Ordering::Relaxed),
        errors: counts.errors.load(Ordering::Relaxed),
        leader_pid: leader_pid.clone(),
        leader_cpu_percent: (cpu_after - cpu_before) / 1e6 / window * 100.0,
        idle_leader_cpu_percent: idle_cpu,
        idle_entries_per_s: idle_entries,
        followers_cpu_percent: (fcpu_after - fcpu_before) / 1e6 / window * 100.0,
        leader_entries_per_s: (entries_after - entries_before) / window,
        entries_metric: entries_metric.to_owned(),
    })
}

/// One connection's stream: each of `leases` gets a keep-alive every `period`, spread evenly
/// (a batch every 20 ms); answers are counted, a TTL of 0 is a lost lease. A broken stream is
/// reopened. Bounded: ends at `stop` (or when aborted).
async fn keep_alive_stream(
    ch: tonic::transport::Channel,
    leases: Vec<i64>,
    period: Duration,
    offset: Duration,
    counts: Arc<Counts>,
    stop: Arc<tokio::sync::Notify>,
) {
    if leases.is_empty() {
        return;
    }
    tokio::time::sleep(offset).await;
    let tick = Duration::from_millis(20);
    let ticks_per_period = (period.as_millis() / tick.as_millis()).max(1) as usize;
    // Tick t sends the leases from t·n/T to (t+1)·n/T (cyclically): n per period, evenly.
    let n = leases.len();
    let mut t = 0usize;
    let mut next = 0usize;
    let stopped = stop.notified();
    tokio::pin!(stopped);
    loop {
        let (tx, rx) = mpsc::channel((n / ticks_per_period).max(16) * 4);
        // One request queued before the open: etcd sends the stream's headers only with its
        // first answer, and the open waits for them.
        if tx
            .send(pb::LeaseKeepAliveRequest {
                id: leases[next % n],
            })
            .await
            .is_err()
        {
            return;
        }
        next = next.wrapping_add(1);
        let opened = LeaseClient::new(ch.clone())
            .lease_keep_alive(ReceiverStream::new(rx))
            .await;
        let mut answers = match opened {
            Ok(s) => s.into_inner(),
            Err(_) => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let reader_counts = counts.clone();
        let reader = tokio::spawn(async move {
            while let Some(m) = answers.next().await {
                match m {
                    Ok(r) if r.ttl > 0 => {
                        reader_counts.answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        reader_counts.lost.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        reader_counts.errors.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        });
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        'send: loop {
            tokio::select! {
                _ = &mut stopped => {
                    reader.abort();
                    return;
                }
                _ = interval.tick() => {}
            }
            if reader.is_finished() {
                break 'send;
            }
            let due = (t % ticks_per_period + 1) * n / ticks_per_period
                - (t % ticks_per_period) * n / ticks_per_period;
            t = t.wrapping_add(1);
            for _ in 0..due {
                let id = leases[next % leases.len()];
                next = next.wrapping_add(1);
                if tx.send(pb::LeaseKeepAliveRequest { id }).await.is_err() {
                    break 'send;
                }
            }
        }
        reader.abort();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The markdown table of the keep-alive rows.
pub fn markdown(rows: &[LeaseResult]) -> String {
    let mut out = String::from(
        "| backend | leases | TTL (s) | streams | keep-alives/s | leader CPU (% of a core) | idle leader CPU (%) | followers' CPU (%) | leader Raft entries/s | idle entries/s | lost | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |\n",
            r.backend,
            r.leases,
            r.ttl_s,
            r.streams,
            r.keepalives_per_s,
            r.leader_cpu_percent,
            r.idle_leader_cpu_percent,
            r.followers_cpu_percent,
            r.leader_entries_per_s,
            r.idle_entries_per_s,
            r.lost,
            r.errors
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn metrics_are_summed_over_labels_and_matched_whole() {
        let text = "# HELP x\n\
                    etcd_server_is_leader 1\n\
                    etcd_server_proposals_applied_total 1.5e+03\n\
                    etcd_server_proposals_applied_total_other 9\n\
                    fenced_raft_applied_index{node=\"1\"} 10\n\
                    fenced_raft_applied_index{node=\"2\"} 5\n";
        assert_eq!(metric(text, "etcd_server_is_leader"), Some(1.0));
        assert_eq!(
            metric(text, "etcd_server_proposals_applied_total"),
            Some(1500.0)
        );
        assert_eq!(metric(text, "fenced_raft_applied_index"), Some(15.0));
        assert_eq!(metric(text, "fenced_is_leader"), None);
    }
}
