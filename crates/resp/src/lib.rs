//! The RESP front end of fenced (README, "Redis clients (RESP)"): unchanged Redis clients on the replicated,
//! linearizable keyspace and lock table.
//!
//! Shape (after tokio-rs/mini-redis): [`frame`] parses and encodes RESP2/RESP3, [`conn`]
//! runs one connection (pipelining, MULTI/WATCH, pub/sub, blocking pops, auth), and
//! [`serve`] accepts connections with a limit and shuts down gracefully; [`acl`] holds the
//! users (`--acl-file`, `--requirepass`) and their permissions. The cluster is
//! reached through the [`Backend`] trait, which `fenced-server` implements for its node, so
//! this crate does not depend on Raft.

pub mod acl;
mod clients;
pub mod conn;
pub mod frame;
pub mod info;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fenced_core::kv::{KvCommand, KvEvent, KvResponse, Reply};
use fenced_core::{Command, Event, Millis, RequestId, Response, StateMachine};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch, Semaphore};

pub use frame::{Limits, Proto};
pub use info::{MemberInfo, NodeInfo};

/// The Redis version fenced answers as (`HELLO`, `INFO server`): the one whose commands and
/// replies it follows.
pub const REDIS_VERSION: &str = "7.2.0";

/// Why the cluster could not answer.
#[derive(thiserror::Error, Debug, Clone)]
pub enum BackendError {
    /// No leader reachable / no quorum: certainly or possibly not applied.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// The outcome is unknown (timeout while the entry may commit).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The state machine refused the request.
    #[error("{0}")]
    Rejected(String),
    /// The node has too much work queued; nothing was done (`-BUSY`).
    #[error("busy: {0}")]
    Busy(String),
    /// This member's divergence alarm is raised: it serves nothing; use another member
    /// (`-CORRUPT`).
    #[error("corrupt: {0}")]
    Corrupt(String),
}

/// A read-only view evaluated on the state machine at a linearizable point; gets the
/// state machine and the log time to judge expiry at. It may be called more than once (at
/// two times, to learn whether its answer depends on time at all), so it must be pure.
pub type ReadFn = Box<dyn Fn(&StateMachine, Millis) -> Vec<Reply> + Send + Sync>;

/// What the RESP front end needs from the cluster. Implemented by `fenced-server` for its
/// node; every method may be called on any node (writes are forwarded to the leader).
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Replicate a keyspace command through the log. `rid` makes internal retries safe.
    async fn write(&self, rid: RequestId, cmd: KvCommand) -> Result<KvResponse, BackendError>;
    /// Evaluate `f` linearizably: after a read-index barrier, with every expiry that was due
    /// on the leader's log clock already applied.
    async fn read(&self, f: ReadFn) -> Result<Vec<Reply>, BackendError>;
    /// A lock-family command with a wait (an acquire with `WAIT ms`): proposed, and if it
    /// queued, its grant or give-up awaited (across leader changes, under `rid`) for up to
    /// `wait_ms`. The state machine's own answer, [`Response::Rejected`] included;
    /// [`Response::Pending`] if the wait's outcome could not be learnt in time.
    ///
    /// Should the call be dropped before it is answered (the connection closed), the node
    /// withdraws the wait; `own_id` says `rid` is the connection's own (no `REQID`), so a
    /// grant it already got is ended too.
    async fn lock_wait(
        &self,
        rid: RequestId,
        cmd: Command,
        wait_ms: u64,
        own_id: bool,
    ) -> Result<Response, BackendError>;
    /// Lock-family commands that do not wait (a pipeline's run of them), proposed in order,
    /// each with its own request id; one result each, the state machine's own answer.
    async fn lock_batch(
        &self,
        cmds: Vec<(RequestId, Command)>,
    ) -> Vec<Result<Response, BackendError>>;
    /// Ended grants applied on this node (`Event::LockReleased`), for the lock-loss channels.
    fn lock_events(&self) -> broadcast::Receiver<Event>;
    /// Session `id` is gone, as of a linearizable read judged at the read's time (the path of
    /// [`Backend::read`]): it was opened at or before the revision read (a session id is the
    /// revision that opened it) and is not there, or its deadline passed at the read's time.
    /// `false` if the read fails (no leader, say): nothing is reported then.
    async fn session_gone(&self, id: u64) -> bool;
    /// This node's log time (ms): the lease left after a keep-alive is its deadline minus it.
    fn log_time(&self) -> u64;
    /// Keyspace events applied on this node (pub/sub messages, list pushes).
    fn events(&self) -> broadcast::Receiver<KvEvent>;
    /// What `INFO` shows of the node: its Raft view, the keyspace's size (from the local
    /// applied state, without a read barrier, so `INFO` answers without a quorum) and the
    /// process's memory and CPU.
    fn info(&self) -> NodeInfo;
    /// A fresh random client id (nonzero) for a new connection's request ids: the node draws
    /// it from its own source of randomness, which a simulator seeds.
    fn client_id(&self) -> u64;
}

