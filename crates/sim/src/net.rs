//! The simulated network between the nodes: every node-to-node call (Raft's append-entries,
//! votes and snapshots; the forwarder's proposals, read-index rounds, checks and campaigns) is
//! one message the simulator carries from the caller's [`fenced_network::Links`] to the
//! target's real service object, and may delay, drop, duplicate or hold (a paused node) — the
//! answer too. Reordering follows from independent random delays.
//!
//! What the caller sees (the contract of `fenced_network::links`): a dropped message or
//! answer is never answered (the caller's own timeout fires, in simulated time); a call to a
//! node that is down is refused at once (`UNAVAILABLE`, a refused connection); a call made by a
//! crashed node's leftover task goes nowhere.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fenced_network::{Links, TransportError};
use fenced_proto::raft::forward_server::Forward;
use fenced_proto::raft::raft_server::Raft as RaftRpc;
use fenced_proto::raft::{
    AdminReply, AdminRequest, CampaignReply, CampaignRequest, CheckReply, CheckRequest,
    ProposeBatchReply, ProposeBatchRequest, ProposeReply, ProposeRequest, RaftReply, RaftRequest,
    ReadIndexReply, ReadIndexRequest,
};
use fenced_raft_types::NodeId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

type Reply<T> = Result<Response<T>, Status>;
type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A node's services, as its peers reach them.
#[derive(Clone)]
pub struct Endpoint {
    pub raft: Arc<dyn RaftRpc>,
    pub forward: Arc<dyn Forward>,
}

/// Message noise on every link: a fault sets it for a while.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Noise {
    /// Chance that a message (or its answer) is lost.
    pub loss: f64,
    /// Chance that a message is delivered twice.
    pub dup: f64,
    /// Delay of one hop, ms (uniform).
    pub delay_ms: (f64, f64),
}

impl Noise {
    pub const QUIET: Noise = Noise {
        loss: 0.0,
        dup: 0.0,
        delay_ms: (0.05, 0.5),
    };
}

struct NodeState {
    addr: String,
    /// Incremented at every crash: messages from an older life go nowhere.
    life: u64,
    endpoint: Option<Endpoint>,
    paused: watch::Sender<bool>,
}

struct State {
    rng: StdRng,
    nodes: BTreeMap<NodeId, NodeState>,
    /// Directed cuts (from, to), counted: overlapping faults may cut the same link.
    cuts: BTreeMap<(NodeId, NodeId), u32>,
    noise: Noise,
    delivered: u64,
    dropped: u64,
    duplicated: u64,
}

/// The network of one run.
pub struct Net {
    state: Mutex<State>,
    /// The `holdback` fault's hold on a new leader's first appends (inert unless armed).
    hold: crate::holdback::Hold,
}

