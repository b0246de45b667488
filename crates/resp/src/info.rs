//! `INFO`: which sections a request selects (Redis 7's rules) and their text.
//!
//! Everything here is pure: the connection gathers a [`NodeInfo`] from the backend and a
//! [`FrontInfo`] from what the front end counts, and [`render`] turns them into the reply.
//! Fields follow Redis 7.2's names and formats so that clients' `INFO` parsers (redis-py's
//! `parse_info`, Lettuce's, Redisson's) read them; values are fenced's own truths
//! (docs/resp.md, "INFO").

/// A member of the Raft cluster, as `INFO fenced` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    /// Its gRPC (node-to-node) address.
    pub addr: String,
    /// A voter (else a learner).
    pub voter: bool,
}

/// What the node tells `INFO` ([`crate::Backend::info`]): its Raft view, the keyspace's size
/// and the process's resources.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInfo {
    pub node_id: u64,
    /// The cluster id as fenced prints it everywhere (16 hex digits).
    pub cluster_id: String,
    /// `leader`, `follower`, `learner`, `candidate` or `shutdown`.
    pub raft_role: String,
    /// 0: no leader known.
    pub leader_id: u64,
    pub term: u64,
    pub applied_index: u64,
    pub last_log_index: u64,
    pub snapshot_index: u64,
    pub members: Vec<MemberInfo>,
    /// Live keys and keys with an expiry in this node's applied state, judged at its applied
    /// log time (not behind a read barrier: `INFO` answers without a quorum).
    pub keys: u64,
    pub expires: u64,
    /// `--config` file, empty if none.
    pub config_file: String,
    pub data_dir: String,
    /// Resident set size of the process (bytes).
    pub rss_bytes: u64,
    /// Peak resident set size (bytes).
    pub peak_rss_bytes: u64,
    /// Physical memory of the machine (bytes; 0 unknown).
    pub total_system_memory: u64,
    /// The allocator the binary runs on (`mimalloc`, `libc`).
    pub mem_allocator: String,
    /// CPU time of the process, seconds.
    pub cpu_sys: f64,
    pub cpu_user: f64,
    /// `uname`-like: `Linux 6.1.0 x86_64`.
    pub os: String,
}

/// What the front end itself counts, for `INFO`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FrontInfo {
    pub process_id: u32,
    pub run_id: String,
    pub tcp_port: u16,
    pub uptime_secs: u64,
    /// Wall-clock time of the request (µs since the epoch).
    pub server_time_usec: u64,
    pub executable: String,
    pub connected_clients: u64,
    pub blocked_clients: u64,
    pub pubsub_clients: u64,
    pub maxclients: u64,
    pub total_connections_received: u64,
    pub total_commands_processed: u64,
    pub instantaneous_ops_per_sec: u64,
    pub total_net_input_bytes: u64,
    pub total_net_output_bytes: u64,
    pub rejected_connections: u64,
    pub total_error_replies: u64,
    pub pubsub_channels: u64,
    pub pubsub_patterns: u64,
}

/// The sections in Redis's order, and whether `INFO` without arguments (`default`) shows
/// them. fenced keeps no `commandstats`, `latencystats` or `errorstats` (command counts and
/// latencies are Prometheus metrics at `--metrics-addr`), so those names select nothing.
pub const SECTIONS: &[(&str, bool)] = &[
    ("server", true),
    ("clients", true),
    ("memory", true),
    ("persistence", true),
    ("stats", true),
    ("replication", true),
    ("cpu", true),
    ("cluster", true),
    ("keyspace", true),
    ("fenced", true),
];