/// RESP server settings.
#[derive(Clone)]
pub struct Config {
    pub addr: String,
    /// Users and their permissions: [`acl::Acl::load`] for `--acl-file`, or
    /// [`acl::Acl::new`] (the `default` user, with `--requirepass`'s password if any).
    pub acl: Arc<acl::Acl>,
    pub max_connections: usize,
    /// Close connections idle for this long (0: never, like Redis's default). Subscribed
    /// connections and blocked pops do not count as idle.
    pub idle_timeout: Duration,
    /// Bounds on one request. `limits.max_request` (64 MiB by default) is also the
    /// per-connection cap on unparsed input (Redis's `client-query-buffer-limit`): a
    /// connection reads more only once its buffer holds no whole request, and a partial
    /// request past it closes the connection. `limits.before_auth` is set per connection.
    pub limits: Limits,
    /// The node-wide cap on unparsed input, all connections together (bytes; 0: none;
    /// `--resp-query-buffer-total`): a read that takes the total past it closes its
    /// connection, unless that connection's own unparsed input is small (16 KiB), so the
    /// total stays under the cap plus 16 KiB per connection.
    pub max_query_buffer_total: usize,
    /// Serve TLS only (the node's `--tls-cert`); the handshake must finish within
    /// [`TLS_HANDSHAKE_TIMEOUT`].
    pub tls: Option<fenced_tls::TlsAcceptor>,
    /// Told every command served, with its result and latency ([`CommandObserver`]).
    pub observer: Option<Arc<dyn CommandObserver>>,
}

/// Receives one call per command served (the server implements it with Prometheus counters
/// and histograms; this crate knows no metrics library). Called on the connection's task:
/// keep it cheap and non-blocking.
pub trait CommandObserver: Send + Sync + 'static {
    /// `command`: the command table's name (upper case, so the set of values is bounded),
    /// or `"unknown"` for a name not in the table; `ok`: the reply is not an error (a
    /// refusal — `NOAUTH`, `NOPERM`, wrong arity — is an error of that command); `took`: from
    /// when the connection began serving it to its reply. A pipeline's run of reads or writes
    /// is served together (one barrier, one log entry), so each of its commands counts the
    /// run's time.
    fn command(&self, command: &'static str, ok: bool, took: Duration);

    /// A connection was closed for its unparsed input: `reason` is `unauthenticated` (over
    /// the limits before authentication), `query_buffer` (a request over
    /// [`Limits::max_request`]) or `query_buffer_total` (the node-wide
    /// [`Config::max_query_buffer_total`]).
    fn input_refused(&self, reason: &'static str) {
        let _ = reason;
    }
}

/// Default [`Config::max_query_buffer_total`]: 256 MiB.
pub const DEFAULT_MAX_QUERY_BUFFER_TOTAL: usize = 256 * 1024 * 1024;

/// The name [`CommandObserver::command`] gets for `argv`: its row's name in the command
/// table, else `"unknown"`.
pub fn command_label(argv: &fenced_core::kv::Argv) -> &'static str {
    argv.first()
        .and_then(|name| fenced_core::kv::lookup(name))
        .map_or("unknown", |c| c.name)
}

/// Longest a client may take to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Config {
    pub fn new(addr: impl Into<String>) -> Self {
        Config {
            addr: addr.into(),
            acl: Arc::new(acl::Acl::default()),
            max_connections: 10_000,
            idle_timeout: Duration::ZERO,
            limits: Limits::default(),
            max_query_buffer_total: DEFAULT_MAX_QUERY_BUFFER_TOTAL,
            tls: None,
            observer: None,
        }
    }
}

#[derive(thiserror::Error, Debug)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// Local subscriptions, for `PUBLISH`'s receiver count (the count on the node that took the
/// `PUBLISH`, like Redis Cluster).
#[derive(Default)]
pub(crate) struct Subscriptions {
    channels: Mutex<BTreeMap<Vec<u8>, usize>>,
    patterns: Mutex<BTreeMap<Vec<u8>, usize>>,
}

impl Subscriptions {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn add(&self, pattern: bool, name: &[u8]) {
        let m = if pattern {
            &self.patterns
        } else {
            &self.channels
        };
        *Self::lock(m).entry(name.to_vec()).or_default() += 1;
    }
    pub(crate) fn remove(&self, pattern: bool, name: &[u8]) {
        let m = if pattern {
            &self.patterns
        } else {
            &self.channels
        };
        let mut g = Self::lock(m);
        if let Some(n) = g.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                g.remove(name);
            }
        }
    }
    /// Distinct channels and patterns subscribed to on this node (`INFO stats`).
    pub(crate) fn counts(&self) -> (usize, usize) {
        (
            Self::lock(&self.channels).len(),
            Self::lock(&self.patterns).len(),
        )
    }
    pub(crate) fn receivers(&self, channel: &[u8]) -> i64 {
        let direct = Self::lock(&self.channels)
            .get(channel)
            .copied()
            .unwrap_or(0);
        let by_pattern: usize = Self::lock(&self.patterns)
            .iter()
            .filter(|(p, _)| fenced_core::kv::glob_match(p, channel))
            .map(|(_, n)| *n)
            .sum();
        (direct + by_pattern) as i64
    }
}

