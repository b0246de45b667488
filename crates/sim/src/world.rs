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

use fenced_fs::SimFs;
use fenced_server::clock::SimClock;
use fenced_server::config::ClusterState;
use fenced_server::{Node, NodeConfig, Running};
use tokio::sync::watch;

use crate::expiry::Leadership;
use crate::net::{Endpoint, Net};
use crate::trace::Trace;

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
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            nodes: 3,
            snapshot_logs: 300,
            keep_logs: 50,
            digest_interval: 100,
            diverge: None,
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
    /// Waits for the node to stop on a fatal error (its process exits; restarted later).
    fatal: Option<tokio::task::JoinHandle<()>>,
    /// The node's disk: it outlives the node's crashes, not its power losses.
    fs: SimFs,
    /// A byte of its files rotted since it last started: a refusal is expected.
    rotted: bool,
    /// Left down for the rest of the run (it refused its damaged dir, or was retired).
    given_up: bool,
}

/// How long the simulated supervisor waits before restarting a node whose process exited on
/// a fatal error (systemd's `RestartSec`).
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// The cluster of one run. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Rc<Inner>,
}

struct Inner {
    spec: ClusterSpec,
    /// The data dirs' root, as text.
    root: String,
    net: Arc<Net>,
    trace: Trace,
    slots: RefCell<BTreeMap<u64, Slot>>,
    /// Every node's view of the leader over time (for the expiry checker's quiet rule).
    views: Rc<RefCell<Leadership>>,
}

