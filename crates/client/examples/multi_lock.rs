//! An atomic multi-lock: both accounts in one log entry with one token, or neither — no
//! deadlock whatever order two transfers name them in.
//!
//! Needs a running fenced (`cargo run --bin fenced -- serve`); endpoints from
//! `FENCED_ENDPOINTS` (default `127.0.0.1:7380`).

use std::time::Duration;

use fenced_client::{Client, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let eps = std::env::var("FENCED_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:7380".into());
    let client = Client::connect(eps.split(','))?;
    let wait = LockOptions::wait(Duration::from_secs(10));
    let first = client
        .multi_lock(&["acct/alice", "acct/bob"], wait)
        .await?
        .ok_or("first transfer timed out")?;
    println!("first transfer holds both with token {:?}", first.token());
    // The second names them in the other order: it waits for both, never holding one alone.
    let second = {
        let client = client.clone();
        tokio::spawn(async move { client.multi_lock(&["acct/bob", "acct/alice"], wait).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!(
        "alice still held by the first transfer alone: {:?}",
        client.info("acct/alice").await?.map(|i| i.token)
    );
    first.release().await?;
    let second = second.await??.ok_or("second transfer timed out")?;
    println!(
        "second transfer then got both with token {:?}",
        second.token()
    );
    second.release().await?;
    client.close().await?;
    Ok(())
}
