//! The simulated cluster: N real fenced nodes (`fenced_server::run::start_with`, the code
//! `fenced serve` runs, minus its listeners) in this process, each with its own data dir,
//! simulated clock and links into the simulated network; started, crashed (no `Drop`-time
//! I/O: the node's tasks stop, its files stay as they were), restarted and paused by the
//! faults, and called by the simulated clients as a front end would call them.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use fenced_fs::{Fs, SimFs};
use fenced_server::clock::SimClock;
use fenced_server::config::ClusterState;
use fenced_server::{Node, NodeConfig, Running};
use tokio::sync::watch;

use crate::expiry::Leadership;
use crate::net::{Endpoint, Net};
use crate::trace::Trace;

mod watchers;
use watchers::{watch_fatal, watch_leader};

/// Why a client's call did not reach an answer.
#[derive(Debug)]
pub enum Gone {
    /// The node is down: the call was refused (certainly not applied).
    Down,
    /// The node crashed while the call was in it (maybe applied).
    Lost,
}

/// The wall clock every simulated node starts with (2023-11-14): fixed, so log time — and
/// everything stamped with it — is the same in every run of a seed.
pub const START_UNIX_MS: u64 = 1_700_000_000_000;

/// How the nodes are configured.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub nodes: u64,
    /// Entries between snapshots (small, so snapshots and their installation happen).
    pub snapshot_logs: u64,
    pub keep_logs: u64,
    /// `--digest-interval`: the divergence alarm compares states this often.
    pub digest_interval: u64,
    /// Test-only: node and log index from which that node's state diverges (the
    /// `--unsafe-test-diverge-at` hook), to show the agreement checker failing.
    pub diverge: Option<(u64, u64)>,
    /// Most requests in one forwarded batch (the `forward_max_items` test hook; `None`:
    /// production's 1,024).
    pub forward_max_items: Option<usize>,
    /// Most log entries in one replication message (`NodeConfig::raft_max_payload_entries`;
    /// `None`: production's, openraft's 300). See `walfind.rs`.
    pub raft_max_payload: Option<u64>,
    /// Where the nodes' disk work runs: production's flusher and recorder as tasks (the
    /// default), or inline (every seed recorded before issue 40).
    pub disk_io: DiskIo,
}

/// Where a simulated node's disk work runs (`fenced_storage::Io`, docs/simulation.md, "What
/// runs inline").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiskIo {
    /// `Io::Inline`: an append syncs before it returns and a round records the log's end
    /// before it acknowledges. The mode of every seed recorded before issue 40; a run in it
    /// keeps the fingerprint it had then (`crate::knobs`).
    Inline,
    /// `Io::Tasks`: production's group commit and recorder (`wal::Flusher`) as tasks, each
    /// `fdatasync` (and each write production runs in `spawn_blocking`) completing after a
    /// latency drawn from the seed, so an append is acknowledged after it returns and
    /// openraft's pending flush is open while the next message is handled.
    #[default]
    Tasks,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            nodes: 3,
            snapshot_logs: 300,
            keep_logs: 50,
            digest_interval: 100,
            diverge: None,
            forward_max_items: None,
            raft_max_payload: None,
            disk_io: DiskIo::Tasks,
        }
    }
}