impl Cluster {
    /// `seed` draws the disks' faults.
    pub fn new(
        spec: ClusterSpec,
        root: &std::path::Path,
        net: Arc<Net>,
        trace: Trace,
        seed: u64,
    ) -> Cluster {
        let mut slots = BTreeMap::new();
        for id in 1..=spec.nodes {
            let addr = format!("10.0.0.{id}:7380");
            net.add(id, &addr);
            let (life, _) = watch::channel(0);
            slots.insert(
                id,
                Slot {
                    addr,
                    dir: root.join(format!("n{id}")),
                    clock: SimClock::new(START_UNIX_MS),
                    running: None,
                    life,
                    refusals: Vec::new(),
                    watcher: None,
                    fatal: None,
                    fs: SimFs::new(root, seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                    rotted: false,
                    given_up: false,
                },
            );
        }
        Cluster {
            inner: Rc::new(Inner {
                spec,
                root: root.display().to_string(),
                net,
                trace,
                slots: RefCell::new(slots),
                views: Rc::new(RefCell::new(Leadership::default())),
            }),
        }
    }

    pub fn ids(&self) -> Vec<u64> {
        self.inner.slots.borrow().keys().copied().collect()
    }

    /// The nodes not given up on (see [`Cluster::given_up`]): those that must serve and agree
    /// once the faults end.
    pub fn serving_ids(&self) -> Vec<u64> {
        self.inner
            .slots
            .borrow()
            .iter()
            .filter(|(_, s)| !s.given_up)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Nodes left down for the rest of the run, and why.
    pub fn given_up(&self) -> Vec<u64> {
        self.inner
            .slots
            .borrow()
            .iter()
            .filter(|(_, s)| s.given_up)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Node `id`'s simulated disk.
    pub fn fs(&self, id: u64) -> Option<SimFs> {
        self.inner.slots.borrow().get(&id).map(|s| s.fs.clone())
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

    pub fn clock(&self, id: u64) -> Option<SimClock> {
        self.inner.slots.borrow().get(&id).map(|s| s.clock.clone())
    }

    fn config(&self, id: u64) -> NodeConfig {
        let slots = self.inner.slots.borrow();
        let slot = &slots[&id];
        let mut cfg = NodeConfig::new(
            id,
            slot.dir.clone(),
            slot.addr.clone(),
            format!("10.0.0.{id}:7379"),
        );
        cfg.initial_cluster = slots.iter().map(|(i, s)| (*i, s.addr.clone())).collect();
        cfg.initial_cluster_state = Some(ClusterState::New);
        cfg.snapshot_logs = self.inner.spec.snapshot_logs;
        cfg.keep_logs = self.inner.spec.keep_logs;
        cfg.digest_interval = self.inner.spec.digest_interval;
        cfg.clock = slot.clock.node_clock();
        if let Some((node, index)) = self.inner.spec.diverge {
            if node == id {
                cfg.test_hooks.diverge_at = Some(index);
            }
        }
        cfg
    }

    /// Start node `id` (a restart after a crash opens the same data dir).
    pub async fn start(&self, id: u64) {
        let given_up = self
            .inner
            .slots
            .borrow()
            .get(&id)
            .map_or(true, |s| s.given_up);
        if self.is_up(id) || given_up {
            return;
        }
        let fs = self.fs(id).map(|f| Arc::new(f) as Arc<dyn fenced_fs::Fs>);
        let cfg = self.config(id);
        let seams = fenced_server::run::Seams {
            links: Some(self.inner.net.links(id)),
            io: fenced_storage::Io::Inline,
            listen: false,
            fs: fs.unwrap_or_else(fenced_fs::os),
        };
        match fenced_server::run::start_with(cfg, seams).await {
            Ok(running) => {
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
                let fatal = tokio::task::spawn_local(watch_fatal(self.clone(), id, node.clone()));
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
                let failing = s.fs.faults();
                if failing.fsync_error > 0.0 || failing.full {
                    // An I/O error on a failing disk, not a refusal of the dir: the
                    // supervisor tries again (after the fault, it must start).
                    self.inner.trace.line(
                        &format!("n{id}"),
                        format!("failed to start on a failing disk: {why}; retried later"),
                    );
                    drop(slots);
                    let cluster = self.clone();
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep(RESTART_AFTER).await;
                        cluster.start(id).await;
                    });
                } else if s.rotted {
                    self.inner.trace.line(
                        &format!("n{id}"),
                        format!("refused its rotten dir, as it should: {why}; left down"),
                    );
                    s.given_up = true;
                } else {
                    self.inner
                        .trace
                        .line(&format!("n{id}"), format!("REFUSED TO START: {why}"));
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
        if let Some(fs) = self.fs(id) {
            let lost = fs.power_loss();
            self.inner
                .trace
                .line(&format!("n{id}"), format!("lost power: {lost:?}"));
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

/// When node `id` stops on a fatal error (a failed disk write, retirement), its process
/// exits, as `fenced serve`'s does; the supervisor starts it again after [`RESTART_AFTER`],
/// unless it was retired (it would only retire again).
async fn watch_fatal(cluster: Cluster, id: u64, node: Node) {
    let why = node.fatal().await;
    let why = why.replace(&*cluster.inner.root, "<data>");
    cluster
        .trace()
        .line(&format!("n{id}"), format!("stops on a fatal error: {why}"));
    let retired = why.starts_with("this member is retired");
    // Not from this task: crashing the node aborts it.
    tokio::task::spawn_local(async move {
        cluster.crash(id).await;
        if retired {
            if let Some(s) = cluster.inner.slots.borrow_mut().get_mut(&id) {
                s.given_up = true;
            }
            return;
        }
        tokio::time::sleep(RESTART_AFTER).await;
        cluster.start(id).await;
    });
}

/// Write node `id`'s view of the leader into the trace whenever it changes.
async fn watch_leader(
    id: u64,
    mut metrics: tokio::sync::watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
    trace: Trace,
    views: Rc<RefCell<Leadership>>,
) {
    let mut seen = None;
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            (m.current_term, m.current_leader)
        };
        if seen != Some(now) {
            seen = Some(now);
            let (term, leader) = now;
            views
                .borrow_mut()
                .record(trace.now_ns(), id, Some((term, leader)));
            let who = leader.map_or("none".to_owned(), |l| format!("n{l}"));
            trace.line(&format!("n{id}"), format!("term {term}, leader {who}"));
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
