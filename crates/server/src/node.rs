//! A running node as the front ends see it: the two paths every front end uses —
//! [`Node::propose`] (writes, batched into entries on the leader, forwarded by a follower) and
//! [`Node::read`] and its flavours (linearizable reads, in `node/read.rs`) — and the leader's
//! clock and expiry ticker.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::NodeConfig;
use fenced_core::{Batch, Command, Event, Request, RequestId, Response, StateMachine};
use fenced_network::{Links, PeerGate};
use fenced_proto::raft::PeerIdentity;
use fenced_raft_types::{NodeId, Raft};
use fenced_storage::SharedState;
use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::batch::{Batcher, Limits, Refused};
use crate::clock::{LeaderClock, NodeClock};
use crate::error::NodeError;
use crate::forward::client::Forwarder;
use crate::hub::Hub;
use crate::metrics::stages::Trace;
use crate::metrics::Metrics;
use crate::proposal::{self, stopped, Outcome, Proposal, Proposed, PROPOSE_TIMEOUT, WAIT_SLACK};

pub mod alarm;
mod etcd_upkeep;
mod handoff;
mod read;
pub use alarm::Alarms;
pub use handoff::HandOff;

/// How long one local `client_write` may take before it counts as unknown.
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the ticker looks for due deadlines at most.
const TICK_MAX_SLEEP: Duration = Duration::from_millis(50);
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// A queued acquire whose wait should have ended but did not: how long to listen between
/// asking its request's record again.
const REASK_PAUSE: Duration = Duration::from_millis(500);
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

/// A proposal on its way to the proposer, with the trace of a sampled one.
type Traced = (Proposal, Option<Arc<Trace>>);

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
    /// Proposals on this node while it leads, batched into entries; a sampled one carries its
    /// trace ([`crate::metrics::stages`]).
    proposer: Batcher<Traced, Proposed>,
    /// The follower's half of forwarding: proposals and read rounds passed to the leader.
    forwarder: Arc<Forwarder>,
    metrics: Arc<Metrics>,
    /// The read path's shared rounds: read-index checks and read ticks.
    reads: read::Reads,
    /// A leadership hand-off runs ([`Node::step_down`]): the leader serves nothing new.
    handing_off: std::sync::atomic::AtomicBool,
    /// The divergence alarm and the apply-semantics gate ([`alarm`]).
    alarms: Alarms,
    /// Test hook ([`crate::config::TestHooks::hold_ticks`]): the ticker proposes nothing.
    hold_ticks: bool,
}

