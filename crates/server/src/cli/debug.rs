//! `fenced debug`: offline tools for a stopped member's data dir.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fenced_storage::inspect;
use openraft::EntryPayload;

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
    /// Quarantine the log entry at --index in a STOPPED member's data dir: from its next
    /// start the member applies that entry as a no-op (every request in it is answered
    /// "quarantined by the operator" and changes nothing) instead of running it. For a
    /// poisoned log, an entry whose apply hangs or panics on every replica: run it with the
    /// same index on EVERY member's data dir before restarting any (a member without it
    /// would hang on the entry again, or diverge; docs/operations.md, "Recover from a
    /// poisoned log entry"). Records the index in the data dir's `quarantine` file and
    /// prints one JSON line: {"index","quarantined","entry","last_index","committed_index"},
    /// where "entry" describes the entry ({"term","semantics","requests","commands"}) or is
    /// null when this member's log does not hold it yet (it is then quarantined when it
    /// arrives). Refused for an index this member's snapshot covers (applied already) or
    /// an entry that is not a client batch (blank, membership). There is no undo.
    Quarantine {
        #[arg(long)]
        data_dir: PathBuf,
        /// Log index of the poisoned entry (`/health` and the log name it).
        #[arg(long)]
        index: u64,
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
        DebugOp::Quarantine { data_dir, index } => {
            let dir = data_dir.clone();
            let line = tokio::task::spawn_blocking(move || quarantine(&dir, index))
                .await?
                .with_context(|| format!("data dir {}", data_dir.display()))?;
            println!("{line}");
        }
    }
    Ok(())
}

/// `fenced debug quarantine`: check the entry, record the index, describe both.
fn quarantine(dir: &Path, index: u64) -> anyhow::Result<serde_json::Value> {
    let fs = fenced_fs::OsFs;
    let (bounds, entry) = inspect::entry_at_on(&fs, dir, index)?;
    let entry = match entry {
        None => serde_json::Value::Null,
        Some(e) => match e.payload {
            EntryPayload::Normal(batch) => serde_json::json!({
                "term": e.log_id.leader_id.term,
                "semantics": batch.semantics.0,
                "requests": batch.requests.len(),
                "commands": batch.requests.iter().map(|r| r.cmd.kind()).collect::<Vec<_>>(),
            }),
            EntryPayload::Blank => {
                bail!("the entry at index {index} is a leader's blank entry: nothing to quarantine")
            }
            EntryPayload::Membership(_) => {
                bail!("the entry at index {index} is a membership change: it cannot be quarantined")
            }
        },
    };
    let set = fenced_storage::quarantine::add_on(&fs, dir, index)?;
    Ok(serde_json::json!({
        "index": index,
        "quarantined": set,
        "entry": entry,
        "last_index": bounds.last.map(|l| l.index),
        "committed_index": bounds.committed.map(|l| l.index),
    }))
}
