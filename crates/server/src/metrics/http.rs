//! The metrics listener (`/metrics`, `/health`, `/ready`, `/debug/stages`), the watchdog
//! thread that serves it, and the leader watcher that keeps gRPC health in step.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::apply_watch;
use crate::node::Node;

/// How long `/ready` waits for the read barrier.
const READY_TIMEOUT: Duration = Duration::from_secs(1);
/// `/metrics` renders that may wait for the state at once (see [`super::Metrics`]'s
/// `renders`).
pub(super) const MAX_RENDERS: usize = 4;

/// Start the node's watchdog thread, with a runtime of its own: it logs a stuck apply
/// ([`apply_watch::warn_while_stuck`]) and serves `/metrics`, `/health` and `/ready` on
/// `listener` (if any) until `shutdown`. Not on the node's runtime, so that a hung apply —
/// which holds one of its workers, and the state lock other workers then wait for — cannot
/// silence `/health` or the log line naming the stuck index.
pub fn spawn_watchdog(
    node: Node,
    listener: Option<std::net::TcpListener>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("fenced-watchdog".into())
        .spawn(move || {
            rt.block_on(async move {
                let mut stop_rx = shutdown.clone();
                let stop = async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                };
                let warn = apply_watch::warn_while_stuck(&node.metrics().apply, stop);
                let listener = listener.map(TcpListener::from_std).transpose();
                match listener {
                    Ok(Some(l)) => {
                        tokio::join!(warn, serve(node.clone(), l, shutdown));
                    }
                    Ok(None) => warn.await,
                    Err(e) => {
                        tracing::error!("metrics listener failed: {e}");
                        warn.await
                    }
                }
            });
            // A render still waiting for a hung apply must not hold this thread.
            rt.shutdown_background();
        })?;
    Ok(())
}

/// Serve `/metrics`, `/health` and `/ready` on `listener` until `shutdown`.
pub async fn serve(node: Node, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/debug/stages", get(debug_stages))
        .with_state(node);
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!("metrics listener failed: {e}");
    }
}

async fn metrics(
    State(node): State<Node>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::OK,
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render_off_thread(node).await,
    )
}

/// [`Metrics::render`] on a blocking thread ([`Metrics::renders`]).
async fn render_off_thread(node: Node) -> String {
    use std::sync::atomic::Ordering;
    let m = node.metrics().clone();
    if m.renders.fetch_add(1, Ordering::AcqRel) >= MAX_RENDERS {
        m.renders.fetch_sub(1, Ordering::AcqRel);
        let why = match m.apply.current() {
            Some((index, took)) => apply_watch::describe(index, took),
            None => "too many scrapes at once".to_owned(),
        };
        return format!("# metrics unavailable: {why}\n# EOF\n");
    }
    let rendered = tokio::task::spawn_blocking(move || {
        let out = node.metrics().render(&node);
        node.metrics().renders.fetch_sub(1, Ordering::AcqRel);
        out
    })
    .await;
    rendered.unwrap_or_else(|e| format!("# metrics unavailable: {e}\n# EOF\n"))
}

/// `/debug/stages[?reset=1]`: the latency breakdown of sampled proposals as JSON
/// ([`stages`]); `reset=1` empties it after reading.
async fn debug_stages(
    State(node): State<Node>,
    Query(q): Query<HashMap<String, String>>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let reset = q.get("reset").is_some_and(|v| v == "1" || v == "true");
    let summary = node.metrics().stages.summary(reset);
    match serde_json::to_string(&summary) {
        Ok(json) => (StatusCode::OK, [("content-type", "application/json")], json),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            e.to_string(),
        ),
    }
}

async fn health(State(node): State<Node>) -> (StatusCode, String) {
    match node.health() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn ready(State(node): State<Node>) -> (StatusCode, String) {
    if let Some((index, took)) = node.metrics().apply.stuck() {
        let why = apply_watch::describe(index, took);
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        );
    }
    match tokio::time::timeout(READY_TIMEOUT, node.read_barrier()).await {
        Ok(Ok(())) => (StatusCode::OK, "ready\n".into()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: no leader confirmed within {READY_TIMEOUT:?}\n"),
        ),
    }
}

/// Follow Raft's leader: count changes and keep the gRPC health status in step (SERVING while
/// a leader is known and this member's divergence alarm is not raised).
pub async fn watch_leader(
    node: Node,
    health: tonic_health::server::HealthReporter,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut server = node.raft().server_metrics();
    let mut alarm = node.alarm_changes();
    let mut last: Option<(Option<u64>, bool)> = None;
    loop {
        let leader = server.borrow().current_leader;
        let alarmed = *alarm.borrow_and_update();
        if last != Some((leader, alarmed)) {
            if last.is_some_and(|(l, _)| l != leader) {
                node.metrics().leader_changes.inc();
            }
            last = Some((leader, alarmed));
            let status = if leader.is_some() && !alarmed {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            for service in [
                "",
                "fenced.v1.Lock",
                "fenced.v1.Session",
                "fenced.v1.Kv",
                "fenced.v1.Limiter",
            ] {
                health.set_service_status(service, status).await;
            }
        }
        tokio::select! {
            changed = server.changed() => if changed.is_err() { return },
            changed = alarm.changed() => if changed.is_err() { return },
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}
