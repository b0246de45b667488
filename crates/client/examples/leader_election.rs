//! Kubernetes-style leader election on fenced's etcd `Election` service, with fencing.
//!
//! N candidates campaign on one election, each with a lease of its own (TTL a few seconds)
//! kept alive by a [`fenced_client::KeepAlive`]. The leader works during its term: every
//! write to the protected storage — fenced's own keyspace, through the native gRPC
//! `FencedPut` ([`fenced_client::Client::fenced_put`], RESP's `FENCE.SET`) — carries the
//! term's fencing token (the leader key's `create_revision`), and the storage refuses a
//! token below the highest it has seen. A leader steps down when its keep-alive reports the
//! lease lost, or when a write is refused (a newer term wrote: it was deposed while it could
//! not tell, e.g. paused); it resigns after `--term-writes` writes to let another lead.
//! Another candidate then leads with a higher token.
//!
//! ```text
//! cargo run -p fenced-client --example leader_election -- \
//!     --endpoints 127.0.0.1:7380,127.0.0.2:7380,127.0.0.3:7380 --candidates 3 --seconds 30
//! cargo run -p fenced-client --example leader_election -- --candidate c1   # one per process
//! ```
//!
//! Each line it prints starts with `le `: `term` when a term begins, `write` for each write
//! (accepted, refused with the storage's highest token, or unknown), `end` with the term's
//! tally. `tests/leader_election.rs` runs [`candidate`] in processes and checks the log.

use std::error::Error;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fenced_client::{Client, ElectionError};

/// One candidate's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub endpoints: Vec<String>,
    /// The election's name.
    pub election: String,
    /// The protected storage's key (in fenced's keyspace).
    pub key: String,
    /// Lease TTL, seconds.
    pub ttl: i64,
    /// Writes per term before resigning.
    pub term_writes: u32,
    /// Pause between writes.
    pub write_every: Duration,
    /// Bound of one write (its outcome is unknown past it).
    pub write_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            endpoints: vec!["127.0.0.1:7380".into()],
            election: "le-demo".into(),
            key: "le-demo/protected".into(),
            ttl: 3,
            term_writes: 20,
            write_every: Duration::from_millis(100),
            write_timeout: Duration::from_secs(2),
        }
    }
}

/// Microseconds since the epoch (one clock for every process of a machine).
pub fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// Run candidate `id` until `until` passes (or forever): campaign, lead a term, step down,
/// campaign again. Prints its `le ` lines.
pub async fn candidate(
    cfg: &Config,
    id: &str,
    until: Option<std::time::Instant>,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    let client = Client::connect(&cfg.endpoints)?;
    let etcd = client.etcd();
    while until.is_none_or(|u| std::time::Instant::now() < u) {
        let lease = match etcd.grant(cfg.ttl).await {
            Ok(l) => l,
            Err(e) => {
                println!("le note {id} grant failed: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let election = etcd.election(etcd.keep_alive(lease));
        let term = match election.campaign(&cfg.election, id).await {
            Ok(t) => t,
            Err(ElectionError::LeaseLost(loss)) => {
                println!(
                    "le note {id} lease {:x} lost while campaigning: {loss}",
                    lease.id
                );
                continue;
            }
            Err(e) => {
                println!("le note {id} campaign failed: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let token = term.token();
        println!("le term {id} token={token} lease={:x}", lease.id);
        let (mut accepted, mut refused, mut unknown) = (0u32, 0u32, 0u32);
        let mut why = "resigned";
        for seq in 1..=cfg.term_writes {
            let value = format!("{id}:{token}:{seq}");
            let start = now_us();
            let put = tokio::time::timeout(
                cfg.write_timeout,
                client.fenced_put(&cfg.key, value.as_bytes(), token),
            )
            .await;
            let end = now_us();
            let outcome = match put {
                Ok(Ok(Ok(()))) => {
                    accepted += 1;
                    "accepted".to_owned()
                }
                Ok(Ok(Err(stale))) => {
                    refused += 1;
                    format!("refused highest={}", stale.highest)
                }
                Ok(Err(e)) => {
                    unknown += 1;
                    format!("unknown error={e:?}")
                }
                Err(_) => {
                    unknown += 1;
                    "unknown error=timeout".to_owned()
                }
            };
            println!("le write {id} token={token} seq={seq} start={start} end={end} {outcome}");
            if outcome.starts_with("refused") {
                // A newer term wrote: this one is over, whatever the keep-alive says yet.
                why = "deposed (write refused)";
                break;
            }
            tokio::select! {
                loss = term.lost() => {
                    why = if matches!(loss, fenced_client::LeaseLoss::Expired) {
                        "lease expired"
                    } else {
                        "lease unconfirmed"
                    };
                    break;
                }
                () = tokio::time::sleep(cfg.write_every) => {}
            }
        }
        if why == "resigned" {
            if let Err(e) = term.resign().await {
                println!("le note {id} resign failed: {e}");
            }
        } else {
            drop(term);
        }
        println!(
            "le end {id} token={token} accepted={accepted} refused={refused} unknown={unknown} why={why}"
        );
        drop(election); // stops the keep-alives
        let _ = etcd.revoke(lease.id).await; // the lease's end, at once (gone already: fine)
    }
    Ok(())
}

fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let endpoints = arg(&args, "--endpoints")
        .or_else(|| std::env::var("FENCED_ENDPOINTS").ok())
        .unwrap_or_else(|| "127.0.0.1:7380".into());
    let mut cfg = Config {
        endpoints: endpoints.split(',').map(str::to_owned).collect(),
        ..Config::default()
    };
    if let Some(ttl) = arg(&args, "--ttl") {
        cfg.ttl = ttl.parse()?;
    }
    if let Some(n) = arg(&args, "--term-writes") {
        cfg.term_writes = n.parse()?;
    }
    let seconds: u64 = arg(&args, "--seconds").map_or(Ok(30), |s| s.parse())?;
    let until = Some(std::time::Instant::now() + Duration::from_secs(seconds));
    if let Some(id) = arg(&args, "--candidate") {
        return candidate(&cfg, &id, until).await;
    }
    let n: usize = arg(&args, "--candidates").map_or(Ok(3), |s| s.parse())?;
    let mut tasks = Vec::new();
    for i in 1..=n {
        let cfg = cfg.clone();
        tasks.push(tokio::spawn(async move {
            candidate(&cfg, &format!("c{i}"), until).await
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
