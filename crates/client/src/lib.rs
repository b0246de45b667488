//! Rust client of fenced.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fenced_client::ClientError> {
//! let client = fenced_client::Client::connect(["127.0.0.1:7380"])?;
//! if let Some(guard) = client.lock("invoices", fenced_client::LockOptions::default()).await? {
//!     // Hand guard.token() to the storage you write to; it rejects older tokens.
//!     println!("token {}", guard.token());
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! Every mutating call carries `(client_id, seq)`; the client retries a call on another
//! endpoint with the same id when a node is unreachable or the outcome is unknown, and the
//! cluster answers a repeat with the first outcome, so a retry never acts twice.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_proto::v1 as pb;
use fenced_proto::v1::cluster_client::ClusterClient;
use fenced_proto::v1::lock_client::LockClient;
use fenced_proto::v1::session_client::SessionClient;
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

pub use fenced_proto::v1::{InfoResponse as LockInfo, StatusResponse as Status};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no endpoints given")]
    NoEndpoints,
    #[error("invalid endpoint {0:?}: {1}")]
    InvalidEndpoint(String, String),
    /// The cluster refused the request (bad input, limits, ...).
    #[error("{}: {}", .0.code(), .0.message())]
    Rejected(tonic::Status),
    /// No node answered in time; the outcome of a mutating call is unknown.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
}

/// Options of [`Client::lock`].
#[derive(Clone, Copy, Debug)]
pub struct LockOptions {
    /// Session TTL: how long the lock outlives a client that stops sending keep-alives.
    /// Keep-alives are sent every `ttl/3` (like Redisson's watchdog).
    pub ttl: Duration,
    /// How long to wait in the lock's FIFO queue (zero: try once).
    pub wait: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Duration::ZERO,
        }
    }
}

/// A grant returned by [`Client::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub token: u64,
    pub holds: u32,
    /// Lease left when granted.
    pub ttl_ms: u64,
}

/// A connection to a fenced cluster. Cheap to clone; clones share the request numbering.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    channels: Vec<Channel>,
    preferred: AtomicUsize,
    client_id: u64,
    seq: AtomicU64,
    /// How long a call keeps retrying across endpoints.
    retry_for: Duration,
}

fn is_retryable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled
    )
}