impl Net {
    pub fn new(seed: u64) -> Arc<Net> {
        Arc::new(Net {
            state: Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                nodes: BTreeMap::new(),
                cuts: BTreeMap::new(),
                noise: Noise::QUIET,
                delivered: 0,
                dropped: 0,
                duplicated: 0,
            }),
            hold: Default::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Declare node `id` at `addr` (down until [`Net::up`]).
    pub fn add(&self, id: NodeId, addr: &str) {
        let (paused, _) = watch::channel(false);
        self.lock().nodes.insert(
            id,
            NodeState {
                addr: addr.to_owned(),
                life: 0,
                endpoint: None,
                paused,
            },
        );
    }

    /// The links node `id` calls its peers through, in its current life.
    pub fn links(self: &Arc<Self>, id: NodeId) -> Arc<dyn Links> {
        let life = self.lock().nodes.get(&id).map_or(0, |n| n.life);
        Arc::new(NodeLinks {
            net: self.clone(),
            from: id,
            life,
        })
    }

    /// Node `id` serves at `endpoint`.
    pub fn up(&self, id: NodeId, endpoint: Endpoint) {
        if let Some(n) = self.lock().nodes.get_mut(&id) {
            n.endpoint = Some(endpoint);
        }
    }

    /// Node `id` crashed: it is unreachable, and whatever its old tasks still send goes
    /// nowhere.
    pub fn down(&self, id: NodeId) {
        if let Some(n) = self.lock().nodes.get_mut(&id) {
            n.endpoint = None;
            n.life += 1;
        }
    }

    pub fn set_paused(&self, id: NodeId, paused: bool) {
        if let Some(n) = self.lock().nodes.get(&id) {
            n.paused.send_replace(paused);
        }
    }

    pub fn is_paused(&self, id: NodeId) -> bool {
        self.lock()
            .nodes
            .get(&id)
            .is_some_and(|n| *n.paused.borrow())
    }

    /// Wait while node `id` is paused.
    pub async fn unpaused(&self, id: NodeId) {
        let rx = self.lock().nodes.get(&id).map(|n| n.paused.subscribe());
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|p| !*p).await;
        }
    }

    pub fn cut(&self, links: &[(NodeId, NodeId)]) {
        let mut s = self.lock();
        for l in links {
            *s.cuts.entry(*l).or_default() += 1;
        }
    }

    pub fn uncut(&self, links: &[(NodeId, NodeId)]) {
        let mut s = self.lock();
        for l in links {
            if let Some(c) = s.cuts.get_mut(l) {
                *c -= 1;
                if *c == 0 {
                    s.cuts.remove(l);
                }
            }
        }
    }

    pub fn set_noise(&self, noise: Noise) {
        self.lock().noise = noise;
    }

    /// Remove every cut and the noise.
    pub fn heal(&self) {
        let mut s = self.lock();
        s.cuts.clear();
        s.noise = Noise::QUIET;
    }

    /// (delivered, dropped, duplicated) messages so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        let s = self.lock();
        (s.delivered, s.dropped, s.duplicated)
    }

    /// One hop's delay, drawn now.
    pub fn hop(&self) -> Duration {
        let mut s = self.lock();
        let (lo, hi) = s.noise.delay_ms;
        let ms = if hi > lo { s.rng.gen_range(lo..hi) } else { lo };
        Duration::from_micros((ms * 1000.0) as u64)
    }

    pub fn hold(&self) -> &crate::holdback::Hold {
        &self.hold
    }

    /// Whether the `holdback` fault loses this append-entries message.
    fn held_back(&self, from: NodeId, addr: &str, req: &RaftRequest) -> bool {
        if self.hold.phase().is_none() {
            return false;
        }
        let (to, up) = {
            let s = self.lock();
            let to = s
                .nodes
                .iter()
                .find(|(_, n)| n.addr == addr)
                .map(|(id, _)| *id);
            let up = s
                .nodes
                .iter()
                .filter(|(_, n)| n.endpoint.is_some())
                .map(|(id, _)| *id)
                .collect();
            (to, up)
        };
        to.is_some_and(|to| self.hold.judge(from, to, &req.data, &up))
    }

    fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.lock().cuts.contains_key(&(from, to))
    }

    fn alive(&self, id: NodeId, life: u64) -> bool {
        self.lock().nodes.get(&id).is_some_and(|n| n.life == life)
    }

    fn target(&self, addr: &str) -> Option<(NodeId, Option<Endpoint>)> {
        self.lock()
            .nodes
            .iter()
            .find(|(_, n)| n.addr == addr)
            .map(|(id, n)| (*id, n.endpoint.clone()))
    }

    /// Draw whether a message is lost and whether it is duplicated.
    fn draw(&self) -> (bool, bool) {
        let mut s = self.lock();
        let Noise { loss, dup, .. } = s.noise;
        let lost = loss > 0.0 && s.rng.gen_bool(loss);
        let dup = dup > 0.0 && s.rng.gen_bool(dup);
        if lost {
            s.dropped += 1;
        } else {
            s.delivered += 1;
        }
        if dup {
            s.duplicated += 1;
        }
        (lost, dup)
    }

    /// Carry one call from `from` (in its life `life`) to the node at `addr` and its answer
    /// back.
    async fn carry<Q, A>(
        self: Arc<Self>,
        from: NodeId,
        life: u64,
        addr: String,
        req: Request<Q>,
        call: fn(Endpoint, Request<Q>) -> BoxFut<Reply<A>>,
    ) -> Reply<A>
    where
        Q: Clone + Send + 'static,
        A: Send + 'static,
    {
        let body = req.into_inner();
        self.unpaused(from).await;
        if !self.alive(from, life) {
            return never().await;
        }
        let Some((to, endpoint)) = self.target(&addr) else {
            return Err(Status::unavailable(format!("no node at {addr}")));
        };
        if endpoint.is_none() {
            tokio::time::sleep(self.hop()).await;
            return Err(Status::unavailable(format!("n{to} refused the connection")));
        }
        let (lost, dup) = self.draw();
        tokio::time::sleep(self.hop()).await;
        self.unpaused(to).await;
        if lost || self.is_cut(from, to) || !self.alive(from, life) {
            return never().await;
        }
        // The target may have crashed (or restarted) while the message travelled.
        let Some((_, Some(endpoint_now))) = self.target(&addr) else {
            return Err(Status::unavailable(format!("n{to} refused the connection")));
        };
        if dup {
            let net = self.clone();
            let again = body.clone();
            let e = endpoint_now.clone();
            tokio::spawn(async move {
                tokio::time::sleep(net.hop()).await;
                net.unpaused(to).await;
                if !net.is_cut(from, to) {
                    let _ = call(e, Request::new(again)).await;
                }
            });
        }
        let answer = call(endpoint_now, Request::new(body)).await;
        let (lost, _) = self.draw();
        tokio::time::sleep(self.hop()).await;
        self.unpaused(to).await;
        self.unpaused(from).await;
        if lost || self.is_cut(to, from) || !self.alive(from, life) {
            return never().await;
        }
        answer
    }
}