pub(crate) struct Shared {
    pub backend: Arc<dyn Backend>,
    pub config: Config,
    pub subs: Subscriptions,
    pub next_id: std::sync::atomic::AtomicU64,
    pub live: std::sync::atomic::AtomicUsize,
    /// Unparsed input held by every connection, bytes (each adds its read buffer's length).
    pub buffered: std::sync::atomic::AtomicUsize,
    pub shutdown: watch::Receiver<bool>,
    /// `INFO`'s counters.
    pub stats: clients::Stats,
    /// Every connection (`CLIENT LIST`, `CLIENT KILL`).
    pub clients: clients::Registry,
    /// `INFO server`'s `run_id`: 40 random hex digits, new at every start.
    pub run_id: String,
    /// The port clients connect to (`INFO server`'s `tcp_port`; 0 if not a TCP port).
    pub port: u16,
}

/// Bind `config.addr`; then [`serve`] on the listener. Separate so that a bind failure is
/// reported before the node claims to be up.
pub async fn bind(config: &Config) -> Result<TcpListener, ServeError> {
    TcpListener::bind(&config.addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.addr.clone(),
            source,
        })
}

/// One node's RESP front end without its listener: what its connections share (the
/// backend, the settings, the local subscriptions, the connection ids), and how one
/// connection is served over any byte stream. [`serve`] runs its accepted sockets through
/// it; a simulator or a test runs a connection over an in-memory stream
/// (`tokio::io::duplex`) the same way.
#[derive(Clone)]
pub struct Front {
    shared: Arc<Shared>,
}

impl Front {
    /// Connections stop (after their current requests) once `shutdown` turns true or its
    /// sender is dropped.
    pub fn new(backend: Arc<dyn Backend>, config: Config, shutdown: watch::Receiver<bool>) -> Self {
        // Not from the backend's random source: a simulator seeds that one, and a draw here
        // would shift every later one.
        let run_id: String = (0..3u8)
            .map(|i| {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u8(i);
                h.write_u32(std::process::id());
                format!("{:016x}", h.finish())
            })
            .collect::<String>()[..40]
            .to_string();
        let port = config
            .addr
            .parse::<SocketAddr>()
            .map_or(0, |a: SocketAddr| a.port());
        Front {
            shared: Arc::new(Shared {
                backend,
                config,
                subs: Subscriptions::default(),
                next_id: std::sync::atomic::AtomicU64::new(1),
                live: std::sync::atomic::AtomicUsize::new(0),
                buffered: std::sync::atomic::AtomicUsize::new(0),
                shutdown,
                stats: clients::Stats::new(),
                clients: clients::Registry::default(),
                run_id,
                port,
            }),
        }
    }

    /// Serve one connection over `stream` until the client leaves, a protocol error, the
    /// idle timeout or shutdown. `peer` and `local` are what `CLIENT LIST`/`INFO` show.
    pub async fn connection<S>(&self, stream: S, peer: SocketAddr, local: Option<SocketAddr>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_stream(Box::new(stream), peer, local).await
    }

    async fn serve_stream(
        &self,
        stream: Box<dyn conn::Stream>,
        peer: SocketAddr,
        local: Option<SocketAddr>,
    ) {
        conn::Connection::new(self.shared.clone(), stream, peer, local)
            .run()
            .await;
    }
}

/// Accept connections until `shutdown` turns true, then stop accepting, let every
/// connection finish the requests it is running, and return.
pub async fn serve(
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    config: Config,
    shutdown: watch::Receiver<bool>,
) {
    let limit = Arc::new(Semaphore::new(config.max_connections));
    let front = Front::new(backend, config, shutdown.clone());
    let mut stop = shutdown;
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (socket, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!("RESP accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let local = socket.local_addr().ok();
        match limit.clone().try_acquire_owned() {
            Ok(permit) => {
                let front = front.clone();
                conns.spawn(async move {
                    let stream: Box<dyn conn::Stream> = match &front.shared.config.tls {
                        None => Box::new(socket),
                        Some(acceptor) => {
                            match tokio::time::timeout(
                                TLS_HANDSHAKE_TIMEOUT,
                                acceptor.accept(socket),
                            )
                            .await
                            {
                                Ok(Ok(tls)) => Box::new(tls),
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, "RESP TLS handshake: {e}");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "RESP TLS handshake timed out");
                                    return;
                                }
                            }
                        }
                    };
                    front.serve_stream(stream, peer, local).await;
                    drop(permit);
                });
            }
            Err(_) => {
                front
                    .shared
                    .stats
                    .rejected_connections
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                conns.spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let mut socket = socket;
                    let _ = socket
                        .write_all(b"-ERR max number of clients reached\r\n")
                        .await;
                });
            }
        }
    }
    drop(listener);
    // Connections see the same shutdown signal and close after their current requests.
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        conns.abort_all();
    }
}
