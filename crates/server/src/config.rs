//! Node configuration (the `fenced serve` flags).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use fenced_core::etcd::AutoCompaction;

use crate::clock::NodeClock;
use crate::StartError;

/// `--initial-cluster-state`: may an empty data dir bootstrap a new cluster?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterState {
    /// Yes: this start creates the cluster (every member's first start).
    New,
    /// No: the node belongs to a running cluster; an empty data dir is refused.
    Existing,
}

impl std::str::FromStr for ClusterState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "new" => Ok(ClusterState::New),
            "existing" => Ok(ClusterState::Existing),
            _ => Err(format!("expected new or existing, got {s:?}")),
        }
    }
}

/// Default `--max-pending-requests`: at ~100 bytes a proposal, a few MB of queue, and under
/// the benchmark's heaviest load (64 clients, pipelines) never reached.
pub const DEFAULT_MAX_PENDING_REQUESTS: usize = 50_000;
/// Default `--max-clients` (Redis's `maxclients`).
pub const DEFAULT_MAX_CLIENTS: usize = 10_000;

/// Default `--initial-cluster-token`.
pub const DEFAULT_CLUSTER_TOKEN: &str = "fenced";
/// Default `--heartbeat-ms`.
pub const DEFAULT_HEARTBEAT_MS: u64 = 50;
/// Default `--election-timeout-ms`: a follower starts an election 750–900 ms after the last
/// heartbeat (the old leader's lease of 450 ms, then 300–450 ms), so a SIGKILLed leader is
/// replaced in under a second (`fenced-jepsen failover`: median 0.92 s over 10 kills), while
/// 15 heartbeats in a row must go missing before anyone campaigns.
pub const DEFAULT_ELECTION_TIMEOUT: ElectionTimeout = ElectionTimeout {
    min_ms: 300,
    max_ms: 450,
};

/// `--election-timeout-ms MIN..MAX`: a follower that hears no leader for a random time in this
/// range — after the old leader's lease, `MAX` — starts an election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionTimeout {
    pub min_ms: u64,
    pub max_ms: u64,
}

impl std::fmt::Display for ElectionTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.min_ms, self.max_ms)
    }
}

