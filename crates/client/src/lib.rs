//! Rust client of fenced.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fenced_client::ClientError> {
//! use fenced_client::{Client, LockOptions};
//! let client = Client::connect(["127.0.0.1:7380", "127.0.0.2:7380", "127.0.0.3:7380"])?;
//! if let Some(guard) = client.lock("invoices", LockOptions::default()).await? {
//!     // Hand the token to the storage you write to; it rejects older tokens.
//!     if let Some(token) = guard.token() {
//!         println!("writing with token {token}");
//!     }
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! * [`Client::lock`], [`Client::read_lock`], [`Client::write_lock`], [`Client::semaphore`]
//!   and [`Client::multi_lock`] return a [`LockGuard`] whose grant lives in the client's
//!   session. One session per client is kept alive in the background (a watchdog renewing
//!   every `session_ttl/3`, like Redisson's) and watched for lock-loss events pushed by the
//!   server: when a grant ends without the guard releasing it (lease or session expired,
//!   force-unlocked), the guard is *poisoned* — [`LockGuard::token`] returns `None` — and its
//!   [`LockGuard::on_lost`] callback runs.
//! * The lower-level calls ([`Client::acquire`], [`Client::release`], ...) map one to one to
//!   the gRPC API.
//! * [`Client::etcd`] speaks etcd's v3 API on the same port ([`etcd`]): keys, a [`Watch`]
//!   that resumes by revision across failed nodes, and leases with a [`KeepAlive`] task.
//!
//! Every mutating call carries `(client_id, seq)`; the client retries a call on another
//! endpoint with the same id when a node is unreachable or the outcome is unknown, and the
//! cluster answers a repeat with the first outcome, so a retry never acts twice.
//!
//! On a cluster with users (`fenced serve --acl-file` / `--requirepass`), give
//! [`ClientOptions::credentials`]: the client exchanges the password for a token on each node
//! before its first call there (`Auth.Authenticate`), sends it with every call, renews it
//! before it expires and logs in again when a node answers `UNAUTHENTICATED` (it restarted,
//! or forgot the token). A wrong password is [`ClientError::Rejected`] with
//! `Code::Unauthenticated`; a call the user may not make, `Code::PermissionDenied`.

mod cluster;
pub mod etcd;
mod guard;
mod limiter;
mod session;

pub use etcd::{
    Election, ElectionError, Etcd, EventKind, KeepAlive, KeyValue, LeaderKey, Leadership, Lease,
    LeaseLoss, LeaseTimeToLive, Observe, Watch, WatchEvent,
};
pub use fenced_proto::v1::{LockMode, SessionEvent};
pub use guard::{LockGuard, LockOptions};
pub use limiter::{Decision, Limiter, Policy};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_proto::v1 as pb;
use fenced_proto::v1::auth_client::AuthClient;
use fenced_proto::v1::kv_client::KvClient;
use fenced_proto::v1::lock_client::LockClient;
use fenced_proto::v1::session_client::SessionClient;
pub use fenced_tls::ClientTls;
use rand::Rng;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::Code;

pub use fenced_proto::v1::{InfoResponse as LockInfo, StatusResponse as Status};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no endpoints given")]
    NoEndpoints,
    #[error("invalid endpoint {0:?}: {1}")]
    InvalidEndpoint(String, String),
    /// The cluster refused the request (bad input, limits, ...), or the state machine's record
    /// of it says it was refused. Nothing was done.
    #[error("{}: {}", .0.code(), .0.message())]
    Rejected(tonic::Status),
    /// The outcome of a mutating call is unknown: no node answered in time, or an attempt's
    /// outcome was unknown (gRPC `UNAVAILABLE` other than "not the leader") and no later one
    /// learnt it — a later attempt's refusal (overloaded, the node stopped, the request
    /// older than the dedup window) says nothing about the earlier one. It may have taken
    /// effect: look before acting again.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// An etcd watch's next revision is below the keyspace's compact revision: the changes
    /// in between are gone from the history, so the watch cannot go on without a gap
    /// ([`etcd::Watch::next`]). Start a new watch at `compact_revision` or later (after
    /// reading the current state).
    #[error("etcdserver: mvcc: required revision has been compacted (compact revision {compact_revision})")]
    Compacted { compact_revision: i64 },
    /// The cluster cancelled an etcd watch for a reason other than compaction (a permission
    /// refused, an empty key): etcd's `cancel_reason`.
    #[error("watch cancelled: {0}")]
    WatchCanceled(String),
}