struct Slot {
    addr: String,
    dir: PathBuf,
    clock: SimClock,
    running: Option<Running>,
    /// Bumped at every crash: a client's call in flight learns it lost its node.
    life: watch::Sender<u64>,
    /// Start failures (a data dir the node refuses): each is an anomaly.
    refusals: Vec<String>,
    /// Writes this node's leader changes into the trace while it runs.
    watcher: Option<tokio::task::JoinHandle<()>>,
    /// Stops the node when it stops itself (`Node::fatal`: retired, or Raft stopped), as
    /// `fenced serve` exits then.
    fatal: Option<tokio::task::JoinHandle<()>>,
    /// Started as a joining member (`fenced serve --join`), not with `--initial-cluster`.
    join: bool,
    /// Its data dir was wiped and it restarted unchanged: a refusal or a retirement is
    /// expected (`crate::membership`).
    wiped: bool,
    /// Why it stopped itself, if it did: it is not restarted.
    stopped: Option<String>,
    /// Removed from the cluster (or never made it in): no longer one of [`Cluster::ids`].
    gone: bool,
    /// Refusals and retirements of a wiped member: expected, not anomalies.
    expected: Vec<String>,
    /// The node's disk: it outlives the node's crashes, not its power losses.
    fs: SimFs,
    /// A byte of its files rotted since it last started: a refusal is expected.
    rotted: bool,
    /// Left down for the rest of the run: it refused its rotten dir.
    given_up: bool,
    /// The running (or starting) process's disk timing, with [`DiskIo::Tasks`]: killed when
    /// the process dies, a new one at every start.
    task_io: Option<Arc<fenced_storage::TaskIo>>,
    /// Starts so far: each start's disk latencies are drawn from a seed of its own.
    starts: u64,
}

/// How long the simulated supervisor waits before restarting a node whose process exited on
/// a disk error (systemd's `RestartSec`).
const RESTART_AFTER: Duration = Duration::from_secs(1);

impl Slot {
    fn new(addr: String, dir: PathBuf, join: bool, fs: SimFs) -> Slot {
        let (life, _) = watch::channel(0);
        Slot {
            addr,
            dir,
            clock: SimClock::new(START_UNIX_MS),
            running: None,
            life,
            refusals: Vec::new(),
            watcher: None,
            fatal: None,
            join,
            wiped: false,
            stopped: None,
            gone: false,
            expected: Vec::new(),
            fs,
            rotted: false,
            given_up: false,
            task_io: None,
            starts: 0,
        }
    }

    /// The node's process died (crashed, stopped itself, failed to start): its flusher,
    /// recorder and pending writes do nothing more.
    fn kill_io(&mut self) {
        if let Some(t) = self.task_io.take() {
            t.kill();
        }
    }
}

/// The cluster of one run. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Rc<Inner>,
}

struct Inner {
    spec: ClusterSpec,
    /// The data dirs' root, as text.
    root: String,
    /// The data dirs' root.
    root_dir: PathBuf,
    /// `--initial-cluster` of the members that start without `--join` (changed by a restore).
    initial: RefCell<BTreeMap<u64, String>>,
    /// The simulated operator's state (`crate::membership`).
    operator: crate::membership::Operator,
    net: Arc<Net>,
    trace: Trace,
    slots: RefCell<BTreeMap<u64, Slot>>,
    /// Every node's view of the leader over time (for the expiry checker's quiet rule).
    views: Rc<RefCell<Leadership>>,
    /// Draws the disks' faults.
    disk_seed: u64,
    /// The logs' terms after every start (`crate::walcheck`).
    log_terms: crate::walcheck::LogTerms,
}

impl Inner {
    /// A new, empty disk for node `id` (its `n`th).
    fn disk(&self, id: u64, n: u64) -> SimFs {
        disk(&self.root_dir, self.disk_seed, id, n)
    }
}

fn disk(root: &std::path::Path, seed: u64, id: u64, n: u64) -> SimFs {
    SimFs::new(
        root,
        seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
    )
}

impl Cluster {
    /// `disk_seed` draws the disks' faults.
    pub fn new(
        spec: ClusterSpec,
        root: &std::path::Path,
        net: Arc<Net>,
        trace: Trace,
        disk_seed: u64,
    ) -> Cluster {
        let mut slots = BTreeMap::new();
        for id in 1..=spec.nodes {
            let addr = format!("10.0.0.{id}:7380");
            net.add(id, &addr);
            let fs = disk(root, disk_seed, id, 0);
            slots.insert(id, Slot::new(addr, root.join(format!("n{id}")), false, fs));
        }
        let initial = slots.iter().map(|(i, s)| (*i, s.addr.clone())).collect();
        Cluster {
            inner: Rc::new(Inner {
                operator: crate::membership::Operator::new(spec.nodes + 1),
                spec,
                root: root.display().to_string(),
                root_dir: root.to_owned(),
                initial: RefCell::new(initial),
                net,
                trace,
                slots: RefCell::new(slots),
                views: Rc::new(RefCell::new(Leadership::default())),
                disk_seed,
                log_terms: crate::walcheck::LogTerms::default(),
            }),
        }
    }