impl Client {
    /// A client for the given `host:port` gRPC endpoints (any node of the cluster).
    /// Connections are made lazily.
    pub fn connect<I, S>(endpoints: I) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let endpoints: Vec<String> = endpoints
            .into_iter()
            .map(|s| s.as_ref().trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let channels = endpoints
            .iter()
            .map(|e| {
                let uri = if e.contains("://") {
                    e.clone()
                } else {
                    format!("http://{e}")
                };
                Endpoint::from_shared(uri)
                    .map(|ep| {
                        ep.connect_timeout(Duration::from_secs(1))
                            .tcp_nodelay(true)
                            .connect_lazy()
                    })
                    .map_err(|err| ClientError::InvalidEndpoint(e.clone(), err.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Client {
            inner: Arc::new(Inner {
                endpoints,
                channels,
                preferred: AtomicUsize::new(0),
                client_id: rand::thread_rng().gen_range(1..u64::MAX),
                seq: AtomicU64::new(0),
                retry_for: Duration::from_secs(15),
            }),
        })
    }

    /// This client's id in request ids.
    pub fn client_id(&self) -> u64 {
        self.inner.client_id
    }

    fn next_request_id(&self) -> pb::RequestId {
        pb::RequestId {
            client_id: self.inner.client_id,
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }

    /// Run `call` against the preferred endpoint, moving to the next one on unavailability,
    /// for up to `retry_for` (+ `extra`). The same request (and request id) is sent each time.
    async fn call<T, F, Fut>(&self, extra: Duration, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let give_up = Instant::now() + self.inner.retry_for + extra;
        let n = self.inner.channels.len();
        loop {
            let i = self.inner.preferred.load(Ordering::Relaxed) % n;
            match call(self.inner.channels[i].clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) if is_retryable(&s) => {
                    self.inner.preferred.store((i + 1) % n, Ordering::Relaxed);
                    if Instant::now() >= give_up {
                        return Err(ClientError::Unavailable(format!(
                            "{}: {}",
                            self.inner.endpoints[i],
                            s.message()
                        )));
                    }
                }
                Err(s) => return Err(ClientError::Rejected(s)),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Take `name` for `owner`: once (`wait` zero) or waiting server-side in FIFO order.
    /// `session` 0 gives the grant its own lease of `ttl`; otherwise it lives with the session.
    pub async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
        session: u64,
    ) -> Result<Option<Grant>, ClientError> {
        let req = pb::AcquireRequest {
            request: Some(self.next_request_id()),
            name: name.to_owned(),
            owner: owner.to_owned(),
            ttl_ms: ttl.as_millis() as u64,
            wait_ms: wait.as_millis() as u64,
            session,
        };
        let r = self
            .call(wait, |ch| {
                let mut c = LockClient::new(ch);
                let mut req = tonic::Request::new(req.clone());
                req.set_timeout(wait + Duration::from_secs(10));
                async move { c.acquire(req).await }
            })
            .await?;
        Ok(r.granted.then_some(Grant {
            token: r.token,
            holds: r.holds,
            ttl_ms: r.ttl_ms,
        }))
    }

    /// Drop one hold of grant `token`. `false`: not held by that owner with that token.
    pub async fn release(&self, name: &str, owner: &str, token: u64) -> Result<bool, ClientError> {
        let req = pb::ReleaseRequest {
            request: Some(self.next_request_id()),
            name: name.to_owned(),
            owner: owner.to_owned(),
            token,
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = LockClient::new(ch);
                let req = req.clone();
                async move { c.release(req).await }
            })
            .await?;
        Ok(r.released)
    }

    /// Extend the lease of grant `token`. `false`: not held with that token any more.
    pub async fn renew(
        &self,
        name: &str,
        owner: &str,
        token: u64,
        ttl: Duration,
    ) -> Result<bool, ClientError> {
        let req = pb::RenewRequest {
            request: Some(self.next_request_id()),
            name: name.to_owned(),
            owner: owner.to_owned(),
            token,
            ttl_ms: ttl.as_millis() as u64,
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = LockClient::new(ch);
                let req = req.clone();
                async move { c.renew(req).await }
            })
            .await?;
        Ok(r.renewed)
    }

    /// Linearizable read of a lock's holder. `None` if free.
    pub async fn info(&self, name: &str) -> Result<Option<LockInfo>, ClientError> {
        let req = pb::InfoRequest {
            name: name.to_owned(),
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = LockClient::new(ch);
                let req = req.clone();
                async move { c.info(req).await }
            })
            .await?;
        Ok(r.held.then_some(r))
    }

    pub async fn open_session(&self, ttl: Duration) -> Result<u64, ClientError> {
        let req = pb::OpenSessionRequest {
            request: Some(self.next_request_id()),
            ttl_ms: ttl.as_millis() as u64,
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = SessionClient::new(ch);
                async move { c.open(req).await }
            })
            .await?;
        Ok(r.session)
    }

    /// `false`: the session is gone (expired or closed), and with it its locks.
    pub async fn keep_alive(&self, session: u64) -> Result<bool, ClientError> {
        let req = pb::KeepAliveRequest {
            request: Some(self.next_request_id()),
            session,
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = SessionClient::new(ch);
                async move { c.keep_alive(req).await }
            })
            .await?;
        Ok(r.alive)
    }

