//! A running node as the front ends see it: the two paths every front end uses —
//! [`Node::propose`] (writes, batched into entries on the leader, forwarded by a follower) and
//! [`Node::read`] (linearizable reads) — and the leader's clock and expiry ticker.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::NodeConfig;
use fenced_core::{Batch, Command, Event, Request, RequestId, Response, Semantics, StateMachine};
use fenced_network::PeerGate;
use fenced_proto::raft::PeerIdentity;
use fenced_raft_types::{NodeId, Raft};
use fenced_storage::SharedState;
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::ServerState;
use tokio::sync::watch;

use crate::batch::{Batcher, Limits, Refused};
use crate::clock::LeaderClock;
use crate::error::NodeError;
use crate::forward::client::Forwarder;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::proposal::{self, stopped, Proposal, Proposed, PROPOSE_TIMEOUT, WAIT_SLACK};

mod handoff;
pub use handoff::HandOff;

/// How long one local `client_write` may take before it counts as unknown.
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the ticker looks for due deadlines at most.
const TICK_MAX_SLEEP: Duration = Duration::from_millis(50);
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Proposal batching on the leader: entries in flight at once, and the bounds of one entry.
/// Commands arriving while these are in flight ride in the next entry. One at a time: every
/// entry costs each node a replication round and two fsyncs, and on a loaded machine fewer,
/// fuller entries win even for latency (4 clients: acquire p50 1.94 vs 2.12 ms with two in
/// flight; 64 clients: 116 vs 156 µs of server CPU per pair, docs/performance.md).
pub const PROPOSE_LIMITS: Limits = Limits {
    in_flight: 1,
    max_items: 1024,
    max_bytes: 1024 * 1024,
    cap_bytes: proposal::MAX_ENTRY_BYTES,
    // Set from `--max-pending-requests`.
    max_queued: usize::MAX,
};
/// Read-index rounds: one at a time, so every read waits for a round that starts after it
/// arrived; all reads that arrive during a round share the next.
const READ_LIMITS: Limits = Limits {
    in_flight: 1,
    max_items: usize::MAX,
    max_bytes: usize::MAX,
    cap_bytes: usize::MAX,
    // Set from `--max-pending-requests`.
    max_queued: usize::MAX,
};

/// A running node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    id: NodeId,
    raft: Raft,
    state: SharedState,
    hub: Hub,
    clock: LeaderClock,
    /// Identity checks of node-to-node calls, both directions.
    gate: PeerGate,
    /// Proposals on this node while it leads, batched into entries.
    proposer: Batcher<Proposal, Proposed>,
    /// The follower's half of forwarding: proposals and read rounds passed to the leader.
    forwarder: Arc<Forwarder>,
    metrics: Arc<Metrics>,
    /// Read-index rounds, shared by the reads that arrived while the previous one ran:
    /// `(read index, leader log time)`.
    reader: Batcher<(), Result<(u64, u64), NodeError>>,
    /// A leadership hand-off runs ([`Node::step_down`]): the leader serves nothing new.
    handing_off: std::sync::atomic::AtomicBool,
}

impl Node {
    /// A node over a started Raft: its proposal batcher, forwarders and read rounds.
    pub(crate) fn new(
        cfg: &NodeConfig,
        raft: Raft,
        state: SharedState,
        hub: Hub,
        gate: PeerGate,
        metrics: Arc<Metrics>,
    ) -> Node {
        let peer_tls = cfg.tls.as_ref().map(|t| t.peer_client());
        let bounded = |limits: Limits| Limits {
            max_queued: cfg.max_pending_requests.max(1),
            ..limits
        };
        Node {
            inner: Arc::new_cyclic(|me: &Weak<Inner>| Inner {
                id: cfg.id,
                state,
                hub,
                clock: LeaderClock::new(),
                handing_off: std::sync::atomic::AtomicBool::new(false),
                forwarder: Forwarder::new(
                    raft.clone(),
                    gate.clone(),
                    peer_tls,
                    cfg.max_pending_requests.max(1),
                ),
                metrics,
                raft,
                gate,
                proposer: Batcher::spawn(bounded(PROPOSE_LIMITS), {
                    let me = me.clone();
                    move |batch: Vec<Proposal>| {
                        let node = Node::upgrade(&me);
                        async move {
                            match node {
                                Some(node) => node.propose_entry(batch).await,
                                None => stopped(batch.len()),
                            }
                        }
                    }
                }),
                reader: Batcher::spawn(bounded(READ_LIMITS), {
                    let me = me.clone();
                    move |batch: Vec<()>| {
                        let node = Node::upgrade(&me);
                        async move {
                            let round = match node {
                                Some(node) => node.read_round().await,
                                None => Err(NodeError::Fatal("node stopped".into())),
                            };
                            vec![round; batch.len()]
                        }
                    }
                }),
            }),
        }
    }

