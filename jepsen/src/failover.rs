//! Failover time: how long clients go without a grant when the leader dies.
//!
//! Starts a 3-node fenced cluster on loopback addresses, runs one probe client that takes
//! and releases a fresh lock back to back (gRPC, any node, following leader hints), and for
//! each round SIGKILLs the leader, then measures
//!
//! * **elected**: kill → a surviving node reports a new leader (status polled every 10 ms);
//! * **next grant**: kill → the first acquire that succeeds after the kill. The old leader is
//!   dead, so that grant was committed by the new one: this is the gap a client sees.
//!
//! Then it restarts the killed node from its data dir, waits until it has caught up, and
//! goes on. Each round is bounded (30 s); every process is stopped when it ends, also on
//! failure ([`Env`] owns them).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fenced_client::{Client, ClientOptions};
use serde::Serialize;

use crate::env::{Env, NetMode, Spec};
use crate::run::{fenced_serve_args, GRPC_PORT};

const ROUND_LIMIT: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Clone, Debug)]
pub struct FailoverOpts {
    pub fenced: PathBuf,
    pub rounds: usize,
    /// Extra `fenced serve` flags (e.g. `--election-timeout-ms 300..500`).
    pub serve_args: Vec<String>,
    pub out: PathBuf,
    /// Third octet of the loopback addresses (127.0.X.1-3).
    pub subnet: u8,
}

/// One round.
#[derive(Clone, Debug, Serialize)]
pub struct Round {
    pub killed: u64,
    pub elected_ms: f64,
    pub next_grant_ms: f64,
    pub new_leader: u64,
}

/// Every round, with medians.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverReport {
    pub serve_args: Vec<String>,
    pub rounds: Vec<Round>,
    pub elected_median_ms: f64,
    pub next_grant_median_ms: f64,
    pub next_grant_max_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Run the measurement; writes `failover.json` into `o.out`.
