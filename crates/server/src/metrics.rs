//! Prometheus metrics (`/metrics` on `--metrics-addr`) and the health endpoints beside them
//! (`/health`: the node runs; `/ready`: it has a leader and has applied everything the leader
//! had committed when asked — a linearizable read would be served now).
//!
//! Counters are bumped where things happen (the proposer, the leader watcher); gauges are read
//! from Raft's metrics and the state machine at each scrape. The front ends and the lower
//! crates report through hooks that know no metrics library: the gRPC API through a tower
//! layer ([`grpc::GrpcMetricsLayer`]), RESP through [`fenced_resp::CommandObserver`], the
//! storage through [`fenced_storage::StorageObserver`] and the Raft transport through
//! [`fenced_network::PeerObserver`]; [`Metrics`] implements all three traits.

pub mod apply_watch;
pub mod grpc;
mod http;
mod observers;
pub mod stages;

pub use http::{
    metrics, serve, spawn_watchdog, watch_leader, Capped,
    DEFAULT_MAX_CONNECTIONS as DEFAULT_METRICS_MAX_CONNECTIONS,
};

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use fenced_core::{Event, ReleaseReason, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::node::Node;

/// The node's metrics. Cheap to share (`Arc`).
pub struct Metrics {
    registry: Registry,
    /// The latency breakdown of sampled proposals (`/debug/stages`).
    pub stages: stages::Stages,
    /// The entry being applied and since when: is apply stuck? (`/health`, the watchdog).
    pub apply: apply_watch::ApplyWatch,
    /// `/metrics` renders in flight (each on a blocking thread: a hung apply holds the lock
    /// the state's gauges read), at most [`http::MAX_RENDERS`].
    renders: std::sync::atomic::AtomicUsize,
    /// Commands that reached the proposer on this node while it led, and how they ended.
    pub proposals_committed: Counter,
    pub proposals_failed: Counter,
    /// Commands per entry this node proposed as leader.
    pub batch_size: Histogram,
    /// Seconds from handing an entry to Raft to its commit and apply (quorum fsync included).
    pub commit_seconds: Histogram,
    /// Times this node saw the leader change (including to "no leader").
    pub leader_changes: Counter,
    /// Grants answered by this node as leader (immediate ones; queued ones count in
    /// `waiter_grants`).
    grants: Counter,
    /// Applied on this node: queued acquires granted later, and ones whose wait ran out.
    waiter_grants: Counter,
    waiter_gave_up: Counter,
    /// Applied on this node: grants that ended, by why (`released` is the holder's release;
    /// the others are lock losses).
    releases: Family<Reason, Counter>,
    /// Fenced writes refused for a stale token, answered by this node as leader, by API.
    stale_writes: Family<Via, Counter>,
    /// RESP connections closed for their unparsed input, by limit.
    resp_input_closed: Family<Reason, Counter>,
    /// gRPC calls without a valid token refused before their body was read, by limit
    /// ([`crate::pre_auth`]).
    grpc_unauthenticated_refused: Family<Reason, Counter>,
    /// Connections to the metrics port closed at once for `--metrics-max-connections`.
    metrics_connections_refused: Counter,
    /// Authenticated calls refused for `--grpc-request-buffer-total`.
    grpc_request_buffer_refused: Counter,
    term: Gauge,
    is_leader: Gauge,
    /// 1 while this member's divergence alarm is raised.
    alarm_corrupt: Gauge,
    /// 1 while the cluster-wide `CORRUPT` alarm is raised in this node's applied state.
    cluster_alarm_corrupt: Gauge,
    /// The apply rules the leader stamps (0 on a non-leader).
    apply_semantics: Gauge,
    last_log_index: Gauge,
    applied_index: Gauge,
    snapshot_index: Gauge,
    purged_index: Gauge,
    committed_index: Gauge,
    /// Where the committed index is read from at each scrape ([`Metrics::read_log`]).
    log: OnceLock<fenced_storage::CommittedIndex>,
    revision: Gauge,
    locks_held: Gauge,
    waiters: Gauge,
    sessions: Gauge,
    /// etcd watches open on this node's streams, and the events they were sent.
    etcd_watchers: Gauge,
    etcd_watch_events: Counter,
    /// Client API calls by method and code, and their latency ([`grpc`]).
    grpc: Arc<grpc::GrpcStats>,
    /// RESP commands by name and result, and their latency.
    resp: RespStats,
    /// Each fdatasync of the write-ahead log, and each append from call to durable.
    wal_fsync: Histogram,
    wal_append: Histogram,
    /// Snapshots built on this node: how many, the last one's size, how long each took.
    snapshots: Counter,
    snapshot_bytes: Gauge,
    snapshot_seconds: Histogram,
    /// Heartbeat round trips to each peer (this node as leader).
    peer_rtt: DurationFamily<Peer>,
}

/// A family of duration histograms whose buckets a constructor sets.
pub(crate) type DurationFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Request and command latencies: 100 µs to 13 s.
pub(crate) fn request_duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
}