    fn upgrade(inner: &Weak<Inner>) -> Option<Node> {
        inner.upgrade().map(|inner| Node { inner })
    }

    /// The follower's half of forwarding (to the leader).
    pub(crate) fn forwarder(&self) -> &Forwarder {
        &self.inner.forwarder
    }

    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// This node's Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// `Ok` while Raft runs and this member is not retired; else why not.
    pub fn health(&self) -> Result<(), String> {
        if let Err(e) = &self.inner.raft.metrics().borrow().running_state {
            return Err(format!("raft stopped: {e}"));
        }
        match self.inner.gate.identity().retired_reason() {
            Some(reason) => Err(format!("this member is retired: {reason}")),
            None => Ok(()),
        }
    }

    /// The identity checks of node-to-node calls (and this member's identity).
    pub fn gate(&self) -> &PeerGate {
        &self.inner.gate
    }

    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    pub fn hub(&self) -> &Hub {
        &self.inner.hub
    }

    /// The leader's gRPC address when this node is not the leader and knows it (a hint for
    /// clients to talk to the leader directly).
    pub fn leader_hint(&self) -> Option<String> {
        match self.leader_term() {
            Err(NodeError::NotLeader { leader }) => leader,
            _ => None,
        }
    }

    /// Propose a command, from any node: applied through the leader (forwarded if this node
    /// is not it), retried across leader changes for up to [`PROPOSE_TIMEOUT`]. Retrying is
    /// safe because the request id makes the state machine answer a repeat with the first
    /// outcome; commands without an id are only retried when they certainly had no effect.
    pub async fn propose(
        &self,
        rid: Option<RequestId>,
        cmd: Command,
    ) -> Result<Response, NodeError> {
        let mut out = self.propose_all(vec![(rid, cmd)]).await;
        out.pop()
            .unwrap_or_else(|| Err(NodeError::Unknown("no answer from the proposer".into())))
    }

