//! A fenced exclusive lock guarding writes to a token-validating store.
//!
//! `cargo run --bin fenced -- serve` in one shell, then `cargo run -p fenced-client --example lock`.
//! Endpoints come from `FENCED_ENDPOINTS` (default `127.0.0.1:7380`).

use std::time::Duration;

use fenced_client::{Client, LockOptions};

fn endpoints() -> Vec<String> {
    std::env::var("FENCED_ENDPOINTS")
        .unwrap_or_else(|_| "127.0.0.1:7380".into())
        .split(',')
        .map(str::to_owned)
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(endpoints())?;
    let Some(guard) = client
        .lock("invoices", LockOptions::wait(Duration::from_secs(10)))
        .await?
    else {
        eprintln!("someone else held invoices for 10 s");
        return Ok(());
    };
    // Send the token with every write; the storage rejects tokens older than one it has seen.
    match guard.token() {
        Some(token) => println!("holding invoices with fencing token {token}"),
        None => println!("lost the lock before using it"),
    }
    guard.release().await?;
    client.close().await?;
    Ok(())
}