/// The sections `INFO args…` selects, in [`SECTIONS`]'s order: none given or `default` →
/// the default ones; `all` and `everything` → every one; names case-insensitively; an
/// unknown name selects nothing (so `INFO nosuch` is empty, as in Redis).
pub fn select(args: &[Vec<u8>]) -> Vec<&'static str> {
    let mut all = false;
    let mut default = args.is_empty();
    let mut named: Vec<String> = Vec::new();
    for a in args {
        let a = String::from_utf8_lossy(a).to_ascii_lowercase();
        match a.as_str() {
            "all" | "everything" => all = true,
            "default" => default = true,
            _ => named.push(a),
        }
    }
    SECTIONS
        .iter()
        .filter(|(name, in_default)| {
            all || (default && *in_default) || named.iter().any(|n| n == name)
        })
        .map(|(name, _)| *name)
        .collect()
}

/// Redis's `bytesToHuman`: `1.50K`, `12.00M`, `0B`.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    const K: f64 = 1024.0;
    if b < K {
        format!("{bytes}B")
    } else if b < K * K {
        format!("{:.2}K", b / K)
    } else if b < K * K * K {
        format!("{:.2}M", b / (K * K))
    } else if b < K * K * K * K {
        format!("{:.2}G", b / (K * K * K))
    } else {
        format!("{:.2}T", b / (K * K * K * K))
    }
}

