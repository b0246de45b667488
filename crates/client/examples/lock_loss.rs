//! Lock-loss events: an administrator force-unlocks a held lock; the holder's guard is
//! poisoned (its token is no longer offered) and its callback runs.
//!
//! Needs a running fenced (`cargo run --bin fenced -- serve`); endpoints from
//! `FENCED_ENDPOINTS` (default `127.0.0.1:7380`).

use std::time::Duration;

use fenced_client::{Client, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let eps = std::env::var("FENCED_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:7380".into());
    let holder = Client::connect(eps.split(','))?;
    let admin = Client::connect(eps.split(','))?;
    let mut guard = holder
        .lock("nightly-report", LockOptions::default())
        .await?
        .ok_or("lock refused")?;
    guard.on_lost(|| eprintln!("callback: nightly-report was taken away; stop writing"));
    println!("holding with token {:?}", guard.token());
    tokio::time::sleep(Duration::from_millis(300)).await;
    admin.force_unlock("nightly-report").await?;
    tokio::time::timeout(Duration::from_secs(5), guard.lost()).await?;
    println!("guard poisoned: token now {:?}", guard.token());
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder.close().await?;
    Ok(())
}