impl std::str::FromStr for ElectionTimeout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected MIN..MAX in ms with 0 < MIN < MAX, got {s:?}");
        let (a, b) = s.split_once("..").ok_or_else(bad)?;
        let parse = |x: &str| x.trim().parse::<u64>().map_err(|_| bad());
        let (min_ms, max_ms) = (parse(a)?, parse(b)?);
        if min_ms == 0 || min_ms >= max_ms {
            return Err(bad());
        }
        Ok(ElectionTimeout { min_ms, max_ms })
    }
}

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: u64,
    pub data_dir: PathBuf,
    /// `--config`: the TOML file the flags came from, if any (`INFO`'s `config_file`).
    pub config_file: Option<PathBuf>,
    pub grpc_addr: String,
    pub resp_addr: String,
    /// The users of every port (RESP and the gRPC client API): `--acl-file`'s, or only
    /// `default` (`nopass`, or `--requirepass`'s password), loaded and checked before the
    /// node starts.
    pub acl: Arc<fenced_resp::acl::Acl>,
    /// How long a gRPC token is valid after `Auth.Authenticate` (`--auth-token-ttl-ms`).
    pub auth_token_ttl: std::time::Duration,
    /// TLS for both listeners and for calls to other nodes (`--tls-cert/--tls-key/--tls-ca`).
    pub tls: Option<fenced_tls::ServerTls>,
    /// Every member's id and gRPC address. Empty: a single-node cluster of this node.
    pub initial_cluster: BTreeMap<u64, String>,
    /// `None`: `New` for a single-node cluster of this node, else `Existing`.
    pub initial_cluster_state: Option<ClusterState>,
    /// Mixed into the cluster id of a new cluster, so that two clusters with the same member
    /// list get different ids.
    pub initial_cluster_token: String,
    /// Build a snapshot after this many log entries, once the log on disk is also at least
    /// as large as the last snapshot (and then purge the log before it).
    pub snapshot_logs: u64,
    /// Log entries kept before the last snapshot when purging.
    pub keep_logs: u64,
    pub heartbeat_ms: u64,
    pub election_timeout: ElectionTimeout,
    /// `--metrics-addr`: serve `/metrics`, `/health` and `/ready` over HTTP here.
    pub metrics_addr: Option<String>,
    /// `--metrics-max-connections`: connections at once on the metrics port; one past it is
    /// closed at once ([`crate::metrics::Capped`]).
    pub metrics_max_connections: usize,
    /// `--join`: the cluster id of the running cluster that lists this member as a learner
    /// (looked up by the binary before the node starts).
    pub join: Option<u64>,
    /// Started with `--join`: this node never bootstraps a cluster, whatever the lookup
    /// decided (`join` is `None` when the lookup says to start from the data dir). A data dir
    /// whose creation a full disk cut short is not empty, yet holds no Raft state: started
    /// from it without this, a joining learner bootstrapped a one-node cluster of its own and
    /// granted tokens from 1 again (found by fenced-sim, seed 1700938 with `--faults all`).
    pub joining: bool,
    /// `--force-new-cluster`: make this member's data dir a one-node cluster of its own
    /// before starting (`crate::backup::force_new_cluster`).
    pub force_new_cluster: bool,
    /// `--bump-revision`, for `--force-new-cluster`.
    pub bump_revision: u64,
    /// `--max-pending-requests`: requests that may wait for a batch (proposals, forwarded
    /// proposals, reads, each queue); more are refused with `RESOURCE_EXHAUSTED` / `-BUSY`.
    pub max_pending_requests: usize,
    /// `--max-clients`: connections at once per listener (RESP, gRPC).
    pub max_clients: usize,
    /// `--resp-query-buffer-total`: the RESP port's cap on unparsed input, all connections
    /// together (bytes; 0: none; [`fenced_resp::Config::max_query_buffer_total`]).
    pub resp_query_buffer_total: usize,
    /// `--grpc-unauthenticated-calls`: gRPC calls without a valid token reading their
    /// bodies at once, all connections together (0: no limit; [`crate::pre_auth`]).
    pub grpc_unauthenticated_calls: usize,
    /// `--grpc-request-buffer-total`: bytes of incomplete requests authenticated calls on the
    /// client port may hold, all together (0: no cap; [`crate::request_budget`]).
    pub grpc_request_buffer_total: usize,
    /// `--grpc-max-concurrent-streams`: HTTP/2 streams per gRPC connection.
    pub grpc_max_concurrent_streams: u32,
    /// `--digest-interval`: digest the state every N log indexes for the divergence alarm
    /// (0: off). See `crate::node::alarm`.
    pub digest_interval: u64,
    /// Most log entries in one replication message (openraft's `max_payload_entries`). Not a
    /// flag: production keeps openraft's default ([`DEFAULT_RAFT_MAX_PAYLOAD_ENTRIES`]); a
    /// simulator caps it so a follower catches up in many small appends.
    pub raft_max_payload_entries: u64,
    /// Hooks for tests only (hidden flags, refused unless `FENCED_UNSAFE_TEST_HOOKS` is set).
    pub test_hooks: TestHooks,
    /// This node's clocks (monotonic and wall): the real ones, with the test-only offset
    /// file of [`TEST_CLOCK_OFFSET_ENV`] if that is set when the config is made; a
    /// simulator puts its own per node ([`crate::clock::SimClock`]).
    pub clock: NodeClock,
    /// `--quota-backend-bytes`: the etcd keyspace's space quota this node proposes while it
    /// leads (0: etcd's default, 2 GiB). See `crate::node::etcd_upkeep`.
    pub quota_backend_bytes: u64,
    /// `--auto-compaction-mode` and `--auto-compaction-retention`: `None` = off (etcd's
    /// default).
    pub auto_compaction: Option<AutoCompaction>,
}

/// Default [`NodeConfig::raft_max_payload_entries`]: openraft 0.9's own default.
pub const DEFAULT_RAFT_MAX_PAYLOAD_ENTRIES: u64 = 300;

/// Default `--digest-interval`: a digest of the state every 1,000 log indexes.
pub const DEFAULT_DIGEST_INTERVAL: u64 = 1_000;

/// Test-only behaviour, off in every real deployment: `fenced serve` accepts the hidden flags
/// that set these only when the environment variable [`TEST_HOOKS_ENV`] is `1`.
#[derive(Clone, Debug, Default)]
pub struct TestHooks {
    /// Make this replica's state diverge once at this log index
    /// (`fenced_storage::StateMachineStore::diverge_at_for_tests`).
    pub diverge_at: Option<u64>,
    /// Advertise these apply rules to the leader instead of `Semantics::NEWEST` (as a member
    /// running older code would).
    pub advertise_semantics: Option<u8>,
    /// Advertise this Lua build fingerprint instead of this build's (as a member built
    /// differently would).
    pub advertise_lua_build: Option<u64>,
    /// Most requests in one forwarded batch, instead of 1,024: small batches make a
    /// simulator reach what only a long queue reaches otherwise (a client's pipeline at a
    /// batch's edge).
    pub forward_max_items: Option<usize>,
    /// The leader never proposes the expiry ticks of its ticker (`Node::ticker`): deadlines
    /// pass on its clock while no tick is applied, and only reads (which commit the time
    /// they judge at) or other traffic move the log time.
    pub hold_ticks: bool,
}

