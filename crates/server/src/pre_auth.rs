//! Limits on the gRPC port before authentication (issue 49; the RESP port's are in
//! `fenced_resp`, "Limits before login" in docs/operations.md).
//!
//! tonic reads a call's whole request message before its handler runs, and the handler is
//! where the caller's token is checked ([`Users::caller`]), so without these limits a client
//! that never logs in could make a node buffer a message up to the method's size limit
//! (1 MiB for fenced's API, 2 MiB for etcd's) on every stream of every connection. This
//! tower layer, around the whole router, looks at a call's headers before anything reads
//! its body. A call whose headers carry no valid credential — no token when the node has no
//! open `default` user, or an unknown or expired one — is an *unauthenticated call*:
//!
//! * its request body may hold at most [`UNAUTHENTICATED_BODY_BYTES`] (a login, a status
//!   call and a refusal's request are far smaller), or it is answered `RESOURCE_EXHAUSTED`;
//! * it must have sent its whole body within [`UNAUTHENTICATED_BODY_WITHIN`] of its
//!   headers, or it is answered `DEADLINE_EXCEEDED`;
//! * at most `--grpc-unauthenticated-calls` of them read their bodies at once on the node
//!   (all connections together); one past it is answered `RESOURCE_EXHAUSTED` at once,
//!   without reading its body, and a warning is logged (at most one every 10 s).
//!
//! So what unauthenticated clients can make a node hold is bounded by the number of calls
//! times (64 KiB of body plus HTTP/2's 16 KiB header list). Each refusal is counted in
//! `fenced_grpc_unauthenticated_refused_total{reason}` (`body_size`, `body_time`,
//! `calls`). The node-to-node services (`fenced.raft.v1.*`) are not limited here: with TLS
//! their interceptor checks the peer's certificate before the body is read, and without
//! TLS they are open to whoever reaches the port (docs/operations.md, "Users and
//! permissions"). With no users (an open `default`), every call is authenticated, as on
//! the RESP port. An authenticated call's body is counted in the node's budget of
//! incomplete requests instead ([`crate::request_budget`], `--grpc-request-buffer-total`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body as HttpBody, Frame, SizeHint};
use prost::bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use crate::metrics::Metrics;
use crate::users::Users;

/// The most request body (gRPC framing included) an unauthenticated call may send.
pub const UNAUTHENTICATED_BODY_BYTES: usize = 64 * 1024;
/// How long an unauthenticated call may take to send its whole body.
pub const UNAUTHENTICATED_BODY_WITHIN: Duration = Duration::from_secs(10);
/// Default `--grpc-unauthenticated-calls`.
pub const DEFAULT_UNAUTHENTICATED_CALLS: usize = 256;
/// Default `--grpc-max-concurrent-streams`: HTTP/2 streams (calls in flight) per
/// connection. tonic's own default is no limit.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;

/// The node-to-node services, guarded by their own interceptor (see the module docs).
const NODE_SERVICES: &str = "/fenced.raft.v1.";

/// The layer; see the module docs.
#[derive(Clone)]
pub struct PreAuthLayer {
    shared: Arc<Shared>,
}

struct Shared {
    users: Arc<Users>,
    /// The node-wide budget of authenticated calls' incomplete requests; `None`: no cap.
    budget: Option<Arc<crate::request_budget::RequestBudget>>,
    /// Permits for unauthenticated calls reading their bodies; `None`: no limit.
    calls: Option<Arc<Semaphore>>,
    limit: usize,
    metrics: Arc<Metrics>,
    /// When the last "too many unauthenticated calls" warning was logged (seconds since
    /// `epoch`), so that a flood does not flood the log.
    last_warning: AtomicU64,
    epoch: std::time::Instant,
}

impl PreAuthLayer {
    /// `calls`: `--grpc-unauthenticated-calls` (0: no limit); `buffer_total`:
    /// `--grpc-request-buffer-total` (0: no cap; [`crate::request_budget`]).
    pub fn new(
        users: Arc<Users>,
        calls: usize,
        buffer_total: usize,
        metrics: Arc<Metrics>,
    ) -> PreAuthLayer {
        PreAuthLayer {
            shared: Arc::new(Shared {
                users,
                budget: (buffer_total > 0).then(|| {
                    crate::request_budget::RequestBudget::new(buffer_total, metrics.clone())
                }),
                calls: (calls > 0).then(|| Arc::new(Semaphore::new(calls))),
                limit: calls,
                metrics,
                last_warning: AtomicU64::new(u64::MAX),
                epoch: std::time::Instant::now(),
            }),
        }
    }
}

impl<S> Layer<S> for PreAuthLayer {
    type Service = PreAuth<S>;

