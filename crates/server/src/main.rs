//! `fenced`: run a node (`serve`), run a command under a lock (`lock`), show the cluster
//! (`status`). Flags and ports: `fenced serve --help` and the README.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use fenced_client::{Client, ClientOptions, LockOptions};
use fenced_resp::acl::Acl;
use fenced_server::config::{parse_cluster, ClusterState, DEFAULT_CLUSTER_TOKEN};
use fenced_server::NodeConfig;

/// Exit status of `fenced lock` when the lock was not acquired in time (EX_TEMPFAIL).
const EXIT_NOT_ACQUIRED: u8 = 75;

#[derive(Parser)]
#[command(name = "fenced", version, about = "A lock service with fencing tokens")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a node. With no flags: a single-node cluster in ./fenced-data.
    Serve(ServeArgs),
    /// Run CMD while holding lock NAME, with FENCED_TOKEN and FENCED_LOCK in its environment.
    Lock(LockArgs),
    /// Print the cluster's status as one JSON object.
    Status(StatusArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// This node's id (≥ 1).
    #[arg(long, default_value_t = 1)]
    id: u64,
    #[arg(long, default_value = "./fenced-data")]
    data_dir: PathBuf,
    /// RESP (Redis protocol) listen address.
    #[arg(long, default_value = "127.0.0.1:7379")]
    resp_addr: String,
    /// Require this password from RESP clients (`AUTH`); also read from FENCED_REQUIREPASS.
    #[arg(long, env = "FENCED_REQUIREPASS", hide_env_values = true)]
    requirepass: Option<String>,
    /// RESP users, permissions and passwords in Redis's aclfile format (`user NAME RULES…`
    /// per line), read once at startup. Without it, only the `default` user.
    #[arg(long)]
    acl_file: Option<PathBuf>,
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
    /// How often the leader sends heartbeats (ms).
    #[arg(long, default_value_t = fenced_server::config::DEFAULT_HEARTBEAT_MS)]
    heartbeat_ms: u64,
    /// A follower that hears no leader for a random time in MIN..MAX ms (after the old
    /// leader's lease of MAX ms) starts an election. Shorter: faster failover; too short for
    /// the network or the machine's load: needless elections. See the README, "Failover".
    #[arg(long, default_value_t = fenced_server::config::DEFAULT_ELECTION_TIMEOUT)]
    election_timeout_ms: fenced_server::config::ElectionTimeout,
    /// Worker threads of the node's runtime (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Log lines on stderr: `text` for people (coloured only on a terminal, and not with
    /// NO_COLOR set), `json` for one JSON object per line. The filter is FENCED_LOG (default
    /// `info,openraft=warn,sled=warn`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
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

/// TLS for the `lock`/`status` clients.
#[derive(Args)]
struct ClientTlsArgs {
    /// Connect over TLS, trusting this CA (PEM).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Present this client certificate (PEM), for clusters that require one.
    #[arg(long, requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Verify the servers' certificates for this name instead of the endpoint's host.
    #[arg(long, requires = "tls_ca")]
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
struct LockArgs {
    #[arg(long, default_value = "127.0.0.1:7380", value_delimiter = ',')]
    endpoints: Vec<String>,
    #[command(flatten)]
    tls: ClientTlsArgs,
    /// Session lease: how long the lock outlives this process if it stops renewing.
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// How long to wait for the lock (0: try once).
    #[arg(long, default_value_t = 0)]
    wait_ms: u64,
    name: String,
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

#[derive(Args)]
struct StatusArgs {
    #[arg(long, default_value = "127.0.0.1:7380", value_delimiter = ',')]
    endpoints: Vec<String>,
    #[command(flatten)]
    tls: ClientTlsArgs,
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
    let cli = Cli::parse();
    init_logs(match &cli.command {
        Cmd::Serve(a) => a.log_format,
        Cmd::Lock(_) | Cmd::Status(_) => LogFormat::Text,
    });
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Cmd::Serve(ServeArgs {
        threads: Some(n), ..
    }) = &cli.command
    {
        builder.worker_threads((*n).max(1));
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
            Cmd::Serve(a) => serve(a).await.map(|()| ExitCode::SUCCESS),
            Cmd::Lock(a) => lock(a).await,
            Cmd::Status(a) => status(a).await.map(|()| ExitCode::SUCCESS),
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
    cfg.initial_cluster = a.initial_cluster.unwrap_or_default();
    cfg.initial_cluster_state = a.initial_cluster_state;
    cfg.initial_cluster_token = a.initial_cluster_token;
    cfg.snapshot_logs = a.snapshot_logs;
    cfg.keep_logs = a.keep_logs;
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
    cfg.resp_acl = Arc::new(match &a.acl_file {
        None => Acl::new(pass),
        Some(path) => Acl::load(path, pass)?,
    });
    if let (Some(cert), Some(key), Some(ca)) = (&a.tls.tls_cert, &a.tls.tls_key, &a.tls.tls_ca) {
        let mut tls = fenced_tls::ServerTls::load(cert, key, ca)?
            .require_client_cert(a.tls.tls_require_client_cert);
        if let Some(client_ca) = &a.tls.tls_client_ca {
            tls = tls.with_client_ca(client_ca)?;
        }
        cfg.tls = Some(tls);
    }
    let running = fenced_server::start(cfg.clone())
        .await
        .context("starting the node")?;
    tracing::info!(
        id = cfg.id,
        grpc = %cfg.grpc_addr,
        data_dir = %cfg.data_dir.display(),
        "fenced node serving"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let node = running.node.clone();
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt: shutting down"),
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

async fn lock(a: LockArgs) -> anyhow::Result<ExitCode> {
    let client = Client::connect_with(
        &a.endpoints,
        ClientOptions {
            session_ttl: Duration::from_millis(a.ttl_ms),
            tls: a.tls.load()?,
            ..ClientOptions::default()
        },
    )?;
    let opts = LockOptions::wait(Duration::from_millis(a.wait_ms));
    let tls = a.tls.tls_ca.is_some();
    let locked = client.lock(&a.name, opts).await;
    let Some(mut guard) = locked.map_err(|e| tls_hint(e, tls))? else {
        eprintln!("fenced: lock {} not acquired", a.name);
        return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
    };
    let token = guard
        .token()
        .context("the lock was lost right after it was granted")?;
    let (program, args) = a.cmd.split_first().context("no command given after --")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("FENCED_TOKEN", token.to_string())
        .env("FENCED_LOCK", &a.name)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let status = tokio::select! {
        status = child.wait() => status?,
        () = guard.lost() => {
            eprintln!("fenced: lock {} lost; stopping the command", a.name);
            if let Some(pid) = child.id() {
                // SAFETY: plain kill(2) on our own child's pid.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            child.wait().await?
        }
    };
    let released = guard.release().await;
    if let Err(e) = released.and(client.close().await) {
        eprintln!("fenced: releasing {}: {e} (the lease will expire)", a.name);
    }
    Ok(match status.code() {
        Some(c) => ExitCode::from(c as u8),
        None => ExitCode::FAILURE,
    })
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
    let client = Client::connect_with(
        &a.endpoints,
        ClientOptions {
            tls: a.tls.load()?,
            ..ClientOptions::default()
        },
    )?;
    let s = client
        .status()
        .await
        .map_err(|e| tls_hint(e, a.tls.tls_ca.is_some()))?;
    let members: Vec<serde_json::Value> = s
        .members
        .iter()
        .map(|m| serde_json::json!({"id": m.id, "addr": m.addr, "voter": m.voter}))
        .collect();
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
    });
    println!("{out}");
    Ok(())
}