impl Node {
    /// A node over a started Raft: its proposal batcher, forwarders and read rounds. Calls
    /// to other nodes go through `links` (the one its Raft's `NetworkFactory` uses).
    #[allow(clippy::too_many_arguments)] // the parts `run.rs` assembles, each once
    pub(crate) fn new(
        cfg: &NodeConfig,
        raft: Raft,
        state: SharedState,
        hub: Hub,
        gate: PeerGate,
        metrics: Arc<Metrics>,
        alarms: Alarms,
        links: Arc<dyn Links>,
    ) -> Node {
        let bounded = |limits: Limits| Limits {
            max_queued: cfg.max_pending_requests.max(1),
            ..limits
        };
        Node {
            inner: Arc::new_cyclic(|me: &Weak<Inner>| Inner {
                id: cfg.id,
                state,
                hub,
                clock: LeaderClock::new(cfg.clock.clone()),
                handing_off: std::sync::atomic::AtomicBool::new(false),
                hold_ticks: cfg.test_hooks.hold_ticks,
                alarms,
                forwarder: Forwarder::new(
                    raft.clone(),
                    gate.clone(),
                    links,
                    cfg.max_pending_requests.max(1),
                    cfg.test_hooks.forward_max_items,
                ),
                metrics,
                raft,
                gate,
                proposer: Batcher::spawn(bounded(PROPOSE_LIMITS), {
                    let me = me.clone();
                    move |batch: Vec<Traced>| {
                        let node = Node::upgrade(&me);
                        async move {
                            match node {
                                Some(node) => node.propose_entry(batch).await,
                                None => stopped(batch.len()),
                            }
                        }
                    }
                }),
                reads: read::Reads::new(me, cfg.max_pending_requests.max(1)),
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

    /// `Ok` while Raft runs, apply is not stuck on one entry (for
    /// [`STUCK_AFTER`](crate::metrics::apply_watch::STUCK_AFTER)) and this member is not
    /// retired; else why not.
    pub fn health(&self) -> Result<(), String> {
        if let Err(e) = &self.inner.raft.metrics().borrow().running_state {
            return Err(format!("raft stopped: {e}"));
        }
        // Read from atomics: a hung apply holds the state's lock.
        if let Some((index, took)) = self.metrics().apply.stuck() {
            return Err(crate::metrics::apply_watch::describe(index, took));
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

    /// This node's clocks (the leader's log clock reads them).
    pub fn clock(&self) -> &NodeClock {
        self.inner.clock.node_clock()
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
        // A disarm of the cluster-wide alarm passes it (nothing else does).
        let disarm = proposals
            .iter()
            .all(|(_, c)| matches!(c.inner(), Command::ClusterAlarm { raise: None }));
        let check = if disarm {
            self.member_serving()
        } else {
            self.serving()
        };
        if let Err(e) = check {
            return vec![Err(e); proposals.len()];
        }
        let outcomes = vec![Outcome::new(); proposals.len()];
        self.propose_all_after(proposals, outcomes).await.0
    }

    /// [`Node::propose`] for a request whose earlier attempts told `outcome`.
    async fn propose_after(&self, rid: RequestId, cmd: Command, outcome: &mut Outcome) -> Proposed {
        let (mut out, mut told) = self
            .propose_all_after(vec![(Some(rid), cmd)], vec![std::mem::take(outcome)])
            .await;
        if let Some(told) = told.pop() {
            *outcome = told;
        }
        out.pop()
            .unwrap_or_else(|| Err(NodeError::Unknown("no answer from the proposer".into())))
    }

    /// [`Node::propose_all`], each proposal's earlier attempts having told its `outcomes`
    /// entry. Every attempt, local or forwarded, is settled by the one rule ([`Outcome`]).
    /// Returns the answers and what the attempts told.
    async fn propose_all_after(
        &self,
        proposals: Vec<Proposal>,
        mut outcomes: Vec<Outcome>,
    ) -> (Vec<Proposed>, Vec<Outcome>) {
        let give_up = Instant::now() + PROPOSE_TIMEOUT;
        let n = proposals.len();
        let mut done: Vec<Option<Proposed>> = vec![None; n];
        loop {
            let open: Vec<usize> = (0..n).filter(|i| done[*i].is_none()).collect();
            if open.is_empty() {
                return (done.into_iter().flatten().collect(), outcomes);
            }
            let batch: Vec<Proposal> = open.iter().map(|i| proposals[*i].clone()).collect();
            let mut attempt = self.propose_local_all(batch.clone()).await;
            if let Some(Err(NodeError::NotLeader { leader: Some(addr) })) = attempt.first() {
                // Not the leader (for all of them: leadership is checked once per call).
                let addr = addr.clone();
                attempt = self.inner.forwarder.forward_all(&addr, batch).await;
            }
            // A stopped Raft core answers nothing again: give the answer now, while the
            // node still serves (it is about to exit).
            let retry = Instant::now() < give_up && !self.raft_stopped();
            for (i, result) in open.into_iter().zip(attempt) {
                let has_id = proposals[i].0.is_some();
                done[i] = outcomes[i].settle(result, has_id, retry);
            }
            if done.iter().any(Option::is_none) {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }

    /// Propose an acquire and, if it waits (`wait_ms > 0`) and was queued (`Pending`), wait
    /// for the entry that grants it or gives up (the wait's deadline is in the command; the
    /// leader's ticker ends it). Returns `Granted`, `NotGranted`, `Rejected`, or `Pending` if
    /// the resolution could not be learnt in time (outcome unknown; retry with the same
    /// request id). Once an attempt may have been applied, no answer says "refused"
    /// ([`Outcome`]).
    ///
    /// A waiting acquire whose call is dropped unanswered (its client went away) is
    /// withdrawn ([`Command::Withdraw`], proposed by [`Withdrawal`]'s drop): it never becomes
    /// a holder nobody knows about. `own_id` says the caller chose `rid` itself (a RESP
    /// connection's own counter), so no other attempt can have told a client of a grant it
    /// got — that grant is ended too; with a client's id (gRPC, RESP `REQID`) only the wait.
    pub async fn acquire(
        &self,
        rid: RequestId,
        cmd: Command,
        wait_ms: u64,
        own_id: bool,
    ) -> Result<Response, NodeError> {
        self.serving()?;
        if wait_ms == 0 {
            return self.propose(Some(rid), cmd).await;
        }
        let withdrawal = Withdrawal::arm(self, rid, &cmd, own_id);
        let answer = self.acquire_waiting(rid, cmd, wait_ms).await;
        // Answered (whatever the answer): the caller is told, nothing to take back.
        withdrawal.disarm();
        answer
    }

    async fn acquire_waiting(
        &self,
        rid: RequestId,
        cmd: Command,
        wait_ms: u64,
    ) -> Result<Response, NodeError> {
        let started = Instant::now();
        // Listen before anything is proposed: the grant may be applied right after the
        // queueing entry, and this node applies it whoever waits on the leader.
        let registration = self.inner.hub.register(rid);
        let mut outcome = Outcome::new();
        // A follower lets the leader do the waiting: the leader applies the granting entry
        // first, so the grant reaches the client one commit notification earlier. If that
        // does not resolve it (the leader changed mid-wait), the wait resumes here on the
        // same request id, knowing what the forwarded attempt told.
        if let Err(NodeError::NotLeader { leader: Some(addr) }) = self.leader_term() {
            let forwarded = self
                .inner
                .forwarder
                .forward(&addr, Some(rid), &cmd, wait_ms)
                .await;
            match forwarded {
                Ok(Response::Pending) => outcome.note_queued(),
                other => {
                    if let Some(answer) = outcome.settle(other, true, true) {
                        return answer;
                    }
                    tracing::debug!(?outcome, "forwarded wait unresolved; waiting here");
                }
            }
        }
        self.wait_here(rid, cmd, wait_ms, registration, started, outcome)
            .await
    }

    /// [`Node::acquire`], waiting for the resolution on this node (the leader's half of a
    /// forwarded wait).
    pub async fn acquire_here(
        &self,
        rid: RequestId,
        cmd: Command,
        wait_ms: u64,
    ) -> Result<Response, NodeError> {
        if wait_ms == 0 {
            return self.propose(Some(rid), cmd).await;
        }
        let registration = self.inner.hub.register(rid);
        self.wait_here(
            rid,
            cmd,
            wait_ms,
            registration,
            Instant::now(),
            Outcome::new(),
        )
        .await
    }

    /// Propose a waiting acquire (unless an attempt already queued it) and wait for its
    /// resolution on `registration`. Once queued, the wait only listens and asks again
    /// under the same request id (answered from the request's record, never acting again),
    /// until it is resolved or [`PROPOSE_TIMEOUT`] past the wait's own deadline (plus
    /// [`WAIT_SLACK`]); then `Pending`, "outcome unknown".
    async fn wait_here(
        &self,
        rid: RequestId,
        cmd: Command,
        wait_ms: u64,
        mut registration: crate::hub::Registration,
        started: Instant,
        mut outcome: Outcome,
    ) -> Result<Response, NodeError> {
        if !outcome.queued() {
            match self.propose_after(rid, cmd.clone(), &mut outcome).await {
                Ok(Response::Pending) => outcome.note_queued(),
                other => return other,
            }
        }
        let resolved_by = started + Duration::from_millis(wait_ms) + WAIT_SLACK;
        let give_up = resolved_by + PROPOSE_TIMEOUT;
        let mut listen_until = resolved_by;
        loop {
            let left = listen_until.saturating_duration_since(Instant::now());
            match registration.wait(left).await {
                Some(Event::WaiterGranted {
                    token, deadline_ms, ..
                }) => {
                    return Ok(Response::Granted {
                        token,
                        holds: 1,
                        deadline_ms,
                    })
                }
                Some(_) => return Ok(Response::NotGranted),
                None => {}
            }
            if Instant::now() >= give_up {
                return outcome.give_up();
            }
            // Not heard (this node lagged, restarted, or caught up by snapshot; or the
            // leader changed and its successor has not ended the wait yet): the request's
            // record holds the resolution once there is one. Ask it, same request id.
            let answer = self.propose_after(rid, cmd.clone(), &mut outcome).await;
            if let Some(answer) = outcome.reask(answer) {
                return answer;
            }
            listen_until = (Instant::now() + REASK_PAUSE).min(give_up);
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
    ///
    /// A command that needs newer apply rules than the leader stamps now (an etcd write
    /// while a member runs an older release) is refused here, unproposed ([`Node::admit`]):
    /// every proposal, local or forwarded, passes this door on the leader.
    pub async fn propose_local_all(&self, mut proposals: Vec<Proposal>) -> Vec<Proposed> {
        if let Err(e) = self.leader_term() {
            return vec![Err(e); proposals.len()];
        }
        // While some member runs rules without session owners, a user's command goes in as
        // it was before them (its sessions unowned) rather than being refused: sessions are
        // no new feature that could wait for the upgrade (docs/operations.md).
        if !self.stamp_semantics().session_owners() {
            for p in &mut proposals {
                if matches!(p.1, Command::AsUser { .. }) {
                    let cmd = std::mem::replace(&mut p.1, Command::Tick);
                    p.1 = cmd.without_user();
                }
            }
        }
        // The usual case, without a vector per call: every command passes.
        if proposals.iter().all(|p| self.admit(&p.1).is_ok()) {
            return self.batch_proposals(proposals).await;
        }
        let refusals: Vec<Option<NodeError>> =
            proposals.iter().map(|p| self.admit(&p.1).err()).collect();
        let admitted: Vec<Proposal> = proposals
            .into_iter()
            .zip(&refusals)
            .filter(|(_, r)| r.is_none())
            .map(|(p, _)| p)
            .collect();
        let mut answers = self.batch_proposals(admitted).await.into_iter();
        refusals
            .into_iter()
            .map(|r| match r {
                Some(e) => Err(e),
                None => answers.next().unwrap_or_else(|| {
                    Err(NodeError::Unknown("no answer from the proposer".into()))
                }),
            })
            .collect()
    }

    /// Queue proposals into the next entries, one result each.
    async fn batch_proposals(&self, proposals: Vec<Proposal>) -> Vec<Proposed> {
        if proposals.is_empty() {
            return Vec::new();
        }
        let stages = &self.inner.metrics.stages;
        let trace = stages.sample();
        let mut traced = trace.clone();
        let sized = proposals.into_iter().map(|p| {
            let size = proposal::size(&p.1);
            ((p, traced.take()), size)
        });
        let answers = self
            .inner
            .proposer
            .call_all(sized, |why| {
                Err(refused(why, "the proposal batcher stopped"))
            })
            .await;
        if let Some(trace) = trace {
            stages.finish(&trace);
        }
        answers
    }

    /// One entry: stamp the batch's log time now, when it closes (so it is never earlier
    /// than any of its commands was sent), append, and answer each command.
    async fn propose_entry(&self, proposals: Vec<Traced>) -> Vec<Proposed> {
        let n = proposals.len();
        let traces: Vec<Arc<Trace>> = proposals.iter().filter_map(|p| p.1.clone()).collect();
        for t in &traces {
            t.batched();
        }
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
                .map(|((client, cmd), _)| Request {
                    time_ms,
                    client,
                    cmd,
                })
                .collect(),
            semantics: self.stamp_semantics(),
        };
        let metrics = &self.inner.metrics;
        metrics.batch_size.observe(n as f64);
        let err = |e: NodeError| {
            metrics.proposals_failed.inc_by(n as u64);
            vec![Err(e); n]
        };
        if self.raft_stopped() {
            // Stopped before this entry was handed to it: nothing of it can apply.
            return err(NodeError::Fatal("raft stopped".into()));
        }
        // A metric only (commit_seconds): the real time an entry took, also under a simulator.
        let started = std::time::Instant::now();
        let written =
            tokio::time::timeout(WRITE_TIMEOUT, self.inner.raft.client_write(batch)).await;
        if let Ok(Ok(resp)) = &written {
            for t in &traces {
                t.answered(resp.log_id.index);
            }
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
            // The core stopped (a storage write failed) after the entry was handed to it: it
            // may be in the log, and a new leader may commit it.
            Ok(Err(RaftError::Fatal(e))) => err(NodeError::Unknown(format!("node stopped: {e}"))),
        }
    }

    /// Whether the Raft core stopped (a storage write failed, a panic, shutdown).
    fn raft_stopped(&self) -> bool {
        self.inner.raft.metrics().borrow().running_state.is_err()
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
                || self.member_serving().is_err()
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
    /// (and locks pass to their next waiter) without other traffic — none while the cluster's
    /// `CORRUPT` alarm is raised; and finish a voter change left joint
    /// ([`Node::finish_abandoned_joint`]).
    pub(crate) async fn ticker(self, mut shutdown: watch::Receiver<bool>) {
        let mut joint_seen = None;
        loop {
            let sleep = match self.leader_term() {
                Err(_) => TICK_MAX_SLEEP,
                Ok(term) => {
                    self.finish_abandoned_joint(&mut joint_seen).await;
                    let (next, applied, alarmed) = self
                        .inner
                        .state
                        .read(|sm| (sm.next_deadline(), sm.now(), sm.cluster_alarm().is_some()));
                    let now = self.inner.clock.peek(term, || applied);
                    match next {
                        Some(_) if self.inner.hold_ticks => TICK_MAX_SLEEP,
                        // While the cluster's CORRUPT alarm is raised nothing is to expire
                        // (under rules 15 the replicated clock stands still; under older
                        // rules the next entry, the disarm, expires what is due): a tick
                        // would change nothing, and proposing one per deadline passed would
                        // spin.
                        Some(_) if alarmed => TICK_MAX_SLEEP,
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

/// Takes back a waiting acquire whose call was dropped before it was answered: dropped
/// armed, it proposes [`Command::Withdraw`] on a task of its own (the call's future is
/// gone). Only acquires of the lock table are armed; an etcd lock call has its own cancel.
pub(crate) struct Withdrawal {
    armed: Option<(Node, Command)>,
}

impl Withdrawal {
    fn arm(node: &Node, request: RequestId, cmd: &Command, own_id: bool) -> Withdrawal {
        let (names, owner) = match cmd.inner() {
            Command::Acquire { name, owner, .. } => (vec![name.clone()], owner.clone()),
            Command::AcquireWith(spec) => (spec.names.clone(), spec.owner.clone()),
            _ => return Withdrawal { armed: None },
        };
        let withdraw = Command::Withdraw {
            request,
            names,
            owner,
            grant: own_id,
        };
        Withdrawal {
            armed: Some((node.clone(), withdraw)),
        }
    }

    fn disarm(mut self) {
        self.armed = None;
    }
}

impl Drop for Withdrawal {
    fn drop(&mut self) {
        let Some((node, cmd)) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            // A refusal (no leader for a while, older rules) leaves the wait to its own
            // deadline, as before withdrawals existed.
            match node.propose(None, cmd).await {
                Ok(r) => tracing::debug!(?r, "withdrew an abandoned acquire"),
                Err(e) => tracing::info!(error = %e, "could not withdraw an abandoned acquire"),
            }
        });
    }
}