async fn never<T>() -> T {
    std::future::pending().await
}

/// One node's links in one of its lives.
struct NodeLinks {
    net: Arc<Net>,
    from: NodeId,
    life: u64,
}

impl Links for NodeLinks {
    fn raft(&self, _target: NodeId, addr: &str) -> Result<Arc<dyn RaftRpc>, TransportError> {
        Ok(Arc::new(Handle {
            net: self.net.clone(),
            from: self.from,
            life: self.life,
            addr: addr.to_owned(),
        }))
    }

    fn forward(&self, _target: NodeId, addr: &str) -> Result<Arc<dyn Forward>, TransportError> {
        Ok(Arc::new(Handle {
            net: self.net.clone(),
            from: self.from,
            life: self.life,
            addr: addr.to_owned(),
        }))
    }
}

/// A call handle to the node at `addr`, resolved at every call (it follows restarts).
struct Handle {
    net: Arc<Net>,
    from: NodeId,
    life: u64,
    addr: String,
}

impl Handle {
    async fn carry<Q, A>(
        &self,
        req: Request<Q>,
        call: fn(Endpoint, Request<Q>) -> BoxFut<Reply<A>>,
    ) -> Reply<A>
    where
        Q: Clone + Send + 'static,
        A: Send + 'static,
    {
        self.net
            .clone()
            .carry(self.from, self.life, self.addr.clone(), req, call)
            .await
    }
}

#[tonic::async_trait]
impl RaftRpc for Handle {
    async fn append_entries(&self, r: Request<RaftRequest>) -> Reply<RaftReply> {
        if self.net.held_back(self.from, &self.addr, r.get_ref()) {
            return never().await;
        }
        self.carry(r, |e, r| {
            Box::pin(async move { e.raft.append_entries(r).await })
        })
        .await
    }

    async fn vote(&self, r: Request<RaftRequest>) -> Reply<RaftReply> {
        self.carry(r, |e, r| Box::pin(async move { e.raft.vote(r).await }))
            .await
    }

    async fn install_snapshot(&self, r: Request<RaftRequest>) -> Reply<RaftReply> {
        self.carry(r, |e, r| {
            Box::pin(async move { e.raft.install_snapshot(r).await })
        })
        .await
    }
}

#[tonic::async_trait]
impl Forward for Handle {
    async fn propose(&self, r: Request<ProposeRequest>) -> Reply<ProposeReply> {
        self.carry(r, |e, r| {
            Box::pin(async move { e.forward.propose(r).await })
        })
        .await
    }

    async fn propose_batch(&self, r: Request<ProposeBatchRequest>) -> Reply<ProposeBatchReply> {
        self.carry(r, |e, r| {
            Box::pin(async move { e.forward.propose_batch(r).await })
        })
        .await
    }

    async fn campaign(&self, r: Request<CampaignRequest>) -> Reply<CampaignReply> {
        self.carry(r, |e, r| {
            Box::pin(async move { e.forward.campaign(r).await })
        })
        .await
    }

    async fn admin(&self, r: Request<AdminRequest>) -> Reply<AdminReply> {
        self.carry(r, |e, r| Box::pin(async move { e.forward.admin(r).await }))
            .await
    }

    async fn check(&self, r: Request<CheckRequest>) -> Reply<CheckReply> {
        self.carry(r, |e, r| Box::pin(async move { e.forward.check(r).await }))
            .await
    }

    async fn read_index(&self, r: Request<ReadIndexRequest>) -> Reply<ReadIndexReply> {
        self.carry(r, |e, r| {
            Box::pin(async move { e.forward.read_index(r).await })
        })
        .await
    }
}
