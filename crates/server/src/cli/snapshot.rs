//! `fenced snapshot`: back up the cluster's state, check a backup, restore one into a new
//! member's data dir.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand};
use fenced_server::config::{parse_cluster, DEFAULT_CLUSTER_TOKEN};

use crate::ConnArgs;

#[derive(Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub op: SnapshotOp,
}

#[derive(Subcommand)]
pub enum SnapshotOp {
    /// Stream a consistent backup (every write acknowledged before the call) into FILE,
    /// checked before it is kept. FILE must not exist.
    Save {
        file: PathBuf,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Check FILE (checksum, format version) and print what it holds as JSON.
    Status { file: PathBuf },
    /// Create the data dir of member --id of a NEW cluster from FILE (run it for every
    /// member with the same file, --initial-cluster, token and bump; then `fenced serve` each
    /// with the same --initial-cluster). The revision jumps by --bump-revision, and every
    /// lock, waiter and session of the backup is dropped: tokens the old cluster issued after
    /// the backup are never issued again. --data-dir must not exist or be empty.
    Restore {
        file: PathBuf,
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long)]
        id: u64,
        /// Every member of the new cluster, `1=HOST:PORT,...` (default: --id alone at
        /// 127.0.0.1:7380).
        #[arg(long, value_parser = parse_cluster)]
        initial_cluster: Option<std::collections::BTreeMap<u64, String>>,
        #[arg(long, default_value = DEFAULT_CLUSTER_TOKEN)]
        initial_cluster_token: String,
        /// Added to the backup's revision: the new cluster's tokens start above every token
        /// the old cluster issued, unless it applied more commands than this after the
        /// backup. Use the same value for every member.
        #[arg(long, default_value_t = fenced_server::backup::DEFAULT_BUMP_REVISION)]
        bump_revision: u64,
    },
}

pub async fn snapshot(op: SnapshotOp) -> anyhow::Result<()> {
    use fenced_server::backup;
    let json = match op {
        SnapshotOp::Save { file, conn } => {
            let client = conn.client()?;
            let info = backup::save(&client, &file).await?;
            serde_json::to_string_pretty(&info)?
        }
        SnapshotOp::Status { file } => {
            let (info, _, _) =
                tokio::task::spawn_blocking(move || backup::inspect(&file)).await??;
            serde_json::to_string_pretty(&info)?
        }
        SnapshotOp::Restore {
            file,
            data_dir,
            id,
            initial_cluster,
            initial_cluster_token,
            bump_revision,
        } => {
            if id == 0 {
                bail!("--id must be at least 1");
            }
            let opts = backup::RestoreOptions {
                snapshot: file,
                data_dir,
                member_id: id,
                members: initial_cluster
                    .unwrap_or_else(|| [(id, "127.0.0.1:7380".to_owned())].into()),
                cluster_token: initial_cluster_token,
                bump_revision,
            };
            let report = tokio::task::spawn_blocking(move || backup::restore(&opts)).await??;
            serde_json::to_string_pretty(&report)?
        }
    };
    println!("{json}");
    Ok(())
}