/// The fields of section `name` (a name from [`SECTIONS`]).
pub fn section(name: &str, n: &NodeInfo, f: &FrontInfo) -> (&'static str, Vec<(String, String)>) {
    let mut v: Vec<(String, String)> = Vec::new();
    let mut put = |k: &str, val: String| v.push((k.to_string(), val));
    let title = match name {
        "server" => {
            put("redis_version", crate::REDIS_VERSION.into());
            put("redis_git_sha1", "00000000".into());
            put("redis_git_dirty", "0".into());
            put("redis_build_id", "0".into());
            put("redis_mode", "standalone".into());
            put("os", n.os.clone());
            put("arch_bits", usize::BITS.to_string());
            put("monotonic_clock", "POSIX clock_gettime".into());
            put("multiplexing_api", "epoll".into());
            put("process_id", f.process_id.to_string());
            put("process_supervised", "no".into());
            put("run_id", f.run_id.clone());
            put("tcp_port", f.tcp_port.to_string());
            put("server_time_usec", f.server_time_usec.to_string());
            put("uptime_in_seconds", f.uptime_secs.to_string());
            put("uptime_in_days", (f.uptime_secs / 86_400).to_string());
            put("executable", f.executable.clone());
            put("config_file", n.config_file.clone());
            put("io_threads_active", "0".into());
            "Server"
        }
        "clients" => {
            put("connected_clients", f.connected_clients.to_string());
            put("cluster_connections", "0".into());
            put("maxclients", f.maxclients.to_string());
            put("blocked_clients", f.blocked_clients.to_string());
            put("tracking_clients", "0".into());
            put("pubsub_clients", f.pubsub_clients.to_string());
            "Clients"
        }
        "memory" => {
            put("used_memory", n.rss_bytes.to_string());
            put("used_memory_human", human(n.rss_bytes));
            put("used_memory_rss", n.rss_bytes.to_string());
            put("used_memory_rss_human", human(n.rss_bytes));
            put("used_memory_peak", n.peak_rss_bytes.to_string());
            put("used_memory_peak_human", human(n.peak_rss_bytes));
            put("total_system_memory", n.total_system_memory.to_string());
            put("total_system_memory_human", human(n.total_system_memory));
            put("maxmemory", "0".into());
            put("maxmemory_human", "0B".into());
            put("maxmemory_policy", "noeviction".into());
            put("mem_allocator", n.mem_allocator.clone());
            put("fenced_used_memory_is_rss", "1".into());
            "Memory"
        }
        "persistence" => {
            let now_secs = (f.server_time_usec / 1_000_000).to_string();
            put("loading", "0".into());
            put("async_loading", "0".into());
            // Every acknowledged write is already fsynced on a majority's WAL.
            put("rdb_changes_since_last_save", "0".into());
            put("rdb_bgsave_in_progress", "0".into());
            put("rdb_last_save_time", now_secs);
            put("rdb_last_bgsave_status", "ok".into());
            put("rdb_last_bgsave_time_sec", "-1".into());
            put("rdb_current_bgsave_time_sec", "-1".into());
            put("aof_enabled", "1".into());
            put("aof_rewrite_in_progress", "0".into());
            put("aof_rewrite_scheduled", "0".into());
            put("aof_last_rewrite_time_sec", "-1".into());
            put("aof_current_rewrite_time_sec", "-1".into());
            put("aof_last_bgrewrite_status", "ok".into());
            put("aof_last_write_status", "ok".into());
            put("fenced_wal_enabled", "1".into());
            put("fenced_wal_fsync", "always".into());
            put("fenced_write_acknowledged_after", "majority_fsync".into());
            put("fenced_snapshot_index", n.snapshot_index.to_string());
            put("fenced_data_dir", n.data_dir.clone());
            "Persistence"
        }
        "stats" => {
            put(
                "total_connections_received",
                f.total_connections_received.to_string(),
            );
            put(
                "total_commands_processed",
                f.total_commands_processed.to_string(),
            );
            put(
                "instantaneous_ops_per_sec",
                f.instantaneous_ops_per_sec.to_string(),
            );
            put("total_net_input_bytes", f.total_net_input_bytes.to_string());
            put(
                "total_net_output_bytes",
                f.total_net_output_bytes.to_string(),
            );
            put("rejected_connections", f.rejected_connections.to_string());
            put("pubsub_channels", f.pubsub_channels.to_string());
            put("pubsub_patterns", f.pubsub_patterns.to_string());
            put("total_error_replies", f.total_error_replies.to_string());
            "Stats"
        }
        "replication" => {
            put("role", "master".into());
            put("connected_slaves", "0".into());
            put("master_failover_state", "no-failover".into());
            put("master_replid", replid(&n.cluster_id));
            put("master_replid2", "0".repeat(40));
            put("master_repl_offset", n.applied_index.to_string());
            put("second_repl_offset", "-1".into());
            put("repl_backlog_active", "0".into());
            "Replication"
        }
        "cpu" => {
            put("used_cpu_sys", format!("{:.6}", n.cpu_sys));
            put("used_cpu_user", format!("{:.6}", n.cpu_user));
            "CPU"
        }
        "cluster" => {
            put("cluster_enabled", "0".into());
            "Cluster"
        }
        "keyspace" => {
            if n.keys > 0 {
                put(
                    "db0",
                    format!("keys={},expires={},avg_ttl=0", n.keys, n.expires),
                );
            }
            "Keyspace"
        }
        "fenced" => {
            put("fenced_version", env!("CARGO_PKG_VERSION").into());
            put("fenced_node_id", n.node_id.to_string());
            put("fenced_cluster_id", n.cluster_id.clone());
            put("fenced_role", n.raft_role.clone());
            put("fenced_leader_id", n.leader_id.to_string());
            put("fenced_term", n.term.to_string());
            put("fenced_applied_index", n.applied_index.to_string());
            put("fenced_last_log_index", n.last_log_index.to_string());
            put("fenced_keyspace_view", "local_applied".into());
            put("fenced_members", n.members.len().to_string());
            put(
                "fenced_voters",
                n.members.iter().filter(|m| m.voter).count().to_string(),
            );
            for m in &n.members {
                put(
                    &format!("fenced_member_{}", m.id),
                    format!("addr={},voter={}", m.addr, if m.voter { 1 } else { 0 }),
                );
            }
            "Fenced"
        }
        _ => return ("", Vec::new()),
    };
    (title, v)
}

/// A 40-hex-digit replication id from the cluster id: the same on every member, since
/// every member holds the same history.
fn replid(cluster_id: &str) -> String {
    format!("{cluster_id:0>40}")
}