/// The `name` / `names` fields of a request: one lock goes in `name`, a multi-lock's in
/// `names`.
pub(crate) fn name_fields(names: &[&str]) -> (String, Vec<String>) {
    match names {
        [one] => (one.to_string(), Vec::new()),
        many => (String::new(), many.iter().map(|n| n.to_string()).collect()),
    }
}

/// Response header in which a follower names the leader's gRPC address.
const LEADER_HINT: &str = "x-fenced-leader";

/// Options of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// TTL of the client's session: how long its locks outlive a client that stops sending
    /// keep-alives (which it sends every `session_ttl/3`).
    pub session_ttl: Duration,
    /// How long one call keeps retrying across endpoints before giving up.
    pub retry_for: Duration,
    /// Connect over TLS (the cluster runs with `--tls-cert`): the CA to trust and,
    /// optionally, a client certificate.
    pub tls: Option<ClientTls>,
    /// Log in as this user (clusters with `--acl-file` or `--requirepass`). `None`: send no
    /// token (the calls run as the cluster's `default` user, if it needs no password).
    pub credentials: Option<Credentials>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            session_ttl: Duration::from_secs(10),
            retry_for: Duration::from_secs(15),
            tls: None,
            credentials: None,
        }
    }
}

impl ClientOptions {
    /// These options, logging in as `user` with `password`.
    pub fn with_credentials(mut self, user: &str, password: &str) -> Self {
        self.credentials = Some(Credentials::new(user, password));
        self
    }
}

/// A user and password of the cluster's ACL (the same as RESP's `AUTH user password`).
#[derive(Clone)]
pub struct Credentials {
    user: String,
    password: String,
}

impl Credentials {
    pub fn new(user: &str, password: &str) -> Self {
        Credentials {
            user: user.to_owned(),
            password: password.to_owned(),
        }
    }

    pub fn user(&self) -> &str {
        &self.user
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The channel every call goes through: adds `authorization: Bearer <token>` when logged in.
pub type AuthChannel = InterceptedService<Channel, BearerToken>;

/// Interceptor that sends a node's token (or nothing).
#[derive(Clone)]
pub struct BearerToken(Option<AsciiMetadataValue>);

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A node's token and when to renew it.
struct Token {
    header: AsciiMetadataValue,
    renew_at: Instant,
}

/// A fenced write refused because a newer token already wrote the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale token {presented}: {highest} already wrote this key")]
pub struct Stale {
    pub presented: u64,
    pub highest: u64,
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
    options: ClientOptions,
    /// The session shared by this client's guards (opened on first use, reopened if lost).
    session: tokio::sync::Mutex<Option<Arc<session::SharedSession>>>,
    /// Owners of guards are unique per guard: `<client_id>-<n>`.
    guards: AtomicU64,
    endpoints: Vec<String>,
    channels: Vec<Channel>,
    /// Per endpoint: the token it issued us (with credentials).
    tokens: Vec<tokio::sync::Mutex<Option<Token>>>,
    preferred: AtomicUsize,
    client_id: u64,
    seq: AtomicU64,
    /// Attempts that failed retryably and were sent again ([`Client::retries`]).
    retries: AtomicU64,
}

fn is_retryable(s: &tonic::Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => true,
        // etcd's election answers ("election: not leader", "election: no leader") are
        // `UNKNOWN`, as etcd's server sends them: answers, not failures.
        Code::Unknown => !s.message().starts_with("election: "),
        _ => false,
    }
}

/// The server's rule for outcomes, across the client's own attempts of one call (the same
/// request id each time): once an attempt may have taken effect, a later refusal is no
/// answer — only the state machine's record of the request is.
#[derive(Debug, Default)]
struct Attempts {
    /// Why an earlier attempt may have taken effect.
    maybe_applied: Option<String>,
}

impl Attempts {
    /// A retryable failure: did the attempt possibly take effect? Not if the node said it is
    /// not the leader, or the connection was never made.
    fn failed(&mut self, s: &tonic::Status) {
        let m = s.message();
        let certainly_not = m.starts_with("not the leader") || m.contains("tcp connect error");
        if !certainly_not && self.maybe_applied.is_none() {
            self.maybe_applied = Some(format!("{}: {m}", s.code()));
        }
    }

