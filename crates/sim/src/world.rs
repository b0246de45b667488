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
    /// Most requests in one forwarded batch (the `forward_max_items` test hook; `None`:
    /// production's 1,024).
    pub forward_max_items: Option<usize>,
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
    net: Arc<Net>,
    trace: Trace,
    slots: RefCell<BTreeMap<u64, Slot>>,
    /// Every node's view of the leader over time (for the expiry checker's quiet rule).
    views: Rc<RefCell<Leadership>>,
}

impl Cluster {
    pub fn new(spec: ClusterSpec, root: &std::path::Path, net: Arc<Net>, trace: Trace) -> Cluster {
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

    /// Node `id`'s configuration (what it starts with).
    pub fn config(&self, id: u64) -> NodeConfig {
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
        cfg.test_hooks.forward_max_items = self.inner.spec.forward_max_items;
        if let Some((node, index)) = self.inner.spec.diverge {
            if node == id {
                cfg.test_hooks.diverge_at = Some(index);
            }
        }
        cfg
    }

    /// Start node `id` (a restart after a crash opens the same data dir).
    pub async fn start(&self, id: u64) {
        if self.is_up(id) {
            return;
        }
        let cfg = self.config(id);
        let seams = fenced_server::run::Seams {
            links: Some(self.inner.net.links(id)),
            io: fenced_storage::Io::Inline,
            listen: false,
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
                if let Some(s) = self.inner.slots.borrow_mut().get_mut(&id) {
                    s.running = Some(running);
                    s.watcher = Some(watcher);
                }
            }
            Err(e) => {
                // The data dirs' root differs between runs: keep it out of the trace.
                let why = e.to_string().replace(&*self.inner.root, "<data>");
                self.inner
                    .trace
                    .line(&format!("n{id}"), format!("REFUSED TO START: {why}"));
                if let Some(s) = self.inner.slots.borrow_mut().get_mut(&id) {
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
            slot.life.send_modify(|l| *l += 1);
            r
        };
        self.inner.net.down(id);
        self.view_lost(id);
        self.inner.trace.line(&format!("n{id}"), "crashed");
        running.crash().await;
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
