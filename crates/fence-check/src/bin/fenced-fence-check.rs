//! `fenced-fence-check`: a tiny storage service that validates fencing tokens with [`FenceStore`].
//! A stand-in for "the storage you protect" in demos, the Kleppmann test and the
//! fault-injection harness.
//!
//! Line protocol over TCP, one request per line:
//! ```text
//! PUT <key> <token> <value>   → OK | STALE <presented> <highest>
//! PUTU <key> <value>          → OK            (no token check: the unfenced baseline)
//! GET <key>                   → VALUE <token> <value> | NIL
//! PING                        → PONG
//! ```
//! Errors: `ERR <message>`. Keys contain no spaces; values run to the end of the line.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use fenced_fence_check::{FenceStore, GuardError};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(
    name = "fenced-fence-check",
    about = "A token-validating storage service"
)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:7390")]
    listen: String,
    #[arg(long, default_value = "./fenced-fence-check-data")]
    data_dir: PathBuf,
}

/// Longest accepted request line.
const MAX_LINE: usize = 64 * 1024;

fn handle(store: &FenceStore, line: &str) -> String {
    let mut parts = line.splitn(2, ' ');
    let verb = parts.next().unwrap_or_default().to_ascii_uppercase();
    let rest = parts.next().unwrap_or_default();
    let result = match verb.as_str() {
        "PING" => return "PONG".into(),
        "GET" => store.get(rest.trim()).map(|v| match v {
            Some((value, token)) => format!("VALUE {token} {}", String::from_utf8_lossy(&value)),
            None => "NIL".into(),
        }),
        "PUT" => {
            let mut p = rest.splitn(3, ' ');
            let (Some(key), Some(token), value) = (p.next(), p.next(), p.next().unwrap_or(""))
            else {
                return "ERR usage: PUT <key> <token> <value>".into();
            };
            let Ok(token) = token.parse::<u64>() else {
                return format!("ERR bad token {token:?}");
            };
            store
                .put(key, value.as_bytes(), token)
                .map(|()| "OK".to_owned())
        }
        "PUTU" => {
            let mut p = rest.splitn(2, ' ');
            let Some(key) = p.next().filter(|k| !k.is_empty()) else {
                return "ERR usage: PUTU <key> <value>".into();
            };
            store
                .put_unfenced(key, p.next().unwrap_or("").as_bytes())
                .map(|()| "OK".to_owned())
        }
        _ => return format!("ERR unknown command {verb:?}"),
    };
    match result {
        Ok(s) => s,
        Err(GuardError::Stale {
            presented, highest, ..
        }) => format!("STALE {presented} {highest}"),
        Err(e) => format!("ERR {e}"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let store = FenceStore::open(&args.data_dir)
        .with_context(|| format!("opening {}", args.data_dir.display()))?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    eprintln!("fenced-fence-check listening on {}", args.listen);
    loop {
        let (socket, _) = listener.accept().await?;
        let store = store.clone();
        tokio::spawn(async move {
            let (r, mut w) = socket.into_split();
            let mut reader = BufReader::new(r);
            let mut line = String::new();
            loop {
                line.clear();
                // Bounded read: a line longer than MAX_LINE ends the connection.
                match (&mut reader)
                    .take(MAX_LINE as u64 + 1)
                    .read_line(&mut line)
                    .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if !line.ends_with('\n') {
                    let _ = w.write_all(b"ERR line too long\n").await;
                    break;
                }
                let store = store.clone();
                let request = line.trim_end().to_owned();
                let reply = tokio::task::spawn_blocking(move || handle(&store, &request))
                    .await
                    .unwrap_or_else(|e| format!("ERR {e}"));
                if w.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = FenceStore::open(dir.path()).expect("open");
        assert_eq!(handle(&s, "PUT c 5 41"), "OK");
        assert_eq!(handle(&s, "PUT c 4 99"), "STALE 4 5");
        assert_eq!(handle(&s, "GET c"), "VALUE 5 41");
        assert_eq!(handle(&s, "GET nope"), "NIL");
        assert_eq!(handle(&s, "PUTU c 7"), "OK");
        assert!(handle(&s, "PUT c x 1").starts_with("ERR"));
        assert!(handle(&s, "FOO").starts_with("ERR"));
    }
}