    /// A final (non-retryable) answer `s`: passed on as a refusal unless an earlier attempt
    /// may have taken effect and `s` is not the state machine's answer to the request
    /// (`rejected: …`, which a repeat is given from the request's record).
    fn refused(&self, s: tonic::Status) -> ClientError {
        let from_record = s.message().starts_with("rejected: ")
            && !s.message().contains("older than the dedup window");
        match &self.maybe_applied {
            Some(first) if !from_record => ClientError::Unavailable(format!(
                "outcome unknown: {first}; then {}: {}",
                s.code(),
                s.message()
            )),
            _ => ClientError::Rejected(s),
        }
    }
}

impl Client {
    /// A client for the given `host:port` gRPC endpoints (any node of the cluster).
    /// Connections are made lazily.
    pub fn connect<I, S>(endpoints: I) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::connect_with(endpoints, ClientOptions::default())
    }

    /// [`Client::connect`] with options.
    pub fn connect_with<I, S>(endpoints: I, options: ClientOptions) -> Result<Client, ClientError>
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
        let tls = options.tls.as_ref().map(ClientTls::grpc);
        let channels = endpoints
            .iter()
            .map(|e| {
                fenced_tls::endpoint(e, tls.as_ref())
                    .map(|ep| {
                        ep.connect_timeout(Duration::from_secs(1))
                            .tcp_nodelay(true)
                            .connect_lazy()
                    })
                    .map_err(|err| ClientError::InvalidEndpoint(e.clone(), err))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Client {
            inner: Arc::new(Inner {
                options,
                session: tokio::sync::Mutex::new(None),
                guards: AtomicU64::new(0),
                tokens: endpoints
                    .iter()
                    .map(|_| tokio::sync::Mutex::new(None))
                    .collect(),
                endpoints,
                channels,
                preferred: AtomicUsize::new(0),
                client_id: rand::thread_rng().gen_range(1..u64::MAX),
                seq: AtomicU64::new(0),
                retries: AtomicU64::new(0),
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

    /// How many calls of this client (and its clones) failed retryably — an unavailable or
    /// restarting node, a leader change — and were sent again; the caller saw none of them.
    pub fn retries(&self) -> u64 {
        self.inner.retries.load(Ordering::Relaxed)
    }

    /// Endpoint `i`'s channel, with our token there when we have credentials: logs in
    /// (`Auth.Authenticate`) first if we have no token of that node, or one due for renewal.
    async fn authed(&self, i: usize) -> Result<AuthChannel, tonic::Status> {
        let ch = self.inner.channels[i].clone();
        let Some(creds) = &self.inner.options.credentials else {
            return Ok(InterceptedService::new(ch, BearerToken(None)));
        };
        let mut slot = self.inner.tokens[i].lock().await;
        if let Some(t) = slot.as_ref().filter(|t| Instant::now() < t.renew_at) {
            return Ok(InterceptedService::new(
                ch,
                BearerToken(Some(t.header.clone())),
            ));
        }
        let mut req = tonic::Request::new(pb::AuthenticateRequest {
            user: creds.user.clone(),
            password: creds.password.clone(),
        });
        req.set_timeout(Duration::from_secs(5));
        let r = AuthClient::new(ch.clone())
            .authenticate(req)
            .await?
            .into_inner();
        let header: AsciiMetadataValue = format!("Bearer {}", r.token)
            .parse()
            .map_err(|_| tonic::Status::internal("the node sent a token that is not ASCII"))?;
        // Renew at three quarters of its life, before the node forgets it.
        let renew_in = Duration::from_millis(r.ttl_ms.saturating_mul(3) / 4);
        *slot = Some(Token {
            header: header.clone(),
            renew_at: Instant::now() + renew_in,
        });
        Ok(InterceptedService::new(ch, BearerToken(Some(header))))
    }

    /// Forget endpoint `i`'s token (it refused it): the next call logs in again.
    async fn forget_token(&self, i: usize) {
        *self.inner.tokens[i].lock().await = None;
    }

    /// Run `call` against the preferred endpoint, moving to the next one on unavailability,
    /// for up to `retry_for` (+ `extra`). The same request (and request id) is sent each time.
    /// With credentials, each endpoint is logged in on first use, and again when it answers
    /// `UNAUTHENTICATED` (once per endpoint and call).
    async fn call<T, F, Fut>(&self, extra: Duration, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(AuthChannel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let give_up = Instant::now() + self.inner.options.retry_for + extra;
        let n = self.inner.channels.len();
        let mut relogins = 0;
        let mut attempts = Attempts::default();
        loop {
            let i = self.inner.preferred.load(Ordering::Relaxed) % n;
            let answer = match self.authed(i).await {
                Ok(ch) => call(ch).await,
                // The login itself failed: a wrong password is final, an unreachable node
                // is retried like any call.
                Err(s) => Err(s),
            };
            match answer {
                Ok(r) => {
                    self.follow_leader_hint(r.metadata());
                    return Ok(r.into_inner());
                }
                Err(s)
                    if s.code() == Code::Unauthenticated
                        && self.inner.options.credentials.is_some()
                        && relogins < n
                        && self.inner.tokens[i].lock().await.is_some() =>
                {
                    // The node no longer knows our token (restart, expiry): log in again.
                    relogins += 1;
                    self.forget_token(i).await;
                    continue;
                }
                Err(s) if is_retryable(&s) => {
                    attempts.failed(&s);
                    self.inner.retries.fetch_add(1, Ordering::Relaxed);
                    self.inner.preferred.store((i + 1) % n, Ordering::Relaxed);
                    if Instant::now() >= give_up {
                        return Err(ClientError::Unavailable(format!(
                            "{}: {}",
                            self.inner.endpoints[i],
                            s.message()
                        )));
                    }
                }
                Err(s) => return Err(attempts.refused(s)),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A follower names the leader in `x-fenced-leader`; if it is one of our endpoints, use
    /// it from now on (the follower would forward there anyway).
    fn follow_leader_hint(&self, meta: &tonic::metadata::MetadataMap) {
        let Some(leader) = meta.get(LEADER_HINT).and_then(|v| v.to_str().ok()) else {
            return;
        };
        if let Some(i) = self
            .inner
            .endpoints
            .iter()
            .position(|e| e.rsplit("://").next() == Some(leader))
        {
            self.inner.preferred.store(i, Ordering::Relaxed);
        }
    }

    /// Take `name` exclusively for `owner`: once (`wait` zero) or waiting server-side in FIFO
    /// order. `session` 0 gives the grant its own lease of `ttl`; otherwise it lives with the
    /// session.
    pub async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
        session: u64,
    ) -> Result<Option<Grant>, ClientError> {
        self.acquire_with(pb::AcquireRequest {
            name: name.to_owned(),
            owner: owner.to_owned(),
            ttl_ms: ttl.as_millis() as u64,
            wait_ms: wait.as_millis() as u64,
            session,
            ..Default::default()
        })
        .await
    }

    /// The general acquire (read/write, semaphore permits, multi-locks, lock-delay): `req`
    /// as in the gRPC API; its request id is filled in.
    pub async fn acquire_with(
        &self,
        mut req: pb::AcquireRequest,
    ) -> Result<Option<Grant>, ClientError> {
        req.request = Some(self.next_request_id());
        let wait = Duration::from_millis(req.wait_ms);
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
        self.release_all(&[name], owner, token).await
    }

    /// Drop one hold of grant `token` on each of `names` (a multi-lock grant).
    pub async fn release_all(
        &self,
        names: &[&str],
        owner: &str,
        token: u64,
    ) -> Result<bool, ClientError> {
        let (name, names) = name_fields(names);
        let req = pb::ReleaseRequest {
            request: Some(self.next_request_id()),
            name,
            owner: owner.to_owned(),
            token,
            names,
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

    /// Administrative: end every grant of `name` now. `false` if nobody held it.
    pub async fn force_unlock(&self, name: &str) -> Result<bool, ClientError> {
        let req = pb::ForceUnlockRequest {
            request: Some(self.next_request_id()),
            name: name.to_owned(),
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = LockClient::new(ch);
                let req = req.clone();
                async move { c.force_unlock(req).await }
            })
            .await?;
        Ok(r.released)
    }

    /// The lock-loss events of `session`, pushed by the node first answering.
    pub async fn watch(&self, session: u64) -> Result<tonic::Streaming<SessionEvent>, ClientError> {
        self.call(Duration::ZERO, |ch| {
            let mut c = SessionClient::new(ch);
            async move { c.watch(pb::WatchRequest { session }).await }
        })
        .await
    }

    /// Write `value` under `key` in fenced's own keyspace if `token` is at least every token
    /// used to write `key` before (RESP: `FENCE.SET`). `Err(Stale)` otherwise, changing nothing.
    pub async fn fenced_put(
        &self,
        key: &str,
        value: &[u8],
        token: u64,
    ) -> Result<Result<(), Stale>, ClientError> {
        let req = pb::FencedPutRequest {
            request: Some(self.next_request_id()),
            key: key.to_owned(),
            value: value.to_vec(),
            token,
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = KvClient::new(ch);
                let req = req.clone();
                async move { c.fenced_put(req).await }
            })
            .await?;
        Ok(if r.accepted {
            Ok(())
        } else {
            Err(Stale {
                presented: token,
                highest: r.highest,
            })
        })
    }

    /// Linearizable read of `key` in fenced's keyspace: its value and fence (highest token).
    pub async fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u64)>, ClientError> {
        let req = pb::GetRequest {
            key: key.to_owned(),
        };
        let r = self
            .call(Duration::ZERO, |ch| {
                let mut c = KvClient::new(ch);
                let req = req.clone();
                async move { c.get(req).await }
            })
            .await?;
        Ok(r.found.then_some((r.value, r.fence)))
    }

    /// Linearizable read of a lock's holder(s). `None` if free.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown() -> tonic::Status {
        tonic::Status::unavailable("outcome unknown: raft write timed out")
    }

    #[test]
    fn a_refusal_is_passed_on_until_an_attempt_may_have_taken_effect() {
        let overloaded = || tonic::Status::resource_exhausted("overloaded: 10 requests wait");
        let a = Attempts::default();
        assert!(matches!(a.refused(overloaded()), ClientError::Rejected(_)));
        let mut a = Attempts::default();
        a.failed(&tonic::Status::unavailable(
            "not the leader (leader: unknown)",
        ));
        a.failed(&tonic::Status::unavailable("tcp connect error"));
        assert!(matches!(a.refused(overloaded()), ClientError::Rejected(_)));
    }

    #[test]
    fn after_an_unknown_attempt_only_the_record_of_the_request_is_an_answer() {
        let mut a = Attempts::default();
        a.failed(&unknown());
        for s in [
            tonic::Status::resource_exhausted("overloaded: 10 requests wait"),
            tonic::Status::internal("node stopped: raft stopped"),
            tonic::Status::failed_precondition(
                "rejected: request 3 of client 9 is older than the dedup window",
            ),
        ] {
            match a.refused(s) {
                ClientError::Unavailable(m) => assert!(m.contains("timed out"), "{m}"),
                other => panic!("expected an unknown outcome, got {other:?}"),
            }
        }
        let core = tonic::Status::resource_exhausted("rejected: lock l already has 8 waiters");
        assert!(matches!(a.refused(core), ClientError::Rejected(_)));
    }
}