/// Disk syncs and appends: 50 µs to 6.5 s (etcd's `etcd_disk_wal_fsync_duration_seconds`
/// starts at 1 ms, too coarse for a fast SSD).
fn disk_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
}

/// Peer round trips: 50 µs to 3.3 s (loopback is well under a millisecond).
fn rtt_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
}

/// RESP commands: a handle per command of the command table (and `unknown`), resolved on
/// first use, so a command costs a hash lookup of its name, a counter increment and a
/// histogram observation.
struct RespStats {
    commands: Family<CommandResult, Counter>,
    durations: DurationFamily<CommandLabel>,
    by_name: HashMap<&'static str, RespSlot>,
}

#[derive(Default)]
struct RespSlot {
    ok: OnceLock<Counter>,
    err: OnceLock<Counter>,
    duration: OnceLock<Histogram>,
}

impl RespStats {
    fn new() -> RespStats {
        let by_name = fenced_core::kv::command_table()
            .iter()
            .map(|c| c.name)
            .chain(["unknown"])
            .map(|n| (n, RespSlot::default()))
            .collect();
        RespStats {
            commands: Family::default(),
            durations: Family::new_with_constructor(request_duration_histogram),
            by_name,
        }
    }

    fn record(&self, command: &'static str, ok: bool, seconds: f64) {
        let (command, slot) = match self.by_name.get_key_value(command) {
            Some((name, slot)) => (*name, slot),
            // Not a name of the table (the RESP crate only sends those): counted as unknown.
            None => match self.by_name.get_key_value("unknown") {
                Some((name, slot)) => (*name, slot),
                None => return,
            },
        };
        let (cell, result) = if ok {
            (&slot.ok, "ok")
        } else {
            (&slot.err, "err")
        };
        cell.get_or_init(|| {
            self.commands
                .get_or_create(&CommandResult { command, result })
                .clone()
        })
        .inc();
        slot.duration
            .get_or_init(|| {
                self.durations
                    .get_or_create(&CommandLabel { command })
                    .clone()
            })
            .observe(seconds);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("fenced");
        let m = Metrics {
            stages: stages::Stages::new(),
            apply: apply_watch::ApplyWatch::default(),
            renders: std::sync::atomic::AtomicUsize::new(0),
            proposals_committed: Counter::default(),
            proposals_failed: Counter::default(),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            commit_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            leader_changes: Counter::default(),
            grants: Counter::default(),
            waiter_grants: Counter::default(),
            waiter_gave_up: Counter::default(),
            releases: Family::default(),
            stale_writes: Family::default(),
            resp_input_closed: Family::default(),
            grpc_unauthenticated_refused: Family::default(),
            metrics_connections_refused: Counter::default(),
            grpc_request_buffer_refused: Counter::default(),
            term: Gauge::default(),
            is_leader: Gauge::default(),
            alarm_corrupt: Gauge::default(),
            cluster_alarm_corrupt: Gauge::default(),
            apply_semantics: Gauge::default(),
            last_log_index: Gauge::default(),
            applied_index: Gauge::default(),
            snapshot_index: Gauge::default(),
            purged_index: Gauge::default(),
            committed_index: Gauge::default(),
            log: OnceLock::new(),
            revision: Gauge::default(),
            locks_held: Gauge::default(),
            waiters: Gauge::default(),
            sessions: Gauge::default(),
            etcd_watchers: Gauge::default(),
            etcd_watch_events: Counter::default(),
            grpc: Arc::new(grpc::GrpcStats::new()),
            resp: RespStats::new(),
            wal_fsync: disk_histogram(),
            wal_append: disk_histogram(),
            snapshots: Counter::default(),
            snapshot_bytes: Gauge::default(),
            snapshot_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            peer_rtt: Family::new_with_constructor(rtt_histogram),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "proposals_committed",
            "Commands this node proposed as leader that were committed and applied",
            m.proposals_committed.clone(),
        );
        r.register(
            "proposals_failed",
            "Commands this node proposed as leader that failed (not the leader, timeout, stop)",
            m.proposals_failed.clone(),
        );
        r.register(
            "proposal_batch_size",
            "Commands per log entry proposed by this node as leader",
            m.batch_size.clone(),
        );
        r.register(
            "commit_duration_seconds",
            "From handing an entry to Raft to its commit and apply (fsync on a quorum included)",
            m.commit_seconds.clone(),
        );
        r.register(
            "leader_changes",
            "Leader changes seen by this node",
            m.leader_changes.clone(),
        );
        r.register(
            "lock_grants",
            "Acquires granted at once, answered by this node as leader",
            m.grants.clone(),
        );
        r.register(
            "lock_waiter_grants",
            "Queued acquires granted when the lock passed to them (applied on this node)",
            m.waiter_grants.clone(),
        );
        r.register(
            "lock_waiter_timeouts",
            "Queued acquires whose wait ran out or whose session ended (applied on this node)",
            m.waiter_gave_up.clone(),
        );
        r.register(
            "lock_releases",
            "Grants that ended, by reason: released by the holder, or lost (expired, \
             session_expired, session_closed, force_unlocked); applied on this node",
            m.releases.clone(),
        );
        r.register(
            "stale_writes_rejected",
            "Fenced writes refused because their token was older than the key's mark, by API \
             (grpc: Kv.FencedPut, resp: FENCE.SET), answered by this node as leader",
            m.stale_writes.clone(),
        );
        r.register(
            "resp_input_closed",
            "RESP connections closed for what they sent before it was parsed, by reason: \
             unauthenticated (over 10 arguments or a 16 KiB bulk before AUTH), query_buffer \
             (a request over 64 MiB), query_buffer_total (--resp-query-buffer-total)",
            m.resp_input_closed.clone(),
        );
        r.register(
            "grpc_unauthenticated_refused",
            "gRPC calls without a valid token refused before their body was read, by reason: \
             body_size (over 64 KiB), body_time (not sent within 10 s), calls \
             (--grpc-unauthenticated-calls reading theirs already)",
            m.grpc_unauthenticated_refused.clone(),
        );
        r.register(
            "metrics_connections_refused",
            "Connections to the metrics port (/metrics, /health, /ready) closed at once \
             because --metrics-max-connections were open",
            m.metrics_connections_refused.clone(),
        );
        r.register(
            "grpc_request_buffer_refused",
            "Calls on the client port refused because the node's incomplete requests were \
             over --grpc-request-buffer-total",
            m.grpc_request_buffer_refused.clone(),
        );
        r.register("raft_term", "Current Raft term", m.term.clone());
        r.register(
            "is_leader",
            "1 if this node is the leader",
            m.is_leader.clone(),
        );
        r.register(
            "alarm_corrupt",
            "1 if this member's divergence alarm is raised: its state differs from the \
             majority's and it serves no client requests (docs/operations.md)",
            m.alarm_corrupt.clone(),
        );
        r.register(
            "cluster_alarm_corrupt",
            "1 if the cluster-wide CORRUPT alarm is raised (the members' state digests had no \
             majority): every member refuses reads and writes until an operator disarms it \
             (docs/operations.md)",
            m.cluster_alarm_corrupt.clone(),
        );
        r.register(
            "apply_semantics",
            "The apply rules this node stamps on new entries as leader (2: deterministic \
             Lua, once every member runs it); 0 on a non-leader",
            m.apply_semantics.clone(),
        );
        r.register(
            "raft_last_log_index",
            "Index of the last entry in this node's log",
            m.last_log_index.clone(),
        );
        r.register(
            "raft_applied_index",
            "Index of the last entry applied to this node's state machine",
            m.applied_index.clone(),
        );
        r.register(
            "raft_snapshot_index",
            "Last index in this node's snapshot",
            m.snapshot_index.clone(),
        );
        r.register(
            "raft_committed_index",
            "Index of the last entry this node knows to be committed",
            m.committed_index.clone(),
        );
        r.register(
            "raft_purged_index",
            "Last index purged from this node's log",
            m.purged_index.clone(),
        );
        r.register(
            "store_revision",
            "Store revision applied on this node (every token issued is at most this)",
            m.revision.clone(),
        );
        r.register("locks_held", "Locks held", m.locks_held.clone());
        r.register(
            "lock_waiters",
            "Acquires queued on held locks",
            m.waiters.clone(),
        );
        r.register("sessions", "Open sessions", m.sessions.clone());
        r.register(
            "etcd_watchers",
            "etcd watches open on this node's Watch streams",
            m.etcd_watchers.clone(),
        );
        r.register(
            "etcd_watch_events",
            "Events this node sent to etcd watches",
            m.etcd_watch_events.clone(),
        );
        r.register(
            "grpc_requests",
            "Calls of the client gRPC API (fenced.v1) answered by this node, by method \
             (Lock.Acquire, ...) and gRPC status code (OK, Unavailable, ...)",
            m.grpc.requests(),
        );
        r.register(
            "grpc_request_duration_seconds",
            "Client gRPC API calls from request to the end of the response, by method \
             (streams: their lifetime)",
            m.grpc.durations(),
        );
        r.register(
            "resp_commands",
            "RESP commands served by this node, by command (the command table's name, or \
             unknown) and result (ok, err: an error reply)",
            m.resp.commands.clone(),
        );
        r.register(
            "resp_command_duration_seconds",
            "RESP commands from the start of serving to the reply, by command (a pipelined run \
             of reads or writes shares one barrier or log entry and counts the run's time)",
            m.resp.durations.clone(),
        );
        r.register(
            "wal_fsync_duration_seconds",
            "Each fdatasync of the write-ahead log (one per group commit)",
            m.wal_fsync.clone(),
        );
        r.register(
            "wal_append_duration_seconds",
            "Log appends from the append call to durable (written and fsynced)",
            m.wal_append.clone(),
        );
        r.register(
            "snapshot",
            "Snapshots built on this node",
            m.snapshots.clone(),
        );
        r.register(
            "snapshot_bytes",
            "Size of the last snapshot built on this node",
            m.snapshot_bytes.clone(),
        );
        r.register(
            "snapshot_duration_seconds",
            "Time to write and install a snapshot built on this node",
            m.snapshot_seconds.clone(),
        );
        r.register(
            "peer_round_trip_seconds",
            "Heartbeat (empty AppendEntries) round trips from this node as leader, by peer id",
            m.peer_rtt.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Read the committed index from `log` at each scrape (a reader, not the store: the store
    /// holds these metrics as its observer).
    pub fn read_log(&self, log: fenced_storage::CommittedIndex) {
        let _ = self.log.set(log);
    }

    /// The tower layer that counts and times client gRPC calls.
    pub fn grpc_layer(&self) -> grpc::GrpcMetricsLayer {
        grpc::GrpcMetricsLayer::new(self.grpc.clone())
    }

    /// Count what the state machine reports (every node applies every entry).
    /// The etcd watch gauge: `delta` watches opened (positive) or closed (negative).
    pub fn etcd_watchers(&self, delta: i64) {
        self.etcd_watchers.inc_by(delta);
    }

    /// `n` events sent to etcd watches.
    pub fn etcd_watch_events(&self, n: usize) {
        self.etcd_watch_events.inc_by(n as u64);
    }

    pub fn observe_events(&self, events: &[Event]) {
        for e in events {
            match e {
                Event::WaiterGranted { .. } => {
                    self.waiter_grants.inc();
                }
                Event::WaiterGaveUp { .. } => {
                    self.waiter_gave_up.inc();
                }
                Event::LockReleased { reason, .. } => {
                    let reason = match reason {
                        ReleaseReason::Released => "released",
                        ReleaseReason::Expired => "expired",
                        ReleaseReason::SessionExpired => "session_expired",
                        ReleaseReason::SessionClosed => "session_closed",
                        ReleaseReason::ForceUnlocked => "force_unlocked",
                    };
                    self.releases
                        .get_or_create(&Reason {
                            reason: reason.into(),
                        })
                        .inc();
                }
                Event::Kv(_) | Event::EtcdChanged { .. } => {}
            }
        }
    }

    /// Count the answers of an entry this node proposed as leader.
    pub fn observe_responses(&self, responses: &[Response]) {
        for r in responses {
            match r {
                Response::Granted { .. } => {
                    self.grants.inc();
                }
                Response::Fenced {
                    accepted: false, ..
                } => {
                    self.stale("grpc");
                }
                Response::Kv(k) => {
                    for reply in &k.replies {
                        if matches!(reply, fenced_core::kv::Reply::Error(e) if e.starts_with("STALE "))
                        {
                            self.stale("resp");
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn stale(&self, via: &str) {
        self.stale_writes
            .get_or_create(&Via { via: via.into() })
            .inc();
    }

    /// The text exposition, with the gauges read from `node` now.
    pub fn render(&self, node: &Node) -> String {
        {
            let m = node.raft().metrics().borrow().clone();
            self.term.set(m.current_term as i64);
            self.is_leader
                .set(i64::from(m.state == openraft::ServerState::Leader));
            self.apply_semantics
                .set(if m.state == openraft::ServerState::Leader {
                    i64::from(node.stamp_semantics().0)
                } else {
                    0
                });
            self.last_log_index
                .set(m.last_log_index.unwrap_or(0) as i64);
            self.applied_index
                .set(m.last_applied.map_or(0, |l| l.index) as i64);
            self.snapshot_index
                .set(m.snapshot.map_or(0, |l| l.index) as i64);
            self.purged_index
                .set(m.purged.map_or(0, |l| l.index) as i64);
        }
        if let Some(log) = self.log.get() {
            self.committed_index.set(log.index().unwrap_or(0) as i64);
        }
        let (revision, locks, waiters, sessions, cluster_alarm) = node.local(|sm| {
            let waiters: usize = sm.locks().map(|l| sm.waiter_count(&l.name)).sum();
            let alarm = sm.cluster_alarm().is_some();
            (
                sm.revision(),
                sm.lock_count(),
                waiters,
                sm.session_count(),
                alarm,
            )
        });
        self.alarm_corrupt.set(i64::from(node.alarm().is_some()));
        self.cluster_alarm_corrupt.set(i64::from(cluster_alarm));
        self.revision.set(revision as i64);
        self.locks_held.set(locks as i64);
        self.waiters.set(waiters as i64);
        self.sessions.set(sessions as i64);
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::warn!("encoding metrics: {e}");
        }
        out
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Via {
    via: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MethodCode {
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MethodLabel {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandResult {
    command: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabel {
    command: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Peer {
    peer: u64,
}