/// The environment variable that must be `1` for `fenced serve` to accept test hooks.
pub const TEST_HOOKS_ENV: &str = "FENCED_UNSAFE_TEST_HOOKS";

/// Environment variable naming the test-only wall-clock offset file (`crate::clock`'s module
/// docs), read into [`NodeConfig::clock`] by [`NodeConfig::new`].
pub const TEST_CLOCK_OFFSET_ENV: &str = "FENCED_TEST_CLOCK_OFFSET_FILE";

impl NodeConfig {
    pub fn new(id: u64, data_dir: PathBuf, grpc_addr: String, resp_addr: String) -> Self {
        NodeConfig {
            id,
            data_dir,
            grpc_addr,
            resp_addr,
            acl: Arc::default(),
            auth_token_ttl: crate::users::DEFAULT_TOKEN_TTL,
            tls: None,
            initial_cluster: BTreeMap::new(),
            initial_cluster_state: None,
            initial_cluster_token: DEFAULT_CLUSTER_TOKEN.to_owned(),
            config_file: None,
            snapshot_logs: 5_000,
            keep_logs: 1_000,
            heartbeat_ms: DEFAULT_HEARTBEAT_MS,
            join: None,
            joining: false,
            force_new_cluster: false,
            bump_revision: crate::backup::DEFAULT_BUMP_REVISION,
            max_pending_requests: DEFAULT_MAX_PENDING_REQUESTS,
            max_clients: DEFAULT_MAX_CLIENTS,
            resp_query_buffer_total: fenced_resp::DEFAULT_MAX_QUERY_BUFFER_TOTAL,
            grpc_unauthenticated_calls: crate::pre_auth::DEFAULT_UNAUTHENTICATED_CALLS,
            grpc_request_buffer_total: crate::request_budget::DEFAULT_REQUEST_BUFFER_TOTAL,
            grpc_max_concurrent_streams: crate::pre_auth::DEFAULT_MAX_CONCURRENT_STREAMS,
            digest_interval: DEFAULT_DIGEST_INTERVAL,
            raft_max_payload_entries: DEFAULT_RAFT_MAX_PAYLOAD_ENTRIES,
            test_hooks: TestHooks::default(),
            metrics_addr: None,
            metrics_max_connections: crate::metrics::DEFAULT_METRICS_MAX_CONNECTIONS,
            election_timeout: DEFAULT_ELECTION_TIMEOUT,
            clock: NodeClock::real(std::env::var_os(TEST_CLOCK_OFFSET_ENV).map(PathBuf::from)),
            quota_backend_bytes: 0,
            auto_compaction: None,
        }
    }

    /// Whether an empty data dir may bootstrap a new cluster: `--initial-cluster-state new`,
    /// or, by default, only a cluster of this node alone (a node that names peers may be a
    /// member that lost its disk, which must never bootstrap and vote again).
    pub fn may_bootstrap(&self) -> Result<bool, StartError> {
        if self.joining {
            return Ok(false);
        }
        Ok(match self.initial_cluster_state {
            Some(ClusterState::New) => true,
            Some(ClusterState::Existing) => false,
            None => self.members()?.keys().all(|id| *id == self.id),
        })
    }

    /// The members this node bootstraps with on first start (itself alone with
    /// `--force-new-cluster`).
    pub fn members(&self) -> Result<BTreeMap<u64, String>, StartError> {
        if self.initial_cluster.is_empty() || self.force_new_cluster {
            return Ok(BTreeMap::from([(self.id, self.grpc_addr.clone())]));
        }
        if !self.initial_cluster.contains_key(&self.id) {
            return Err(StartError::Config(format!(
                "--initial-cluster does not list this node's id {}",
                self.id
            )));
        }
        Ok(self.initial_cluster.clone())
    }
}

/// Parse `1=host:port,2=host:port,...`.
pub fn parse_cluster(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("expected ID=HOST:PORT, got {part:?}"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("bad node id {id:?} in {part:?}"))?;
        if id == 0 {
            return Err("node ids start at 1".into());
        }
        let addr = addr.trim();
        if addr.rsplit_once(':').is_none() {
            return Err(format!("expected HOST:PORT for node {id}, got {addr:?}"));
        }
        if out.insert(id, addr.to_owned()).is_some() {
            return Err(format!("node {id} listed twice"));
        }
    }
    if out.is_empty() {
        return Err("empty cluster".into());
    }
    Ok(out)
}