    pub async fn close_session(&self, session: u64) -> Result<bool, ClientError> {
        let req = pb::CloseSessionRequest {
            request: Some(self.next_request_id()),
            session,
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = SessionClient::new(ch);
                async move { c.close(req).await }
            })
            .await?;
        Ok(r.closed)
    }

    /// Status of the first endpoint that answers.
    pub async fn status(&self) -> Result<Status, ClientError> {
        self.call(Duration::ZERO, |ch| {
            let mut c = ClusterClient::new(ch);
            async move { c.status(pb::StatusRequest {}).await }
        })
        .await
    }

    /// Status of every endpoint, in order (`Err` for the ones that did not answer).
    pub async fn status_all(&self) -> Vec<Result<Status, ClientError>> {
        let mut out = Vec::new();
        for ch in &self.inner.channels {
            let mut c = ClusterClient::new(ch.clone());
            let mut req = tonic::Request::new(pb::StatusRequest {});
            req.set_timeout(Duration::from_secs(2));
            out.push(
                c.status(req)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| ClientError::Unavailable(s.message().to_owned())),
            );
        }
        out
    }

    /// Open a session, take `name` under it and keep the session alive in the background
    /// until the guard is released or dropped. `None` if not granted within `opts.wait`.
    pub async fn lock(
        &self,
        name: &str,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, ClientError> {
        let session = self.open_session(opts.ttl).await?;
        let owner = format!("{:016x}-{session}", self.inner.client_id);
        let grant = match self
            .acquire(name, &owner, opts.ttl, opts.wait, session)
            .await
        {
            Ok(Some(g)) => g,
            other => {
                let _ = self.close_session(session).await;
                return other.map(|_| None);
            }
        };
        let (lost_tx, lost_rx) = watch::channel(false);
        let keepalive = tokio::spawn(keep_alive_loop(self.clone(), session, opts.ttl, lost_tx));
        Ok(Some(LockGuard {
            client: self.clone(),
            name: name.to_owned(),
            owner,
            token: grant.token,
            session,
            lost: lost_rx,
            keepalive,
            released: false,
        }))
    }
}

/// Renew the session every `ttl/3`. If the cluster says the session is gone, or no renewal
/// succeeded for a whole `ttl`, the lock must be presumed lost.
async fn keep_alive_loop(client: Client, session: u64, ttl: Duration, lost: watch::Sender<bool>) {
    let period = (ttl / 3).max(Duration::from_millis(10));
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        let sent = Instant::now();
        match client.keep_alive(session).await {
            Ok(true) => last_ok = sent,
            Ok(false) => {
                tracing::warn!(session, "session expired: lock lost");
                let _ = lost.send(true);
                return;
            }
            Err(e) => tracing::warn!(session, "keep-alive failed: {e}"),
        }
        if last_ok.elapsed() >= ttl {
            tracing::warn!(
                session,
                "no keep-alive succeeded for a whole ttl: lock presumed lost"
            );
            let _ = lost.send(true);
            return;
        }
    }
}

/// A held lock. Present [`LockGuard::token`] with every write to the protected storage.
pub struct LockGuard {
    client: Client,
    name: String,
    owner: String,
    token: u64,
    session: u64,
    lost: watch::Receiver<bool>,
    keepalive: JoinHandle<()>,
    released: bool,
}

impl LockGuard {
    /// The fencing token of this grant.
    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn session(&self) -> u64 {
        self.session
    }

    /// True once the session (and with it the lock) is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves when the lock is lost (never, while it is kept alive).
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|l| *l).await;
    }

    /// Release the lock and close its session.
    pub async fn release(mut self) -> Result<(), ClientError> {
        self.released = true;
        self.keepalive.abort();
        let released = self
            .client
            .release(&self.name, &self.owner, self.token)
            .await;
        let closed = self.client.close_session(self.session).await;
        released.and(closed).map(|_| ())
    }
}

impl Drop for LockGuard {
    /// Best effort: close the session (releasing the lock) in the background.
    fn drop(&mut self) {
        self.keepalive.abort();
        if self.released {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let session = self.session;
            rt.spawn(async move {
                let _ = client.close_session(session).await;
            });
        }
    }
}
