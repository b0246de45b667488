//! `fenced`: run a node (`serve`), run a command under a lock (`lock`), show the cluster
//! (`status`). Flags and ports: `fenced serve --help` and the README.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use fenced_client::{Client, ClientOptions};
use fenced_resp::acl::Acl;
use fenced_server::config::{parse_cluster, ClusterState, DEFAULT_CLUSTER_TOKEN};
use fenced_server::membership::{join_decision, JoinAnswer, JoinError};
use fenced_server::NodeConfig;

mod cli;

use cli::alarm::{alarm, AlarmArgs};
use cli::debug::{debug, DebugArgs};
use cli::etcd::EtcdServeArgs;
use cli::limits::LimitArgs;
use cli::lock::{lock, LockArgs};
use cli::signals::{watch_signals, Signal};
use cli::snapshot::{snapshot, SnapshotArgs};

#[derive(Parser)]
#[command(name = "fenced", version, about = "A lock service with fencing tokens")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a node. With no flags: a single-node cluster in ./fenced-data.
    Serve(Box<ServeArgs>),
    /// Run CMD while holding lock NAME, with FENCED_TOKEN and FENCED_LOCK in its environment.
    Lock(LockArgs),
    /// Print the cluster's status as one JSON object (the leader's view when it is among the
    /// endpoints: learners with their lag).
    Status(StatusArgs),
    /// List, add, promote or remove members (on the leader; one change at a time).
    Member(MemberArgs),
    /// Leadership: `fenced leader step-down` hands it from the leader to a caught-up voter
    /// (planned maintenance; SIGTERM on the leader does the same before it exits).
    Leader(LeaderArgs),
    /// Back up the cluster's state to a file, check a backup, or restore one into the data
    /// dir of a member of a new cluster.
    Snapshot(SnapshotArgs),
    /// Offline tools for a stopped member's data dir (`fenced debug digest`).
    Debug(DebugArgs),
    /// The cluster-wide CORRUPT alarm and the members' divergence alarms: `fenced alarm
    /// list`, `fenced alarm disarm`.
    Alarm(AlarmArgs),
}

#[derive(Args)]
struct LeaderArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    op: LeaderOp,
}

#[derive(Subcommand)]
enum LeaderOp {
    /// Hand leadership to the caught-up voter furthest ahead; prints the old and new leader
    /// and how long it took, as JSON.
    StepDown,
}

#[derive(Args)]
struct MemberArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    op: MemberOp,
}

#[derive(Subcommand)]
enum MemberOp {
    /// Print the members as JSON (id, addr, voter, and on the leader how far each has caught up).
    List,
    /// Add member ID serving its gRPC at ADDR. It starts as a learner that receives the log;
    /// without --learner it is promoted to voter once it has caught up (start it with
    /// `fenced serve --id ID --grpc-addr ADDR --join ENDPOINTS` meanwhile).
    Add {
        id: u64,
        addr: String,
        /// Stay a learner (promote later with `fenced member promote`).
        #[arg(long)]
        learner: bool,
        /// How long to wait for the new member to catch up before promoting it (ms).
        #[arg(long, default_value_t = 60_000)]
        wait_ms: u64,
    },
    /// Make learner ID a voter (refused until it has caught up).
    Promote { id: u64 },
    /// Remove member ID (refused if that would leave the voters without a quorum). Its id is
    /// never used again.
    Remove { id: u64 },
}