/// etcd's `--auto-compaction-mode` (`periodic` or `revision`) with its
/// `--auto-compaction-retention`, parsed as etcd parses them: `0` is off; in periodic mode a
/// bare integer is hours, anything else a Go duration (`30m`, `1h30m`, `1.5h`, `90s`); in
/// revision mode an integer, the revisions kept.
pub fn parse_auto_compaction(
    mode: &str,
    retention: &str,
) -> Result<Option<AutoCompaction>, String> {
    let retention = retention.trim();
    match mode {
        "periodic" => {
            let ms = match retention.parse::<u64>() {
                Ok(hours) => hours.checked_mul(3_600_000).ok_or("retention too long")?,
                Err(_) => go_duration_ms(retention)?,
            };
            Ok((ms > 0).then_some(AutoCompaction::Periodic { retention_ms: ms }))
        }
        "revision" => {
            let n = retention.parse::<u64>().map_err(|_| {
                format!("--auto-compaction-retention {retention:?}: revision mode keeps a number of revisions")
            })?;
            Ok((n > 0).then_some(AutoCompaction::Revision { revisions: n }))
        }
        other => Err(format!(
            "--auto-compaction-mode {other:?}: expected periodic or revision"
        )),
    }
}

/// A Go duration (`time.ParseDuration`: `300ms`, `1.5h`, `2h45m`; units ns, us, µs, ms, s,
/// m, h) in whole milliseconds.
fn go_duration_ms(s: &str) -> Result<u64, String> {
    let bad = || {
        format!("--auto-compaction-retention {s:?}: expected hours or a duration like 30m, 1h30m")
    };
    if s.is_empty() {
        return Err(bad());
    }
    let mut rest = s;
    let mut total_ms = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let ms_per = match &rest[..unit_len] {
            "ns" => 1e-6,
            "us" | "µs" | "μs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3_600e3,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total_ms += value * ms_per;
    }
    if !total_ms.is_finite() || total_ms >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(total_ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node started with `--join` never bootstraps, even alone in its config (seed 1700938).
    #[test]
    fn a_joining_node_never_bootstraps() {
        let mut cfg = NodeConfig::new(5, "d".into(), "10.0.0.5:7380".into(), "r".into());
        assert!(
            cfg.may_bootstrap().expect("config"),
            "alone: a one-node cluster"
        );
        cfg.joining = true;
        assert!(!cfg.may_bootstrap().expect("config"));
    }

    #[test]
    fn raft_max_payload_entries_defaults_to_openrafts_own() {
        assert_eq!(
            DEFAULT_RAFT_MAX_PAYLOAD_ENTRIES,
            openraft::Config::default().max_payload_entries
        );
    }

    #[test]
    fn election_timeouts_parse_and_print_alike() {
        let t: ElectionTimeout = "150..300".parse().expect("parse");
        assert_eq!((t.min_ms, t.max_ms), (150, 300));
        assert_eq!(
            DEFAULT_ELECTION_TIMEOUT.to_string().parse(),
            Ok(DEFAULT_ELECTION_TIMEOUT)
        );
        for bad in ["", "300", "300..150", "0..10", "a..b", "10..10"] {
            assert!(bad.parse::<ElectionTimeout>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn auto_compaction_flags_parse_as_etcd_parses_them() {
        let p = |m, r| parse_auto_compaction(m, r);
        let periodic = |ms| Ok(Some(AutoCompaction::Periodic { retention_ms: ms }));
        assert_eq!(p("periodic", "0"), Ok(None));
        assert_eq!(p("periodic", "1"), periodic(3_600_000));
        assert_eq!(p("periodic", "72"), periodic(72 * 3_600_000));
        assert_eq!(p("periodic", "30m"), periodic(1_800_000));
        assert_eq!(p("periodic", "1h30m"), periodic(5_400_000));
        assert_eq!(p("periodic", "1.5h"), periodic(5_400_000));
        assert_eq!(p("periodic", "90s"), periodic(90_000));
        assert_eq!(p("periodic", "0s"), Ok(None));
        assert_eq!(
            p("revision", "1000"),
            Ok(Some(AutoCompaction::Revision { revisions: 1000 }))
        );
        assert_eq!(p("revision", "0"), Ok(None));
        for (m, r) in [
            ("periodic", "1x"),
            ("periodic", "h"),
            ("periodic", "-1"),
            ("periodic", ""),
            ("revision", "1h"),
            ("revision", "-5"),
            ("hourly", "1"),
        ] {
            assert!(p(m, r).is_err(), "{m} {r}");
        }
    }

    #[test]
    fn parses_clusters_and_rejects_garbage() {
        let c = parse_cluster("1=127.0.0.1:7380, 2=127.0.0.2:7380").expect("parse");
        assert_eq!(c.get(&2).map(String::as_str), Some("127.0.0.2:7380"));
        for bad in ["", "1", "x=a:1", "0=a:1", "1=a:1,1=b:2", "1=nohost"] {
            assert!(parse_cluster(bad).is_err(), "{bad:?}");
        }
    }
}
