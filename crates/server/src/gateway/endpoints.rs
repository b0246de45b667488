//! etcd's plain HTTP endpoints on the client port: `GET /version` and `GET /health`.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::Response;
use http::StatusCode;

use super::error;
use crate::node::Node;

/// How long `/health` waits for its linearizable read (etcd's own check is a quorum read).
pub const HEALTH_READ_WITHIN: Duration = Duration::from_secs(2);

/// The etcd server version `/version` reports: the API level fenced serves, without the
/// build metadata `Maintenance.Status` adds (clients parse this one to pick `/v3`).
pub const ETCD_SERVER_VERSION: &str = "3.5.0";
/// The cluster version: etcd reports `major.minor.0`.
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";

/// `{"etcdserver": …, "etcdcluster": …}`, as etcd 3.5 answers.
pub async fn version() -> Response {
    // etcd's field order (serde_json's maps sort keys).
    let body = format!(
        r#"{{"etcdserver":{},"etcdcluster":{}}}"#,
        error::json_string(ETCD_SERVER_VERSION),
        error::json_string(ETCD_CLUSTER_VERSION)
    );
    error::json_response(StatusCode::OK, body.into_bytes())
}

/// `{"health": "true"|"false", "reason": …}`, 200 when healthy and 503 when not, with
/// etcd 3.5's reasons and query parameters: an alarm (`ALARM NOSPACE`; fenced's divergence
/// alarm is etcd's `ALARM CORRUPT`) unless `?exclude=NAME` names it, no leader
/// (`RAFT NO LEADER`), or a linearizable read that fails (`QGET ERROR: …`);
/// `?serializable=true` skips the leader and the read. A member fenced itself finds
/// unable to serve (raft stopped, apply stuck, retired) is unhealthy with that reason.
pub async fn health(
    State(node): State<Node>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let serializable = q.get("serializable").is_some_and(|v| v == "true");
    let reason = check(&node, serializable, q.get("exclude").map(String::as_str)).await;
    let (code, healthy, reason) = match reason {
        None => (StatusCode::OK, "true", String::new()),
        Some(r) => (StatusCode::SERVICE_UNAVAILABLE, "false", r),
    };
    let body = serde_json::json!({"health": healthy, "reason": reason});
    error::json_response(code, body.to_string().into_bytes())
}

async fn check(node: &Node, serializable: bool, exclude: Option<&str>) -> Option<String> {
    let excluded = |name: &str| exclude == Some(name);
    if let Err(why) = node.health() {
        return Some(why);
    }
    if node.alarm().is_some() && !excluded("CORRUPT") {
        return Some("ALARM CORRUPT".into());
    }
    if node.local(|sm| sm.etcd_quota().nospace) && !excluded("NOSPACE") {
        return Some("ALARM NOSPACE".into());
    }
    if serializable {
        return None;
    }
    if node.raft().metrics().borrow().current_leader.is_none() {
        return Some("RAFT NO LEADER".into());
    }
    match tokio::time::timeout(HEALTH_READ_WITHIN, node.read_barrier()).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("QGET ERROR:{e}")),
        Err(_) => Some(format!(
            "QGET ERROR:no read confirmed within {HEALTH_READ_WITHIN:?}"
        )),
    }
}
