//! `fenced serve`'s flags for the etcd keyspace, named as etcd names them.

use clap::Args;
use fenced_server::config::parse_auto_compaction;
use fenced_server::NodeConfig;

#[derive(Args)]
pub struct EtcdServeArgs {
    /// The etcd keyspace's space quota (etcd's flag): bytes of stored history (keys, values
    /// and a 48-byte overhead per version, what Maintenance.Status reports as dbSize). A
    /// write that would go above it is refused with "etcdserver: mvcc: database space
    /// exceeded" and raises the NOSPACE alarm until a compaction and `etcdctl alarm disarm`.
    /// 0: etcd's default, 2 GiB. The leader's value is the cluster's: give every member the
    /// same.
    #[arg(long, default_value_t = 0)]
    quota_backend_bytes: u64,
    /// `periodic` or `revision` (etcd's flag): how --auto-compaction-retention counts.
    #[arg(long, default_value = "periodic")]
    auto_compaction_mode: String,
    /// Compact the etcd history automatically (etcd's flag; 0: off, the default). Periodic:
    /// keep this much history in log time, hours as a bare number (`1`) or a duration
    /// (`30m`, `1h30m`); revision: keep the last N revisions. The leader proposes the
    /// compactions.
    #[arg(long, default_value = "0")]
    auto_compaction_retention: String,
}

impl EtcdServeArgs {
    /// Set the etcd options of `cfg`, or say which flag is wrong.
    pub fn apply(&self, cfg: &mut NodeConfig) -> anyhow::Result<()> {
        cfg.quota_backend_bytes = self.quota_backend_bytes;
        cfg.auto_compaction =
            parse_auto_compaction(&self.auto_compaction_mode, &self.auto_compaction_retention)
                .map_err(anyhow::Error::msg)?;
        Ok(())
    }
}