#[derive(Args)]
struct ServeArgs {
    /// Read flags from this TOML file: every flag below as a key without its dashes
    /// (`data-dir = "/var/lib/fenced"`, `heartbeat-ms = 50`); flags given here win. See
    /// packaging/fenced.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    /// This node's id (≥ 1).
    #[arg(long, default_value_t = 1)]
    id: u64,
    #[arg(long, default_value = "./fenced-data")]
    data_dir: PathBuf,
    /// RESP (Redis protocol) listen address.
    #[arg(long, default_value = "127.0.0.1:7379")]
    resp_addr: String,
    /// Require this password from every client: RESP's `AUTH`, and gRPC's
    /// `Auth.Authenticate` (user `default`); also read from FENCED_REQUIREPASS.
    #[arg(long, env = "FENCED_REQUIREPASS", hide_env_values = true)]
    requirepass: Option<String>,
    /// Users, permissions and passwords of every port (RESP and the gRPC client API) in
    /// Redis's aclfile format (`user NAME RULES…` per line), read once at startup. Without
    /// it, only the `default` user.
    #[arg(long)]
    acl_file: Option<PathBuf>,
    /// How long a gRPC token from `Auth.Authenticate` stays valid (ms). Tokens live in the
    /// memory of the node that issued them.
    #[arg(long, default_value_t = fenced_server::users::DEFAULT_TOKEN_TTL.as_millis() as u64)]
    auth_token_ttl_ms: u64,
    #[command(flatten)]
    tls: ServeTlsArgs,
    /// gRPC listen address: client API and node-to-node Raft.
    #[arg(long, default_value = "127.0.0.1:7380")]
    grpc_addr: String,
    /// Every member's gRPC address, `1=HOST:PORT,2=HOST:PORT,...`; used to bootstrap an empty
    /// data dir. Without it: a single-node cluster of this node.
    #[arg(long, value_parser = parse_cluster)]
    initial_cluster: Option<std::collections::BTreeMap<u64, String>>,
    /// `new`: an empty data dir bootstraps a new cluster from --initial-cluster (give it to
    /// every member's first start). `existing`: an empty data dir is refused — a member that
    /// lost its disk must never bootstrap and vote again. Default: `new` for a single-node
    /// cluster of this node, `existing` as soon as --initial-cluster names peers. A data dir
    /// that holds state ignores it.
    #[arg(long, value_parser = clap::value_parser!(ClusterState))]
    initial_cluster_state: Option<ClusterState>,
    /// Part of the cluster id of a new cluster: give clusters with the same member list
    /// different tokens.
    #[arg(long, default_value = DEFAULT_CLUSTER_TOKEN)]
    initial_cluster_token: String,
    /// Build a snapshot (and purge the log before it) after N entries, once the log on disk
    /// is also at least as large as the last snapshot.
    #[arg(long, default_value_t = 5_000, hide = true)]
    snapshot_logs: u64,
    /// Entries kept before the last snapshot when purging.
    #[arg(long, default_value_t = 1_000, hide = true)]
    keep_logs: u64,
    /// Divergence alarm: every N log indexes each member digests its state and the leader
    /// compares the digests; a member unlike the majority is fenced out (docs/operations.md,
    /// "Divergence alarm"). 0 turns it off.
    #[arg(long, default_value_t = fenced_server::config::DEFAULT_DIGEST_INTERVAL)]
    digest_interval: u64,
    #[command(flatten)]
    etcd: EtcdServeArgs,
    /// TEST ONLY (needs FENCED_UNSAFE_TEST_HOOKS=1): make this member's state diverge at
    /// this log index.
    #[arg(long, hide = true)]
    unsafe_test_diverge_at_index: Option<u64>,
    /// TEST ONLY (needs FENCED_UNSAFE_TEST_HOOKS=1): advertise these apply rules.
    #[arg(long, hide = true)]
    unsafe_test_advertise_semantics: Option<u8>,
    /// TEST ONLY (needs FENCED_UNSAFE_TEST_HOOKS=1): the leader proposes no expiry ticks.
    #[arg(long, hide = true)]
    unsafe_test_hold_ticks: bool,
    /// TEST ONLY (needs FENCED_UNSAFE_TEST_HOOKS=1): advertise this Lua build fingerprint.
    #[arg(long, hide = true)]
    unsafe_test_advertise_lua_build: Option<u64>,
    /// How often the leader sends heartbeats (ms).
    #[arg(long, default_value_t = fenced_server::config::DEFAULT_HEARTBEAT_MS)]
    heartbeat_ms: u64,
    /// A follower that hears no leader for a random time in MIN..MAX ms (after the old
    /// leader's lease of MAX ms) starts an election. Shorter: faster failover; too short for
    /// the network or the machine's load: needless elections. See the README, "Failover".
    #[arg(long, default_value_t = fenced_server::config::DEFAULT_ELECTION_TIMEOUT)]
    election_timeout_ms: fenced_server::config::ElectionTimeout,
    /// Serve Prometheus metrics (`/metrics`) and health checks (`/health`: the node runs;
    /// `/ready`: it has a leader and has caught up with it) over HTTP on this address.
    /// Default: off.
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Worker threads of the node's runtime (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Join a running cluster through these gRPC endpoints, as the learner that `fenced
    /// member add ID ADDR` announced: an empty data dir takes the cluster's id and receives
    /// the log from the leader (no bootstrap). Ignored once the data dir holds state, unless
    /// the cluster still lists this member as a learner.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["initial_cluster", "initial_cluster_state"])]
    join: Option<Vec<String>>,
    #[command(flatten)]
    join_tls: JoinTlsArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// Recovery after a lost quorum: make this member's data dir (all of its log, committed
    /// or not) a new cluster of this member alone, revision bumped by --bump-revision and
    /// every lock dropped; the old data dir is kept beside it. Other members never rejoin:
    /// add new ones with `fenced member add`. Remove the flag afterwards (a restart that
    /// keeps it changes nothing).
    #[arg(long, conflicts_with = "join")]
    force_new_cluster: bool,
    /// With --force-new-cluster: how far the revision jumps (see `fenced snapshot restore`).
    #[arg(long, default_value_t = fenced_server::backup::DEFAULT_BUMP_REVISION)]
    bump_revision: u64,
    /// Log lines on stderr: `text` for people (coloured only on a terminal, and not with
    /// NO_COLOR set), `json` for one JSON object per line. The filter is FENCED_LOG (default
    /// `info,openraft=warn,sled=warn`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// How `--join` reaches the cluster over TLS (defaults: the node's own --tls-ca, and no client
/// certificate).
#[derive(Args)]
struct JoinTlsArgs {
    /// Present this client certificate to the cluster when joining (PEM).
    #[arg(long, requires = "join_tls_key")]
    join_tls_cert: Option<PathBuf>,
    #[arg(long, requires = "join_tls_cert")]
    join_tls_key: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// TLS for a node: with these, gRPC and RESP accept TLS only, and calls between nodes use
/// TLS with client certificates (the node-to-node services refuse callers without one).
#[derive(Args)]
struct ServeTlsArgs {
    /// This node's certificate chain (PEM). Its subject-alt-names must cover the addresses
    /// clients and peers dial (IP or DNS).
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) that signed every node's certificate (and client certificates, unless
    /// --tls-client-ca).
    #[arg(long, requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// The CA (PEM) of API and RESP client certificates, when not --tls-ca: then no client
    /// certificate can pass for a node's at the node-to-node services.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Also refuse API and RESP clients that present no CA-signed certificate.
    #[arg(long, requires = "tls_cert")]
    tls_require_client_cert: bool,
}

/// Who the `lock`/`status`/`member` clients log in as, on clusters with users
/// (`--acl-file`/`--requirepass`).
#[derive(Args)]
struct ClientAuthArgs {
    /// Log in as this user (default: `default` when a password is given).
    #[arg(long, global = true)]
    user: Option<String>,
    /// The user's password; also read from FENCED_PASSWORD.
    #[arg(long, env = "FENCED_PASSWORD", hide_env_values = true, global = true)]
    password: Option<String>,
}

impl ClientAuthArgs {
    fn credentials(&self) -> Option<fenced_client::Credentials> {
        match (&self.user, &self.password) {
            (None, None) => None,
            (user, password) => Some(fenced_client::Credentials::new(
                user.as_deref().unwrap_or("default"),
                password.as_deref().unwrap_or(""),
            )),
        }
    }
}

/// How a client subcommand reaches the cluster: endpoints, TLS, user.
#[derive(Args)]
struct ConnArgs {
    /// gRPC endpoints of any members (comma-separated).
    #[arg(
        long,
        default_value = "127.0.0.1:7380",
        value_delimiter = ',',
        global = true
    )]
    endpoints: Vec<String>,
    #[command(flatten)]
    tls: ClientTlsArgs,
    #[command(flatten)]
    auth: ClientAuthArgs,
}

