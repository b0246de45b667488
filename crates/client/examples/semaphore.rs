//! A 2-permit semaphore: at most two holders; each permit has its own lease and token.
//!
//! Needs a running fenced (`cargo run --bin fenced -- serve`); endpoints from
//! `FENCED_ENDPOINTS` (default `127.0.0.1:7380`).

use fenced_client::{Client, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let eps = std::env::var("FENCED_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:7380".into());
    let client = Client::connect(eps.split(','))?;
    let now = LockOptions::default();
    let p1 = client
        .semaphore("gpu", 2, now)
        .await?
        .ok_or("permit 1 refused")?;
    let p2 = client
        .semaphore("gpu", 2, now)
        .await?
        .ok_or("permit 2 refused")?;
    let p3 = client.semaphore("gpu", 2, now).await?;
    println!(
        "permits: {:?} {:?}; a third one granted? {}",
        p1.token(),
        p2.token(),
        p3.is_some()
    );
    p1.release().await?;
    p2.release().await?;
    client.close().await?;
    Ok(())
}