    /// [`Node::propose`] for several commands at once (a client's pipeline): queued in order
    /// into the same entries (or one forwarded batch), one result each. Around a leader change
    /// the commands that must be tried again are, in their order, after those that were
    /// already applied.
    pub async fn propose_all(&self, proposals: Vec<Proposal>) -> Vec<Proposed> {
        let give_up = Instant::now() + PROPOSE_TIMEOUT;
        let n = proposals.len();
        let mut done: Vec<Option<Proposed>> = vec![None; n];
        let mut unknown: Vec<Option<String>> = vec![None; n];
        loop {
            let open: Vec<usize> = (0..n).filter(|i| done[*i].is_none()).collect();
            if open.is_empty() {
                return done.into_iter().flatten().collect();
            }
            let batch: Vec<Proposal> = open.iter().map(|i| proposals[*i].clone()).collect();
            let mut attempt = self.propose_local_all(batch.clone()).await;
            if let Some(Err(NodeError::NotLeader { leader: Some(addr) })) = attempt.first() {
                // Not the leader (for all of them: leadership is checked once per call).
                let addr = addr.clone();
                attempt = self.inner.forwarder.forward_all(&addr, batch).await;
            }
            let retry = Instant::now() < give_up;
            for (i, result) in open.into_iter().zip(attempt) {
                let has_id = proposals[i].0.is_some();
                done[i] = settle(result, &mut unknown[i], has_id, retry);
            }
            if done.iter().any(Option::is_none) {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }

    /// Propose an [`Command::Acquire`] and, if it was queued (`Pending`), wait for the entry
    /// that grants it or gives up (the wait's deadline is in the command; the leader's ticker
    /// ends it). Returns `Granted`, `NotGranted`, `Rejected`, or `Pending` if the resolution
    /// could not be learnt in time (outcome unknown; retry with the same request id).
    pub async fn acquire(
        &self,
        rid: RequestId,
        cmd: Command,
        wait_ms: u64,
    ) -> Result<Response, NodeError> {
        // A follower lets the leader do the waiting: the leader applies the granting entry
        // first, so the grant reaches the client one commit notification earlier. If that
        // fails (the leader changed mid-wait), wait here; the request id makes it safe.
        if wait_ms > 0 {
            if let Err(NodeError::NotLeader { leader: Some(addr) }) = self.leader_term() {
                match self
                    .inner
                    .forwarder
                    .forward(&addr, Some(rid), &cmd, wait_ms)
                    .await
                {
                    Ok(resp) if resp != Response::Pending => return Ok(resp),
                    Ok(_) => {}
                    Err(e) => tracing::debug!("forwarded wait: {e}; waiting here"),
                }
            }
        }
        self.acquire_here(rid, cmd, wait_ms).await
    }

    /// [`Node::acquire`], waiting for the resolution on this node.
    pub async fn acquire_here(
        &self,
        rid: RequestId,
        cmd: Command,
        wait_ms: u64,
    ) -> Result<Response, NodeError> {
        // Listen before proposing: the grant may be applied right after the queueing entry.
        let mut registration = (wait_ms > 0).then(|| self.inner.hub.register(rid));
        let resp = self.propose(Some(rid), cmd.clone()).await?;
        let Some(reg) = registration.as_mut().filter(|_| resp == Response::Pending) else {
            return Ok(resp);
        };
        match reg.wait(Duration::from_millis(wait_ms) + WAIT_SLACK).await {
            Some(Event::WaiterGranted {
                token, deadline_ms, ..
            }) => Ok(Response::Granted {
                token,
                holds: 1,
                deadline_ms,
            }),
            Some(_) => Ok(Response::NotGranted),
            // Missed (this node lagged, restarted, or caught up by snapshot): the dedup record
            // of the request holds the resolution.
            None => self.propose(Some(rid), cmd).await,
        }
    }

    /// Propose on this node, which must be the leader. The command rides in the next entry
    /// with whatever else arrives while earlier entries are in flight
    /// ([`PROPOSE_LIMITS`]).
    pub async fn propose_local(
        &self,
        rid: Option<RequestId>,
        cmd: Command,
    ) -> Result<Response, NodeError> {
        let mut out = self.propose_local_all(vec![(rid, cmd)]).await;
        out.pop()
            .unwrap_or_else(|| Err(NodeError::Unknown("no answer from the proposer".into())))
    }

    /// Propose several commands on this node (the leader) in order, batched with the rest;
    /// one result each.
    pub async fn propose_local_all(&self, proposals: Vec<Proposal>) -> Vec<Proposed> {
        if let Err(e) = self.leader_term() {
            return vec![Err(e); proposals.len()];
        }
        let sized = proposals.into_iter().map(|p| {
            let size = proposal::size(&p.1);
            (p, size)
        });
        self.inner
            .proposer
            .call_all(sized, |why| {
                Err(refused(why, "the proposal batcher stopped"))
            })
            .await
    }

    /// One entry: stamp the batch's log time now, when it closes (so it is never earlier
    /// than any of its commands was sent), append, and answer each command.
    async fn propose_entry(&self, proposals: Vec<Proposal>) -> Vec<Proposed> {
        let n = proposals.len();
        let term = match self.leader_term() {
            Ok(term) => term,
            Err(e) => return vec![Err(e); n],
        };
        let time_ms = self
            .inner
            .clock
            .stamp(term, || self.inner.state.read(StateMachine::now));
        let batch = Batch {
            requests: proposals
                .into_iter()
                .map(|(client, cmd)| Request {
                    time_ms,
                    client,
                    cmd,
                })
                .collect(),
            semantics: Semantics::REVISIONS,
        };
        let metrics = &self.inner.metrics;
        metrics.batch_size.observe(n as f64);
        let err = |e: NodeError| {
            metrics.proposals_failed.inc_by(n as u64);
            vec![Err(e); n]
        };
        let started = Instant::now();
        let written =
            tokio::time::timeout(WRITE_TIMEOUT, self.inner.raft.client_write(batch)).await;
        if let Ok(Ok(resp)) = &written {
            metrics
                .commit_seconds
                .observe(started.elapsed().as_secs_f64());
            metrics.proposals_committed.inc_by(n as u64);
            metrics.observe_responses(&resp.data);
        }
        match written {
            Err(_) => err(NodeError::Unknown("raft write timed out".into())),
            Ok(Ok(resp)) if resp.data.len() == n => resp.data.into_iter().map(Ok).collect(),
            Ok(Ok(resp)) => err(NodeError::Unknown(format!(
                "{} responses for an entry of {n} commands",
                resp.data.len()
            ))),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                err(NodeError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                })
            }
            Ok(Err(RaftError::APIError(e))) => err(NodeError::Unknown(e.to_string())),
            Ok(Err(RaftError::Fatal(e))) => err(NodeError::Fatal(e.to_string())),
        }
    }