impl ConnArgs {
    /// A client with these settings and `options`' others.
    fn client_with(&self, options: ClientOptions) -> anyhow::Result<Client> {
        Ok(Client::connect_with(
            &self.endpoints,
            ClientOptions {
                tls: self.tls.load()?,
                credentials: self.auth.credentials(),
                ..options
            },
        )?)
    }

    fn client(&self) -> anyhow::Result<Client> {
        self.client_with(ClientOptions::default())
    }
}

/// TLS for the client subcommands.
#[derive(Args)]
struct ClientTlsArgs {
    /// Connect over TLS, trusting this CA (PEM).
    #[arg(long, global = true)]
    tls_ca: Option<PathBuf>,
    /// Present this client certificate (PEM), for clusters that require one.
    #[arg(long, requires_all = ["tls_ca", "tls_key"], global = true)]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", global = true)]
    tls_key: Option<PathBuf>,
    /// Verify the servers' certificates for this name instead of the endpoint's host.
    #[arg(long, requires = "tls_ca", global = true)]
    tls_server_name: Option<String>,
}

impl ClientTlsArgs {
    fn load(&self) -> anyhow::Result<Option<fenced_client::ClientTls>> {
        let Some(ca) = &self.tls_ca else {
            return Ok(None);
        };
        let mut tls = fenced_client::ClientTls::load(ca)?;
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            tls = tls.with_identity(cert, key)?;
        }
        if let Some(name) = &self.tls_server_name {
            tls = tls.with_server_name(name.clone());
        }
        Ok(Some(tls))
    }
}