/// The reply to `INFO args…`.
pub fn render(args: &[Vec<u8>], n: &NodeInfo, f: &FrontInfo) -> String {
    let mut out = String::new();
    for name in select(args) {
        let (title, fields) = section(name, n, f);
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        out.push_str("# ");
        out.push_str(title);
        out.push_str("\r\n");
        for (k, v) in fields {
            out.push_str(&k);
            out.push(':');
            out.push_str(&v);
            out.push_str("\r\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<Vec<u8>> {
        a.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn selection_follows_redis_7() {
        let every: Vec<&str> = SECTIONS.iter().map(|(n, _)| *n).collect();
        assert_eq!(select(&[]), every);
        assert_eq!(select(&args(&["default"])), every);
        assert_eq!(select(&args(&["ALL"])), every);
        assert_eq!(select(&args(&["everything"])), every);
        assert_eq!(select(&args(&["Server"])), vec!["server"]);
        // Several names, in the table's order, each once.
        assert_eq!(
            select(&args(&["keyspace", "SERVER", "keyspace"])),
            vec!["server", "keyspace"]
        );
        assert!(select(&args(&["nosuch"])).is_empty());
        assert!(select(&args(&["commandstats"])).is_empty());
        assert_eq!(select(&args(&["nosuch", "cpu"])), vec!["cpu"]);
    }

    #[test]
    fn rendering_is_redis_shaped() {
        let n = NodeInfo {
            node_id: 2,
            cluster_id: "00000000deadbeef".into(),
            raft_role: "follower".into(),
            leader_id: 1,
            term: 3,
            applied_index: 42,
            keys: 5,
            expires: 2,
            members: vec![
                MemberInfo {
                    id: 1,
                    addr: "127.0.0.1:7380".into(),
                    voter: true,
                },
                MemberInfo {
                    id: 4,
                    addr: "127.0.0.4:7380".into(),
                    voter: false,
                },
            ],
            ..NodeInfo::default()
        };
        let f = FrontInfo {
            uptime_secs: 200_000,
            ..FrontInfo::default()
        };
        let s = render(
            &args(&["server", "keyspace", "replication", "fenced"]),
            &n,
            &f,
        );
        assert!(s.starts_with("# Server\r\nredis_version:"), "{s}");
        assert!(s.contains("\r\nuptime_in_days:2\r\n"), "{s}");
        assert!(s.contains("\r\n\r\n# Keyspace\r\ndb0:keys=5,expires=2,avg_ttl=0\r\n"));
        assert!(s.contains("\r\nrole:master\r\n"), "{s}");
        assert!(s.contains(&format!("master_replid:{}deadbeef\r\n", "0".repeat(32))));
        assert!(
            s.contains("\r\nfenced_role:follower\r\nfenced_leader_id:1\r\n"),
            "{s}"
        );
        assert!(s.contains("\r\nfenced_voters:1\r\n"), "{s}");
        assert!(s.contains("\r\nfenced_member_4:addr=127.0.0.4:7380,voter=0\r\n"));
        assert!(s.ends_with("\r\n") && !s.ends_with("\r\n\r\n"));
        // Every line is `# Title`, empty, or `key:value` with no spaces in the key.
        for line in s.split("\r\n") {
            assert!(
                line.is_empty()
                    || line.starts_with("# ")
                    || line.split_once(':').is_some_and(|(k, _)| !k.contains(' ')),
                "{line:?}"
            );
        }
        // An empty keyspace shows the header only, like Redis.
        let empty = render(&args(&["keyspace"]), &NodeInfo::default(), &f);
        assert_eq!(empty, "# Keyspace\r\n");
        assert_eq!(render(&args(&["nosuch"]), &n, &f), "");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(1023), "1023B");
        assert_eq!(human(1536), "1.50K");
        assert_eq!(human(3 * 1024 * 1024), "3.00M");
        assert_eq!(human(5 * 1024 * 1024 * 1024), "5.00G");
    }
}