    /// `Ok` if this node is the leader and serving, else `NotLeader` (with a hint if known).
    pub fn check_leader(&self) -> Result<(), NodeError> {
        self.leader_term().map(|_| ())
    }

    /// The current term if this node is the leader, else `NotLeader` with a hint.
    ///
    /// A leader serves (and reads or anchors its log clock) only once its state machine has
    /// applied the whole log it took office with, its blank entry included. Its log clock
    /// then continues from the last committed log time. Before that the state machine can be
    /// behind — at log time 0 after a restart whose commit index was not yet on disk, which
    /// the clock would take for a new cluster and anchor to the wall clock, counting the
    /// downtime against every lease. Until then it answers `NotLeader` (no hint): callers
    /// retry.
    fn leader_term(&self) -> Result<u64, NodeError> {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        if m.state == ServerState::Leader {
            if self
                .inner
                .handing_off
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                // Handing off: callers wait and retry, then reach the new leader.
                return Err(NodeError::NotLeader { leader: None });
            }
            let caught_up = m.last_applied.map(|l| l.index) >= m.last_log_index;
            if caught_up || self.inner.clock.anchored(m.current_term) {
                return Ok(m.current_term);
            }
            return Err(NodeError::NotLeader { leader: None });
        }
        let leader = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.addr.clone())
        });
        Err(NodeError::NotLeader { leader })
    }

    /// Wait until a read on this node's state machine is linearizable: the leader confirms
    /// its leadership with a quorum (read-index) and this node has applied up to that index.
    pub async fn read_barrier(&self) -> Result<(), NodeError> {
        self.read_barrier_time().await.map(|_| ())
    }

    /// A linearizable read judged at the leader's log time: `f` gets the state machine and
    /// `now`, the later of the leader's log clock at the read-index check and the state
    /// machine's own log time (the last applied entry can be up to a lease old on an idle
    /// cluster, which would overstate leases left and keep expired keys alive).
    pub async fn read_at_leader_time<T>(
        &self,
        f: impl FnOnce(&StateMachine, u64) -> T,
    ) -> Result<T, NodeError> {
        let leader_now = self.read_barrier_time().await?;
        Ok(self.local(|sm| f(sm, leader_now.max(sm.now()))))
    }

    /// [`Node::read_barrier`], returning the leader's log clock at the read-index check:
    /// a state machine whose next deadline is at or before it has expiries due that are not
    /// applied yet (the RESP front end ticks before reading then).
    pub async fn read_barrier_time(&self) -> Result<u64, NodeError> {
        let give_up = Instant::now() + PROPOSE_TIMEOUT;
        loop {
            let attempt = self.shared_read_round().await;
            match attempt {
                Ok((index, time)) => {
                    let left = give_up.saturating_duration_since(Instant::now());
                    return self
                        .inner
                        .raft
                        .wait(Some(left.max(Duration::from_millis(100))))
                        .applied_index_at_least(Some(index), "read barrier")
                        .await
                        .map(|_| time)
                        .map_err(|e| NodeError::Unknown(format!("catching up: {e}")));
                }
                Err(NodeError::NotLeader { .. } | NodeError::Unknown(_))
                    if Instant::now() < give_up => {}
                Err(e) => return Err(e),
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Read the state machine linearizably.
    pub async fn read<T>(&self, f: impl FnOnce(&StateMachine) -> T) -> Result<T, NodeError> {
        self.read_barrier().await?;
        Ok(self.inner.state.read(f))
    }

    /// A consistent copy of the state as of a linearizable read that started with this call,
    /// with the meta of a snapshot of it (`fenced snapshot save`).
    pub async fn backup(
        &self,
    ) -> Result<
        (
            openraft::SnapshotMeta<NodeId, openraft::BasicNode>,
            StateMachine,
        ),
        NodeError,
    > {
        self.read_barrier().await?;
        Ok(self.inner.state.backup())
    }

    /// A read-index round that started after this call: `(read index, leader log time)`.
    /// Every caller that arrives while a round runs shares the next one ([`READ_LIMITS`]).
    pub async fn shared_read_round(&self) -> Result<(u64, u64), NodeError> {
        self.inner
            .reader
            .call((), 0, |why| Err(refused(why, "the read batcher stopped")))
            .await
    }

    /// One read-index round: on the leader a quorum check, on a follower one forwarded
    /// round on the leader (which shares it with the leader's own reads the same way).
    async fn read_round(&self) -> Result<(u64, u64), NodeError> {
        match self.read_index_local().await {
            Ok(index) => Ok((index, self.leader_time_now())),
            Err(NodeError::NotLeader { leader: Some(addr) }) => {
                self.inner.forwarder.read_index(&addr).await
            }
            Err(e) => Err(e),
        }
    }

    /// On the leader: the index a linearizable read must wait for.
    pub async fn read_index_local(&self) -> Result<u64, NodeError> {
        self.leader_term()?;
        match self.inner.raft.get_read_log_id().await {
            Ok((read, _applied)) => Ok(read.map_or(0, |l| l.index)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(NodeError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                })
            }
            Err(RaftError::APIError(e)) => Err(NodeError::Unknown(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(NodeError::Fatal(e.to_string())),
        }
    }

    /// The log time now: the leader's log clock on the leader, else the applied log time.
    pub fn leader_time_now(&self) -> u64 {
        let applied = self.inner.state.read(StateMachine::now);
        match self.leader_term() {
            Ok(term) => self.inner.clock.peek(term, || applied).max(applied),
            Err(_) => applied,
        }
    }

    /// Resolves when Raft stopped on a fatal error (a storage write failed, a panic), or when
    /// this member was retired (a peer knows it under another incarnation): the node must not
    /// go on serving. Never resolves while the node is healthy.
    pub async fn fatal(&self) -> String {
        // Raft's full metrics change with every entry; its server metrics (vote, role,
        // membership) rarely. Both senders close when Raft stops, the full metrics holding
        // the error: listening to the quiet one costs no wake-up per entry.
        let mut server = self.inner.raft.server_metrics();
        let mut retired = self.inner.gate.identity().retired();
        loop {
            if let Err(e) = &self.inner.raft.metrics().borrow().running_state {
                return e.to_string();
            }
            if let Some(reason) = retired.borrow().as_ref() {
                return format!("this member is retired: {reason}");
            }
            tokio::select! {
                changed = server.changed() => if changed.is_err() {
                    return match &self.inner.raft.metrics().borrow().running_state {
                        Err(e) => e.to_string(),
                        Ok(()) => "raft stopped".into(),
                    };
                },
                _ = retired.changed() => {}
            }
        }
    }

    /// Check the identity of a node-to-node call ([`PeerGate::admit`]) against the
    /// membership this node knows.
    pub fn admit_peer(&self, from: Option<&PeerIdentity>) -> Result<(), tonic::Status> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        self.inner
            .gate
            .admit(from, metrics.membership_config.membership())
    }

    /// Local, possibly stale view of the state machine (no read barrier).
    pub fn local<T>(&self, f: impl FnOnce(&StateMachine) -> T) -> T {
        self.inner.state.read(f)
    }

    /// The log time to count a just-answered proposal's lease from: the local state
    /// machine's, or the leader's as reported with the last forwarded answer if that is
    /// newer. A follower has often not applied the entry that answered its forwarded
    /// proposal yet; its own clock alone can be any amount behind (0 before its first entry),
    /// which would overstate the lease left.
    pub fn log_time(&self) -> u64 {
        let local = self.local(StateMachine::now);
        local.max(self.inner.forwarder.leader_log_time())
    }

    /// While this node leads, propose a `Tick` whenever the earliest deadline of the state
    /// machine has passed on the leader's log clock, so leases, sessions and waits expire
    /// (and locks pass to their next waiter) without other traffic.
    /// The leader's expiry driver: proposes a `Tick` when the earliest deadline is due.
    pub(crate) async fn ticker(self, mut shutdown: watch::Receiver<bool>) {
        loop {
            let sleep = match self.leader_term() {
                Err(_) => TICK_MAX_SLEEP,
                Ok(term) => {
                    let (next, applied) =
                        self.inner.state.read(|sm| (sm.next_deadline(), sm.now()));
                    let now = self.inner.clock.peek(term, || applied);
                    match next {
                        Some(due) if due <= now => {
                            if let Err(e) = self.propose_local(None, Command::Tick).await {
                                tracing::debug!("tick: {e}");
                                TICK_MAX_SLEEP
                            } else {
                                Duration::ZERO
                            }
                        }
                        Some(due) => Duration::from_millis(due - now).min(TICK_MAX_SLEEP),
                        None => TICK_MAX_SLEEP,
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(sleep.max(Duration::from_millis(1))) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }
}

/// One attempt of [`Node::propose`]: `None` to try again, or the answer. `unknown` remembers
/// that an earlier attempt may have taken effect: once it is set, giving up on "not the
/// leader" must still say "outcome unknown" — "not the leader" alone tells clients (RESP
/// `-TRYAGAIN`) that nothing was applied.
/// The error of a request its batcher did not run.
pub(crate) fn refused(why: Refused, stopped: &str) -> NodeError {
    match why {
        Refused::Gone => NodeError::Unknown(stopped.into()),
        Refused::Full { queued } => NodeError::Overloaded(format!(
            "{queued} requests already wait on this node (--max-pending-requests); retry \
             later or on another node"
        )),
        Refused::TooLarge { size, cap } => proposal::too_large(size, cap),
    }
}

fn settle(
    attempt: Result<Response, NodeError>,
    unknown: &mut Option<String>,
    has_id: bool,
    retry: bool,
) -> Option<Result<Response, NodeError>> {
    match attempt {
        Err(NodeError::NotLeader { .. }) if retry => None,
        Err(NodeError::Unknown(m)) if has_id && retry => {
            *unknown = Some(m);
            None
        }
        Err(NodeError::NotLeader { leader }) => Some(Err(match unknown.take() {
            Some(m) => NodeError::Unknown(m),
            None => NodeError::NotLeader { leader },
        })),
        // Refused now, but an earlier attempt may have been applied.
        Err(NodeError::Overloaded(m)) => Some(Err(match unknown.take() {
            Some(u) => NodeError::Unknown(u),
            None => NodeError::Overloaded(m),
        })),
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_leader() -> Result<Response, NodeError> {
        Err(NodeError::NotLeader { leader: None })
    }

    #[test]
    fn giving_up_after_an_unknown_attempt_stays_unknown() {
        let mut unknown = None;
        let timed_out = Err(NodeError::Unknown("timed out on the leader".into()));
        assert!(settle(timed_out, &mut unknown, true, true).is_none());
        assert!(settle(not_leader(), &mut unknown, true, true).is_none());
        match settle(not_leader(), &mut unknown, true, false) {
            Some(Err(NodeError::Unknown(m))) => assert!(m.contains("timed out"), "{m}"),
            other => panic!("expected outcome unknown, got {other:?}"),
        }
    }

    #[test]
    fn not_leader_throughout_means_not_applied() {
        let mut unknown = None;
        assert!(settle(not_leader(), &mut unknown, true, true).is_none());
        assert!(matches!(
            settle(not_leader(), &mut unknown, true, false),
            Some(Err(NodeError::NotLeader { .. }))
        ));
        // Without a request id an unknown outcome is not retried: it is the answer.
        let timed_out = Err(NodeError::Unknown("t".into()));
        assert!(matches!(
            settle(timed_out, &mut unknown, false, true),
            Some(Err(NodeError::Unknown(_)))
        ));
        assert!(matches!(
            settle(Ok(Response::Pending), &mut unknown, true, true),
            Some(Ok(Response::Pending))
        ));
    }
}