#[derive(Args)]
struct StatusArgs {
    #[command(flatten)]
    conn: ConnArgs,
}

/// mimalloc instead of glibc's malloc: under 64 clients, malloc/free were ~8 % of all CPU
/// samples (docs/performance.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Log to stderr, filtered by FENCED_LOG. Text is coloured only when stderr is a terminal
/// and NO_COLOR is unset (https://no-color.org), so a redirected log holds no escape codes.
fn init_logs(format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCED_LOG")
                .unwrap_or_else(|_| "info,openraft=warn,sled=warn".into()),
        )
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            logs.with_ansi(std::io::stderr().is_terminal() && !no_color)
                .init()
        }
        LogFormat::Json => logs.with_ansi(false).json().init(),
    }
}

fn main() -> ExitCode {
    let args =
        match fenced_server::config_file::merge(std::env::args_os().collect(), Cli::command()) {
            Ok(args) => args,
            Err(e) => {
                eprintln!("fenced: {e}");
                return ExitCode::from(2);
            }
        };
    let cli = Cli::parse_from(args);
    init_logs(match &cli.command {
        Cmd::Serve(a) => a.log_format,
        _ => LogFormat::Text,
    });
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Cmd::Serve(a) = &cli.command {
        if let Some(n) = a.threads {
            builder.worker_threads(n.max(1));
        }
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fenced: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cli.command {
            Cmd::Serve(a) => serve(*a).await.map(|()| ExitCode::SUCCESS),
            Cmd::Lock(a) => lock(a).await,
            Cmd::Status(a) => status(a).await.map(|()| ExitCode::SUCCESS),
            Cmd::Member(a) => member(a).await.map(|()| ExitCode::SUCCESS),
            Cmd::Snapshot(a) => snapshot(a.op).await.map(|()| ExitCode::SUCCESS),
            Cmd::Leader(a) => leader(a).await.map(|()| ExitCode::SUCCESS),
            Cmd::Debug(a) => debug(a.op).await.map(|()| ExitCode::SUCCESS),
            Cmd::Alarm(a) => alarm(a).await.map(|()| ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fenced: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    if a.id == 0 {
        bail!("--id must be at least 1");
    }
    let mut cfg = NodeConfig::new(a.id, a.data_dir, a.grpc_addr, a.resp_addr);
    cfg.config_file = a.config.clone();
    cfg.initial_cluster = a.initial_cluster.unwrap_or_default();
    cfg.initial_cluster_state = a.initial_cluster_state;
    cfg.initial_cluster_token = a.initial_cluster_token;
    cfg.snapshot_logs = a.snapshot_logs;
    cfg.metrics_addr = a.metrics_addr.clone();
    cfg.keep_logs = a.keep_logs;
    cfg.force_new_cluster = a.force_new_cluster;
    a.limits.apply(&mut cfg)?;
    cfg.bump_revision = a.bump_revision;
    cfg.digest_interval = a.digest_interval;
    a.etcd.apply(&mut cfg)?;
    let hooks = fenced_server::config::TestHooks {
        diverge_at: a.unsafe_test_diverge_at_index,
        advertise_semantics: a.unsafe_test_advertise_semantics,
        advertise_lua_build: a.unsafe_test_advertise_lua_build,
        forward_max_items: None,
        hold_ticks: a.unsafe_test_hold_ticks,
    };
    if hooks.diverge_at.is_some()
        || hooks.advertise_semantics.is_some()
        || hooks.advertise_lua_build.is_some()
        || hooks.hold_ticks
    {
        let env = fenced_server::config::TEST_HOOKS_ENV;
        if std::env::var(env).as_deref() != Ok("1") {
            bail!("the --unsafe-test-* flags are for tests only; they need {env}=1");
        }
        cfg.test_hooks = hooks;
    }
    if a.heartbeat_ms == 0 || a.heartbeat_ms * 2 >= a.election_timeout_ms.min_ms {
        bail!(
            "--heartbeat-ms {} must be more than 0 and less than half of the election \
             timeout's minimum ({} ms)",
            a.heartbeat_ms,
            a.election_timeout_ms.min_ms
        );
    }
    cfg.heartbeat_ms = a.heartbeat_ms;
    cfg.election_timeout = a.election_timeout_ms;
    // A bad ACL file stops the node before it starts anything.
    let pass = a.requirepass.as_deref();
    cfg.acl = Arc::new(match &a.acl_file {
        None => Acl::new(pass),
        Some(path) => Acl::load(path, pass)?,
    });
    if a.auth_token_ttl_ms == 0 {
        bail!("--auth-token-ttl-ms must be at least 1");
    }
    cfg.auth_token_ttl = Duration::from_millis(a.auth_token_ttl_ms);
    if let (Some(cert), Some(key), Some(ca)) = (&a.tls.tls_cert, &a.tls.tls_key, &a.tls.tls_ca) {
        let mut tls = fenced_tls::ServerTls::load(cert, key, ca)?
            .require_client_cert(a.tls.tls_require_client_cert);
        if let Some(client_ca) = &a.tls.tls_client_ca {
            tls = tls.with_client_ca(client_ca)?;
        }
        cfg.tls = Some(tls);
    }
    if let Some(endpoints) = &a.join {
        cfg.joining = true;
        cfg.join = join_lookup(&cfg, endpoints, &a.tls, &a.join_tls).await?;
    }
    // Before the node starts: its log's replay can hang (a poisoned entry).
    let mut signals = watch_signals()?;
    let running = fenced_server::start(cfg.clone())
        .await
        .context("starting the node")?;
    tracing::info!(
        id = cfg.id,
        grpc = %cfg.grpc_addr,
        data_dir = %cfg.data_dir.display(),
        "fenced node serving"
    );
    let node = running.node.clone();
    tokio::select! {
        signal = &mut signals => match signal {
            Ok(Signal::Term) => {
                tracing::info!("SIGTERM: shutting down");
                // A leader hands off first, so that clients wait a lease instead of an
                // election.
                let voters = node.raft().metrics().borrow().membership_config.membership().voter_ids().count();
                if voters > 1 && node.check_leader().is_ok() {
                    if let Err(e) = node.step_down().await {
                        tracing::warn!("no hand-off before stopping: {e}");
                    }
                }
            }
            Ok(Signal::Interrupt) => tracing::info!("interrupt: shutting down"),
            Err(_) => bail!("the signal thread stopped"),
        },
        e = node.fatal() => {
            // E.g. a failed disk write: stop loudly rather than acknowledge anything more.
            tracing::error!("fatal: {e}; stopping");
            running.shutdown().await;
            bail!("raft stopped on a fatal error: {e}");
        }
    }
    running.shutdown().await;
    Ok(())
}

async fn leader(a: LeaderArgs) -> anyhow::Result<()> {
    let client = a.conn.client()?;
    match a.op {
        LeaderOp::StepDown => {
            let r = client.leader_step_down().await?;
            println!(
                "{}",
                serde_json::json!({"from": r.from, "to": r.to, "took_ms": r.took_ms})
            );
        }
    }
    Ok(())
}

/// `--join`: ask the running cluster whether it lists this member (as a learner at this
/// address) and for its id. `None` when the data dir holds state and the cluster cannot say
/// (the node then starts from its data dir as usual).
async fn join_lookup(
    cfg: &NodeConfig,
    endpoints: &[String],
    tls: &ServeTlsArgs,
    join_tls: &JoinTlsArgs,
) -> anyhow::Result<Option<u64>> {
    let fresh = fenced_storage::datadir::holds_nothing_on(&fenced_fs::OsFs, &cfg.data_dir);
    let client_tls = match &tls.tls_ca {
        None => None,
        Some(ca) => {
            let mut t = fenced_client::ClientTls::load(ca)?;
            if let (Some(cert), Some(key)) = (&join_tls.join_tls_cert, &join_tls.join_tls_key) {
                t = t.with_identity(cert, key)?;
            }
            Some(t)
        }
    };
    let client = Client::connect_with(
        endpoints,
        ClientOptions {
            tls: client_tls,
            ..ClientOptions::default()
        },
    )?;
    let answers: Vec<_> = client.status_all().await.into_iter().flatten().collect();
    let answer = answers
        .iter()
        .find(|s| s.state == "leader")
        .or_else(|| answers.first())
        .map(|s| JoinAnswer {
            leader: s.state == "leader",
            cluster_id: s.cluster_id,
            members: s
                .members
                .iter()
                .map(|m| (m.id, m.addr.clone(), m.voter))
                .collect(),
        });
    let decision = join_decision(cfg.id, &cfg.grpc_addr, fresh, answer.as_ref());
    match (&decision, &answer) {
        (Err(e @ (JoinError::NoAnswer | JoinError::NotAdded { .. })), _) => {
            bail!("{e} (asked: {})", endpoints.join(","))
        }
        (Ok(None), None) => {
            tracing::warn!("--join: the cluster did not answer; starting from the data dir")
        }
        _ => {}
    }
    Ok(decision?)
}

async fn member(a: MemberArgs) -> anyhow::Result<()> {
    let client = a.conn.client()?;
    let tls = a.conn.tls.tls_ca.is_some();
    let members = match a.op {
        MemberOp::List => leader_status(&client, tls).await?.members,
        MemberOp::Add {
            id,
            addr,
            learner,
            wait_ms,
        } => client
            .member_add(id, &addr, learner, Duration::from_millis(wait_ms))
            .await
            .map_err(|e| tls_hint(e, tls))?,
        MemberOp::Promote { id } => client
            .member_promote(id)
            .await
            .map_err(|e| tls_hint(e, tls))?,
        MemberOp::Remove { id } => client
            .member_remove(id)
            .await
            .map_err(|e| tls_hint(e, tls))?,
    };
    println!("{}", serde_json::Value::Array(members_json(&members, None)));
    Ok(())
}

/// The leader's status if the leader is among the endpoints, else the first answer.
async fn leader_status(client: &Client, tls: bool) -> anyhow::Result<fenced_client::Status> {
    let answers = client.status_all().await;
    let mut first_err = None;
    let mut first_ok = None;
    for a in answers {
        match a {
            Ok(s) if s.state == "leader" => return Ok(s),
            Ok(s) => first_ok = first_ok.or(Some(s)),
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    match (first_ok, first_err) {
        (Some(s), _) => Ok(s),
        (None, Some(e)) => Err(tls_hint(e, tls)),
        (None, None) => bail!("no endpoints given"),
    }
}

/// Members as JSON; with the leader's last log index, each one's lag behind it.
fn members_json(
    members: &[fenced_proto::v1::Member],
    leader_last: Option<u64>,
) -> Vec<serde_json::Value> {
    members
        .iter()
        .map(|m| {
            let mut v = serde_json::json!({
                "id": m.id,
                "addr": m.addr,
                "voter": m.voter,
                "role": if m.voter { "voter" } else { "learner" },
            });
            if m.matched_index > 0 {
                v["matched_index"] = m.matched_index.into();
                if let Some(last) = leader_last {
                    v["lag"] = last.saturating_sub(m.matched_index).into();
                }
            }
            v
        })
        .collect()
}

/// A plaintext client meeting a TLS port (or the reverse) fails deep inside HTTP/2 or TLS;
/// say what to check.
fn tls_hint(e: fenced_client::ClientError, tls: bool) -> anyhow::Error {
    let msg = e.to_string();
    if !tls && msg.contains("h2 protocol error") {
        anyhow::anyhow!("{msg} (does the cluster use TLS? then pass --tls-ca)")
    } else if tls && msg.contains("InvalidContentType") {
        anyhow::anyhow!("{msg} (the endpoint does not speak TLS: drop --tls-ca)")
    } else {
        e.into()
    }
}

async fn status(a: StatusArgs) -> anyhow::Result<()> {
    let client = a.conn.client()?;
    let s = leader_status(&client, a.conn.tls.tls_ca.is_some()).await?;
    let leader_last = (s.state == "leader").then_some(s.last_log_index);
    let members = members_json(&s.members, leader_last);
    let out = serde_json::json!({
        "leader": (s.leader != 0).then_some(s.leader),
        "term": s.term,
        "commit_index": s.commit_index,
        "members": members,
        "id": s.id,
        "state": s.state,
        "last_applied": s.last_applied,
        "snapshot_index": s.snapshot_index,
        "purged_index": s.purged_index,
        "revision": s.revision,
        "cluster_id": fenced_raft_types::identity::fmt_cluster_id(s.cluster_id),
        "last_log_index": s.last_log_index,
        "alarm": (!s.alarm.is_empty()).then_some(&s.alarm),
        "cluster_alarm": s.cluster_alarm.as_ref().map(|a| serde_json::json!({
            "alarm": "CORRUPT",
            "index": a.index,
            "raised_by": a.raised_by,
            "detail": a.detail,
        })),
        "alarmed_members": &s.alarmed_members,
        "semantics": s.semantics,
        "lua_build": format!("{:016x}", s.lua_build),
        "lua_build_differs": &s.lua_build_differs,
    });
    println!("{out}");
    Ok(())
}
