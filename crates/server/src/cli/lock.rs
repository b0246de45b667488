//! `fenced lock NAME -- CMD`: run a command while holding a lock, with FENCED_TOKEN and
//! FENCED_LOCK in its environment; the command is stopped if the lock is lost.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fenced_client::{ClientOptions, LockOptions};

use crate::{tls_hint, ConnArgs};

/// Exit status of `fenced lock` when the lock was not acquired in time (EX_TEMPFAIL).
const EXIT_NOT_ACQUIRED: u8 = 75;

#[derive(Args)]
pub struct LockArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Session lease: how long the lock outlives this process if it stops renewing.
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// How long to wait for the lock (0: try once).
    #[arg(long, default_value_t = 0)]
    wait_ms: u64,
    name: String,
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

pub async fn lock(a: LockArgs) -> anyhow::Result<ExitCode> {
    let client = a.conn.client_with(ClientOptions {
        session_ttl: Duration::from_millis(a.ttl_ms),
        ..ClientOptions::default()
    })?;
    let opts = LockOptions::wait(Duration::from_millis(a.wait_ms));
    let tls = a.conn.tls.tls_ca.is_some();
    let locked = client.lock(&a.name, opts).await;
    let Some(mut guard) = locked.map_err(|e| tls_hint(e, tls))? else {
        eprintln!("fenced: lock {} not acquired", a.name);
        return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
    };
    let token = guard
        .token()
        .context("the lock was lost right after it was granted")?;
    let (program, args) = a.cmd.split_first().context("no command given after --")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("FENCED_TOKEN", token.to_string())
        .env("FENCED_LOCK", &a.name)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let status = tokio::select! {
        status = child.wait() => status?,
        () = guard.lost() => {
            eprintln!("fenced: lock {} lost; stopping the command", a.name);
            if let Some(pid) = child.id() {
                // SAFETY: plain kill(2) on our own child's pid.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            child.wait().await?
        }
    };
    let released = guard.release().await;
    if let Err(e) = released.and(client.close().await) {
        eprintln!("fenced: releasing {}: {e} (the lease will expire)", a.name);
    }
    Ok(match status.code() {
        Some(c) => ExitCode::from(c as u8),
        None => ExitCode::FAILURE,
    })
}
