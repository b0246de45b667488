//! Read-write lock: two readers at once; the writer waits for both, and blocks new readers.
//!
//! Needs a running fenced (`cargo run --bin fenced -- serve`); endpoints from
//! `FENCED_ENDPOINTS` (default `127.0.0.1:7380`).

use std::time::Duration;

use fenced_client::{Client, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let eps = std::env::var("FENCED_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:7380".into());
    let client = Client::connect(eps.split(','))?;
    let now = LockOptions::default();
    let r1 = client
        .read_lock("config", now)
        .await?
        .ok_or("reader 1 refused")?;
    let r2 = client
        .read_lock("config", now)
        .await?
        .ok_or("reader 2 refused")?;
    println!("two readers: tokens {:?} and {:?}", r1.token(), r2.token());
    let writer = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .write_lock("config", LockOptions::wait(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    r1.release().await?;
    r2.release().await?;
    let w = writer.await??.ok_or("writer timed out")?;
    println!("writer after both readers: token {:?}", w.token());
    w.release().await?;
    client.close().await?;
    Ok(())
}