    fn layer(&self, inner: S) -> PreAuth<S> {
        PreAuth {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// [`PreAuthLayer`]'s service.
#[derive(Clone)]
pub struct PreAuth<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl Shared {
    fn warn_calls(&self) {
        let now = self.epoch.elapsed().as_secs();
        let last = self.last_warning.load(Ordering::Relaxed);
        if (last == u64::MAX || now >= last + 10)
            && self
                .last_warning
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                limit = self.limit,
                "gRPC call refused before its body was read: {} unauthenticated calls are \
                 already reading theirs (--grpc-unauthenticated-calls)",
                self.limit
            );
        }
    }
}

impl<S> Service<http::Request<Body>> for PreAuth<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = PreAuthFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let s = &self.shared;
        let gateway = crate::gateway::is_gateway_path(req.uri().path());
        if gateway {
            crate::gateway::normalize_token(req.headers_mut());
        }
        if req.uri().path().starts_with(NODE_SERVICES) {
            return PreAuthFuture::Inner {
                fut: self.inner.call(req),
            };
        }
        if s.users.has_caller(req.headers()) {
            // Authenticated: its incomplete request counts in the node's total.
            let req = match &s.budget {
                Some(budget) => {
                    let (parts, body) = req.into_parts();
                    http::Request::from_parts(parts, budget.wrap(body, !gateway))
                }
                None => req,
            };
            return PreAuthFuture::Inner {
                fut: self.inner.call(req),
            };
        }
        let permit = match &s.calls {
            None => None,
            Some(calls) => match calls.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    s.metrics.grpc_unauthenticated_refused("calls");
                    s.warn_calls();
                    let status = Status::resource_exhausted(format!(
                        "this node is already reading {} unauthenticated calls \
                         (--grpc-unauthenticated-calls); log in, or retry later",
                        s.limit
                    ));
                    // The gateway's clients get its JSON error (429), gRPC's the status.
                    let response = if gateway {
                        crate::gateway::error::response(&status).map(Body::new)
                    } else {
                        status.into_http()
                    };
                    return PreAuthFuture::Refused {
                        response: Some(response),
                        _error: std::marker::PhantomData,
                    };
                }
            },
        };
        let (parts, body) = req.into_parts();
        let capped = Capped {
            inner: body,
            left: UNAUTHENTICATED_BODY_BYTES,
            deadline: Box::pin(tokio::time::sleep(UNAUTHENTICATED_BODY_WITHIN)),
            metrics: s.metrics.clone(),
            _permit: permit,
        };
        let req = http::Request::from_parts(parts, Body::new(capped));
        PreAuthFuture::Inner {
            fut: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    /// [`PreAuth`]'s future: the inner service's, or a refusal made before it was called.
    #[project = PreAuthProj]
    pub enum PreAuthFuture<F, E> {
        Inner { #[pin] fut: F },
        Refused { response: Option<http::Response<Body>>, _error: std::marker::PhantomData<fn() -> E> },
    }
}

impl<F, E> Future for PreAuthFuture<F, E>
where
    F: Future<Output = Result<http::Response<Body>, E>>,
{
    type Output = Result<http::Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            PreAuthProj::Inner { fut } => fut.poll(cx),
            PreAuthProj::Refused { response, .. } => match response.take() {
                Some(r) => Poll::Ready(Ok(r)),
                None => Poll::Pending,
            },
        }
    }
}

/// An unauthenticated call's request body: at most [`UNAUTHENTICATED_BODY_BYTES`], all of
/// it within [`UNAUTHENTICATED_BODY_WITHIN`]; holds its permit until dropped (tonic drops
/// it once it has read the request message).
struct Capped {
    inner: Body,
    left: usize,
    deadline: Pin<Box<tokio::time::Sleep>>,
    metrics: Arc<Metrics>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl HttpBody for Capped {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, Bytes::len);
                if len > this.left {
                    this.left = 0;
                    this.metrics.grpc_unauthenticated_refused("body_size");
                    tracing::debug!("unauthenticated gRPC call refused: body over 64 KiB");
                    return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                        "a call without a valid token may send at most \
                         {UNAUTHENTICATED_BODY_BYTES} bytes: authenticate first \
                         (fenced.v1.Auth/Authenticate, etcdserverpb.Auth/Authenticate)"
                    )))));
                }
                this.left -= len;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.metrics.grpc_unauthenticated_refused("body_time");
                    tracing::debug!("unauthenticated gRPC call refused: body too slow");
                    return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                        "a call without a valid token must send its request within {}s",
                        UNAUTHENTICATED_BODY_WITHIN.as_secs()
                    )))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