pub fn run(o: &FailoverOpts) -> anyhow::Result<FailoverReport> {
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    let mut env = Env::new(NetMode::Loopback, "fenced-failover", &o.out, o.subnet)?;
    let names = ["n1", "n2", "n3"];
    let mut grpc = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let host = env.add_host(name, (i + 1) as u8)?;
        grpc.push(format!("{}:{GRPC_PORT}", host.ip));
    }
    let cluster: Vec<String> = grpc
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect();
    for (i, name) in names.iter().enumerate() {
        let ip = env.host(name)?.ip.clone();
        let mut args = fenced_serve_args(i + 1, &o.out.join("data").join(name), &ip, &cluster);
        args.extend(o.serve_args.iter().cloned());
        let spec = Spec {
            host: (*name).to_owned(),
            program: o.fenced.clone(),
            args,
            env: vec![(
                "FENCED_LOG".into(),
                std::env::var("FAILOVER_LOG").unwrap_or("info,openraft=warn".into()),
            )],
        };
        env.spawn(name, spec)?;
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let _in_runtime = rt.enter();
    let client = Client::connect_with(
        &grpc,
        ClientOptions {
            retry_for: Duration::from_secs(10),
            ..ClientOptions::default()
        },
    )?;
    let mut rounds = Vec::new();
    for r in 0..o.rounds {
        let round = rt.block_on(one_round(&mut env, &client, &names, &grpc, r))?;
        eprintln!(
            "round {}: killed leader {}, new leader {} elected after {:.0} ms, next grant after {:.0} ms",
            r + 1,
            round.killed,
            round.new_leader,
            round.elected_ms,
            round.next_grant_ms
        );
        rounds.push(round);
    }
    env.teardown();
    let report = FailoverReport {
        serve_args: o.serve_args.clone(),
        elected_median_ms: median(rounds.iter().map(|r| r.elected_ms).collect()),
        next_grant_median_ms: median(rounds.iter().map(|r| r.next_grant_ms).collect()),
        next_grant_max_ms: rounds.iter().map(|r| r.next_grant_ms).fold(0.0, f64::max),
        rounds,
    };
    let path = o.out.join("failover.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(report)
}

/// One node's status, if it answers within half a second.
async fn status_of(endpoint: &str) -> Option<fenced_client::Status> {
    let c = Client::connect_with(
        [endpoint],
        ClientOptions {
            retry_for: Duration::ZERO,
            ..ClientOptions::default()
        },
    )
    .ok()?;
    tokio::time::timeout(Duration::from_millis(500), c.status())
        .await
        .ok()?
        .ok()
}

/// The leader as every reachable node sees it, once they agree.
async fn agreed_leader(endpoints: &[String]) -> Option<u64> {
    let mut leader = None;
    for e in endpoints {
        let s = status_of(e).await?;
        if s.leader == 0 || leader.is_some_and(|l| l != s.leader) {
            return None;
        }
        leader = Some(s.leader);
    }
    leader
}

/// The index a node has applied.
async fn applied(endpoint: &str) -> Option<u64> {
    status_of(endpoint).await.map(|s| s.last_applied)
}

async fn probe(client: &Client, n: u64) -> bool {
    let name = format!("failover-{n}");
    match client
        .acquire(&name, "probe", Duration::from_secs(10), Duration::ZERO, 0)
        .await
    {
        Ok(Some(g)) => {
            let _ = client.release(&name, "probe", g.token).await;
            true
        }
        _ => false,
    }
}

async fn one_round(
    env: &mut Env,
    client: &Client,
    names: &[&str],
    grpc: &[String],
    round: usize,
) -> anyhow::Result<Round> {
    let limit = Instant::now() + ROUND_LIMIT;
    // Steady: every node agrees on a leader and grants go through.
    let leader = loop {
        if let Some(l) = agreed_leader(grpc).await {
            if probe(client, round as u64 * 1_000_000).await {
                break l;
            }
        }
        if Instant::now() > limit {
            bail!(
                "round {}: no steady leader within {ROUND_LIMIT:?}",
                round + 1
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for i in 1..=20 {
        probe(client, round as u64 * 1_000_000 + i).await;
    }
    let victim = names[(leader - 1) as usize];
    let survivors: Vec<String> = grpc
        .iter()
        .enumerate()
        .filter(|(i, _)| *i as u64 + 1 != leader)
        .map(|(_, a)| a.clone())
        .collect();

    let killed_at = Instant::now();
    env.kill(victim)?;
    let elected = async {
        loop {
            if let Some(l) = agreed_leader(&survivors).await {
                if l != leader {
                    return (killed_at.elapsed(), l);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let granted = async {
        let mut n = round as u64 * 1_000_000 + 100;
        loop {
            n += 1;
            if probe(client, n).await {
                return killed_at.elapsed();
            }
        }
    };
    let ((elected, new_leader), granted) =
        tokio::time::timeout(ROUND_LIMIT, async { tokio::join!(elected, granted) })
            .await
            .with_context(|| format!("round {}: no new leader or grant", round + 1))?;

    // Bring the victim back and let it catch up before the next round: a member with a
    // short log cannot win an election, which would make the next round measure that.
    env.start(victim)?;
    let back = Instant::now() + ROUND_LIMIT;
    let victim_ep = &grpc[(leader - 1) as usize];
    loop {
        let caught_up = match (agreed_leader(grpc).await, applied(victim_ep).await) {
            (Some(l), Some(mine)) => applied(&grpc[(l - 1) as usize])
                .await
                .is_some_and(|theirs| mine >= theirs),
            _ => false,
        };
        if caught_up {
            break;
        }
        if Instant::now() > back {
            bail!("round {}: {victim} did not rejoin and catch up", round + 1);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Round {
        killed: leader,
        elected_ms: ms(elected),
        next_grant_ms: ms(granted),
        new_leader,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