    /// The members: every node started, and not removed since.
    pub fn ids(&self) -> Vec<u64> {
        self.inner
            .slots
            .borrow()
            .iter()
            .filter(|(_, s)| !s.gone)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Every node the run had, removed ones included.
    pub fn all_ids(&self) -> Vec<u64> {
        self.inner.slots.borrow().keys().copied().collect()
    }

    /// The members not given up on (see [`Cluster::given_up`]): those that must serve and
    /// agree once the faults end.
    pub fn serving_ids(&self) -> Vec<u64> {
        self.inner
            .slots
            .borrow()
            .iter()
            .filter(|(_, s)| !s.gone && !s.given_up)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Members that lost their data (wiped, not removed yet), or whose disk holds a rotten
    /// byte they have not started from yet, or that gave up on it. The disk faults damage
    /// one member at a time, or the rest could lose their majority.
    pub fn damaged(&self) -> Vec<u64> {
        self.inner
            .slots
            .borrow()
            .iter()
            .filter(|(_, s)| !s.gone && (s.given_up || s.rotted || s.wiped))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Members left down for the rest of the run: they refused their rotten dirs.
    pub fn given_up(&self) -> Vec<u64> {
        self.inner
            .slots
            .borrow()
            .iter()
            .filter(|(_, s)| !s.gone && s.given_up)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Node `id`'s simulated disk.
    pub fn fs(&self, id: u64) -> Option<SimFs> {
        self.inner.slots.borrow().get(&id).map(|s| s.fs.clone())
    }

    /// The `log-terms` checks of this run.
    pub fn log_terms(&self) -> &crate::walcheck::LogTerms {
        &self.inner.log_terms
    }

    pub fn spec(&self) -> &ClusterSpec {
        &self.inner.spec
    }

    pub fn root(&self) -> &std::path::Path {
        &self.inner.root_dir
    }

    pub fn operator(&self) -> &crate::membership::Operator {
        &self.inner.operator
    }

    /// A new node `id` that joins a running cluster (`fenced serve --join`), with an empty
    /// data dir, down until started.
    pub fn add_joining(&self, id: u64) -> String {
        let addr = format!("10.0.0.{id}:7380");
        self.inner.net.add(id, &addr);
        self.inner.slots.borrow_mut().insert(
            id,
            Slot::new(
                addr.clone(),
                self.inner.root_dir.join(format!("n{id}")),
                true,
                self.inner.disk(id, 0),
            ),
        );
        addr
    }

    /// Node `id` is no member any more (removed, or never added): it is not started again.
    pub fn set_gone(&self, id: u64) {
        if let Some(s) = self.inner.slots.borrow_mut().get_mut(&id) {
            s.gone = true;
        }
    }

    /// Delete node `id`'s data dir (it must be down): an operator's mistake, or a lost disk
    /// (the node gets a new, empty one).
    pub fn wipe(&self, id: u64) {
        let mut slots = self.inner.slots.borrow_mut();
        if let Some(s) = slots.get_mut(&id) {
            s.fs = self.inner.disk(id, 1);
            s.wiped = true;
            s.stopped = None;
        }
        drop(slots);
        self.inner.trace.line(&format!("n{id}"), "data dir wiped");
    }

    pub fn is_wiped(&self, id: u64) -> bool {
        self.inner.slots.borrow().get(&id).is_some_and(|s| s.wiped)
    }

    /// Why node `id` stopped itself (retired, Raft stopped), if it did.
    pub fn stopped(&self, id: u64) -> Option<String> {
        self.inner
            .slots
            .borrow()
            .get(&id)
            .and_then(|s| s.stopped.clone())
    }

    /// Expected refusals and retirements so far (of wiped members), per node.
    pub fn expected(&self) -> Vec<(u64, String)> {
        self.inner
            .slots
            .borrow()
            .iter()
            .flat_map(|(id, s)| s.expected.iter().map(move |r| (*id, r.clone())))
            .collect()
    }

    /// Node `id`'s data dir.
    pub fn dir(&self, id: u64) -> Option<PathBuf> {
        self.inner.slots.borrow().get(&id).map(|s| s.dir.clone())
    }

    pub fn addr(&self, id: u64) -> Option<String> {
        self.inner.slots.borrow().get(&id).map(|s| s.addr.clone())
    }

    /// After a restore: `members` start as a new cluster with this `--initial-cluster`, from
    /// their restored data dirs.
    pub fn restored(&self, members: &BTreeMap<u64, String>) {
        *self.inner.initial.borrow_mut() = members.clone();
        for (id, s) in self.inner.slots.borrow_mut().iter_mut() {
            s.gone = !members.contains_key(id);
            s.join = false;
            s.wiped = false;
            s.stopped = None;
            s.rotted = false;
            s.given_up = false;
        }
    }

    pub fn net(&self) -> &Arc<Net> {
        &self.inner.net
    }

    pub fn trace(&self) -> &Trace {
        &self.inner.trace
    }

    /// Every node's view of the leader so far: when it changed, and when a node went down.
    pub fn leadership(&self) -> Leadership {
        self.inner.views.borrow().clone()
    }

    /// Node `id` is down from now on: it has no view of the leader.
    fn view_lost(&self, id: u64) {
        let now = self.inner.trace.now_ns();
        self.inner.views.borrow_mut().record(now, id, None);
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.inner
            .slots
            .borrow()
            .get(&id)
            .is_some_and(|s| s.running.is_some())
    }

    /// The running node `id`, if up.
    pub fn node(&self, id: u64) -> Option<Node> {
        self.inner
            .slots
            .borrow()
            .get(&id)
            .and_then(|s| s.running.as_ref().map(|r| r.node.clone()))
    }

    /// The running node `id` and a receiver that changes when it crashes, if up.
    pub fn node_life(&self, id: u64) -> Option<(Node, watch::Receiver<u64>)> {
        let slots = self.inner.slots.borrow();
        let slot = slots.get(&id)?;
        let node = slot.running.as_ref()?.node.clone();
        let mut life = slot.life.subscribe();
        life.mark_unchanged();
        Some((node, life))
    }

    pub fn clock(&self, id: u64) -> Option<SimClock> {
        self.inner.slots.borrow().get(&id).map(|s| s.clock.clone())
    }

    /// Node `id`'s command line: `--initial-cluster … --initial-cluster-state new` for the
    /// members the cluster started (or was restored) with, `--join` for those added later
    /// (then `Err` if the binary's `--join` lookup would stop it before it starts).
    fn command_line(&self, id: u64) -> Result<NodeConfig, String> {
        let (cfg, join) = {
            let slots = self.inner.slots.borrow();
            let slot = &slots[&id];
            let cfg = NodeConfig::new(
                id,
                slot.dir.clone(),
                slot.addr.clone(),
                format!("10.0.0.{id}:7379"),
            );
            (cfg, slot.join)
        };
        if join {
            return self.join_config(id, cfg);
        }
        let mut cfg = cfg;
        cfg.initial_cluster = self.inner.initial.borrow().clone();
        cfg.initial_cluster_state = Some(ClusterState::New);
        Ok(self.tune(id, cfg))
    }

    /// Node `id`'s configuration as its front ends see it (without its cluster flags).
    pub fn config(&self, id: u64) -> NodeConfig {
        let cfg = {
            let slots = self.inner.slots.borrow();
            let slot = &slots[&id];
            NodeConfig::new(
                id,
                slot.dir.clone(),
                slot.addr.clone(),
                format!("10.0.0.{id}:7379"),
            )
        };
        self.tune(id, cfg)
    }

    fn join_config(&self, id: u64, mut cfg: NodeConfig) -> Result<NodeConfig, String> {
        cfg.joining = true;
        cfg.join = crate::membership::join_lookup(self, id, &cfg)?;
        Ok(self.tune(id, cfg))
    }

    fn tune(&self, id: u64, mut cfg: NodeConfig) -> NodeConfig {
        let slots = self.inner.slots.borrow();
        let slot = &slots[&id];
        cfg.snapshot_logs = self.inner.spec.snapshot_logs;
        cfg.keep_logs = self.inner.spec.keep_logs;
        cfg.digest_interval = self.inner.spec.digest_interval;
        cfg.clock = slot.clock.node_clock();
        cfg.test_hooks.forward_max_items = self.inner.spec.forward_max_items;
        if let Some(n) = self.inner.spec.raft_max_payload {
            cfg.raft_max_payload_entries = n;
        }
        if let Some((node, index)) = self.inner.spec.diverge {
            if node == id {
                cfg.test_hooks.diverge_at = Some(index);
            }
        }
        cfg
    }

    /// The disk mode of node `id`'s next process: with [`DiskIo::Tasks`] a fresh
    /// [`fenced_storage::TaskIo`] whose latencies come from the disks' seed, the node and its
    /// start count (not from the run's generator, whose draws stay as they were).
    fn start_io(&self, id: u64) -> fenced_storage::Io {
        if self.inner.spec.disk_io == DiskIo::Inline {
            return fenced_storage::Io::Inline;
        }
        let mut slots = self.inner.slots.borrow_mut();
        let Some(s) = slots.get_mut(&id) else {
            return fenced_storage::Io::Inline;
        };
        s.kill_io();
        s.starts += 1;
        let seed = self.inner.disk_seed.rotate_left(29)
            ^ id.wrapping_mul(0xA24B_AED4_963E_E407)
            ^ s.starts.wrapping_mul(0x9FB2_1C65_1E98_DF25);
        let t = fenced_storage::TaskIo::new(seed);
        s.task_io = Some(t.clone());
        fenced_storage::Io::Tasks(t)
    }

    /// Start node `id` (a restart after a crash opens the same data dir).
    pub async fn start(&self, id: u64) {
        if self.is_up(id) {
            return;
        }
        // A removed node, or one that stopped itself (retired): the operator does not start it.
        let skip = self
            .inner
            .slots
            .borrow()
            .get(&id)
            .is_none_or(|s| s.gone || s.stopped.is_some() || s.given_up);
        if skip {
            return;
        }
        let fs: Option<Arc<dyn Fs>> = self.fs(id).map(|f| Arc::new(f) as Arc<dyn Fs>);
        let cfg = match self.command_line(id) {
            Ok(cfg) => cfg,
            Err(why) => {
                // `fenced serve --join` stops before the node starts (not the node refusing
                // its data dir): the supervisor tries again, as systemd's `Restart=` does.
                self.inner.trace.line(
                    &format!("n{id}"),
                    format!("not started: {why}; retried in {RESTART_AFTER:?}"),
                );
                let cluster = self.clone();
                tokio::task::spawn_local(async move {
                    tokio::time::sleep(RESTART_AFTER).await;
                    cluster.start(id).await;
                });
                return;
            }
        };
        let io = self.start_io(id);
        let seams = fenced_server::run::Seams {
            links: Some(self.inner.net.links(id)),
            io,
            listen: false,
            fs: fs.unwrap_or_else(fenced_fs::os),
        };
        match fenced_server::run::start_with(cfg, seams).await {
            Ok(running) => {
                if let (Some(fs), Some(dir)) = (self.fs(id), self.dir(id)) {
                    if let Some(why) = self.inner.log_terms.started(id, &fs, &dir) {
                        self.inner.trace.line(&format!("n{id}"), why);
                    }
                }
                let node = running.node.clone();
                self.inner.net.up(
                    id,
                    Endpoint {
                        raft: Arc::new(fenced_network::RaftService::new(
                            node.raft().clone(),
                            node.gate().clone(),
                        )),
                        forward: Arc::new(fenced_server::forward::server::Leader::new(
                            node.clone(),
                        )),
                    },
                );
                self.inner.trace.line(&format!("n{id}"), "started");
                let watcher = tokio::task::spawn_local(watch_leader(
                    id,
                    node.raft().metrics(),
                    self.inner.trace.clone(),
                    self.inner.views.clone(),
                ));
                let fatal = tokio::task::spawn_local(watch_fatal(id, node, self.clone()));
                if let Some(s) = self.inner.slots.borrow_mut().get_mut(&id) {
                    s.running = Some(running);
                    s.watcher = Some(watcher);
                    s.fatal = Some(fatal);
                    s.rotted = false;
                }
            }
            Err(e) => {
                // The data dirs' root differs between runs: keep it out of the trace.
                let why = e.to_string().replace(&*self.inner.root, "<data>");
                let mut slots = self.inner.slots.borrow_mut();
                let Some(s) = slots.get_mut(&id) else {
                    return;
                };
                s.kill_io();
                let failing = s.fs.faults();
                let line = |what: String| self.inner.trace.line(&format!("n{id}"), what);
                if failing.fsync_error > 0.0 || failing.full || s.fs.is_dead() {
                    // An I/O error on a failing disk, not a refusal of the dir: the
                    // supervisor tries again (after the fault, it must start).
                    line(format!(
                        "failed to start on a failing disk: {why}; retried later"
                    ));
                    drop(slots);
                    let cluster = self.clone();
                    cluster.lost_power_if_dead(id);
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep(RESTART_AFTER).await;
                        cluster.start(id).await;
                    });
                } else if s.rotted {
                    line(format!(
                        "refused its rotten dir, as it should: {why}; left down"
                    ));
                    s.given_up = true;
                } else if s.wiped {
                    // A wiped member refused (e.g. `--join` of a voter with an empty dir):
                    // what the docs promise, not an anomaly.
                    line(format!("refused to start: {why}"));
                    s.expected.push(format!("refused to start: {why}"));
                } else {
                    line(format!("REFUSED TO START: {why}"));
                    s.refusals.push(why);
                }
            }
        }
    }

    /// Crash node `id`: it vanishes from the network at once, its calls in flight are lost,
    /// its tasks stop (Raft's included) without any shutdown work, its files stay as they are.
    pub async fn crash(&self, id: u64) {
        let running = {
            let mut slots = self.inner.slots.borrow_mut();
            let Some(slot) = slots.get_mut(&id) else {
                return;
            };
            let Some(r) = slot.running.take() else {
                return;
            };
            if let Some(w) = slot.watcher.take() {
                w.abort();
            }
            if let Some(w) = slot.fatal.take() {
                w.abort();
            }
            slot.kill_io();
            slot.life.send_modify(|l| *l += 1);
            r
        };
        self.inner.net.down(id);
        self.view_lost(id);
        self.inner.trace.line(&format!("n{id}"), "crashed");
        running.crash().await;
    }

    /// Node `id`'s machine loses power: the node crashes and its disk keeps only what
    /// reached it ([`SimFs::power_loss`]).
    pub async fn power_loss(&self, id: u64) {
        self.crash(id).await;
        self.apply_power_loss(id, self.fs(id), "lost power");
    }

    /// If node `id`'s disk died ([`SimFs::lose_power_at_sync`]; the node is down), its machine
    /// lost power then: apply the loss.
    fn lost_power_if_dead(&self, id: u64) {
        let dead = self.fs(id).filter(SimFs::is_dead);
        self.apply_power_loss(id, dead, "lost power in the middle of its writes");
    }

    /// Node `id`'s disk `fs` (if any) keeps only what reached it; the trace says `what`.
    fn apply_power_loss(&self, id: u64, fs: Option<SimFs>, what: &str) {
        if let Some(fs) = fs {
            let lost = fs.power_loss();
            if let Some(dir) = self.dir(id) {
                self.inner.log_terms.lost_power(&fs, &dir);
            }
            self.inner
                .trace
                .line(&format!("n{id}"), format!("{what}: {lost:?}"));
        }
    }

    /// A bit of one synced byte of node `id`'s files rots (the node should be down).
    pub fn rot(&self, id: u64) {
        let mut slots = self.inner.slots.borrow_mut();
        let Some(s) = slots.get_mut(&id) else {
            return;
        };
        if let Some((file, at)) = s.fs.rot(&s.dir) {
            s.rotted = true;
            self.inner.trace.line(
                &format!("n{id}"),
                format!("byte {at} of {} rots", file.display()),
            );
        }
    }

    pub fn pause(&self, id: u64, paused: bool) {
        self.inner.net.set_paused(id, paused);
        let what = if paused { "paused" } else { "resumed" };
        self.inner.trace.line(&format!("n{id}"), what);
    }

    /// Start refusals so far, per node.
    pub fn refusals(&self) -> Vec<(u64, String)> {
        self.inner
            .slots
            .borrow()
            .iter()
            .flat_map(|(id, s)| s.refusals.iter().map(move |r| (*id, r.clone())))
            .collect()
    }

    /// Stop every node (at the end of a run), abruptly.
    pub async fn stop_all(&self) {
        for id in self.ids() {
            let running = self.inner.slots.borrow_mut().get_mut(&id).and_then(|s| {
                if let Some(w) = s.watcher.take() {
                    w.abort();
                }
                if let Some(w) = s.fatal.take() {
                    w.abort();
                }
                s.kill_io();
                s.running.take()
            });
            if let Some(r) = running {
                self.inner.net.down(id);
                self.view_lost(id);
                r.crash().await;
            }
        }
    }

    /// A client's call to node `id`: one hop there, `f` on the node (as a front end's handler
    /// runs it), one hop back. A paused node holds the call and its answer; a crash while the
    /// call is in the node loses it.
    pub async fn call<T, F, Fut>(&self, id: u64, f: F) -> Result<T, Gone>
    where
        F: FnOnce(Node) -> Fut,
        Fut: Future<Output = T>,
    {
        let net = self.inner.net.clone();
        tokio::time::sleep(net.hop()).await;
        net.unpaused(id).await;
        let (node, mut life) = {
            let slots = self.inner.slots.borrow();
            let Some(slot) = slots.get(&id) else {
                return Err(Gone::Down);
            };
            let Some(r) = &slot.running else {
                return Err(Gone::Down);
            };
            (r.node.clone(), slot.life.subscribe())
        };
        life.mark_unchanged();
        let answer = tokio::select! {
            biased;
            _ = life.changed() => return Err(Gone::Lost),
            a = f(node) => a,
        };
        net.unpaused(id).await;
        if life.has_changed().unwrap_or(true) {
            return Err(Gone::Lost);
        }
        tokio::time::sleep(net.hop()).await;
        Ok(answer)
    }

    /// The leader every up node agrees on, if any.
    pub fn leader(&self) -> Option<u64> {
        let mut seen = None;
        for id in self.ids() {
            let node = self.node(id)?;
            let l = node.raft().metrics().borrow().current_leader?;
            if seen.is_some_and(|s| s != l) {
                return None;
            }
            seen = Some(l);
        }
        seen.filter(|l| self.is_up(*l))
    }

    /// Wait (simulated time) until every node is up and agrees on a leader, or `within`
    /// passes.
    pub async fn settle(&self, within: Duration) -> Option<u64> {
        let until = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < until {
            if let Some(l) = self.leader() {
                return Some(l);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}
