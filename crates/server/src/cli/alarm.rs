//! `fenced alarm list` and `fenced alarm disarm`: the cluster-wide `CORRUPT` alarm (the
//! members' state digests had no majority; every member refuses reads and writes while it is
//! raised) and the members' own divergence alarms, through `fenced.v1.Cluster/Alarm`
//! (docs/operations.md, "Divergence alarm").

use clap::{Args, Subcommand};
use fenced_proto::v1 as pb;

use crate::{tls_hint, ConnArgs};

#[derive(Args)]
pub struct AlarmArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    op: AlarmOp,
}

#[derive(Subcommand)]
enum AlarmOp {
    /// Print the alarms as JSON: the cluster-wide CORRUPT alarm (`cluster`: the log index
    /// whose digests had no majority, the member that raised it, the digests) or null, and
    /// the members whose own divergence alarm is raised, as the node that answers knows them
    /// (the leader knows every member's).
    List,
    /// Disarm the cluster-wide CORRUPT alarm (an administrator, on a cluster with users):
    /// every member serves again. Stop the member whose state is wrong first, or the next
    /// check raises it again. Prints what was cleared (`disarmed`, null if nothing was
    /// raised). A member's own divergence alarm is not disarmed: replace its data dir.
    Disarm,
}

fn alarm_json(a: Option<&pb::ClusterAlarm>) -> serde_json::Value {
    match a {
        None => serde_json::Value::Null,
        Some(a) => serde_json::json!({
            "alarm": "CORRUPT",
            "index": a.index,
            "raised_by": a.raised_by,
            "detail": a.detail,
        }),
    }
}

pub async fn alarm(a: AlarmArgs) -> anyhow::Result<()> {
    let client = a.conn.client()?;
    let tls = a.conn.tls.tls_ca.is_some();
    let r = match a.op {
        AlarmOp::List => client.alarm_list().await,
        AlarmOp::Disarm => client.alarm_disarm().await,
    }
    .map_err(|e| tls_hint(e, tls))?;
    let mut out = serde_json::json!({
        "id": r.id,
        "cluster": alarm_json(r.cluster.as_ref()),
        "alarmed_members": r.alarmed_members,
    });
    if matches!(a.op, AlarmOp::Disarm) {
        out["disarmed"] = alarm_json(r.disarmed.as_ref());
    }
    println!("{out}");
    Ok(())
}
