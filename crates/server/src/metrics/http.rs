//! The metrics listener (`/metrics`, `/health`, `/ready`, `/debug/stages`), the watchdog
//! thread that serves it, and the leader watcher that keeps gRPC health in step.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use super::apply_watch;
use crate::conn_limit::{try_admit, Limited};
use crate::node::Node;

/// How long `/ready` waits for the read barrier.
const READY_TIMEOUT: Duration = Duration::from_secs(1);
/// `/metrics` renders that may wait for the state at once (see [`super::Metrics`]'s
/// `renders`).
pub(super) const MAX_RENDERS: usize = 4;
/// `--metrics-max-connections`' default: far more than any monitoring opens, far fewer
/// file descriptors and buffers than the node has.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// At most one warning per this long about connections closed for the limit.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// A metrics connection that sends nothing for this long is closed (an idle keep-alive
/// between scrapes too: the scraper reconnects), so connections left open by idle or
/// vanished clients give their places back.
pub const IDLE: Duration = Duration::from_secs(5);

/// Start the node's watchdog thread, with a runtime of its own: it logs a stuck apply
/// ([`apply_watch::warn_while_stuck`]) and serves `/metrics`, `/health` and `/ready` on
/// `listener` (if any) until `shutdown`. Not on the node's runtime, so that a hung apply —
/// which holds one of its workers, and the state lock other workers then wait for — cannot
/// silence `/health` or the log line naming the stuck index.
/// At most `max_connections` connections are open on it at once ([`Capped`]).
pub fn spawn_watchdog(
    node: Node,
    listener: Option<std::net::TcpListener>,
    max_connections: usize,
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
                        let l = Capped::new(l, max_connections, node.clone());
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

/// The metrics listener with its connection cap (`--metrics-max-connections`): a
/// connection accepted while the cap's are open is closed at once (counted in
/// `fenced_metrics_connections_refused_total`, a warning at most every 10 s), and one that
/// sends nothing for [`IDLE`] is closed, so idle or slow clients hold at most that many
/// sockets and buffers, and for at most [`IDLE`] each: a fresh `/health` is served once
/// one of them closes.
pub struct Capped {
    inner: TcpListener,
    limit: Arc<Semaphore>,
    max: usize,
    node: Node,
    warned: Option<Instant>,
}

impl Capped {
    pub fn new(inner: TcpListener, max: usize, node: Node) -> Capped {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Capped {
            inner,
            limit: Arc::new(Semaphore::new(max)),
            max,
            node,
            warned: None,
        }
    }
}

/// A metrics connection: its permit, and the deadline of its next byte ([`IDLE`]).
pub struct Conn {
    inner: Limited,
    idle: Pin<Box<tokio::time::Sleep>>,
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    let next = tokio::time::Instant::now() + IDLE;
                    self.idle.as_mut().reset(next);
                }
                Poll::Ready(r)
            }
            // Nothing for IDLE: end of input, and hyper closes the connection.
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Ok(())),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for Capped {
    type Io = Conn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Conn, std::net::SocketAddr) {
        loop {
            let (socket, addr) = axum::serve::Listener::accept(&mut self.inner).await;
            match try_admit(&self.limit, socket) {
                Ok(inner) => {
                    let idle = Box::pin(tokio::time::sleep(IDLE));
                    return (Conn { inner, idle }, addr);
                }
                Err(socket) => {
                    drop(socket);
                    self.node.metrics().metrics_connection_refused();
                    if self.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        self.warned = Some(Instant::now());
                        tracing::warn!(
                            peer = %addr,
                            max = self.max,
                            "metrics connection closed: --metrics-max-connections are open"
                        );
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}

/// Serve `/metrics`, `/health` and `/ready` on `listener` until `shutdown`.
pub async fn serve<L>(node: Node, listener: L, mut shutdown: watch::Receiver<bool>)
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
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

/// `GET /metrics`: the node's families in Prometheus/OpenMetrics text. Also served on the
/// client port, as etcd serves its `/metrics` there (`crate::gateway`).
pub async fn metrics(
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
