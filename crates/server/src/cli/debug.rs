//! `fenced debug`: offline tools for a stopped member's data dir.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use fenced_storage::inspect;

#[derive(Args)]
pub struct DebugArgs {
    #[command(subcommand)]
    pub op: DebugOp,
}

#[derive(Subcommand)]
pub enum DebugOp {
    /// Rebuild the state machine of a STOPPED member's data dir at log index --index (its
    /// snapshot, then its log entries up to the index, applied as the node applies them) and
    /// print its digest as one JSON line: {"index","digest","term","snapshot_index",
    /// "last_index","committed_index"}. Replicas with equal digests at one index hold equal
    /// states. Read-only: nothing in the data dir is written. Refused for an index below the
    /// snapshot's or past the last durable entry.
    Digest {
        #[arg(long)]
        data_dir: PathBuf,
        /// Log index (default: the last durable entry).
        #[arg(long)]
        index: Option<u64>,
    },
}

pub async fn debug(op: DebugOp) -> anyhow::Result<()> {
    match op {
        DebugOp::Digest { data_dir, index } => {
            let dir = data_dir.clone();
            let r = tokio::task::spawn_blocking(move || inspect::state_at(&dir, index))
                .await?
                .with_context(|| format!("data dir {}", data_dir.display()))?;
            let line = serde_json::json!({
                "index": r.index,
                "digest": format!("{:016x}", r.machine.digest()),
                "term": r.log_id.leader_id.term,
                "snapshot_index": r.bounds.snapshot.map(|l| l.index),
                "last_index": r.bounds.last.map(|l| l.index),
                "committed_index": r.bounds.committed.map(|l| l.index),
            });
            println!("{line}");
        }
    }
    Ok(())
}
