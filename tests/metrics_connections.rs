//! `--metrics-max-connections` (issue 49, the metrics port's bound): a node started with a
//! cap of 16 is sent 26 idle connections on its metrics port. The 10 past the cap are closed
//! at once (each reads end of input within 2 s) and counted in
//! `fenced_metrics_connections_refused_total`; the 16 it holds are closed after 5 s with
//! nothing sent; a fresh client's `/health` is then answered, the node's RSS grew by less
//! than [`GROWTH`], and the cluster served `SET`/`GET` all along. Before the cap, every one
//! of them was held open for as long as its client liked.
//!
//! Run: `cargo test -p fenced-server --test metrics_connections`.

#[path = "support/mod.rs"]
mod support;

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::{resp_connect, TestCluster, LEADER_TIMEOUT};

const METRICS_PORT: u16 = 9190;
const CAP: usize = 16;
/// Idle connections opened: the cap and 10 more.
const OPENED: usize = CAP + 10;
/// How much the node's RSS may grow while they are open (a socket and hyper's buffers each:
/// well under 1 MB for all of them).
const GROWTH: u64 = 32 * 1024 * 1024;

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Whether the node closed `s` within `within`: a read that ends (0 bytes or an error
/// other than a timeout).
fn closed_within(mut s: &TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_past_the_cap_are_closed_and_health_still_answers() {
    let cap = CAP.to_string();
    let c = TestCluster::start(
        "metrics_connections",
        &[
            "--metrics-addr",
            "{ip}:9190",
            "--metrics-max-connections",
            &cap,
        ],
    );
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let ip = c.ip(leader);
    let pid = c.pid(leader).expect("the node's pid");
    let (code, _) = support::http_get(&ip, METRICS_PORT, "/health")
        .await
        .expect("/health before");
    assert_eq!(code, 200);
    let before = rss(pid);
    let mut resp = resp_connect(&c, leader).await;

    // Opened one after another, so the first CAP are the ones the node holds.
    let conns: Vec<TcpStream> = (0..OPENED)
        .map(|_| {
            let s = TcpStream::connect((ip.as_str(), METRICS_PORT)).expect("connect");
            std::thread::sleep(Duration::from_millis(20));
            s
        })
        .collect();
    let (held, past) = conns.split_at(CAP);
    let refused = past
        .iter()
        .filter(|s| closed_within(s, Duration::from_secs(2)))
        .count();
    assert_eq!(
        refused,
        OPENED - CAP,
        "the connections past the cap closed at once"
    );
    let peak = rss(pid);
    assert!(
        peak < before + GROWTH,
        "RSS grew from {before} to {peak} with {OPENED} idle connections"
    );
    // The cap's connections are still open (not yet idle for 5 s) ...
    assert!(
        !closed_within(&held[0], Duration::from_millis(200)),
        "a connection under the cap was closed before its idle time"
    );
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async::<()>(&mut resp)
        .await
        .expect("SET while the metrics port is full");
    let got: String = redis::cmd("GET")
        .arg("k")
        .query_async(&mut resp)
        .await
        .expect("GET");
    assert_eq!(got, "v");
    // ... and closed once idle for 5 s, so a fresh client is served again.
    let started = Instant::now();
    let freed = held
        .iter()
        .filter(|s| closed_within(s, Duration::from_secs(10)))
        .count();
    assert_eq!(
        freed, CAP,
        "idle connections under the cap closed after 5 s"
    );
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(9),
        "idle ones closed after {waited:?}"
    );
    let (code, body) = support::http_get(&ip, METRICS_PORT, "/health")
        .await
        .expect("/health of a fresh client");
    assert_eq!(code, 200, "{body}");
    let (code, body) = support::http_get(&ip, METRICS_PORT, "/metrics")
        .await
        .expect("/metrics");
    assert_eq!(code, 200);
    let counted = body
        .lines()
        .find_map(|l| l.strip_prefix("fenced_metrics_connections_refused_total "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(counted, Some((OPENED - CAP) as f64), "the refusals counted");
    eprintln!(
        "metrics port: {refused} closed at once, {freed} after {waited:?} idle; RSS {before} -> {peak}"
    );
}
