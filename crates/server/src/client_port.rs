//! The client port (`--grpc-addr`): one listener for gRPC and HTTP, and the one place that
//! owns accepting its connections, TLS and which protocol a request is served by.
//!
//! * **Accept.** Every accepted connection gets `TCP_NODELAY` (a reply written as HEADERS,
//!   DATA and trailers must not wait for the peer's delayed ACK, a 40 ms stall per call)
//!   and takes one of `--max-clients` permits ([`crate::conn_limit`]); past the limit it is
//!   closed at once.
//! * **TLS.** With `--tls-cert`, fenced terminates TLS itself (rustls,
//!   [`fenced_tls::ServerTls::client_port_acceptor`]) and offers ALPN `h2` and `http/1.1`,
//!   so gRPC clients and HTTP/1.1 clients (curl, Python `requests`) both complete the
//!   handshake; tonic's own TLS offers only `h2`. Handshakes run concurrently, each within
//!   [`HANDSHAKE_WITHIN`], so a slow client does not hold up the accept loop. The
//!   connection's certificates reach the services as tonic's `TlsConnectInfo`, which is
//!   what `Request::peer_certs` reads: the node-to-node services' certificate check
//!   ([`fenced_tls::PeerCertCheck`]) is unchanged.
//! * **Protocols.** hyper serves HTTP/2 (with or without TLS: h2c by its connection
//!   preface) and HTTP/1.1 on the same connections; HTTP/2 streams per connection are
//!   capped at `--grpc-max-concurrent-streams`.
//! * **Routing.** [`routes`] joins the gRPC services (each at `/<package.Service>/…`, as
//!   tonic routes them) and the HTTP routes (etcd's JSON gateway `/v3/…`, `/version`,
//!   `/health`) in one router; a path neither knows is answered gRPC's `UNIMPLEMENTED` if
//!   the request is gRPC (`content-type: application/grpc…`) and HTTP 404 otherwise.
//! * **Layers**, around every request whatever its protocol: the client API's metrics
//!   ([`crate::metrics`]) and the limits before login ([`crate::pre_auth`]).
//!
//! A node-to-node stream that should share the port (issue 41) is added here, as a route or
//! as a protocol choice, not beside it.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;

use crate::conn_limit::Limited;
use crate::error::StartError;
use crate::metrics::grpc::GrpcMetricsLayer;
use crate::pre_auth::PreAuthLayer;

/// How long a client has to complete its TLS handshake.
pub const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// The client port's listener and how its connections are served.
pub struct ClientPort {
    listener: TcpListener,
    tls: Option<fenced_tls::TlsAcceptor>,
    max_clients: usize,
    max_concurrent_streams: u32,
}

/// The layers around every request of the port (outermost first).
pub struct Layers {
    pub metrics: GrpcMetricsLayer,
    pub pre_auth: PreAuthLayer,
}

impl ClientPort {
    /// The port on `listener`, with the configuration's TLS and limits.
    pub fn new(listener: TcpListener, cfg: &crate::NodeConfig) -> Result<ClientPort, StartError> {
        let tls = match &cfg.tls {
            Some(t) => Some(
                t.client_port_acceptor()
                    .map_err(|e| StartError::Config(format!("TLS: {e}")))?,
            ),
            None => None,
        };
        Ok(ClientPort {
            listener,
            tls,
            max_clients: cfg.max_clients.max(1),
            max_concurrent_streams: cfg.grpc_max_concurrent_streams.max(1),
        })
    }

    /// Serve `routes` until `stop` resolves; the task doing it. Once `stop` has resolved
    /// the listening socket is closed and open connections are shut down gracefully.
    pub fn serve(
        self,
        layers: Layers,
        routes: Routes,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        let mut server = tonic::transport::Server::builder()
            .accept_http1(true)
            .max_concurrent_streams(self.max_concurrent_streams)
            .layer(layers.metrics)
            .layer(layers.pre_auth);
        let router = server.add_routes(routes);
        let limit = Arc::new(Semaphore::new(self.max_clients));
        match self.tls {
            None => {
                let incoming = accept(self.listener, limit, |conn| async move { Some(conn) });
                tokio::spawn(async move {
                    if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                        tracing::error!("client port (gRPC and HTTP) failed: {e}");
                    }
                })
            }
            Some(acceptor) => {
                let incoming = accept(self.listener, limit, move |conn| {
                    let acceptor = acceptor.clone();
                    async move {
                        match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(conn)).await {
                            Ok(Ok(tls)) => Some(tls),
                            Ok(Err(e)) => {
                                tracing::debug!("TLS handshake on the client port: {e}");
                                None
                            }
                            Err(_) => {
                                tracing::debug!("TLS handshake on the client port timed out");
                                None
                            }
                        }
                    }
                });
                tokio::spawn(async move {
                    if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                        tracing::error!("client port (gRPC and HTTP) failed: {e}");
                    }
                })
            }
        }
    }
}

/// Accept connections on `listener` (nodelay, `--max-clients`), each made ready by
/// `handshake` on a task of its own; the stream of ready ones. The accept loop ends, and
/// the socket closes, when the stream is dropped (the server stopped).
fn accept<IO, H, F>(
    listener: TcpListener,
    limit: Arc<Semaphore>,
    handshake: H,
) -> ReceiverStream<io::Result<IO>>
where
    IO: Send + 'static,
    H: Fn(Limited) -> F + Send + 'static,
    F: Future<Output = Option<IO>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                r = listener.accept() => r,
            };
            let socket = match accepted {
                Ok((socket, _)) => socket,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::debug!("accept on the client port: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if let Err(e) = socket.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY on an accepted connection: {e}");
            }
            let Some(conn) = crate::conn_limit::admit(&limit, socket) else {
                continue;
            };
            let ready = handshake(conn);
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Some(io) = ready.await {
                    let _ = tx.send(Ok(io)).await;
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The gRPC services and the HTTP routes in one router (see the module docs).
pub fn routes(grpc: Routes, http: axum::Router) -> Routes {
    let router = grpc.into_axum_router().merge(http).fallback(unknown_path);
    Routes::from(router)
}

/// A path no route has: gRPC's `UNIMPLEMENTED` to a gRPC call, 404 to anything else (the
/// text Go's `http.ServeMux` answers, as etcd does).
async fn unknown_path(headers: http::HeaderMap) -> axum::response::Response {
    let grpc = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        let (parts, ()) = tonic::Status::unimplemented("")
            .into_http::<()>()
            .into_parts();
        return http::Response::from_parts(parts, axum::body::Body::empty());
    }
    (
        http::StatusCode::NOT_FOUND,
        [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}
